"""``kubeplane reset`` through the CLI against fake nodes: the plan, the node's dry run first, the
flags as the node receives them, and the usage errors (the Kubernetes side is tests/unit/ops)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.unit


def test_dry_run_prints_the_plan_after_asking_the_node(three: Cluster) -> None:
    node = three.addresses[1]
    result = three.run("-n", node, "reset", "--dry-run")
    assert result.exit_code == 0, result.output
    everything = "state,etcd,kubelet,containerd"
    assert result.stdout.splitlines() == [
        "reset (graceful: true): 4 steps",
        f"   1. check reset on node {node}: stop the services, wipe {everything}, then stop the agent",
        f"   2. drain Kubernetes node on node {node}: host-{node} -> cordoned, pods evicted",
        f"   3. reset node on node {node}: services stopped, {everything} wiped, stop the agent",
        f"   4. delete Kubernetes node on node {node}: host-{node} -> deleted",
        "dry run: nothing was changed",
    ]
    assert three.nodes[1].calls == [
        "reset graceful=True reboot=False wipe=state,etcd,kubelet,containerd dry_run=True"
    ]


def test_not_graceful_resets_without_the_kubernetes_api(three: Cluster) -> None:
    node = three.addresses[1]
    result = three.run("-n", node, "reset", "--graceful=false", "--reboot", "--wipe", "kubelet,state")
    assert result.exit_code == 0, result.output
    # Labels come back in their fixed order, whatever order they were given in.
    assert three.nodes[1].calls == [
        "reset graceful=False reboot=True wipe=state,kubelet dry_run=True",
        "reset graceful=False reboot=True wipe=state,kubelet dry_run=False",
    ]
    assert f"node {node} reset: stop the services, wipe state,kubelet, then reboot" in result.output
    assert f"kubeplane -n {node} apply-config --insecure --file CONFIG" in result.output


def test_an_unknown_wipe_label_is_refused_before_any_call(three: Cluster) -> None:
    result = three.run("-n", three.addresses[0], "reset", "--wipe", "etcd,disk")
    assert result.exit_code == 2, result.output
    assert "unknown wipe label disk: choose from state, etcd, kubelet, containerd" in result.output
    assert all(not node.calls for node in three.nodes)


def test_reset_needs_exactly_one_node(three: Cluster) -> None:
    result = three.run("-n", ",".join(three.addresses[:2]), "reset")
    assert result.exit_code == 2, result.output
    assert "reset works on one node at a time" in result.output
