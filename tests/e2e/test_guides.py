"""The configuration guides of the original documentation, followed step by step on a local cluster.

"Configuring Containerd": the base containerd configuration merges in ``/var/cri/conf.d/*.toml``;
a ``machine.files`` entry creating ``metrics.toml`` with ``[metrics] address = "0.0.0.0:11234"``
makes containerd serve Prometheus metrics on port 11234. The shared cluster is left as it was:
the entry is removed again (the agent removes the file it created) and the cluster is healthy.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx
import pytest
from e2e_clients import wait_until

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

METRICS_PORT = 11234
#: The guide's machine config addition, as written there.
METRICS_FILE = {
    "content": f'[metrics]\n  address = "0.0.0.0:{METRICS_PORT}"\n',
    "path": "/var/cri/conf.d/metrics.toml",
    "op": "create",
}


def metrics_text(node: str) -> str | None:
    """containerd's metrics page on ``node`` (from the host, on the cluster's bridge), or None."""
    try:
        response = httpx.get(f"http://{node}:{METRICS_PORT}/v1/metrics", timeout=3.0)
    except httpx.TransportError:
        return None
    return response.text if response.status_code == httpx.codes.OK else None


def test_configuring_containerd_exposes_metrics(cluster_1cp1w: E2ECluster) -> None:
    node = cluster_1cp1w.workers[0]
    config = cluster_1cp1w.cli("-n", node, "get", "mc", "-o", "json")
    assert config.returncode == 0, config.stdout + config.stderr
    assert '"files"' not in config.stdout, "the test adds machine.files and removes them after"
    assert metrics_text(node) is None, f"something already answers on {node}:{METRICS_PORT}"

    # "Into each machine config, add the following" (applied the default way: the node's
    # services restart with the new config).
    patch = [{"op": "add", "path": "/machine/files", "value": [METRICS_FILE]}]
    try:
        result = cluster_1cp1w.cli("-n", node, "patch", "mc", "-p", json.dumps(patch))
        assert result.returncode == 0, result.stdout + result.stderr

        # "see that metrics are now present on this port": Prometheus text, with the metrics of
        # the node's containers (namespace k8s.io) once its pods run again.
        wait_until(f"containerd metrics on {node}:{METRICS_PORT}", lambda: metrics_text(node) is not None)
        text = metrics_text(node) or ""
        assert "# TYPE containerd_build_info_total counter" in text
        wait_until(
            "metrics of the node's containers",
            lambda: 'namespace="k8s.io"' in (metrics_text(node) or ""),
            timeout=240,
        )
        assert any(
            line.startswith("container_") and 'namespace="k8s.io"' in line
            for line in (metrics_text(node) or "").splitlines()
        )
    finally:
        undo = cluster_1cp1w.cli(
            "-n", node, "patch", "mc", "-p", json.dumps([{"op": "remove", "path": "/machine/files"}])
        )
        assert undo.returncode == 0, undo.stdout + undo.stderr
        # The agent removes the file it created: containerd comes back without the endpoint.
        wait_until(f"{node}:{METRICS_PORT} to stop answering", lambda: metrics_text(node) is None)
        health = cluster_1cp1w.cli("health", "--wait-timeout", "5m")
        assert health.returncode == 0, health.stdout + health.stderr
