"""One checkpointer round end to end, with the API server and the kubelet faked: its DaemonSet
deleted, the checkpointer removes every checkpoint at once; while the API cannot say, it waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubeplane.checkpointer import SourceUnavailable, logic, sources
from kubeplane.checkpointer.main import Checkpointer
from kubeplane.checkpointer.store import CheckpointStore

pytestmark = pytest.mark.unit

NODE = "cp1"
SELF = "kube-system/pod-checkpointer-xyz"


def parent() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "pod-checkpointer-xyz",
            "namespace": "kube-system",
            "annotations": {logic.ANNOTATION_CHECKPOINT: "true"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "pod-checkpointer", "uid": "ds-1"}
            ],
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "img"}]},
        "status": {"phase": "Running"},
    }


class FakeApi:
    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = [parent()]
        self.daemonset: bool | Exception = True
        self.asked: list[tuple[str, str]] = []

    def pods_on_node(self, node: str) -> tuple[dict[str, Any], ...]:
        assert node == NODE
        return tuple(self.pods)

    def daemonset_exists(self, namespace: str, name: str) -> bool:
        self.asked.append((namespace, name))
        if isinstance(self.daemonset, Exception):
            raise self.daemonset
        return self.daemonset

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return None


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Checkpointer, FakeApi, CheckpointStore]:
    monkeypatch.setattr(sources, "fetch_kubelet_pods", lambda url: (parent(),))
    store = CheckpointStore(manifest_dir=tmp_path / "manifests", state_dir=tmp_path / "state")
    api = FakeApi()
    clock = iter(float(n) for n in range(100))
    checkpointer = Checkpointer(
        node=NODE,
        api=api,  # type: ignore[arg-type]
        store=store,
        grace_period=300,
        self_id=SELF,
        clock=lambda: next(clock),
    )
    return checkpointer, api, store


def test_its_daemonset_deleted_it_removes_its_checkpoint_at_once(
    setup: tuple[Checkpointer, FakeApi, CheckpointStore],
) -> None:
    checkpointer, api, store = setup
    checkpointer.round()
    assert store.stored() == {SELF} and store.active() == {SELF}
    assert api.asked == [], "nothing to ask while the parent is listed"
    api.pods = []
    api.daemonset = False
    plan = checkpointer.round()
    assert api.asked == [("kube-system", "pod-checkpointer")]
    assert plan.disabled and plan.remove == (SELF,)
    assert store.stored() == set() and store.active() == set()


def test_its_daemonset_still_there_or_unknown_it_waits_for_the_grace_period(
    setup: tuple[Checkpointer, FakeApi, CheckpointStore],
) -> None:
    checkpointer, api, store = setup
    checkpointer.round()
    api.pods = []
    plan = checkpointer.round()  # the DaemonSet exists: a new pod of it is coming
    assert not plan.disabled and SELF in plan.waiting
    api.daemonset = SourceUnavailable("https://localhost:6443: timed out")
    plan = checkpointer.round()
    assert not plan.disabled and SELF in plan.waiting
    assert store.stored() == {SELF}
