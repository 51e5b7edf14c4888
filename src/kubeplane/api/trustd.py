"""trustd: control plane nodes sign the node API certificates of workers that know the machine token.

Workers' configs carry the OS CA certificate without its key, so they cannot issue their own
node API server (and proxy) certificates. A control plane node serves trustd on port 50001:
one gRPC method, ``/kubeplane.trustd.Trustd/Certificate``, in the JSON style of
:mod:`kubeplane.api.wire` — request ``{"token", "csr"}`` (PEM CSR), response ``{"crt", "ca"}``.
The channel is TLS with the control plane node's API server certificate (the worker verifies it
against the OS CA it has); the caller proves itself with the machine token only, compared in
constant time. A wrong token is ``PERMISSION_DENIED`` and nothing is signed.

Which endpoints a worker asks (decided here, documented for the provisioner): the host of
``cluster.controlPlane.endpoint`` first (in local clusters haproxy on the host may forward
50001 too), then every other address it is given, in order; each is tried until one answers,
and the whole list is retried until a certificate arrives.
"""

from __future__ import annotations

import asyncio
import datetime
import hmac
import json
import logging
import urllib.parse
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from kubeplane import pki
from kubeplane.api import auth

log = logging.getLogger("kubeplaned.trustd")

PORT = 50001
METHOD = "/kubeplane.trustd.Trustd/Certificate"
#: Worker node API certificates are renewed by restarting the agent well before this.
LIFETIME = datetime.timedelta(days=365)


class TrustdError(Exception):
    """trustd refused or could not be reached; the message says which endpoint and why."""


def _encode(document: object) -> bytes:
    return json.dumps(document).encode()


class TrustdServer:
    """The trustd endpoint of a control plane node."""

    def __init__(self, *, token: str, ca: pki.CertKey, credentials: auth.Credentials) -> None:
        self._token = token.encode()
        self._ca = ca
        self._credentials = credentials
        self._server: Any = None
        self.port = 0

    async def start(self, listen: str) -> None:
        server = grpc.aio.server(options=(("grpc.so_reuseport", 0),))
        handler = grpc.unary_unary_rpc_method_handler(
            self._certificate, request_deserializer=json.loads, response_serializer=_encode
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("kubeplane.trustd.Trustd", {"Certificate": handler}),)
        )
        credentials = grpc.ssl_server_credentials([(self._credentials.key, self._credentials.cert)])
        self.port = server.add_secure_port(listen, credentials)
        await server.start()
        self._server = server
        log.info("trustd listening on %s", listen)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(1.0)
            self._server = None

    async def _certificate(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
        token = str(request.get("token", "")) if isinstance(request, dict) else ""
        if not self._token or not hmac.compare_digest(token.encode(), self._token):
            log.warning(
                "trustd: refused a certificate request with a wrong machine token from %s", context.peer()
            )
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "wrong machine token")
        try:
            crt = pki.sign_csr(
                ca=self._ca,
                csr=str(request.get("csr", "")).encode(),
                usages=("server", "client"),
                lifetime=LIFETIME,
            )
        except pki.PKIError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot sign the CSR: {exc}")
        log.info("trustd: signed a node certificate for %s", context.peer())
        return {"crt": crt.decode(), "ca": self._ca.cert.decode()}


def endpoints(control_plane_endpoint: str, others: Sequence[str] = ()) -> list[str]:
    """``host:50001`` targets to try: the control plane endpoint's host first, then ``others``."""
    host = urllib.parse.urlsplit(control_plane_endpoint).hostname or ""
    hosts = [host, *others] if host else list(others)
    return [f"[{h}]:{PORT}" if ":" in h else f"{h}:{PORT}" for h in dict.fromkeys(hosts)]


async def request_certificate(
    *, targets: Sequence[str], token: str, csr: bytes, ca: bytes, timeout: float = 5.0
) -> bytes:
    """The PEM certificate trustd signs for ``csr``; tries ``targets`` in order.

    Raises :class:`TrustdError` naming every target and its failure; a refusal of the token is
    raised at once (every control plane node would refuse it the same way).
    """
    failures = []
    for target in targets:
        channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca))
        try:
            call = channel.unary_unary(METHOD, request_serializer=_encode, response_deserializer=json.loads)
            response = await asyncio.wait_for(call({"token": token, "csr": csr.decode()}), timeout)
            return str(response["crt"]).encode()
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.PERMISSION_DENIED:
                raise TrustdError(f"trustd at {target} refused the machine token (machine.token)") from exc
            failures.append(f"{target}: {exc.details() or exc.code().name}")
        except TimeoutError:
            failures.append(f"{target}: no answer within {timeout:g}s")
        finally:
            await channel.close()
    raise TrustdError("no trustd answered: " + "; ".join(failures))
