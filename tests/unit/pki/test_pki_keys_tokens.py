"""Keys, tokens and kubeconfig rendering of kubeplane.pki."""

from __future__ import annotations

import base64
import subprocess

import pytest
import yaml

from kubeplane import pki

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("algorithm", "header"),
    [
        ("ecdsa-p256", b"EC PRIVATE KEY"),
        ("rsa-2048", b"RSA PRIVATE KEY"),
        ("rsa-4096", b"RSA PRIVATE KEY"),
        ("ed25519", b"-----BEGIN PRIVATE KEY"),
    ],
)
def test_generate_key_formats(algorithm: pki.KeyAlgorithm, header: bytes) -> None:
    key = pki.generate_key(algorithm)
    assert header in key
    check = subprocess.run(
        ["openssl", "pkey", "-noout", "-check"], input=key, capture_output=True, check=False
    )
    assert check.returncode == 0, check.stderr


def test_service_account_key_public_half_matches_openssl() -> None:
    key = pki.service_account_key()
    # SEC1 on purpose: Kubernetes v1.20's --service-account-key-file parser does not read PKCS#8 EC keys.
    assert key.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    expected = subprocess.run(
        ["openssl", "pkey", "-pubout"], input=key, capture_output=True, check=True
    ).stdout
    assert pki.public_key_pem(key) == expected


def test_bootstrap_tokens() -> None:
    tokens = {pki.bootstrap_token() for _ in range(200)}
    assert len(tokens) == 200
    assert all(pki.BOOTSTRAP_TOKEN_RE.match(t) for t in tokens)


def test_random_secret_is_32_bytes_base64() -> None:
    assert len(base64.b64decode(pki.random_secret())) == 32
    assert pki.random_secret() != pki.random_secret()


def test_kubeconfig_renders_inline_credentials() -> None:
    ca = pki.new_ca("kubernetes")
    admin = pki.issue(ca=ca, common_name="admin", organizations=["system:masters"], usages=["client"])
    text = pki.kubeconfig(
        cluster_name="demo", server="https://10.5.0.1:6443", ca_cert=ca.cert, user="admin", client=admin
    )
    doc = yaml.safe_load(text)
    assert doc["kind"] == "Config"
    assert doc["current-context"] == "admin@demo"
    cluster = doc["clusters"][0]
    assert cluster["name"] == "demo"
    assert cluster["cluster"]["server"] == "https://10.5.0.1:6443"
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == ca.cert
    user = doc["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == admin.cert
    assert base64.b64decode(user["client-key-data"]) == admin.key
    assert doc["contexts"][0] == {"name": "admin@demo", "context": {"cluster": "demo", "user": "admin"}}
    named = yaml.safe_load(
        pki.kubeconfig(
            cluster_name="demo", server="https://x:6443", ca_cert=ca.cert, user="a", client=admin, context="c"
        )
    )
    assert named["current-context"] == "c"
