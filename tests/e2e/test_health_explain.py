"""e2e: ``kubeplane health --explain`` on the shared 1+1 cluster.

1. On the healthy cluster: no diagnosis at all (no false alarm), every check listed as passed,
   and the text form says ``healthy`` with the checks it ran.
2. One injected failure, cheap and fully reversible: the worker's kubelet service stopped through
   the node API (its pods keep running, and its Node stays Ready for the 40 s grace period, so
   the health checks still pass: only the evidence tells). The diagnosis must name kubelet and
   the worker; ``finally`` starts kubelet again and waits until ``health`` passes.

The other branches of the guide are unit-tested on hand-built evidence (tests/unit/ops); making
each failure for real (a crash-looping kube-apiserver, an endpoint of another cluster, ...) costs
a cluster change and a recovery each, beyond this suite's time budget.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from e2e_clients import wait_until

from kubeplane.ops import health

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e


def explain(cluster: E2ECluster) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    result = cluster.cli("health", "--explain", "-o", "json", timeout=120)
    elapsed = time.monotonic() - started
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout), elapsed


def test_healthy_cluster_gets_no_diagnosis(cluster_1cp1w: E2ECluster) -> None:
    passed = cluster_1cp1w.cli("health", "--wait-timeout", "3m")
    assert passed.returncode == 0, passed.stdout + passed.stderr

    code, document, elapsed = explain(cluster_1cp1w)
    print(f"health --explain on the healthy cluster: {elapsed:.1f}s")
    assert document["diagnoses"] == [], json.dumps(document["diagnoses"], indent=2)
    assert document["healthy"] is True
    assert [check["name"] for check in document["checks"]] == list(health.CHECK_NAMES)
    assert all(check["ok"] for check in document["checks"]), document["checks"]
    assert code == 0
    # It reads what is visible once; nothing waits for a timeout.
    assert elapsed < 30, f"health --explain took {elapsed:.1f}s on a healthy cluster"

    text = cluster_1cp1w.cli("health", "--explain", timeout=120)
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"healthy: {len(health.CHECK_NAMES)} checks passed, nothing to diagnose" in text.stdout
    for name in health.CHECK_NAMES:
        assert f"  checked: {name}" in text.stdout


def test_stopped_kubelet_is_diagnosed_on_its_node(cluster_1cp1w: E2ECluster) -> None:
    worker = cluster_1cp1w.workers[0]
    stopped = cluster_1cp1w.cli("-n", worker, "service", "kubelet", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    try:
        code, document, elapsed = explain(cluster_1cp1w)
        print(f"health --explain with kubelet stopped: {elapsed:.1f}s")
        print(json.dumps(document["diagnoses"], indent=2))
        assert code == 1
        assert document["healthy"] is False
        found = [d for d in document["diagnoses"] if d["id"] == "kubelet-not-running"]
        assert [d["node"] for d in found] == [worker], json.dumps(document["diagnoses"], indent=2)
        assert "was stopped" in found[0]["cause"]
        assert any("service kubelet: state" in line for line in found[0]["evidence"])
        assert f"kubeplane -n {worker} logs kubelet" in found[0]["commands"]
    finally:
        started = cluster_1cp1w.cli("-n", worker, "service", "kubelet", "start")
        assert started.returncode == 0, started.stdout + started.stderr
        wait_until("kubelet to be healthy again", lambda: _kubelet_up(cluster_1cp1w, worker), timeout=120)
        passed = cluster_1cp1w.cli("health", "--wait-timeout", "2m")
        assert passed.returncode == 0, passed.stdout + passed.stderr


def _kubelet_up(cluster: E2ECluster, node: str) -> bool:
    result = cluster.cli("-n", node, "service", "kubelet", "-o", "json")
    if result.returncode != 0:
        return False
    document = json.loads(result.stdout.splitlines()[0])
    return bool(document.get("running") and document["health"]["healthy"])
