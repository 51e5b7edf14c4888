"""trustd: control plane nodes sign the node API certificates of workers that know the machine token.

Workers' configs carry the OS CA certificate without its key, so they cannot issue their own
node API server certificates. A control plane node serves trustd on port 50001 (or
``machine.ports.trustd``, the same on every node): one gRPC method,
``/kubeplane.node.v1.Trustd/Certificate`` (``proto/kubeplane/node/v1/trustd.proto``, with server
reflection) — request ``CertificateRequest{token, csr}`` (PEM CSR), response
``CertificateResponse{crt, ca}`` — and, for workers older than the schema, the same as JSON
documents on ``/kubeplane.trustd.Trustd/Certificate``. The channel is TLS with the
control plane node's API server certificate (the worker verifies it against the OS CA it has);
the caller proves itself with the machine token only, compared in constant time. A wrong token
is ``PERMISSION_DENIED`` and nothing is signed. A request that is not that document (not JSON, a
field missing, unknown or not a string) is ``INVALID_ARGUMENT`` naming the field, one over
:data:`MAX_REQUEST_BYTES` ``RESOURCE_EXHAUSTED``, and a failure of trustd itself ``INTERNAL``
without its details (they go to the log).

What trustd signs (:func:`node_certificate`, a pure function of the CSR, the address the request
comes from, the control plane endpoint and the node's own certificate names). trustd sets the
subject itself: CN is the hostname the CSR asks for (a valid DNS-1123 name, checked like the DNS
SANs below; or the requester's address), O is always
:data:`~kubeplane.pki.NODE_ORG`, which is no node API role — such a certificate cannot call
the node API, nor act as a proxy. Usages are server and client. Only the CSR's public key and its
checked SANs are used, and any bad part refuses the whole CSR (nothing is downgraded):

- an Organization other than the node one → ``PERMISSION_DENIED`` naming it;
- an IP address other than the one the request comes from (gRPC peer) or a loopback address →
  ``FAILED_PRECONDITION``: trustd signs only the address it sees, so a worker must reach it
  directly at a control plane node, not through a load balancer (whose address trustd would see);
  a request that comes from the endpoint's or this node's own address is refused the same way;
- a DNS name that is the endpoint's host, one of this node's own certificate names, a wildcard,
  or a ``localhost`` variant other than ``localhost`` itself → ``PERMISSION_DENIED``;
- a malformed CSR, a signature that does not verify, other SAN types → ``INVALID_ARGUMENT``.

So a leaked machine token (every worker config holds it) still gets its holder a node
certificate, but only for the holder's own address (plus loopback) and with no role: it lets
someone impersonate a worker's node API server at an address they already own, nothing more.
Workers get no proxy certificate either: they cannot forward node API calls to other nodes.

Which endpoints a worker asks (:func:`request_certificate`): the host of
``cluster.controlPlane.endpoint`` first (right when it is a control plane node's address or a
VIP on one), then the control plane nodes' own addresses, discovered on demand from the
Kubernetes ``Endpoints default/kubernetes`` (the agent reads it through the endpoint with the
bootstrap token, ``cluster.token``, which the bootstrap manifest ``01-trustd-discovery`` allows
to get that one object). For each target the worker asks for a certificate of the local address it
reaches that target from. A refused token or a refused request is final for the round
(``PERMISSION_DENIED``: every control plane node answers the same); anything else, including an
address mismatch, moves on to the next target. The agent retries rounds until one succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import hmac
import ipaddress
import json
import logging
import re
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio
from cryptography import x509
from cryptography.x509.oid import NameOID
from grpc_reflection.v1alpha import reflection

from kubeplane import pki
from kubeplane.api import auth, errors, schema, wire
from kubeplane.clients import kube
from kubeplane.config import defaults

log = logging.getLogger("kubeplaned.trustd")

#: trustd's port unless ``machine.ports.trustd`` says otherwise.
PORT = defaults.DEFAULT_TRUSTD_PORT
METHOD = schema.TRUSTD_METHOD
#: The JSON wire of trustd from before the schema; still served, never called.
LEGACY_SERVICE = "kubeplane.trustd.Trustd"
LEGACY_METHOD = f"/{LEGACY_SERVICE}/Certificate"
#: Worker node API certificates are renewed by restarting the agent well before this.
LIFETIME = datetime.timedelta(days=365)
#: Where the control plane nodes' addresses are listed (the kube-apiservers' advertise addresses).
ENDPOINTS_PATH = "/api/v1/namespaces/default/endpoints/kubernetes"

#: The largest request trustd reads: a CSR is a few KiB even with many names, and the caller is
#: not authenticated yet when grpc reads the message.
MAX_REQUEST_BYTES = 64 * 1024
#: The request document (its parameters only; trustd is not a node API call).
REQUEST = wire.Call(
    "Certificate",
    "certificate",
    params=(
        wire.Param("token", str, required=True),
        wire.Param("csr", str, required=True, max_length=None),  # bounded by MAX_REQUEST_BYTES
    ),
)

_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$", re.I)
_LOCALHOST = "localhost"
_DIRECTLY = (
    "trustd signs only the address the request comes from (and loopback addresses), so reach trustd "
    "directly at a control plane node, not through a load balancer"
)


class TrustdError(Exception):
    """trustd refused or could not be reached; the message says which endpoint and why."""


class Refused(Exception):
    """trustd does not sign this request; ``code`` is the gRPC status it answers with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class NodeCertificate:
    """What trustd signs for a request: the subject and SANs (the key is the CSR's)."""

    common_name: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    organization: str = pki.NODE_ORG


