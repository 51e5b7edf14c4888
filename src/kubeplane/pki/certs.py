"""X.509 certificates: CAs, leaf certificates, CSRs, signing, inspection and renewal checks.

Everything is PEM bytes in and out so callers never handle ``cryptography`` objects; the
certificate/key pair travels as :class:`CertKey`. Certificates carry the extensions Kubernetes,
etcd and Go's TLS stack look at: BasicConstraints, KeyUsage, ExtendedKeyUsage, subject and
authority key identifiers, and subject alternative names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import warnings
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Literal, TypeVar, get_args

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kubeplane.pki import errors, keys

Usage = Literal["server", "client"]
USAGES: tuple[Usage, ...] = get_args(Usage)
_EKU_OIDS = {"server": ExtendedKeyUsageOID.SERVER_AUTH, "client": ExtendedKeyUsageOID.CLIENT_AUTH}
_EKU_NAMES = {oid: name for name, oid in _EKU_OIDS.items()}
_Ext = TypeVar("_Ext", bound=x509.ExtensionType)

CA_LIFETIME = timedelta(days=3650)
LEAF_LIFETIME = timedelta(days=365)
#: Certificates start slightly in the past so a peer whose clock lags the issuer still accepts them.
BACKDATE = timedelta(minutes=5)
#: The default renewal window is a third of the certificate's lifetime, capped at this.
MAX_RENEWAL_WINDOW = timedelta(days=30)
#: Common name of the Kubernetes front-proxy (aggregation layer) CA, as kubeadm names it.
AGGREGATOR_CA_CN = "front-proxy"


@dataclasses.dataclass(frozen=True)
class CertKey:
    """A PEM certificate and its PEM private key; ``key`` is ``b""`` when only the certificate is known."""

    cert: bytes
    key: bytes = b""

    @property
    def has_key(self) -> bool:
        """Whether the private key is present (a CA can sign only then)."""
        return bool(self.key)

    def cert_only(self) -> CertKey:
        """The same certificate without its private key (what worker nodes get for CAs)."""
        return CertKey(cert=self.cert)


@dataclasses.dataclass(frozen=True)
class CertInfo:
    """What :func:`cert_info` reads out of a certificate; times are timezone-aware UTC."""

    subject_cn: str
    organizations: tuple[str, ...]
    issuer_cn: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    not_before: datetime
    not_after: datetime
    is_ca: bool
    #: KeyUsage flags by their ``cryptography`` names (``digital_signature``, ``key_cert_sign``...).
    key_usages: tuple[str, ...]
    #: ``server``/``client`` for the TLS usages, dotted OIDs for anything else.
    extended_key_usages: tuple[str, ...]
    serial_number: int
    key_algorithm: str

    @property
    def lifetime(self) -> timedelta:
        """Total validity period."""
        return self.not_after - self.not_before


def load_certificate(cert_pem: bytes) -> x509.Certificate:
    """Parse the first certificate of a PEM bundle."""
    try:
        with warnings.catch_warnings():
            # kubeadm v1.20 gives its CAs serial number 0, which RFC 5280 disallows; cryptography
            # warns on every load of one, and a kubeadm cluster's CA is one kubeplane must read.
            warnings.filterwarnings("ignore", message="Parsed a serial number which wasn't positive")
            return x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise errors.InvalidPEMError(f"not a PEM certificate: {exc}") from exc


def new_ca(
    common_name: str,
    *,
    organization: str | None = None,
    algorithm: keys.KeyAlgorithm = "ecdsa-p256",
    lifetime: timedelta = CA_LIFETIME,
    now: datetime | None = None,
) -> CertKey:
    """Create a self-signed CA certificate and its key."""
    _require_name(common_name)
    key = keys.new_private_key(algorithm)
    subject = _name(common_name, (organization,) if organization else ())
    start = _now(now) - BACKDATE
    builder = _base_builder(
        subject=subject,
        issuer=subject,
        public_key=key.public_key(),
        not_before=start,
        not_after=start + BACKDATE + lifetime,
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True, rsa_key=False), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
    )
    cert = builder.sign(key, _hash_for(key))
    return CertKey(cert=cert.public_bytes(serialization.Encoding.PEM), key=keys.private_key_pem(key))


def aggregator_ca(*, now: datetime | None = None) -> CertKey:
    """The front-proxy CA kube-apiserver uses for the aggregation layer (CN ``front-proxy``, 10 years)."""
    return new_ca(AGGREGATOR_CA_CN, now=now)


def issue(
    *,
    ca: CertKey,
    common_name: str,
    organizations: Iterable[str] = (),
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    usages: Iterable[Usage] = ("server", "client"),
    lifetime: timedelta = LEAF_LIFETIME,
    algorithm: keys.KeyAlgorithm = "ecdsa-p256",
    key: bytes | None = None,
    now: datetime | None = None,
) -> CertKey:
    """Issue a leaf certificate signed by ``ca``; a new key is generated unless ``key`` is given."""
    _require_name(common_name)
    private = keys.load_private_key(key) if key else keys.new_private_key(algorithm)
    cert = _sign_leaf(
        ca=ca,
        subject=_name(common_name, tuple(organizations)),
        public_key=private.public_key(),
        san=_san(dns_names, ip_addresses),
        usages=usages,
        lifetime=lifetime,
        now=now,
    )
    return CertKey(cert=cert, key=key if key else keys.private_key_pem(private))


def new_csr(
    *,
    key: bytes,
    common_name: str,
    organizations: Iterable[str] = (),
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
) -> bytes:
    """Create a PEM certificate signing request for ``key``."""
    _require_name(common_name)
    private = keys.load_private_key(key)
    builder = x509.CertificateSigningRequestBuilder().subject_name(_name(common_name, tuple(organizations)))
    san = _san(dns_names, ip_addresses)
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return builder.sign(private, _hash_for(private)).public_bytes(serialization.Encoding.PEM)


def sign_csr(
    *,
    ca: CertKey,
    csr: bytes,
    usages: Iterable[Usage] = ("server", "client"),
    lifetime: timedelta = LEAF_LIFETIME,
    now: datetime | None = None,
    common_name: str | None = None,
    organizations: Iterable[str] = (),
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
) -> bytes:
    """Sign a CSR with ``ca``; returns the PEM certificate.

    Without ``common_name`` the certificate keeps the subject and SANs the CSR asks for. With it
    the signer decides: the subject is ``common_name``/``organizations``, the SANs are exactly
    ``dns_names``/``ip_addresses``, and only the CSR's public key is used.
    """
    try:
        request = x509.load_pem_x509_csr(csr)
    except ValueError as exc:
        raise errors.InvalidPEMError(f"not a PEM certificate signing request: {exc}") from exc
    if not request.is_signature_valid:
        raise errors.InvalidCSRError("the CSR's signature does not verify: regenerate it with its own key")
    try:
        san: x509.SubjectAlternativeName | None = request.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value
    except x509.ExtensionNotFound:
        san = None
    public_key = request.public_key()
    if not isinstance(public_key, keys.PublicKey):
        raise errors.UnsupportedAlgorithmError(
            f"CSR key type {type(public_key).__name__} is not supported: use ECDSA, RSA or Ed25519"
        )
    subject = request.subject
    if common_name is not None:
        _require_name(common_name)
        subject = _name(common_name, tuple(organizations))
        san = _san(dns_names, ip_addresses)
    return _sign_leaf(
        ca=ca,
        subject=subject,
        public_key=public_key,
        san=san,
        usages=usages,
        lifetime=lifetime,
        now=now,
    )


def ca_cert_hash(cert_pem: bytes) -> str:
    """``sha256:<hex>`` of the certificate's DER SubjectPublicKeyInfo, as kubeadm prints CA hashes."""
    spki = (
        load_certificate(cert_pem)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def cert_info(cert_pem: bytes) -> CertInfo:
    """Read the fields operators and renewal logic care about out of a PEM certificate."""
    cert = load_certificate(cert_pem)
    san = _extension(cert, x509.SubjectAlternativeName)
    basic = _extension(cert, x509.BasicConstraints)
    usage = _extension(cert, x509.KeyUsage)
    extended = _extension(cert, x509.ExtendedKeyUsage)
    public_key = cert.public_key()
    return CertInfo(
        subject_cn=_first(cert.subject, NameOID.COMMON_NAME),
        organizations=tuple(
            str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
        ),
        issuer_cn=_first(cert.issuer, NameOID.COMMON_NAME),
        dns_names=tuple(san.get_values_for_type(x509.DNSName)) if san else (),
        ip_addresses=tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress)) if san else (),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        is_ca=basic is not None and basic.ca,
        key_usages=tuple(name for name in _KEY_USAGE_FLAGS if usage and _flag(usage, name)),
        extended_key_usages=tuple(_EKU_NAMES.get(oid, oid.dotted_string) for oid in extended or ()),
        serial_number=cert.serial_number,
        key_algorithm=keys.key_algorithm(public_key) if isinstance(public_key, keys.PublicKey) else "unknown",
    )


