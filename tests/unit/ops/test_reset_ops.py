"""The Kubernetes side of ``kubeplane reset`` on an in-memory API: which pods a drain evicts, that
it waits until they are gone (retrying a disruption budget's 429), and that re-running skips."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubeplane import retry
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.ops import reset

pytestmark = pytest.mark.unit


def pod(
    name: str, *, node: str = "w1", owner: str = "ReplicaSet", mirror: bool = False, phase: str = "Running"
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "ownerReferences": [{"kind": owner}]}
    if mirror:
        metadata["annotations"] = {kube.MIRROR_ANNOTATION: "x"}
    return {"metadata": metadata, "spec": {"nodeName": node}, "status": {"phase": phase}}


class FakeAPI:
    """Nodes and pods; an eviction removes the pod, unless a budget refuses it ``refusals`` times."""

    def __init__(self, pods: list[dict[str, Any]], *, refusals: int = 0) -> None:
        self.pods = pods
        self.nodes = {"w1": {"metadata": {"name": "w1"}, "spec": {}}}
        self.refusals = refusals
        self.evictions: list[str] = []

    async def get_or_none(self, path: str) -> dict[str, Any] | None:
        return self.nodes.get(path.rpartition("/")[2])

    async def patch(self, path: str, patch: Any, *, patch_type: str) -> dict[str, Any]:
        node = self.nodes[path.rpartition("/")[2]]
        node["spec"].update(patch["spec"])
        return node

    async def list(self, path: str, *, field_selector: str = "") -> list[dict[str, Any]]:
        node = field_selector.removeprefix("spec.nodeName=")
        return [p for p in self.pods if p["spec"]["nodeName"] == node]

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if self.refusals:
            self.refusals -= 1
            raise client_errors.KubeUnavailable(f"POST {path}: 429 Cannot evict pod", status=429)
        if not any(p["metadata"]["name"] == name for p in self.pods):
            raise client_errors.KubeNotFound(f"POST {path}: 404", status=404)
        self.evictions.append(name)
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
        return {}

    async def delete(self, path: str) -> dict[str, Any]:
        if self.nodes.pop(path.rpartition("/")[2], None) is None:
            raise client_errors.KubeNotFound(f"DELETE {path}: 404", status=404)
        return {}


def test_only_pods_that_would_not_come_back_on_their_own_are_evicted() -> None:
    assert reset.evictable(pod("app"))
    assert not reset.evictable(pod("kube-apiserver-w1", mirror=True))
    assert not reset.evictable(pod("kube-proxy-x", owner="DaemonSet"))
    assert not reset.evictable(pod("job-done", phase="Succeeded"))


def test_cordon_drain_and_delete_and_a_second_run_skips_each() -> None:
    api = FakeAPI([pod("app-1"), pod("app-2"), pod("proxy", owner="DaemonSet"), pod("other", node="w2")])

    async def scenario() -> None:
        assert await reset.cordon(api, "w1")  # type: ignore[arg-type]
        assert api.nodes["w1"]["spec"]["unschedulable"] is True
        assert await reset.drain(api, "w1", timeout=10) == ["default/app-1", "default/app-2"]  # type: ignore[arg-type]
        assert {p["metadata"]["name"] for p in api.pods} == {"proxy", "other"}
        assert not await reset.cordon(api, "w1")  # type: ignore[arg-type]
        assert await reset.drain(api, "w1", timeout=10) == []  # type: ignore[arg-type]
        assert await reset.delete_node(api, "w1")  # type: ignore[arg-type]
        assert not await reset.delete_node(api, "w1")  # type: ignore[arg-type]

    asyncio.run(scenario())


def test_a_disruption_budget_refusal_is_retried_until_the_pod_goes() -> None:
    api = FakeAPI([pod("app-1")], refusals=2)
    evicted = asyncio.run(reset.drain(api, "w1", timeout=30))  # type: ignore[arg-type]
    assert evicted == ["default/app-1"] and api.evictions == ["app-1"]


def test_a_pod_that_never_goes_times_out_naming_it() -> None:
    api = FakeAPI([pod("stuck")], refusals=1000)
    with pytest.raises(retry.WaitTimeout, match="default/stuck"):
        asyncio.run(reset.drain(api, "w1", timeout=1.5))  # type: ignore[arg-type]
