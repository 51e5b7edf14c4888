"""What trustd signs: the pure policy (subject, SANs, peer address) and the node org's lack of a role."""

from __future__ import annotations

import base64
import ipaddress

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from kubeplane import api, pki
from kubeplane.api import trustd

pytestmark = pytest.mark.unit

KEY = pki.generate_key()
WORKER = "10.5.0.4"
PEER = f"ipv4:{WORKER}:41234"
ENDPOINT_HOST = "10.5.0.1"
#: The control plane node's own server certificate names (as the agent issues them).
OWN = ("cp-1", "localhost", "api.example.org", "127.0.0.1", "10.5.0.2")


def csr(
    common_name: str = "worker-1",
    organizations: tuple[str, ...] = (pki.NODE_ORG,),
    dns: tuple[str, ...] = ("worker-1", "localhost"),
    ips: tuple[str, ...] = (WORKER, "127.0.0.1"),
) -> bytes:
    return pki.new_csr(
        key=KEY, common_name=common_name, organizations=organizations, dns_names=dns, ip_addresses=ips
    )


def grant(request: bytes, *, peer: str = PEER, endpoint_host: str = ENDPOINT_HOST) -> trustd.NodeCertificate:
    return trustd.node_certificate(request, peer=peer, endpoint_host=endpoint_host, own_names=OWN)


def refused(request: bytes, *, peer: str = PEER, endpoint_host: str = ENDPOINT_HOST) -> trustd.Refused:
    with pytest.raises(trustd.Refused) as info:
        grant(request, peer=peer, endpoint_host=endpoint_host)
    return info.value


def test_a_node_csr_gets_its_name_and_the_address_it_comes_from() -> None:
    assert grant(csr()) == trustd.NodeCertificate(
        common_name="worker-1",
        dns_names=("worker-1", "localhost"),
        ip_addresses=(WORKER, "127.0.0.1"),
        organization="kubeplane:node",
    )


def test_a_csr_without_organization_still_gets_only_the_node_org() -> None:
    assert grant(csr(organizations=())).organization == pki.NODE_ORG


@pytest.mark.parametrize(
    "organizations",
    [
        (api.ROLE_ADMIN,),
        (api.ROLE_READER,),
        (api.ROLE_PROXY,),
        ("system:masters",),
        (pki.NODE_ORG, api.ROLE_ADMIN),
    ],
)
def test_any_other_organization_is_refused_and_named(organizations: tuple[str, ...]) -> None:
    refusal = refused(csr(organizations=organizations))
    assert refusal.code is grpc.StatusCode.PERMISSION_DENIED
    assert f"O={organizations[-1]}" in str(refusal)


@pytest.mark.parametrize("other", ["10.5.0.2", "10.5.0.9", "192.0.2.1", "fd00::4"])
def test_an_address_the_request_does_not_come_from_is_refused(other: str) -> None:
    refusal = refused(csr(ips=(WORKER, other)))
    assert refusal.code is grpc.StatusCode.FAILED_PRECONDITION
    message = str(refusal)
    assert other in message and f"comes from {WORKER}" in message
    assert "not through a load balancer" in message


def test_loopback_addresses_are_allowed() -> None:
    assert grant(csr(ips=("127.0.0.9", "::1"))).ip_addresses == ("127.0.0.9", "::1")


@pytest.mark.parametrize(
    ("peer", "what"),
    [(f"ipv4:{ENDPOINT_HOST}:5000", "control plane endpoint"), ("ipv4:10.5.0.2:5000", "control plane node")],
)
def test_a_request_from_the_endpoint_or_this_node_is_refused(peer: str, what: str) -> None:
    address = peer.split(":")[1]
    refusal = refused(csr(ips=(address,)), peer=peer)
    assert refusal.code is grpc.StatusCode.FAILED_PRECONDITION
    assert f"comes from {address}" in str(refusal) and what in str(refusal)


@pytest.mark.parametrize(
    ("name", "code", "reason"),
    [
        ("api.example.org", grpc.StatusCode.PERMISSION_DENIED, "names the control plane"),  # own SAN
        ("API.Example.org", grpc.StatusCode.PERMISSION_DENIED, "names the control plane"),
        ("cp-1", grpc.StatusCode.PERMISSION_DENIED, "names the control plane"),
        ("*.example.org", grpc.StatusCode.PERMISSION_DENIED, "wildcard"),
        ("foo.localhost", grpc.StatusCode.PERMISSION_DENIED, "localhost"),
        ("localhost.localdomain", grpc.StatusCode.PERMISSION_DENIED, "localhost"),
        ("bad_name", grpc.StatusCode.INVALID_ARGUMENT, "DNS-1123"),
        ("10.5.0.4", grpc.StatusCode.INVALID_ARGUMENT, "IP addresses go in IP SANs"),
        ("-worker", grpc.StatusCode.INVALID_ARGUMENT, "DNS-1123"),
    ],
)
def test_dns_names_that_are_not_the_node_s_own_are_refused(
    name: str, code: grpc.StatusCode, reason: str
) -> None:
    refusal = refused(csr(dns=("worker-1", name)))
    assert refusal.code is code
    assert repr(name) in str(refusal) and reason in str(refusal)


