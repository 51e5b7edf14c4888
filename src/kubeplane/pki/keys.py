"""Private keys: generation, parsing and public-key export, all as PEM bytes.

ECDSA and RSA keys are serialised in the traditional formats (SEC1 ``EC PRIVATE KEY``, PKCS#1
``RSA PRIVATE KEY``) rather than PKCS#8: Kubernetes v1.20 reads public keys for
``--service-account-key-file`` with a parser that understands SEC1 but not PKCS#8 EC keys, and
the original system wrote the same formats, so keys copied from its configs look familiar.
Ed25519 has no traditional format and is written as PKCS#8. Every loader accepts all formats.
"""

from __future__ import annotations

import base64
from typing import Literal, get_args

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa, x25519

from kubeplane.pki import errors

KeyAlgorithm = Literal["ecdsa-p256", "rsa-2048", "rsa-4096", "ed25519"]
KEY_ALGORITHMS: tuple[KeyAlgorithm, ...] = get_args(KeyAlgorithm)

#: Private key types the library signs with.
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey


def new_private_key(algorithm: KeyAlgorithm) -> PrivateKey:
    """Generate a key object (callers that only need PEM use :func:`generate_key`)."""
    if algorithm == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if algorithm == "rsa-2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if algorithm == "rsa-4096":
        return rsa.generate_private_key(public_exponent=65537, key_size=4096)
    if algorithm == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    raise errors.UnsupportedAlgorithmError(
        f"unsupported key algorithm {algorithm!r}: use one of {', '.join(KEY_ALGORITHMS)}"
    )


def private_key_pem(key: PrivateKey) -> bytes:
    """Serialise a private key, unencrypted, in the format described in the module docstring."""
    fmt = (
        serialization.PrivateFormat.PKCS8
        if isinstance(key, ed25519.Ed25519PrivateKey)
        else serialization.PrivateFormat.TraditionalOpenSSL
    )
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())


def generate_key(algorithm: KeyAlgorithm = "ecdsa-p256") -> bytes:
    """Generate a private key and return it as PEM."""
    return private_key_pem(new_private_key(algorithm))


def load_private_key(pem: bytes) -> PrivateKey:
    """Parse an unencrypted PEM private key of a supported type."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise errors.InvalidPEMError(
            f"not a PEM private key (unencrypted, PKCS#1/SEC1/PKCS#8): {exc}"
        ) from exc
    if isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey):
        return key
    raise errors.UnsupportedAlgorithmError(
        f"unsupported private key type {type(key).__name__}: use ECDSA, RSA or Ed25519"
    )


def public_key_pem(key: bytes) -> bytes:
    """Return the PEM ``PUBLIC KEY`` (SubjectPublicKeyInfo) of a PEM private key."""
    return (
        load_private_key(key)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def service_account_key() -> bytes:
    """Generate the key kube-apiserver signs service account tokens with (ECDSA P-256, SEC1 PEM)."""
    return generate_key("ecdsa-p256")


def key_algorithm(key: PrivateKey | PublicKey) -> str:
    """Describe a key the way :data:`KeyAlgorithm` names it (``ecdsa-p384`` etc. for other curves)."""
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        return {"secp256r1": "ecdsa-p256", "secp384r1": "ecdsa-p384", "secp521r1": "ecdsa-p521"}.get(
            key.curve.name, f"ecdsa-{key.curve.name}"
        )
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return f"rsa-{key.key_size}"
    return "ed25519"


def wireguard_private_key() -> str:
    """A new WireGuard private key: a Curve25519 (X25519) key, base64 as ``wg genkey`` prints it."""
    raw = x25519.X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return base64.b64encode(raw).decode()


def wireguard_public_key(private_key: str) -> str:
    """The public key of a base64 WireGuard private key, base64 as ``wg pubkey`` prints it."""
    key = x25519.X25519PrivateKey.from_private_bytes(base64.b64decode(private_key))
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()
