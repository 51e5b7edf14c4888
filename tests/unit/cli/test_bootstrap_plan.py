"""``bootstrap`` as a one-step plan: ``--dry-run`` prints it, a failure names the node and the re-run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.unit


def test_dry_run_prints_the_plan_and_calls_nothing(cluster: Cluster) -> None:
    node = cluster.addresses[0]
    result = cluster.run("-n", node, "bootstrap", "--self-hosted", "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "bootstrap: 1 steps",
        f"   1. bootstrap etcd on node {node}: a new etcd cluster, self-hosted control plane",
        "dry run: nothing was changed",
    ]


def test_a_refused_bootstrap_names_the_step_the_node_and_the_command_to_re_run(cluster: Cluster) -> None:
    # The fake nodes do not implement Bootstrap: the call fails like a refusal would.
    node = cluster.addresses[0]
    result = cluster.run("-n", node, "bootstrap", "--checkpointer-grace-period", "30")
    assert result.exit_code == 1, result.output
    assert (
        f"[1/1] bootstrap etcd on node {node}: a new etcd cluster, static pod control plane" in result.output
    )
    assert f"step 1/1 failed: bootstrap etcd on node {node}: " in result.output
    assert (
        f"re-run `kubeplane -n {node} bootstrap --checkpointer-grace-period 30` to continue" in result.output
    )
