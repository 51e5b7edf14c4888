"""One gRPC channel to one node API endpoint: credentials, invoking calls, decoding errors.

Shared by :class:`~kubeplane.api.client.NodeClient` and by the server when it forwards proxied
calls, so both speak exactly the wire conventions of :mod:`kubeplane.api.wire`, on the typed
service :data:`~kubeplane.api.wire.SERVICE` (messages: :mod:`kubeplane.api.schema`). A request
its typed messages cannot carry is refused here, before anything is sent, with the INVALID_ARGUMENT
:class:`~kubeplane.api.errors.CallError` naming the fields that the server would give.

A failed call becomes :class:`~kubeplane.api.errors.CallError` when a node API answered it (its
trailing metadata carries :data:`~kubeplane.api.wire.MD_ORIGIN`) or the server's grpc refused it
(a message over :data:`MAX_MESSAGE_BYTES`, an unknown method: every endpoint would answer the
same), or :class:`Unreachable` when the endpoint never answered (refused, TLS handshake failed,
timed out connecting): only the latter is retried on another endpoint.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio
from cryptography import x509
from cryptography.x509.oid import NameOID

from kubeplane.api import auth, errors, schema, wire

#: Resource lists of a busy node exceed grpc's 4 MiB default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)


#: Codes grpc answers with itself, without a node API handler (so without MD_ORIGIN).
_REFUSED_BY_GRPC = frozenset({"RESOURCE_EXHAUSTED", "UNIMPLEMENTED"})


def _identity(data: bytes) -> bytes:
    return data


def _request_bytes(call: wire.Call, request: Mapping[str, Any]) -> bytes:
    try:
        return schema.request_encoder(call)(request)
    except errors.InvalidArgumentError as exc:
        raise errors.CallError(exc.code, exc.message, fields=exc.fields) from None


class Unreachable(Exception):
    """The endpoint did not answer the call; ``reason`` says why in grpc's words."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"{endpoint}: {reason}")
        self.endpoint = endpoint
        self.reason = reason


def with_port(address: str, default_port: int = wire.DEFAULT_PORT) -> str:
    """``host`` → ``host:port``; ``host:port``, ``[v6]:port`` and bare IPv6 are handled."""
    if address.startswith("["):
        return address if "]:" in address else f"{address}:{default_port}"
    if address.count(":") == 1:
        return address
    if ":" in address:
        return f"[{address}]:{default_port}"
    return f"{address}:{default_port}"


def secure_credentials(credentials: auth.Credentials) -> Any:
    """Channel credentials verifying the server against the OS CA and presenting a client cert."""
    return grpc.ssl_channel_credentials(
        root_certificates=credentials.ca,
        private_key=credentials.key,
        certificate_chain=credentials.cert,
    )


def _server_name(cert_pem: bytes) -> str | None:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = san.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    if dns:
        return str(dns[0])
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else None


async def insecure_options(target: str, *, timeout: float) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    """Credentials and options trusting whatever certificate ``target`` presents (maintenance mode).

    grpc has no "skip verification" switch, so the certificate is fetched first and then used as
    the only trust anchor, under the name it was issued for.
    """
    host, _, port = target.rpartition(":")
    try:
        pem = await asyncio.to_thread(
            ssl.get_server_certificate, (host.strip("[]"), int(port)), timeout=timeout
        )
    except (OSError, ValueError) as exc:
        raise Unreachable(target, f"cannot fetch the server certificate: {exc}") from exc
    cert = pem.encode()
    name = _server_name(cert)
    options = (("grpc.ssl_target_name_override", name),) if name else ()
    return grpc.ssl_channel_credentials(root_certificates=cert), options


def _fields(metadata: Any) -> tuple[errors.FieldError, ...]:
    for key, value in metadata or ():
        if key == wire.MD_FIELDS:
            return tuple((str(path), str(problem)) for path, problem in json.loads(value))
    return ()


def _from_node(metadata: Any) -> bool:
    return any(key == wire.MD_ORIGIN for key, _ in metadata or ())


