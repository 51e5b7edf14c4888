"""KubeletCSRController's checks and its approve-and-sign, over ``httpx.MockTransport``: it signs
exactly what kube-controller-manager's node-client approver would for a bootstrap token, sets the
subject itself, and leaves everything else (and every conflict) alone."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
from datetime import timedelta
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from k8s_harness import cluster_admin, eventually, put, run, settle

from kubeplane import pki
from kubeplane.clients import kube
from kubeplane.controllers.k8s import kubelet_csr
from kubeplane.controllers.secrets import common
from kubeplane.resources import State, catalog

pytestmark = pytest.mark.unit

CA, KUBECONFIG = cluster_admin()
LOGGER = logging.getLogger("test-kubelet-csr")


def request_pem(
    *, cn: str = "system:node:w1", orgs: tuple[str, ...] = ("system:nodes",), sans: tuple[str, ...] = ()
) -> bytes:
    private = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in orgs]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attributes))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(s) for s in sans]), False)
    return builder.sign(private, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def csr(**changes: Any) -> dict[str, Any]:
    """A bootstrap CSR as a worker's kubelet makes it; ``changes`` replace spec or status fields."""
    spec: dict[str, Any] = {
        "signerName": kubelet_csr.SIGNER,
        "username": "system:bootstrap:abcdef",
        "groups": ["system:bootstrappers", "system:authenticated"],
        "usages": ["digital signature", "key encipherment", "client auth"],
        "request": base64.b64encode(request_pem()).decode(),
    }
    status: dict[str, Any] = {}
    for key, value in changes.items():
        (status if key in ("conditions", "certificate") else spec)[key] = value
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": "csr-abc", "resourceVersion": "7"},
        "spec": spec,
        "status": status,
    }


def test_a_bootstrap_request_is_accepted_with_its_node_name() -> None:
    checked = kubelet_csr.bootstrap_request(csr())
    assert isinstance(checked, kubelet_csr.BootstrapRequest)
    assert checked.node == "w1"
    # Without key encipherment too (a non-RSA key).
    assert isinstance(
        kubelet_csr.bootstrap_request(csr(usages=["digital signature", "client auth"])),
        kubelet_csr.BootstrapRequest,
    )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"signerName": "kubernetes.io/kube-apiserver-client"}, "signer"),
        ({"certificate": "Zm9v"}, "already signed"),
        ({"conditions": [{"type": "Denied", "status": "True"}]}, "denied"),
        (
            {"conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved"}]},
            "another approver",
        ),
        ({"username": "system:node:w1", "groups": ["system:nodes"]}, "not a bootstrap token"),
        ({"username": "mallory", "groups": ["system:bootstrappers"]}, "not a bootstrap token"),
        ({"groups": ["system:authenticated"]}, "not a bootstrap token"),
        ({"usages": ["digital signature", "key encipherment", "client auth", "server auth"]}, "usages"),
        ({"usages": ["client auth"]}, "usages"),
        ({"request": "not base64!"}, "not a PEM"),
        ({"request": base64.b64encode(b"-----BEGIN CERTIFICATE REQUEST-----\n").decode()}, "not a PEM"),
        ({"request": base64.b64encode(request_pem(orgs=("system:masters",))).decode()}, "subject"),
        ({"request": base64.b64encode(request_pem(orgs=("system:nodes", "x"))).decode()}, "subject"),
        ({"request": base64.b64encode(request_pem(orgs=())).decode()}, "subject"),
        ({"request": base64.b64encode(request_pem(cn="admin")).decode()}, "common name"),
        ({"request": base64.b64encode(request_pem(cn="system:node:")).decode()}, "common name"),
        ({"request": base64.b64encode(request_pem(cn="system:node:W1/../x")).decode()}, "common name"),
        ({"request": base64.b64encode(request_pem(sans=("kubernetes",))).decode()}, "alternative names"),
    ],
)
def test_anything_else_is_left_to_kube_controller_manager(changes: dict[str, Any], reason: str) -> None:
    checked = kubelet_csr.bootstrap_request(csr(**changes))
    assert isinstance(checked, str)
    assert reason in checked


