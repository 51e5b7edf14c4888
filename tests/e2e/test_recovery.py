"""The guide's "Recovering from Node Boot Failures" on a real cluster: a worker applied (default
mode, so it reboots) a config whose control plane endpoint points at nothing cannot get its node
API certificate; its API still answers through the endpoint, the default mode is refused with the
modes that work, and ``apply-config --immediate`` with the right endpoint lets it finish booting
and its kubelet join again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from e2e_clients import wait_until

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

#: An address of the cluster's network where nothing answers.
NOWHERE = "https://10.5.29.250:6443"


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
    cluster_recovery: E2ECluster, tmp_path: Path
) -> None:
    cluster, worker = cluster_recovery, cluster_recovery.workers[0]
    shown = cluster.cli("-n", worker, "get", "mc", "-o", "json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    document = json.loads(shown.stdout.splitlines()[0])["spec"]
    good, wrong = tmp_path / "good.yaml", tmp_path / "wrong.yaml"
    good.write_text(yaml.safe_dump(document))
    document["cluster"]["controlPlane"]["endpoint"] = NOWHERE
    wrong.write_text(yaml.safe_dump(document))

    applied = cluster.cli("-n", worker, "apply-config", "-f", str(wrong))
    assert "rebooting" in applied.stdout, applied.stdout + applied.stderr

    def stuck() -> bool:
        server = server_version(cluster, worker)
        return server is not None and NOWHERE in server.get("waiting", "")

    wait_until("the worker to say its boot waits for trustd", stuck, timeout=120)
    refused = cluster.cli("-n", worker, "apply-config", "-f", str(good))
    assert refused.returncode == 1
    assert "has not finished booting" in refused.stderr and "--immediate" in refused.stderr, refused.stderr

    fixed = cluster.cli("-n", worker, "apply-config", "--immediate", "-f", str(good))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "the unfinished boot retries with it now" in fixed.stdout

    def running() -> bool:
        server = server_version(cluster, worker)
        return server is not None and server["phase"] == "running"

    wait_until("the worker to finish booting", running, timeout=120)
    wait_until("the worker's Node to be Ready", lambda: node_ready(cluster, worker), timeout=300)
