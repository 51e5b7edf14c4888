"""An upgrading node lets its kube-apiserver shut down gracefully before the halt kills its
containers: the kubelet stops first (it would restart the pod), only the kube-apiserver gets
SIGTERM, and the wait ends when its task stops or after the bound; nothing here can stop the
upgrade. The upgrade's reply says whether the node is a control plane node (the CLI waits for
its kube-apiserver then)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_upgrade_decisions import BUILD, FakeEtcd, node_for

from kubeplane.agent import node as node_module
from kubeplane.agent import services as node_services

pytestmark = pytest.mark.unit

LABEL = "io.kubernetes.container.name"


class FakeSupervisor:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def ids(self) -> list[str]:
        return [node_services.CONTAINERD, node_services.KUBELET, "etcd"]

    def snapshot(self, service_id: str) -> Any:
        return SimpleNamespace(running=True)

    async def stop(self, service_id: str) -> None:
        self.log.append(f"stop {service_id}")


class FakeContainerd:
    """``ctr`` over three containers; the kube-apiserver's task stops ``stops_after`` looks later."""

    def __init__(self, log: list[str], *, stops_after: int | None) -> None:
        self.log = log
        self.stops_after = stops_after
        self.labels = {"a1": "kube-apiserver", "s1": "kube-scheduler", "p1": "POD"}

    async def __call__(self, socket: Path, *args: str, **_: Any) -> str:
        if args[:2] == ("containers", "ls"):
            return "\n".join(self.labels) + "\n"
        if args[:2] == ("containers", "info"):
            return json.dumps({"ID": args[2], "Labels": {LABEL: self.labels[args[2]]}})
        if args[:2] == ("tasks", "kill"):
            self.log.append(" ".join(args))
            return ""
        assert args == ("tasks", "ls"), args
        state = "RUNNING"
        if self.stops_after is not None:
            state = "STOPPED" if self.stops_after <= 0 else "RUNNING"
            self.stops_after -= 1
        return f"TASK PID STATUS\na1 10 {state}\ns1 11 RUNNING\np1 12 RUNNING\n"


def apiserver_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, stops_after: int | None) -> Any:
    log: list[str] = []
    node, _ = node_for(tmp_path, control_plane=True, etcd=None)
    node.services = SimpleNamespace(supervisor=FakeSupervisor(log))  # type: ignore[assignment]
    monkeypatch.setattr(node_services, "ctr", FakeContainerd(log, stops_after=stops_after))
    return node, log


def test_the_kube_apiserver_gets_sigterm_after_the_kubelet_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, log = apiserver_node(tmp_path, monkeypatch, stops_after=2)
    asyncio.run(node._stop_apiserver())
    assert log == ["stop kubelet", "tasks kill -s SIGTERM a1"]


def test_the_wait_for_its_shutdown_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node, log = apiserver_node(tmp_path, monkeypatch, stops_after=None)
    monkeypatch.setattr(node_module, "APISERVER_STOP_TIMEOUT", 0.5)
    asyncio.run(asyncio.wait_for(node._stop_apiserver(), timeout=5))
    assert log == ["stop kubelet", "tasks kill -s SIGTERM a1"]


def test_a_failing_containerd_does_not_stop_the_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, log = apiserver_node(tmp_path, monkeypatch, stops_after=0)

    async def broken(socket: Path, *args: str, **_: Any) -> str:
        raise RuntimeError("ctr containers ls: connection refused")

    monkeypatch.setattr(node_services, "ctr", broken)
    asyncio.run(node._stop_apiserver())  # logs, does not raise
    assert log == ["stop kubelet"]


def test_the_reply_says_whether_the_node_is_a_control_plane_node(tmp_path: Path) -> None:
    for control_plane in (True, False):
        node, _ = node_for(tmp_path / str(control_plane), control_plane=control_plane, etcd=FakeEtcd())
        said = asyncio.run(node.upgrade(path=BUILD, stage=False, preserve=True, force=False))
        assert said["control_plane"] is control_plane
