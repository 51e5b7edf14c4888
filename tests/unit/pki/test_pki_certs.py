"""Certificates made by kubeplane.pki verify with openssl and carry the extensions TLS peers check."""

from __future__ import annotations

import base64
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kubeplane import pki

pytestmark = pytest.mark.unit


def openssl_verify(tmp_path: Path, ca: bytes, cert: bytes, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "ca.crt").write_bytes(ca)
    (tmp_path / "leaf.crt").write_bytes(cert)
    return subprocess.run(
        ["openssl", "verify", *extra, "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "leaf.crt")],
        capture_output=True,
        text=True,
        check=False,
    )


def openssl_text(cert: bytes) -> str:
    return subprocess.run(
        ["openssl", "x509", "-noout", "-text"], input=cert, capture_output=True, check=True
    ).stdout.decode()


@pytest.mark.parametrize("ca_algorithm", pki.KEY_ALGORITHMS)
@pytest.mark.parametrize("leaf_algorithm", ["ecdsa-p256", "rsa-2048", "ed25519"])
def test_leaf_verifies_against_ca(
    tmp_path: Path, ca_algorithm: pki.KeyAlgorithm, leaf_algorithm: pki.KeyAlgorithm
) -> None:
    ca = pki.new_ca("kubernetes", algorithm=ca_algorithm)
    leaf = pki.issue(
        ca=ca,
        common_name="kube-apiserver",
        dns_names=["kubernetes", "kubernetes.default.svc.cluster.local"],
        ip_addresses=["10.96.0.1", "127.0.0.1", "::1"],
        algorithm=leaf_algorithm,
    )
    result = openssl_verify(tmp_path, ca.cert, leaf.cert, "-purpose", "sslserver")
    assert result.returncode == 0, result.stderr
    assert openssl_verify(tmp_path, ca.cert, leaf.cert, "-purpose", "sslclient").returncode == 0
    assert pki.is_issued_by(leaf.cert, ca.cert)
    assert pki.load_private_key(leaf.key)  # the returned key is usable


def test_ca_extensions_and_fields() -> None:
    ca = pki.new_ca("machine", organization="talos-ish")
    info = pki.cert_info(ca.cert)
    assert info.is_ca
    assert info.subject_cn == info.issuer_cn == "machine"
    assert info.organizations == ("talos-ish",)
    assert set(info.key_usages) == {"digital_signature", "key_cert_sign", "crl_sign"}
    assert info.key_algorithm == "ecdsa-p256"
    assert timedelta(days=3650) <= info.lifetime <= timedelta(days=3650, minutes=10)
    text = openssl_text(ca.cert)
    assert "CA:TRUE" in text
    assert "X509v3 Subject Key Identifier" in text
    assert "X509v3 Authority Key Identifier" in text
    assert b"BEGIN EC PRIVATE KEY" in ca.key


def test_leaf_extensions_and_fields() -> None:
    ca = pki.new_ca("etcd")
    leaf = pki.issue(
        ca=ca,
        common_name="etcd-peer",
        organizations=["system:masters", "other"],
        dns_names=["node-1"],
        ip_addresses=["10.5.0.2"],
        usages=["client"],
        lifetime=timedelta(hours=24),
    )
    info = pki.cert_info(leaf.cert)
    assert not info.is_ca
    assert (info.subject_cn, info.issuer_cn) == ("etcd-peer", "etcd")
    assert info.organizations == ("system:masters", "other")
    assert info.dns_names == ("node-1",)
    assert info.ip_addresses == ("10.5.0.2",)
    assert info.extended_key_usages == ("client",)
    assert info.key_usages == ("digital_signature",)
    assert info.lifetime <= timedelta(hours=24, minutes=10)
    text = openssl_text(leaf.cert)
    assert "CA:FALSE" in text
    # The AKI of the leaf is the CA's SKI: that is how verifiers pick the issuer among several CAs.
    ca_ski = openssl_text(ca.cert).split("Subject Key Identifier:")[1].split()[0]
    assert ca_ski in text.split("Authority Key Identifier:")[1]


def test_rsa_leaf_has_key_encipherment() -> None:
    leaf = pki.issue(ca=pki.new_ca("ca", algorithm="rsa-2048"), common_name="x", algorithm="rsa-2048")
    assert pki.cert_info(leaf.cert).key_usages == ("digital_signature", "key_encipherment")


def test_issue_with_existing_key_keeps_it() -> None:
    key = pki.generate_key("ed25519")
    leaf = pki.issue(ca=pki.new_ca("ca"), common_name="admin", key=key)
    assert leaf.key == key
    assert pki.cert_info(leaf.cert).key_algorithm == "ed25519"


def test_csr_sign_flow(tmp_path: Path) -> None:
    ca = pki.new_ca("machine", algorithm="rsa-2048")
    key = pki.generate_key()
    csr = pki.new_csr(
        key=key, common_name="admin", organizations=[pki.ROLE_ADMIN], ip_addresses=["127.0.0.1"]
    )
    check = subprocess.run(
        ["openssl", "req", "-noout", "-verify"], input=csr, capture_output=True, check=False
    )
    assert check.returncode == 0, check.stderr
    cert = pki.sign_csr(ca=ca, csr=csr, usages=["client"], lifetime=timedelta(hours=24))
    assert openssl_verify(tmp_path, ca.cert, cert, "-purpose", "sslclient").returncode == 0
    info = pki.cert_info(cert)
    assert (info.subject_cn, info.organizations, info.ip_addresses) == (
        "admin",
        (pki.ROLE_ADMIN,),
        ("127.0.0.1",),
    )
    assert pki.public_key_pem(key) in _pubkey_of(cert)


def _pubkey_of(cert: bytes) -> bytes:
    return subprocess.run(
        ["openssl", "x509", "-noout", "-pubkey"], input=cert, capture_output=True, check=True
    ).stdout


def test_tampered_csr_is_rejected() -> None:
    csr = pki.new_csr(key=pki.generate_key("rsa-2048"), common_name="admin")
    # Replace the subject CN bytes inside the DER so the self-signature no longer matches.
    lines = csr.decode().splitlines()
    der = bytearray(base64.b64decode("".join(lines[1:-1])))
    at = der.find(b"admin")
    der[at] = ord("b")
    forged = (
        b"-----BEGIN CERTIFICATE REQUEST-----\n"
        + base64.encodebytes(bytes(der))
        + b"-----END CERTIFICATE REQUEST-----\n"
    )
    with pytest.raises(pki.InvalidCSRError):
        pki.sign_csr(ca=pki.new_ca("ca"), csr=forged)


def test_ca_errors() -> None:
    ca = pki.new_ca("ca")
    other = pki.new_ca("other")
    with pytest.raises(pki.CAError, match="no private key"):
        pki.issue(ca=ca.cert_only(), common_name="x")
    with pytest.raises(pki.CAError, match="does not belong"):
        pki.issue(ca=pki.CertKey(cert=ca.cert, key=other.key), common_name="x")
    leaf = pki.issue(ca=ca, common_name="leaf")
    with pytest.raises(pki.CAError, match="not a CA"):
        pki.issue(ca=leaf, common_name="x")


def test_request_errors() -> None:
    ca = pki.new_ca("ca")
    with pytest.raises(pki.InvalidRequestError, match="'node-1' is not an IP address"):
        pki.issue(ca=ca, common_name="x", ip_addresses=["node-1"])
    with pytest.raises(pki.InvalidRequestError, match="usages"):
        pki.issue(ca=ca, common_name="x", usages=["peer"])  # type: ignore[list-item]
    with pytest.raises(pki.InvalidRequestError, match="common name"):
        pki.new_ca(" ")
    with pytest.raises(pki.UnsupportedAlgorithmError, match="ecdsa-p256"):
        pki.generate_key("dsa")  # type: ignore[arg-type]
    with pytest.raises(pki.InvalidPEMError):
        pki.cert_info(b"not a cert")
    with pytest.raises(pki.InvalidPEMError):
        pki.load_private_key(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    assert all(issubclass(e, pki.PKIError) for e in (pki.CAError, pki.InvalidCSRError, pki.InvalidPEMError))


def test_leaf_never_outlives_ca() -> None:
    ca = pki.new_ca("short", lifetime=timedelta(days=1))
    leaf = pki.issue(ca=ca, common_name="x", lifetime=timedelta(days=365))
    assert pki.cert_info(leaf.cert).not_after == pki.cert_info(ca.cert).not_after


def test_aggregator_ca() -> None:
    info = pki.cert_info(pki.aggregator_ca().cert)
    assert info.subject_cn == "front-proxy"
    assert info.is_ca
    assert info.lifetime >= timedelta(days=3650)


def test_ca_cert_hash_matches_openssl_pipeline() -> None:
    for algorithm in ("ecdsa-p256", "rsa-2048"):
        ca = pki.new_ca("kubernetes", algorithm=algorithm)
        pipeline = subprocess.run(
            "openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -hex",
            shell=True,
            input=ca.cert,
            capture_output=True,
            check=True,
        ).stdout.decode()
        expected = pipeline.strip().split()[-1]
        assert pki.ca_cert_hash(ca.cert) == f"sha256:{expected}"


def test_needs_renewal() -> None:
    issued = datetime(2021, 3, 1, tzinfo=UTC)
    ca = pki.new_ca("ca", now=issued)
    cert = pki.issue(ca=ca, common_name="x", lifetime=timedelta(days=365), now=issued).cert
    assert not pki.needs_renewal(cert, now=issued + timedelta(days=300))
    # Default window: min(30 days, lifetime / 3) = 30 days before expiry.
    assert pki.needs_renewal(cert, now=issued + timedelta(days=340))
    assert pki.needs_renewal(cert, now=issued + timedelta(days=400))  # expired
    assert pki.needs_renewal(cert, now=issued + timedelta(days=300), before=timedelta(days=90))
    short = pki.issue(ca=ca, common_name="admin", lifetime=timedelta(hours=24), now=issued).cert
    assert not pki.needs_renewal(short, now=issued + timedelta(hours=12))
    assert pki.needs_renewal(short, now=issued + timedelta(hours=20))


def test_split_sans_keeps_order_drops_blanks_and_duplicates() -> None:
    names = ["node-1", " 10.5.0.2 ", "", "fd00::2", "node-1", "10.5.0.2", "localhost"]
    assert pki.split_sans(names) == (["node-1", "localhost"], ["10.5.0.2", "fd00::2"])
    assert [pki.is_ip(n) for n in ("10.5.0.2", "fd00::2", "10.5.0.256", "node-1", "")] == [
        True,
        True,
        False,
        False,
        False,
    ]
