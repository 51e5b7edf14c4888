"""The guide's "Recovering from Node Boot Failures" on a real cluster: a worker applied (default
mode, so it reboots) a config whose control plane endpoint points at nothing cannot get its node
API certificate; its API still answers through the endpoint, the default mode is refused with the
modes that work, and ``apply-config --immediate`` with the right endpoint lets it finish booting
and its kubelet join again. Meanwhile ``health --explain`` names it (``boot-unfinished``, the
worker's trustd unreachable through the endpoint), from what the worker's own API reports.

Runs on the shared 1+1 cluster and leaves it healthy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from e2e_clients import wait_for_diagnosis, wait_until

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e


def nowhere(cluster: E2ECluster) -> str:
    """An endpoint on the cluster's network where nothing answers."""
    return f"https://{cluster.control_plane[0].rsplit('.', 1)[0]}.250:6443"


def server_version(cluster: E2ECluster, node: str) -> dict[str, Any] | None:
    result = cluster.cli("-n", node, "version", "-o", "json", timeout=60)
    if result.returncode != 0:
        return None
    server: dict[str, Any] = json.loads(result.stdout)["servers"][0]
    return server


def node_ready(cluster: E2ECluster, node: str) -> bool:
    result = cluster.kubectl("get", "nodes", "-o", "json")
    if result.returncode != 0:
        return False
    for item in json.loads(result.stdout)["items"]:
        addresses = {a["address"] for a in item["status"].get("addresses", [])}
        conditions = {c["type"]: c["status"] for c in item["status"].get("conditions", [])}
        if node in addresses:
            return conditions.get("Ready") == "True"
    return False


def test_a_worker_rebooted_with_a_wrong_endpoint_is_fixed_with_immediate(
    cluster_1cp1w: E2ECluster, tmp_path: Path
) -> None:
    cluster, worker = cluster_1cp1w, cluster_1cp1w.workers[0]
    wrong_endpoint = nowhere(cluster)
    shown = cluster.cli("-n", worker, "get", "mc", "-o", "json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    document = json.loads(shown.stdout.splitlines()[0])["spec"]
    good, wrong = tmp_path / "good.yaml", tmp_path / "wrong.yaml"
    good.write_text(yaml.safe_dump(document))
    document["cluster"]["controlPlane"]["endpoint"] = wrong_endpoint
    wrong.write_text(yaml.safe_dump(document))

    applied = cluster.cli("-n", worker, "apply-config", "-f", str(wrong))
    assert "rebooting" in applied.stdout, applied.stdout + applied.stderr

    def stuck() -> bool:
        server = server_version(cluster, worker)
        return server is not None and wrong_endpoint in server.get("waiting", "")

    fixed_already = False
    try:
        wait_until("the worker to say its boot waits for trustd", stuck, timeout=120)
        found = wait_for_diagnosis(cluster, "boot-unfinished", worker, quoting=wrong_endpoint, timeout=120)
        assert "trustd" in found["evidence"][0], found["evidence"]
        assert any("apply-config --immediate" in command for command in found["commands"]), found["commands"]
        refused = cluster.cli("-n", worker, "apply-config", "-f", str(good))
        assert refused.returncode == 1
        assert "has not finished booting" in refused.stderr and "--immediate" in refused.stderr, (
            refused.stderr
        )

        fixed = cluster.cli("-n", worker, "apply-config", "--immediate", "-f", str(good))
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "the unfinished boot retries with it now" in fixed.stdout
        fixed_already = True
    finally:
        if not fixed_already:  # leave the shared cluster as it was, whatever failed
            cluster.cli("-n", worker, "apply-config", "--immediate", "-f", str(good))

    def running() -> bool:
        server = server_version(cluster, worker)
        return server is not None and server["phase"] == "running"

    wait_until("the worker to finish booting", running, timeout=120)
    wait_until("the worker's Node to be Ready", lambda: node_ready(cluster, worker), timeout=300)
    health = cluster.cli("health", "--wait-timeout", "4m", timeout=400)
    assert health.returncode == 0, health.stdout + health.stderr