def needs_renewal(cert_pem: bytes, *, now: datetime | None = None, before: timedelta | None = None) -> bool:
    """Whether a certificate expires within ``before`` of ``now`` (or has expired).

    ``before`` defaults to a third of the certificate's lifetime, at most :data:`MAX_RENEWAL_WINDOW`:
    a fixed 30 days would make a one-day admin certificate permanently "due".
    """
    info = cert_info(cert_pem)
    window = before if before is not None else min(MAX_RENEWAL_WINDOW, info.lifetime / 3)
    return _now(now) >= info.not_after - window


def is_issued_by(cert_pem: bytes, ca_cert_pem: bytes) -> bool:
    """Whether ``ca_cert_pem`` issued and signed ``cert_pem`` (signature check only, no validity dates)."""
    try:
        load_certificate(cert_pem).verify_directly_issued_by(load_certificate(ca_cert_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# --- helpers -----------------------------------------------------------------------------------

_KEY_USAGE_FLAGS = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
)


def _flag(usage: x509.KeyUsage, name: str) -> bool:
    return bool(getattr(usage, name))


def _extension(cert: x509.Certificate, ext_type: type[_Ext]) -> _Ext | None:
    try:
        return cert.extensions.get_extension_for_class(ext_type).value
    except x509.ExtensionNotFound:
        return None


def _now(now: datetime | None) -> datetime:
    return now if now is not None else datetime.now(UTC)


def _require_name(common_name: str) -> None:
    if not common_name.strip():
        raise errors.InvalidRequestError("common name is empty: give the certificate a subject name")


def _name(common_name: str, organizations: tuple[str, ...]) -> x509.Name:
    # Organization before CommonName is the order Go's pkix.Name produces; keeping it makes
    # subjects compare equal with certificates issued by Go tooling.
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _first(name: x509.Name, oid: x509.ObjectIdentifier) -> str:
    attributes = name.get_attributes_for_oid(oid)
    return str(attributes[0].value) if attributes else ""


def _san(dns_names: Iterable[str], ip_addresses: Iterable[str]) -> x509.SubjectAlternativeName | None:
    general: list[x509.GeneralName] = []
    for dns in dns_names:
        if not dns.strip():
            raise errors.InvalidRequestError("empty DNS name in subject alternative names")
        general.append(x509.DNSName(dns.strip()))
    for ip in ip_addresses:
        try:
            general.append(x509.IPAddress(ipaddress.ip_address(ip.strip())))
        except ValueError as exc:
            raise errors.InvalidRequestError(
                f"{ip!r} is not an IP address: give host names as DNS names instead"
            ) from exc
    return x509.SubjectAlternativeName(general) if general else None


def _key_usage(*, ca: bool, rsa_key: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        # RSA key exchange (TLS 1.2 without ECDHE) encrypts to the certificate key.
        key_encipherment=rsa_key and not ca,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _hash_for(key: keys.PrivateKey) -> hashes.SHA256 | None:
    # Ed25519 signs the whole message itself; passing a hash is an error.
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _base_builder(
    *,
    subject: x509.Name,
    issuer: x509.Name,
    public_key: keys.PublicKey,
    not_before: datetime,
    not_after: datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )


def _load_ca(ca: CertKey) -> tuple[x509.Certificate, keys.PrivateKey]:
    if not ca.has_key:
        raise errors.CAError("the CA has no private key: signing needs both the CA certificate and its key")
    cert = load_certificate(ca.cert)
    key = keys.load_private_key(ca.key)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(serialization.Encoding.DER, spki) != key.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ):
        raise errors.CAError(
            "the CA private key does not belong to the CA certificate: check which files you paired"
        )
    basic = _extension(cert, x509.BasicConstraints)
    if basic is None or not basic.ca:
        raise errors.CAError(
            f"certificate {_first(cert.subject, NameOID.COMMON_NAME)!r} is not a CA "
            "(BasicConstraints ca=false): sign with a CA certificate"
        )
    return cert, key


def _sign_leaf(
    *,
    ca: CertKey,
    subject: x509.Name,
    public_key: keys.PublicKey,
    san: x509.SubjectAlternativeName | None,
    usages: Iterable[Usage],
    lifetime: timedelta,
    now: datetime | None,
) -> bytes:
    ca_cert, ca_key = _load_ca(ca)
    wanted = tuple(dict.fromkeys(usages))
    unknown = [u for u in wanted if u not in _EKU_OIDS]
    if unknown or not wanted:
        raise errors.InvalidRequestError(
            f"certificate usages {list(wanted)!r} invalid: use one or more of {', '.join(USAGES)}"
        )
    start = _now(now) - BACKDATE
    # A leaf cannot usefully outlive its CA: verifiers reject the chain once the CA expires.
    not_after = min(start + BACKDATE + lifetime, ca_cert.not_valid_after_utc)
    ca_ski = _extension(ca_cert, x509.SubjectKeyIdentifier)
    aki = (
        x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
        if ca_ski is not None
        else x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    )
    builder = (
        _base_builder(
            subject=subject,
            issuer=ca_cert.subject,
            public_key=public_key,
            not_before=start,
            not_after=not_after,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False, rsa_key=isinstance(public_key, rsa.RSAPublicKey)), critical=True)
        .add_extension(x509.ExtendedKeyUsage([_EKU_OIDS[u] for u in wanted]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(aki, critical=False)
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return builder.sign(ca_key, _hash_for(ca_key)).public_bytes(serialization.Encoding.PEM)


def is_ip(value: str) -> bool:
    """Whether ``value`` is an IPv4 or IPv6 address (a SAN of the IP kind, not a DNS name)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def split_sans(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) of a mixed SAN list, de-duplicated in order; empty names dropped."""
    dns: list[str] = []
    ips: list[str] = []
    for name in dict.fromkeys(item.strip() for item in names):
        if name:
            (ips if is_ip(name) else dns).append(name)
    return dns, ips