def peer_address(peer: str) -> str | None:
    """The IP address of a gRPC peer string (``ipv4:10.5.0.4:41234``, ``ipv6:[::1]:5``), or None."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host = rest.rpartition(":")[0].strip("[]").partition("%")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def node_certificate(
    csr: bytes, *, peer: str, endpoint_host: str, own_names: Iterable[str]
) -> NodeCertificate:
    """The node certificate trustd signs for ``csr`` coming from ``peer``; raises :class:`Refused`.

    ``endpoint_host`` is the host of ``cluster.controlPlane.endpoint``; ``own_names`` are the DNS
    names and IP addresses of this control plane node's own server certificate. See the module
    docstring for the rules.
    """
    try:
        request = x509.load_pem_x509_csr(csr)
    except ValueError as exc:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT, f"not a PEM certificate signing request: {exc}"
        ) from exc
    try:
        # cryptography parses a CSR's parts when they are first read: read them all here, so a
        # malformed part (a name that is not UTF-8 or of an unknown string type, a duplicate
        # extension, a key of no known type) is refused as such instead of raising from the
        # middle of the checks below. What it raises then varies (ValueError, KeyError,
        # DuplicateExtension, UnsupportedAlgorithm, ...); whatever it is, the CSR is malformed.
        request.public_key()
        request.subject.rfc4514_string()
        for extension in request.extensions:
            if isinstance(extension.value, x509.SubjectAlternativeName):
                list(extension.value)
        request.is_signature_valid  # noqa: B018 (parses the signature algorithm)
    except Exception as exc:
        detail = str(exc) if isinstance(exc, ValueError) and str(exc) else "a part of it cannot be read"
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"the CSR is malformed: {detail}") from exc
    if not request.is_signature_valid:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            "the CSR's signature does not verify: regenerate it with its own key",
        )
    organizations = [str(a.value) for a in request.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    foreign = [org for org in organizations if org != pki.NODE_ORG]
    if foreign:
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"trustd refuses to sign O={', O='.join(foreign)}: it signs only node certificates "
            f"(O={pki.NODE_ORG}), which grant no node API role",
        )
    address = peer_address(peer)
    if address is None:
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"cannot tell which IP address the request comes from ({peer})",
        )
    endpoint = _normal(endpoint_host)
    # Names only this control plane node (or the endpoint) may present; every node has loopback.
    reserved = {name for name in {_normal(n) for n in own_names} | {endpoint} if not _is_loopback(name)}
    reserved -= {_LOCALHOST, ""}
    if address in reserved:
        what = "the control plane endpoint's host" if address == endpoint else "this control plane node's own"
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the request comes from {address}, {what} address: {_DIRECTLY}",
        )
    dns_names, ip_addresses = _requested_names(request)
    for ip in ip_addresses:
        _check_ip(ip, address=address, what="IP address")
    for name in dns_names:
        _check_dns_name(name, reserved=reserved, what="DNS name")
    names = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    common_name = str(names[0].value) if names else ""
    if pki.is_ip(common_name):
        _check_ip(common_name, address=address, what="common name")
    else:
        _check_dns_name(common_name, reserved=reserved, what="common name (the node's hostname)")
    return NodeCertificate(common_name=common_name, dns_names=dns_names, ip_addresses=ip_addresses)


def _requested_names(request: x509.CertificateSigningRequest) -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        san = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return (), ()
    dns: list[str] = []
    ips: list[str] = []
    for general in san:
        if isinstance(general, x509.DNSName):
            dns.append(general.value)
        elif isinstance(general, x509.IPAddress):
            ips.append(str(general.value))
        else:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the CSR asks for a subject alternative name {general!r}: trustd signs only DNS names "
                "and IP addresses",
            )
    return tuple(dict.fromkeys(dns)), tuple(dict.fromkeys(ips))


def _check_ip(ip: str, *, address: str, what: str) -> None:
    if _normal(ip) != address and not _is_loopback(ip):
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the CSR asks for the {what} {ip}, but the request comes from {address}: {_DIRECTLY}",
        )


def _check_dns_name(name: str, *, reserved: set[str], what: str) -> None:
    normal = _normal(name)
    if "*" in name:
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"the CSR asks for the wildcard {what} {name!r}: trustd signs none",
        )
    if len(name) > 253 or not _DNS_1123.match(name) or pki.is_ip(name):
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the CSR's {what} {name!r} is not a valid DNS-1123 host name (IP addresses go in IP SANs)",
        )
    if normal != _LOCALHOST and _LOCALHOST in normal.split("."):
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"the CSR asks for the {what} {name!r}: trustd signs no localhost name but {_LOCALHOST!r} itself",
        )
    if normal in reserved:
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"the CSR asks for the {what} {name!r}, which names the control plane endpoint or this control "
            "plane node: trustd signs only the requesting node's own names",
        )


def _normal(name: str) -> str:
    name = name.strip().rstrip(".").lower()
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(name.strip("[]")))
    return name


def _is_loopback(value: str) -> bool:
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


def _encode(document: object) -> bytes:
    return json.dumps(document).encode()


class TrustdServer:
    """The trustd endpoint of a control plane node.

    ``endpoint`` is ``cluster.controlPlane.endpoint``; ``credentials`` the node's API server
    certificate (the TLS identity, and the names a worker may not ask for).
    """

    def __init__(self, *, token: str, ca: pki.CertKey, credentials: auth.Credentials, endpoint: str) -> None:
        self._token = token.encode()
        self._ca = ca
        self._credentials = credentials
        self._endpoint_host = urllib.parse.urlsplit(endpoint).hostname or ""
        info = pki.cert_info(credentials.cert)
        self._own_names = (*info.dns_names, *info.ip_addresses)
        self._server: Any = None
        self.port = 0

    async def start(self, listen: str) -> None:
        server = grpc.aio.server(
            options=(("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MAX_REQUEST_BYTES))
        )
        typed = grpc.unary_unary_rpc_method_handler(
            self._certificate,
            request_deserializer=schema.decode_certificate_request,
            response_serializer=schema.encode_certificate_response,
        )
        legacy = grpc.unary_unary_rpc_method_handler(
            self._certificate, request_deserializer=wire.decode_request, response_serializer=_encode
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(schema.TRUSTD_SERVICE, {"Certificate": typed}),
                grpc.method_handlers_generic_handler(LEGACY_SERVICE, {"Certificate": legacy}),
            )
        )
        reflection.enable_server_reflection((schema.TRUSTD_SERVICE, reflection.SERVICE_NAME), server)
        credentials = grpc.ssl_server_credentials([(self._credentials.key, self._credentials.cert)])
        self.port = server.add_secure_port(listen, credentials)
        await server.start()
        self._server = server
        log.info("trustd listening on %s", listen)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(1.0)
            self._server = None

    async def _certificate(
        self, request: wire.Document | wire.BadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dict[str, str]:
        peer = context.peer()
        try:
            return self._sign(request, peer)
        except Refused as exc:
            code, message = exc.code, str(exc)
        except Exception:
            # A bug, not the caller's doing: logged here, and nothing of it told to the caller.
            log.exception("trustd: failed on a certificate request from %s", peer)
            code, message = grpc.StatusCode.INTERNAL, "trustd failed on this request; see its node's log"
        await context.abort(code, wire.status_message(message))
        raise AssertionError("unreachable: abort raises")

    def _sign(self, request: wire.Document | wire.BadRequest, peer: str) -> dict[str, str]:
        """The answer to ``request`` from ``peer``; raises :class:`Refused`."""
        if isinstance(request, wire.BadRequest):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"invalid certificate request: {request.reason}")
        try:
            fields = wire.validate(REQUEST, request)
        except errors.InvalidArgumentError as exc:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, exc.message) from exc
        token, csr = str(fields["token"]).encode(), str(fields["csr"]).encode()
        if not self._token or not hmac.compare_digest(token, self._token):
            log.warning("trustd: refused a certificate request with a wrong machine token from %s", peer)
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "refused the machine token (machine.token): it is not this cluster's",
            )
        try:
            grant = node_certificate(
                csr, peer=peer, endpoint_host=self._endpoint_host, own_names=self._own_names
            )
            crt = pki.sign_csr(
                ca=self._ca,
                csr=csr,
                usages=("server", "client"),
                lifetime=LIFETIME,
                common_name=grant.common_name,
                organizations=(grant.organization,),
                dns_names=grant.dns_names,
                ip_addresses=grant.ip_addresses,
            )
        except Refused as exc:
            log.warning("trustd: refused a certificate request from %s: %s", peer, exc)
            raise
        except pki.PKIError as exc:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"cannot sign the CSR: {exc}") from exc
        log.info(
            "trustd: signed a node certificate for %s (%s) from %s",
            grant.common_name,
            ", ".join((*grant.dns_names, *grant.ip_addresses)) or "no SANs",
            peer,
        )
        return {"crt": crt.decode(), "ca": self._ca.cert.decode()}


# --- the worker's side -------------------------------------------------------------------------


def target(host: str, port: int = PORT) -> str:
    """``host:port`` (``[host]:port`` for an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def endpoints(control_plane_endpoint: str, others: Sequence[str] = (), *, port: int = PORT) -> list[str]:
    """``host:port`` targets to try: the control plane endpoint's host first, then ``others``.

    ``port`` is the cluster's trustd port (``machine.ports.trustd``): the control plane nodes
    serve trustd on the port the worker's own config names.
    """
    host = urllib.parse.urlsplit(control_plane_endpoint).hostname or ""
    hosts = [host, *others] if host else list(others)
    return [target(h, port) for h in dict.fromkeys(hosts)]


def endpoint_addresses(document: object) -> list[str]:
    """The addresses of a Kubernetes Endpoints object (``default/kubernetes``: the API servers)."""
    subsets = document.get("subsets") if isinstance(document, Mapping) else None
    found = [
        str(address["ip"])
        for subset in subsets or []
        if isinstance(subset, dict)
        for address in subset.get("addresses") or []
        if isinstance(address, dict) and address.get("ip")
    ]
    return list(dict.fromkeys(found))


async def control_plane_addresses(kubeconfig: str, *, timeout: float) -> list[str]:
    """The control plane nodes' addresses: ``Endpoints default/kubernetes`` read with ``kubeconfig``.

    The one lookup of them: a worker asks with its bootstrap token (to find trustd), a joining
    control plane node with a cluster admin certificate (to find etcd). Raises
    :class:`~kubeplane.clients.errors.KubeError`.
    """
    async with kube.KubeClient(kubeconfig, timeout=timeout) as api:
        return endpoint_addresses(await api.get(ENDPOINTS_PATH))


def source_address(host: str) -> str | None:
    """The local IP address this machine reaches ``host`` from (what trustd there sees), or None.

    A UDP socket's ``connect`` only picks the route and source address; nothing is sent.
    """
    try:
        infos = socket.getaddrinfo(host, PORT, type=socket.SOCK_DGRAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)
            local = str(probe.getsockname()[0]).partition("%")[0]
    except (OSError, IndexError):
        return None
    return _normal(local)


async def request_certificate(
    *,
    targets: Sequence[str],
    token: str,
    csr: bytes | Callable[[str | None], bytes],
    ca: bytes,
    timeout: float = 5.0,
    discover: Callable[[], Awaitable[Sequence[str]]] | None = None,
    port: int = PORT,
) -> bytes:
    """The PEM certificate trustd signs; tries ``targets`` in order, then the discovered ones.

    ``csr`` is a PEM CSR, or a function of the local address a target is reached from (None when
    unknown) giving the CSR to send there. ``discover``, called only when every target failed,
    gives more hosts (control plane node addresses) to try on ``port``, or raises TrustdError. Raises
    :class:`TrustdError` naming every target and its failure; a ``PERMISSION_DENIED`` (wrong
    token, a refused request) is raised at once: every control plane node would refuse the same.
    """
    failures: list[str] = []
    tried: set[str] = set()

    async def attempt(batch: Sequence[str]) -> bytes | None:
        for where in batch:
            if where in tried:
                continue
            tried.add(where)
            crt = await _ask(where, token=token, csr=csr, ca=ca, timeout=timeout, failures=failures)
            if crt is not None:
                return crt
        return None

    crt = await attempt(targets)
    if crt is None and discover is not None:
        try:
            hosts = await discover()
        except TrustdError as exc:
            failures.append(f"discovering the control plane nodes: {exc}")
        else:
            if not hosts:
                failures.append("discovering the control plane nodes: none listed")
            crt = await attempt([target(host, port) for host in hosts])
    if crt is None:
        raise TrustdError("no trustd signed the node certificate: " + "; ".join(failures))
    return crt


async def _ask(
    where: str,
    *,
    token: str,
    csr: bytes | Callable[[str | None], bytes],
    ca: bytes,
    timeout: float,
    failures: list[str],
) -> bytes | None:
    if callable(csr):
        host = where.rpartition(":")[0].strip("[]")
        source = await asyncio.to_thread(source_address, host)
        pem = await asyncio.to_thread(csr, source)
    else:
        pem = csr
    channel = grpc.aio.secure_channel(where, grpc.ssl_channel_credentials(root_certificates=ca))
    try:
        call = channel.unary_unary(
            METHOD,
            request_serializer=schema.encode_certificate_request,
            response_deserializer=schema.decode_certificate_response,
        )
        response = await asyncio.wait_for(call({"token": token, "csr": pem.decode()}), timeout)
        log.info("trustd at %s signed the node API certificate", where)
        return str(response["crt"]).encode()
    except grpc.aio.AioRpcError as exc:
        if exc.code() is grpc.StatusCode.PERMISSION_DENIED:
            raise TrustdError(f"trustd at {where}: {exc.details()}") from exc
        failures.append(f"{where}: {exc.details() or exc.code().name}")
    except TimeoutError:
        failures.append(f"{where}: no answer within {timeout:g}s")
    finally:
        await channel.close()
    return None