def call_error(exc: grpc.aio.AioRpcError, *, endpoint: str, node: str | None = None) -> Exception:
    """Translate a grpc failure (see the module docstring for which exception and why)."""
    trailing = exc.trailing_metadata()
    code = exc.code().name
    details = exc.details() or code
    if _from_node(trailing):
        return errors.CallError(code, details, node=node, fields=_fields(trailing))
    if code in _REFUSED_BY_GRPC:
        # The server's grpc refused the call before a handler saw it (too big, no such method):
        # the endpoint answered, and every other endpoint would answer the same.
        return errors.CallError(code, details, node=node)
    if code == "DEADLINE_EXCEEDED":
        return errors.CallError(code, f"no answer from {endpoint} within the timeout", node=node)
    if "Socket closed" in details or "andshake" in details:
        # TLS 1.3 servers refuse a client certificate after the client thinks the handshake is done,
        # so the client only sees a closed socket; name the likely cause.
        details += (
            " (the TLS handshake failed: check that the client certificate is signed by the "
            "cluster's OS CA and still valid, and the server certificate by the CA you trust)"
        )
    return Unreachable(endpoint, details)


def reply_error(document: Mapping[str, Any], node: str) -> errors.CallError:
    """The CallError of an in-band ``{"code", "message", "fields"}`` error document."""
    return errors.CallError(
        str(document.get("code", "UNKNOWN")),
        str(document.get("message", "")),
        node=node,
        fields=tuple((str(path), str(problem)) for path, problem in document.get("fields", ())),
    )


class Connection:
    """A channel to one endpoint; create with :meth:`open` or :meth:`open_insecure`."""

    def __init__(self, endpoint: str, channel: Any) -> None:
        self.endpoint = endpoint
        self._channel = channel

    @classmethod
    def open(cls, endpoint: str, credentials: auth.Credentials) -> Connection:
        """A mutual-TLS channel (connects lazily, on the first call)."""
        target = with_port(endpoint)
        channel = grpc.aio.secure_channel(target, secure_credentials(credentials), options=_CHANNEL_OPTIONS)
        return cls(target, channel)

    @classmethod
    async def open_insecure(cls, endpoint: str, *, timeout: float) -> Connection:
        """A TLS channel without verification or client certificate (maintenance mode)."""
        target = with_port(endpoint)
        credentials, options = await insecure_options(target, timeout=timeout)
        channel = grpc.aio.secure_channel(target, credentials, options=_CHANNEL_OPTIONS + options)
        return cls(target, channel)

    async def unary(
        self,
        call: wire.Call,
        request: Mapping[str, Any],
        *,
        metadata: Sequence[tuple[str, str]] = (),
        timeout: float | None,
    ) -> wire.Document:
        """Make a unary call; raises CallError or Unreachable."""
        body = _request_bytes(call, request)
        method = self._channel.unary_unary(
            call.method, request_serializer=_identity, response_deserializer=schema.decode_replies
        )
        try:
            document: wire.Document = await method(body, metadata=tuple(metadata), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise call_error(exc, endpoint=self.endpoint) from None
        return document

    async def stream(
        self,
        call: wire.Call,
        request: Mapping[str, Any],
        *,
        metadata: Sequence[tuple[str, str]] = (),
        timeout: float | None,
    ) -> AsyncIterator[wire.Document]:
        """Make a streaming call; the stream is cancelled when the iterator is closed early."""
        body = _request_bytes(call, request)
        method = self._channel.unary_stream(
            call.method, request_serializer=_identity, response_deserializer=schema.decode_stream_reply
        )
        rpc = method(body, metadata=tuple(metadata), timeout=timeout)
        try:
            async for message in rpc:
                yield message
        except grpc.aio.AioRpcError as exc:
            raise call_error(exc, endpoint=self.endpoint) from None
        finally:
            rpc.cancel()

    async def close(self) -> None:
        """Close the channel, cancelling calls still running on it."""
        await self._channel.close()
