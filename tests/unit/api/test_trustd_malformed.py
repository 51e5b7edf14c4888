"""trustd and malformed requests: what the fuzzing in tests/integration/test_fuzz_wire.py found,
each as a focused case. Every refusal is a clear status; nothing raises out of the handler (grpc
would answer UNKNOWN with the exception's text)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kubeplane import api, pki
from kubeplane.api import trustd, wire

pytestmark = pytest.mark.unit

KEY = ec.generate_private_key(ec.SECP256R1())
TOKEN = "right.token"
PEER = "ipv4:10.5.0.4:41234"
CA = pki.new_ca("unit os ca")


def _der(tag: int, content: bytes) -> bytes:
    size = len(content)
    raw = size.to_bytes((size.bit_length() + 7) // 8, "big")
    length = bytes([size]) if size < 0x80 else bytes([0x80 | len(raw)]) + raw
    return bytes([tag]) + length + content


def node_csr(*extensions: x509.ExtensionType) -> bytes:
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, "worker-1"),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, pki.NODE_ORG),
            ]
        )
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    return builder.sign(KEY, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def resigned(pem: bytes, old: bytes, new: bytes) -> bytes:
    """``pem`` with ``old`` replaced by ``new`` (of the same length) in what it signs, signed
    again: a CSR with a valid signature that no library would write."""
    assert len(old) == len(new)
    request = x509.load_pem_x509_csr(pem)
    der = request.public_bytes(serialization.Encoding.DER)
    tbs = request.tbs_certrequest_bytes
    assert tbs.count(old) == 1, old
    changed = tbs.replace(old, new)
    after = der.index(tbs) + len(tbs)
    algorithm = der[after : after + 2 + der[after + 1]]
    signature = KEY.sign(changed, ec.ECDSA(hashes.SHA256()))
    body = _der(0x30, changed + algorithm + _der(0x03, b"\x00" + signature))
    return x509.load_der_x509_csr(body).public_bytes(serialization.Encoding.PEM)


SAN = x509.SubjectAlternativeName(
    [x509.DNSName("worker-1"), x509.IPAddress(ipaddress.ip_address("10.5.0.4"))]
)


@pytest.mark.parametrize(
    ("old", "new", "extensions"),
    [
        # The common name as an INTEGER: cryptography raised KeyError reading the subject.
        (b"\x0c\x08worker-1", b"\x02\x08worker-1", ()),
        # A UTF8String that is not UTF-8: ValueError reading the subject.
        (b"\x0c\x08worker-1", b"\x0c\x08worker-\xff", ()),
        # A DNS name that is not ASCII: ValueError reading the SAN extension.
        (b"\x82\x08worker-1", b"\x82\x08worker-\xff", (SAN,)),
        # Two SAN extensions: DuplicateExtension reading the extensions.
        (
            b"\x06\x03\x55\x1d\x13",
            b"\x06\x03\x55\x1d\x11",
            (SAN, x509.BasicConstraints(ca=False, path_length=None)),
        ),
        # An IP address of five bytes: ValueError reading the SAN extension.
        (b"\x87\x04\x0a\x05\x00\x04", b"\x87\x04\x0a\x05\x00\x04", (SAN,)),
    ],
    ids=["cn-integer", "cn-not-utf8", "dns-not-ascii", "duplicate-san", "valid-control"],
)
def test_a_validly_signed_csr_with_a_part_that_cannot_be_read_is_invalid(
    old: bytes, new: bytes, extensions: tuple[x509.ExtensionType, ...]
) -> None:
    pem = resigned(node_csr(*extensions), old, new)
    if old == new:  # the control: the same CSR re-signed is granted
        grant = trustd.node_certificate(pem, peer=PEER, endpoint_host="10.5.0.1", own_names=())
        assert grant.common_name == "worker-1"
        return
    with pytest.raises(trustd.Refused) as refused:
        trustd.node_certificate(pem, peer=PEER, endpoint_host="10.5.0.1", own_names=())
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert str(refused.value).startswith("the CSR is malformed: ")


def server() -> trustd.TrustdServer:
    pair = pki.issue(ca=CA, common_name="cp-1", ip_addresses=["10.5.0.2"], usages=["server"])
    return trustd.TrustdServer(
        token=TOKEN,
        ca=CA,
        credentials=api.Credentials(ca=CA.cert, cert=pair.cert, key=pair.key),
        endpoint="https://10.5.0.1:6443",
    )


@pytest.mark.parametrize(
    ("data", "code", "message"),
    [
        # json.loads as the deserializer raised: UNKNOWN with "Unexpected <class ...>".
        (
            b"not json",
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid certificate request: request is not valid JSON",
        ),
        (b"\xff", grpc.StatusCode.INVALID_ARGUMENT, "request is not UTF-8 text"),
        (b"[" * 100_000, grpc.StatusCode.INVALID_ARGUMENT, "nested too deeply"),
        # Not an object, or a token that is not a string: was a wrong token, now says what is wrong.
        (b"[]", grpc.StatusCode.INVALID_ARGUMENT, "must be a JSON object, got an array"),
        (b'{"token": 5, "csr": "x"}', grpc.StatusCode.INVALID_ARGUMENT, "token: must be a str, got int"),
        (b'{"token": "right.token"}', grpc.StatusCode.INVALID_ARGUMENT, "csr: required"),
        (
            b'{"token": "right.token", "csr": "x", "x": 1}',
            grpc.StatusCode.INVALID_ARGUMENT,
            "x: unknown parameter",
        ),
        # A lone surrogate raised UnicodeEncodeError comparing the token: UNKNOWN.
        (
            b'{"token": "\\ud800", "csr": "x"}',
            grpc.StatusCode.INVALID_ARGUMENT,
            "token: must be valid Unicode",
        ),
        (
            b'{"token": "right.token", "csr": "\\ud800"}',
            grpc.StatusCode.INVALID_ARGUMENT,
            "csr: must be valid Unicode",
        ),
        (b'{"token": "wrong", "csr": "x"}', grpc.StatusCode.PERMISSION_DENIED, "refused the machine token"),
        (b'{"token": "right.token", "csr": "x"}', grpc.StatusCode.INVALID_ARGUMENT, "not a PEM certificate"),
    ],
)
def test_malformed_requests_are_refused_with_the_field_named(
    data: bytes, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(trustd.Refused) as refused:
        server()._sign(wire.decode_request(data), PEER)
    assert refused.value.code is code
    assert message in str(refused.value)


@dataclass
class Context:
    aborted: list[tuple[grpc.StatusCode, str]] = field(default_factory=list)

    def peer(self) -> str:
        return PEER

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.append((code, details))
        raise RuntimeError("aborted")


def answer(request: Any) -> tuple[grpc.StatusCode, str]:
    context = Context()
    with pytest.raises(RuntimeError, match="aborted"):
        asyncio.run(server()._certificate(request, context))  # type: ignore[arg-type]
    [aborted] = context.aborted
    return aborted


def test_an_unexpected_failure_is_internal_without_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**_: Any) -> bytes:
        raise RuntimeError("secret detail of the failure")

    monkeypatch.setattr(pki, "sign_csr", broken)
    csr = pki.new_csr(key=pki.generate_key(), common_name="worker-1", ip_addresses=["10.5.0.4"])
    code, details = answer({"token": TOKEN, "csr": csr.decode()})
    assert code is grpc.StatusCode.INTERNAL
    assert "secret detail" not in details and "log" in details


def test_a_refusal_repeating_a_long_name_is_cut_to_fit_the_status() -> None:
    csr = pki.new_csr(key=pki.generate_key(), common_name="worker-1", dns_names=["a" * 63 + ".b" * 3000])
    code, details = answer({"token": TOKEN, "csr": csr.decode()})
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert len(details.encode()) <= wire.MAX_STATUS_MESSAGE and "message cut" in details


def test_requests_are_limited_to_what_a_csr_needs() -> None:
    # trustd reads requests before it knows who sent them; a CSR with 500 names fits, and is signed.
    names = [f"n{i}" for i in range(500)]
    big = pki.new_csr(key=pki.generate_key(), common_name="worker-1", dns_names=names)
    request = {"token": TOKEN, "csr": big.decode()}
    assert len(big) > 4096 and len(json.dumps(request)) < trustd.MAX_REQUEST_BYTES
    crt = server()._sign(request, PEER)["crt"].encode()
    assert pki.cert_info(crt).dns_names == tuple(names)