def test_a_request_whose_signature_does_not_verify_is_left_alone() -> None:
    # Someone else's public key under a forged subject: the last byte of the signature changed.
    der = bytearray(x509.load_pem_x509_csr(request_pem()).public_bytes(serialization.Encoding.DER))
    der[-1] ^= 0xFF
    forged = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    checked = kubelet_csr.bootstrap_request(csr(request=base64.b64encode(forged).decode()))
    assert checked == "the request's signature does not verify"


def test_a_request_approved_here_but_not_signed_is_signed() -> None:
    approved = csr(conditions=[{"type": "Approved", "status": "True", "reason": kubelet_csr.REASON}])
    assert isinstance(kubelet_csr.bootstrap_request(approved), kubelet_csr.BootstrapRequest)


def _serve(
    answers: dict[str, int], *, allowed: bool = True
) -> tuple[list[tuple[str, str, dict[str, Any]]], httpx.MockTransport]:
    """A transport recording (method, path, body): the SubjectAccessReview answers ``allowed``;
    a PUT answers its body back with a new resourceVersion, or the status code ``answers``
    gives for its path."""
    calls: list[tuple[str, str, dict[str, Any]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        calls.append((request.method, request.url.path, copy.deepcopy(body)))
        if request.url.path == kubelet_csr.SUBJECT_ACCESS_REVIEWS:
            return httpx.Response(201, json={**body, "status": {"allowed": allowed}})
        code = answers.get(request.url.path, 200)
        if code != 200:
            return httpx.Response(code, json={"kind": "Status", "code": code, "message": "conflict"})
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
        return httpx.Response(200, json=body)

    return calls, httpx.MockTransport(handler)


def _handle(obj: dict[str, Any], transport: httpx.MockTransport) -> bool:
    async def scenario() -> bool:
        async with kube.KubeClient(KUBECONFIG, transport=transport) as api:
            return await kubelet_csr.handle(api, obj, CA, LOGGER)  # type: ignore[arg-type]

    return asyncio.run(scenario())


def test_approved_then_signed_with_the_subject_set_here() -> None:
    calls, transport = _serve({})
    assert _handle(csr(), transport)
    path = f"{kubelet_csr.CSR_PATH}/csr-abc"
    review, *writes = calls
    assert [(method, where) for method, where, _ in writes] == [
        ("PUT", f"{path}/approval"),
        ("PUT", f"{path}/status"),
    ]
    # The approver's own question, asked for the requester.
    assert review[:2] == ("POST", kubelet_csr.SUBJECT_ACCESS_REVIEWS)
    assert review[2]["spec"]["user"] == "system:bootstrap:abcdef"
    assert review[2]["spec"]["groups"] == ["system:bootstrappers", "system:authenticated"]
    assert review[2]["spec"]["resourceAttributes"] == {
        "group": "certificates.k8s.io",
        "resource": "certificatesigningrequests",
        "subresource": "nodeclient",
        "verb": "create",
    }
    calls = writes
    (condition,) = calls[0][2]["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Approved",
        "True",
        kubelet_csr.REASON,
    )
    status_body = calls[1][2]
    assert status_body["metadata"]["resourceVersion"] == "8", "the status update follows the approval"
    cert = base64.b64decode(status_body["status"]["certificate"])
    assert pki.is_issued_by(cert, CA.cert)
    info = pki.cert_info(cert)
    assert (info.subject_cn, info.organizations) == ("system:node:w1", ("system:nodes",))
    assert info.extended_key_usages == ("client",), "client authentication only"
    assert info.dns_names == () and info.ip_addresses == ()
    assert not info.is_ca
    assert timedelta(days=364) < info.lifetime <= timedelta(days=366)


def test_a_conflict_leaves_the_request_to_whoever_wrote_first() -> None:
    path = f"{kubelet_csr.CSR_PATH}/csr-abc"
    calls, transport = _serve({f"{path}/approval": 409})
    assert not _handle(csr(), transport)
    assert [where for _, where, _ in calls] == [kubelet_csr.SUBJECT_ACCESS_REVIEWS, f"{path}/approval"], (
        "no certificate after a lost approval"
    )


def test_a_request_the_signer_cannot_sign_is_left_without_stopping_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(ca: pki.CertKey, checked: kubelet_csr.BootstrapRequest) -> bytes:
        raise pki.PKIError("CSR key type DSAPublicKey is not supported")

    monkeypatch.setattr(kubelet_csr, "sign", refuse)
    calls, transport = _serve({})
    assert not _handle(csr(), transport)
    assert [method for method, _, _ in calls] == ["POST"], "nothing approved that is not signed here"


def test_a_requester_the_cluster_policy_does_not_allow_is_left_alone() -> None:
    # The operator deleted the binding that lets bootstrap tokens have node certificates approved.
    calls, transport = _serve({}, allowed=False)
    assert not _handle(csr(), transport)
    assert [where for _, where, _ in calls] == [kubelet_csr.SUBJECT_ACCESS_REVIEWS]


def test_a_request_it_does_not_handle_is_not_written() -> None:
    calls, transport = _serve({})
    assert not _handle(csr(usages=["client auth"]), transport)
    assert calls == []


class FakeCsrApi:
    """The CSR collection of a fake API server: a list with one pending request, then a watch
    that delivers a second one and ends; approvals and signatures are recorded."""

    def __init__(self) -> None:
        self.signed: dict[str, bytes] = {}
        self.watches = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == kubelet_csr.SUBJECT_ACCESS_REVIEWS:
            return httpx.Response(201, json={"status": {"allowed": True}})
        if path == kubelet_csr.CSR_PATH and request.url.params.get("watch"):
            self.watches += 1
            second = _named(csr(), "csr-second") if self.watches == 1 else None
            lines = [json.dumps({"type": "ADDED", "object": second})] if second else []
            return httpx.Response(200, content="\n".join(lines).encode())
        if path == kubelet_csr.CSR_PATH:
            return httpx.Response(
                200, json={"metadata": {"resourceVersion": "7"}, "items": [_named(csr(), "csr-first")]}
            )
        body = json.loads(request.content)
        if path.endswith("/status"):
            self.signed[body["metadata"]["name"]] = base64.b64decode(body["status"]["certificate"])
        return httpx.Response(200, json=body)


def _named(obj: dict[str, Any], name: str) -> dict[str, Any]:
    obj["metadata"]["name"] = name
    return obj


def test_the_controller_signs_listed_and_watched_requests_with_the_nodes_ca() -> None:
    api = FakeCsrApi()
    controller = kubelet_csr.KubeletCSRController(
        retry_interval=0.01,
        kube_client=lambda text: kube.KubeClient(text, transport=httpx.MockTransport(api.handle)),
    )

    async def body(state: State) -> None:
        await settle()
        assert api.watches == 0, "nothing is watched without the CA and the admin kubeconfig"
        put(
            state,
            catalog.SECRETS_NAMESPACE,
            catalog.ROOT_SECRETS,
            "k8s",
            catalog.RootSecretSpec(data={"ca": common.pair(CA)}),
        )
        certs = catalog.KubernetesSecretSpec(data={"localAdminKubeconfig": KUBECONFIG})
        put(state, catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, "k8s-certs", certs)
        await eventually(lambda: set(api.signed) == {"csr-first", "csr-second"}, what="both signed")
        assert all(pki.is_issued_by(cert, CA.cert) for cert in api.signed.values())

    run([controller], body)
