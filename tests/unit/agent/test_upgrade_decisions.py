"""What :meth:`kubeplane.agent.node.Node.upgrade` decides before the agent restarts: keep the data
on control plane nodes and wipe it on workers by default, check that an etcd member may go down
(or leave, without --preserve), refuse without changing anything, and only record a staged build."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_upgrade_builds import package

from kubeplane import api
from kubeplane.agent import upgrade
from kubeplane.agent.etcd import EtcdRefused
from kubeplane.agent.node import Node

pytestmark = pytest.mark.unit

BUILD = "/var/lib/kubeplane/uploads/next"


class FakeEtcd:
    def __init__(self, refusal: str | None = None) -> None:
        self.refusal = refusal
        self.calls: list[str] = []

    async def outage_plan(self) -> None:
        self.calls.append("outage_plan")
        if self.refusal:
            raise EtcdRefused(self.refusal)

    async def leave_plan(self, *, force: bool) -> int:
        self.calls.append("leave_plan")
        if self.refusal:
            raise EtcdRefused(self.refusal)
        return 0xAB

    async def forfeit_leadership(self) -> str:
        self.calls.append("forfeit")
        return "not the leader"

    async def remove_self(self, member_id: int) -> None:
        self.calls.append(f"remove {member_id:x}")


def node_for(tmp_path: Path, *, control_plane: bool, etcd: FakeEtcd | None) -> tuple[Node, list[Any]]:
    node = Node(root=tmp_path / "node", listen="127.0.0.1:50000", services=False)
    node.maintenance = False
    document = SimpleNamespace(model=SimpleNamespace(machine=SimpleNamespace(is_control_plane=control_plane)))
    node.store.current = lambda: document  # type: ignore[assignment,method-assign,return-value]
    node.services = SimpleNamespace(etcd=etcd) if etcd is not None else None  # type: ignore[assignment]
    scheduled: list[Any] = []
    node._after_reply = scheduled.append  # type: ignore[method-assign]

    async def halt() -> None:
        node.services = None

    node._halt = halt  # type: ignore[method-assign]
    package(node.paths.agent_uploads / "next")
    return node, scheduled


def test_a_control_plane_node_keeps_its_data_once_etcd_may_lose_it_for_a_while(tmp_path: Path) -> None:
    etcd = FakeEtcd()
    node, scheduled = node_for(tmp_path, control_plane=True, etcd=etcd)
    node.paths.kubelet_root.mkdir(parents=True)
    (node.paths.kubelet_root / "pki").write_text("kept")
    said = asyncio.run(node.upgrade(path=BUILD, stage=False, preserve=None, force=False))
    assert said["preserve"] is True and said["version"] == "9.9.9" and not said["staged"]
    assert etcd.calls == ["outage_plan", "forfeit"]
    assert (node.paths.kubelet_root / "pki").read_text() == "kept"
    assert upgrade.active(node.paths) is not None
    assert len(scheduled) == 1  # the restart, after the reply


def test_a_refusal_from_etcd_changes_nothing(tmp_path: Path) -> None:
    etcd = FakeEtcd(refusal="while it is down 1 of the 3 etcd voters would be healthy")
    node, scheduled = node_for(tmp_path, control_plane=True, etcd=etcd)
    with pytest.raises(api.FailedPreconditionError, match=r"refusing to upgrade .* 1 of the 3 etcd voters"):
        asyncio.run(node.upgrade(path=BUILD, stage=False, preserve=None, force=False))
    assert upgrade.active(node.paths) is None
    assert not node.paths.agent_builds.exists()  # refused before the build was even installed
    assert scheduled == []
    # --force skips the check (a single control plane node).
    said = asyncio.run(node.upgrade(path=BUILD, stage=False, preserve=None, force=True))
    assert said["preserve"] is True and etcd.calls == ["outage_plan", "forfeit"]


def test_without_preserve_a_member_leaves_etcd_and_the_data_is_wiped_but_not_the_config(
    tmp_path: Path,
) -> None:
    etcd = FakeEtcd()
    node, _ = node_for(tmp_path, control_plane=True, etcd=etcd)
    for directory in (node.paths.kubelet_root, node.paths.etcd_data, node.paths.system):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "data").write_text("x")
    said = asyncio.run(node.upgrade(path=BUILD, stage=False, preserve=False, force=False))
    assert said["preserve"] is False
    assert etcd.calls == ["leave_plan", "forfeit", "remove ab"]
    assert not (node.paths.kubelet_root / "data").exists() and not (node.paths.etcd_data / "data").exists()
    assert (node.paths.system / "data").exists()
    assert upgrade.active(node.paths) is not None


def test_a_worker_is_wiped_by_default(tmp_path: Path) -> None:
    node, _ = node_for(tmp_path, control_plane=False, etcd=None)
    node.paths.kubelet_root.mkdir(parents=True)
    (node.paths.kubelet_root / "data").write_text("x")
    said = asyncio.run(node.upgrade(path=BUILD, stage=False, preserve=None, force=False))
    assert said["preserve"] is False and not (node.paths.kubelet_root / "data").exists()


def test_a_staged_build_is_only_recorded(tmp_path: Path) -> None:
    etcd = FakeEtcd(refusal="would lose quorum")
    node, scheduled = node_for(tmp_path, control_plane=True, etcd=etcd)
    said = asyncio.run(node.upgrade(path=BUILD, stage=True, preserve=None, force=False))
    assert said["staged"] is True and "next start" in said["message"]
    assert etcd.calls == [] and scheduled == []
    assert upgrade.active(node.paths) is not None


def test_a_path_outside_the_uploads_is_an_invalid_argument(tmp_path: Path) -> None:
    node, _ = node_for(tmp_path, control_plane=False, etcd=None)
    with pytest.raises(api.InvalidArgumentError, match="not under /var/lib/kubeplane/uploads"):
        asyncio.run(
            node.upgrade(path="/var/lib/kubeplane/uploads/..", stage=False, preserve=None, force=False)
        )
