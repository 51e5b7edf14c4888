"""Who is calling: TLS credentials, certificate roles and the rules of which role may make which call.

Roles travel in the client certificate's Organization (O). ``kubeplane:admin`` may make every
call; ``kubeplane:reader`` only calls whose table entry says ``access="read"``, and never on a
resource type the node flags as sensitive (see :mod:`kubeplane.resources.catalog` for which types
are, and why). ``kubeplane:proxy`` is the certificate a node uses to forward calls: it grants
nothing by itself, but a proxy peer states the original caller's role in
:data:`~kubeplane.api.wire.MD_ROLE`, and only a proxy peer is believed when it does (from anyone
else the header is ignored and their own certificate decides). A certificate with several known
organizations gets the most privileged one, except that ``kubeplane:proxy`` must stand alone: a
certificate mixing it with another role is refused, so what a call runs as never depends on
whether a header happened to be sent. A certificate with no known role is refused; that includes
the worker certificates trustd signs (O=:data:`NODE_ORG`), which identify a node's API server and
grant no API role.

Trust model of proxying. A proxy certificate is as powerful as an admin certificate: whoever holds
one can state ``kubeplane:admin`` and every node believes it. So it is only ever issued to control
plane nodes, by themselves, from the OS CA key in their machine config (worker configs carry no CA
key), and it must never be obtainable through trustd, which signs for anyone who knows the
machine token. What a proxy cannot do is raise a call above the role it states: the target serves
a forwarded call with exactly that role, checks resource sensitivity itself, and never forwards
it again. A forwarding node states the role its own caller was given, so a reader's call proxied
through any node is a reader's call on every target.

The maintenance server has no CA yet, so it presents a self-signed certificate made on the fly
and the insecure client trusts whatever certificate the server presents (the original's
``--insecure`` first apply): the channel is encrypted but not authenticated either way.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kubeplane import pki
from kubeplane.api import errors, wire

ROLE_ADMIN = pki.ROLE_ADMIN
ROLE_READER = pki.ROLE_READER
#: Organization of the certificate a node forwards proxied calls with.
ROLE_PROXY = "kubeplane:proxy"
#: Organization of the worker node certificates trustd signs; deliberately not a role (see Identity.roles).
NODE_ORG = pki.NODE_ORG
#: Pseudo-role of every caller of a maintenance-mode server (no client certificates there).
ROLE_MAINTENANCE = "maintenance"

Role = Literal["kubeplane:admin", "kubeplane:reader", "kubeplane:proxy", "maintenance"]
#: Roles a proxy may pass on, most privileged first.
CALLER_ROLES: tuple[str, ...] = (ROLE_ADMIN, ROLE_READER)
#: Organizations that are roles, most privileged first (a proxy is as powerful as an admin).
KNOWN_ROLES: tuple[str, ...] = (ROLE_ADMIN, ROLE_PROXY, ROLE_READER)

#: Name the maintenance certificate is issued for; the insecure client connects to it by this name.
MAINTENANCE_NAME = "kubeplane-maintenance"
MAINTENANCE_MESSAGE = "node is in maintenance mode: only apply-config --insecure is accepted"


@dataclass(frozen=True)
class Credentials:
    """PEM material of one side of a mutual TLS connection.

    ``ca`` verifies the peer (the OS CA), ``cert``/``key`` are this side's identity: a server
    certificate for :func:`~kubeplane.api.server.serve`, a client certificate for the client
    and for forwarding proxied calls.
    """

    ca: bytes
    cert: bytes
    key: bytes


@dataclass(frozen=True)
class Identity:
    """The authenticated peer: its certificate's common name and organizations."""

    common_name: str
    organizations: tuple[str, ...]

    @property
    def roles(self) -> tuple[str, ...]:
        """The known roles among the organizations, most privileged first."""
        return tuple(role for role in KNOWN_ROLES if role in self.organizations)


@dataclass(frozen=True)
class Caller:
    """What a call runs as: the role, and whether a proxy forwarded it (then it is served
    locally and never forwarded again)."""

    role: str
    forwarded: bool = False


@functools.lru_cache(maxsize=256)
def identity_from_pem(cert_pem: bytes) -> Identity:
    """Parse a peer certificate; cached because every call on a connection presents the same one."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    return Identity(
        common_name=str(names[0].value) if names else "",
        organizations=tuple(str(org.value) for org in orgs),
    )


def caller(identity: Identity, claimed: Sequence[str] = ()) -> Caller:
    """The role a call runs with; raises PermissionDeniedError with the reason when there is none.

    ``claimed`` are the :data:`~kubeplane.api.wire.MD_ROLE` metadata values of the call. They are
    only read from a proxy certificate, which must state exactly one caller role (never proxy
    itself, never an unknown one, never two different ones); see the module docstring.
    """
    roles = identity.roles
    if not roles:
        orgs = ", ".join(identity.organizations) or "none"
        node = (
            f" ({NODE_ORG} certificates identify a node and grant no role)"
            if NODE_ORG in identity.organizations
            else ""
        )
        raise errors.PermissionDeniedError(
            f"client certificate {identity.common_name!r} has no kubeplane role "
            f"(organizations: {orgs}){node}; use a certificate with O={ROLE_ADMIN} or O={ROLE_READER}"
        )
    if ROLE_PROXY not in roles:
        return Caller(roles[0])
    if len(roles) > 1:
        others = ", ".join(role for role in roles if role != ROLE_PROXY)
        raise errors.PermissionDeniedError(
            f"client certificate {identity.common_name!r} mixes O={ROLE_PROXY} with {others}: "
            f"a proxy certificate carries O={ROLE_PROXY} only"
        )
    stated = set(claimed)
    claim = next(iter(stated)) if len(stated) == 1 else None
    if claim not in CALLER_ROLES:
        got = ", ".join(repr(value) for value in sorted(stated)) or "None"
        raise errors.PermissionDeniedError(
            f"proxy {identity.common_name!r} forwarded a call without a valid caller role "
            f"(got {got}, expected one of {', '.join(CALLER_ROLES)})"
        )
    return Caller(claim, forwarded=True)


def check_access(call: wire.Call, role: str) -> None:
    """Raise PermissionDeniedError when ``role`` may not make ``call`` at all."""
    if role == ROLE_MAINTENANCE:
        if not call.maintenance:
            raise errors.PermissionDeniedError(f"{MAINTENANCE_MESSAGE} ({call.name} refused)")
        return
    if role == ROLE_ADMIN or call.access == "read":
        return
    raise errors.PermissionDeniedError(
        f"role {role} may not call {call.name}: it changes the node or reads secrets; "
        f"use a client certificate with O={ROLE_ADMIN}"
    )


def maintenance_certificate(*, now: datetime | None = None) -> pki.CertKey:
    """A self-signed server certificate for a maintenance-mode server (see the module docstring).

    pki only issues leaves under a CA; this one must be its own trust anchor so the insecure
    client can trust exactly the certificate it was shown.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, MAINTENANCE_NAME)])
    start = (now or datetime.now(UTC)) - timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(MAINTENANCE_NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return pki.CertKey(
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ),
    )