def test_the_endpoint_host_name_is_refused_as_dns_name() -> None:
    refusal = refused(csr(dns=("kube.example.org",)), endpoint_host="kube.example.org")
    assert refusal.code is grpc.StatusCode.PERMISSION_DENIED
    assert "'kube.example.org'" in str(refusal)
    # Another name under the same domain is the node's own business.
    assert grant(csr(dns=("w1.example.org",)), endpoint_host="kube.example.org").dns_names == (
        "w1.example.org",
    )


@pytest.mark.parametrize(
    ("common_name", "code"),
    [
        ("worker 1", grpc.StatusCode.INVALID_ARGUMENT),
        ("cp-1", grpc.StatusCode.PERMISSION_DENIED),
        ("10.5.0.2", grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
def test_the_common_name_is_checked_like_a_san(common_name: str, code: grpc.StatusCode) -> None:
    refusal = refused(csr(common_name=common_name))
    assert refusal.code is code
    assert common_name in str(refusal)


def test_a_node_named_by_its_address_keeps_it_as_common_name() -> None:
    assert grant(csr(common_name=WORKER, dns=("localhost",))).common_name == WORKER


def test_a_forged_or_malformed_csr_is_refused() -> None:
    der = bytearray(base64.b64decode("".join(csr().decode().splitlines()[1:-1])))
    der[der.find(b"worker-1")] = ord("v")
    forged = (
        b"-----BEGIN CERTIFICATE REQUEST-----\n"
        + base64.encodebytes(bytes(der))
        + b"-----END CERTIFICATE REQUEST-----\n"
    )
    refusal = refused(forged)
    assert refusal.code is grpc.StatusCode.INVALID_ARGUMENT and "signature" in str(refusal)
    assert refused(b"not a csr").code is grpc.StatusCode.INVALID_ARGUMENT


def test_other_san_types_are_refused() -> None:
    key = pki.load_private_key(KEY)
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "worker-1")]))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("worker-1"), x509.UniformResourceIdentifier("spiffe://cluster/admin")]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())  # type: ignore[arg-type]
        .public_bytes(serialization.Encoding.PEM)
    )
    refusal = refused(request)
    assert refusal.code is grpc.StatusCode.INVALID_ARGUMENT and "spiffe://cluster/admin" in str(refusal)


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.5.0.4:41234", "10.5.0.4"),
        ("ipv6:[fd00::4]:41234", "fd00::4"),
        ("ipv6:%5Bfd00::4%5D:41234", "fd00::4"),
        ("ipv6:[::ffff:10.5.0.4]:41234", "10.5.0.4"),
        ("ipv6:[fe80::1%eth0]:41234", "fe80::1"),
        ("unix:/run/trustd.sock", None),
        ("ipv4:nonsense:1", None),
    ],
)
def test_peer_address(peer: str, address: str | None) -> None:
    assert trustd.peer_address(peer) == address


def test_an_ipv6_peer_is_compared_in_canonical_form() -> None:
    request = csr(ips=("FD00:0::4",))
    assert grant(request, peer="ipv6:[fd00::4]:1").ip_addresses == (str(ipaddress.ip_address("fd00::4")),)


def test_the_signed_certificate_has_the_decided_subject_not_the_requested_one() -> None:
    ca = pki.new_ca("os")
    asked = csr(organizations=(api.ROLE_ADMIN,), dns=("cp-1",), ips=("10.5.0.2",))
    crt = pki.sign_csr(
        ca=ca,
        csr=asked,
        common_name="worker-1",
        organizations=(pki.NODE_ORG,),
        dns_names=("worker-1",),
        ip_addresses=(WORKER,),
    )
    info = pki.cert_info(crt)
    assert (info.subject_cn, info.organizations) == ("worker-1", (pki.NODE_ORG,))
    assert (info.dns_names, info.ip_addresses) == (("worker-1",), (WORKER,))
    assert info.extended_key_usages == ("server", "client")
    assert pki.is_issued_by(crt, ca.cert)
    public = x509.load_pem_x509_certificate(crt).public_key()
    spki = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert spki == pki.public_key_pem(KEY)


def test_endpoint_addresses_of_the_kubernetes_endpoints() -> None:
    document = {
        "subsets": [
            {"addresses": [{"ip": "10.5.0.2"}, {"ip": "10.5.0.3"}], "ports": [{"port": 6443}]},
            {"addresses": [{"ip": "10.5.0.2"}], "notReadyAddresses": [{"ip": "10.5.0.9"}]},
        ]
    }
    assert trustd.endpoint_addresses(document) == ["10.5.0.2", "10.5.0.3"]
    assert trustd.endpoint_addresses({}) == []
    assert trustd.endpoint_addresses([]) == []


def test_targets_start_with_the_endpoint_host() -> None:
    assert trustd.endpoints("https://10.5.0.1:6443", ["10.5.0.2", "10.5.0.1", "fd00::2"]) == [
        "10.5.0.1:50001",
        "10.5.0.2:50001",
        "[fd00::2]:50001",
    ]


def test_source_address_is_the_local_address_towards_a_host() -> None:
    assert trustd.source_address("127.0.0.1") == "127.0.0.1"
    assert trustd.source_address("no-such-host.invalid") is None
