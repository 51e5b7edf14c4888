"""The node's side of ``KubernetesCertificatesRenew``: who may be asked, and what the request says.

The secrets controller that answers the request is tested with the chain
(tests/unit/controllers/secrets); here the node alone: a node without Kubernetes certificates (a
worker, or one not booted) refuses with FAILED_PRECONDITION, and the request it records never
lies in the future nor moves back.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from kubeplane import api
from kubeplane.agent.node import Node
from kubeplane.resources import State, catalog, default_registry

pytestmark = pytest.mark.unit

ISSUED = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def node_with(tmp_path: Path, *, issued: datetime.datetime | None) -> Node:
    node = Node(root=tmp_path, listen="127.0.0.1:50000", services=False)
    node.state = State(default_registry())
    if issued is not None:
        node.state.create(
            catalog.SECRETS_NAMESPACE,
            catalog.KUBERNETES_SECRETS,
            "k8s-certs",
            spec=catalog.KubernetesSecretSpec(data={"issued": issued.isoformat()}),
        )
    return node


def request(node: Node) -> str:
    assert node.state is not None
    found = node.state.find(catalog.CONTROLPLANE_NAMESPACE, catalog.CERTIFICATE_RENEWALS, "k8s-certs")
    assert found is not None
    return str(found.spec.to_dict()["notBefore"])


def seconds(value: datetime.datetime) -> int:
    return int(value.timestamp())


def test_a_node_without_kubernetes_certificates_refuses(tmp_path: Path) -> None:
    for node in (
        Node(root=tmp_path, listen="127.0.0.1:50000", services=False),
        node_with(tmp_path, issued=None),
    ):
        with pytest.raises(api.FailedPreconditionError, match="holds no Kubernetes certificates to renew"):
            node.renew_kubernetes_certificates(not_before=None)


def test_the_request_is_recorded_once_and_never_moves_back_or_ahead_of_the_clock(tmp_path: Path) -> None:
    node = node_with(tmp_path, issued=ISSUED)
    later = ISSUED + datetime.timedelta(seconds=10)
    first = node.renew_kubernetes_certificates(not_before=seconds(later))
    assert first == {"notBefore": later.isoformat(), "issued": ISSUED.isoformat(), "renewing": True}
    # The same request again, and an older one, change nothing.
    assert node.renew_kubernetes_certificates(not_before=seconds(later)) == first
    assert node.renew_kubernetes_certificates(not_before=seconds(ISSUED)) == first
    assert request(node) == later.isoformat()
    # A caller whose clock runs ahead asks for no more than now on the node.
    before = datetime.datetime.now(datetime.UTC)
    ahead = node.renew_kubernetes_certificates(not_before=seconds(before + datetime.timedelta(days=1)))
    assert (
        before <= datetime.datetime.fromisoformat(ahead["notBefore"]) <= datetime.datetime.now(datetime.UTC)
    )


def test_certificates_issued_after_the_request_answer_it(tmp_path: Path) -> None:
    node = node_with(tmp_path, issued=ISSUED + datetime.timedelta(seconds=20))
    answer = node.renew_kubernetes_certificates(not_before=seconds(ISSUED + datetime.timedelta(seconds=10)))
    assert answer["renewing"] is False
