"""e2e: etcd membership on the shared 3+1 cluster, through the CLI as an operator runs it.

Leadership moves on request; a member whose data directory was wiped comes back under a new
member ID (removed and re-added as a learner, then promoted), never under its old one with an
empty log; ``etcd leave`` is refused while it would cost the cluster its quorum, and a node that
left rejoins when its etcd starts again. Every test leaves three healthy voting members behind
(test_upgrade.py runs on the same cluster next).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from e2e_clients import wait_until

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e


def members(cluster: E2ECluster, node: str) -> list[dict[str, Any]]:
    result = cluster.cli("-n", node, "etcd", "members", "-o", "json")
    if result.returncode != 0:
        return []
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def voting(cluster: E2ECluster, node: str) -> dict[str, str]:
    """Member name -> ID of the voting (promoted) members, as ``node`` sees them."""
    return {m["name"]: m["id"] for m in members(cluster, node) if not m["learner"]}


def etcd_running(cluster: E2ECluster, node: str) -> bool:
    result = cluster.cli("-n", node, "service", "-o", "json")
    documents = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return any(d["id"] == "etcd" and d["running"] and d["health"]["healthy"] for d in documents)


def service(cluster: E2ECluster, node: str, action: str) -> None:
    result = cluster.cli("-n", node, "service", "etcd", action)
    assert result.returncode == 0, result.stdout + result.stderr


def three_healthy(cluster: E2ECluster) -> bool:
    first = cluster.control_plane[0]
    return len(voting(cluster, first)) == 3 and all(etcd_running(cluster, n) for n in cluster.control_plane)


def test_forfeit_leadership_moves_the_leader(cluster_3cp1w: E2ECluster) -> None:
    cluster = cluster_3cp1w
    ip_of = {node.name: node.ip for node in cluster.state().nodes}
    leader = next(m["name"] for m in members(cluster, cluster.control_plane[0]) if m["leader"])
    result = cluster.cli("-n", ip_of[leader], "etcd", "forfeit-leadership")
    assert result.returncode == 0, result.stdout + result.stderr

    def moved() -> bool:
        now = [m["name"] for m in members(cluster, cluster.control_plane[0]) if m["leader"]]
        return bool(now) and now[0] != leader

    wait_until(f"etcd leadership to move away from {leader}", moved, timeout=60)


def test_a_member_whose_data_was_wiped_rejoins_under_a_new_id(cluster_3cp1w: E2ECluster) -> None:
    cluster = cluster_3cp1w
    node = cluster.state().nodes[2]
    assert node.role == "controlplane"
    old = voting(cluster, cluster.control_plane[0])
    assert node.name in old, old
    service(cluster, node.ip, "stop")
    wait_until(f"etcd on {node.name} to stop", lambda: not etcd_running(cluster, node.ip), timeout=60)
    # What an operator (or a failed disk) does on the machine: the node's /var/lib/etcd emptied.
    data = Path(node.root_dir) / "var/lib/etcd"
    for entry in data.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    service(cluster, node.ip, "start")

    def rejoined() -> bool:
        now = voting(cluster, cluster.control_plane[0])
        return len(now) == 3 and node.name in now and now[node.name] != old[node.name]

    wait_until(f"{node.name} to rejoin etcd as a new voting member", rejoined)
    wait_until("three healthy etcd members", lambda: three_healthy(cluster))
    health = cluster.cli("health", "--wait-timeout", "2m")
    assert health.returncode == 0, health.stdout + health.stderr


def test_leave_is_refused_without_quorum_and_the_node_rejoins(cluster_3cp1w: E2ECluster) -> None:
    cluster = cluster_3cp1w
    nodes = cluster.state().nodes
    leaving, stopped = nodes[2], nodes[1]
    service(cluster, stopped.ip, "stop")
    try:
        wait_until(
            f"etcd on {stopped.name} to stop", lambda: not etcd_running(cluster, stopped.ip), timeout=60
        )
        refused = cluster.cli("-n", leaving.ip, "etcd", "leave")
        assert refused.returncode != 0
        assert "refusing to leave etcd" in refused.stdout + refused.stderr
        assert len(members(cluster, cluster.control_plane[0])) == 3
    finally:
        service(cluster, stopped.ip, "start")
    wait_until("three healthy etcd members", lambda: three_healthy(cluster))

    left = cluster.cli("-n", leaving.ip, "etcd", "leave")
    assert left.returncode == 0, left.stdout + left.stderr
    remaining = voting(cluster, cluster.control_plane[0])
    assert set(remaining) == {nodes[0].name, nodes[1].name}, remaining
    # The load balancer takes the node out within its /readyz checks (fall 2, 1 s apart); a
    # request that reached that node's API server just before waits on its lost etcd, so each
    # try is bounded and the API must answer again within seconds.
    wait_until(
        "the API to answer through the endpoint",
        lambda: cluster.kubectl("get", "nodes", "--request-timeout=5s").returncode == 0,
        timeout=30,
    )

    service(cluster, leaving.ip, "start")
    wait_until(f"{leaving.name} to rejoin etcd", lambda: leaving.name in voting(cluster, nodes[0].ip))
    wait_until("three healthy etcd members", lambda: three_healthy(cluster))
