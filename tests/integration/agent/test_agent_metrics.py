"""The agent serves Prometheus metrics on its node address, and they move when the node works.

Scraped from the host over the test bridge, as a Prometheus server on the node's network would.
"""

from __future__ import annotations

import httpx
import pytest
from agent_harness import Agent, Cluster, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

METRICS_PORT = 50010
CLUSTER_PATCH = '[{"op": "add", "path": "/cluster/allowSchedulingOnMasters", "value": true}]'

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(agent: Agent) -> Samples:
    response = httpx.get(f"http://{agent.address}:{METRICS_PORT}/metrics", timeout=5, trust_env=False)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(value for (sample, series), value in samples.items() if sample == name and wanted <= series)


def test_metrics_answer_in_maintenance_mode_and_count_api_calls_and_reconciles(cluster: Cluster) -> None:
    agent = cluster.start_agent()
    before = scrape(agent)
    assert total(before, "process_resident_memory_bytes") > 0
    assert total(before, "kubeplane_controller_reconciles_total") == 0  # no config, no controllers yet

    cluster.kp(
        "-n", agent.address, "apply-config", "--insecure", "-f", str(cluster.gen.controlplane), config=None
    )
    cluster.wait_booted(agent)
    booted = wait_for(
        lambda: (
            (samples := scrape(agent))
            and total(samples, "kubeplane_controller_reconciles_total", result="ok") > 0
            and samples
        ),
        timeout=30,
        what="reconciles to be counted",
        logs=cluster.logs,
    )
    assert total(booted, "kubeplane_api_requests_total", code="OK") > 0
    controllers = {
        dict(series)["controller"]
        for (name, series) in booted
        if name == "kubeplane_controller_reconcile_duration_seconds_count"
    }
    assert "config.MachineTypeController" in controllers, controllers

    # A call that fails is counted under its code, not as OK.
    failed = cluster.kp("-e", agent.address, "get", "mt", "no-such-id", check=False)
    assert failed.returncode != 0
    # A change to the config runs controllers again.
    cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", CLUSTER_PATCH)
    after = wait_for(
        lambda: (
            (samples := scrape(agent))
            and total(samples, "kubeplane_controller_reconciles_total")
            > total(booted, "kubeplane_controller_reconciles_total")
            and samples
        ),
        timeout=30,
        what="reconciles after a config change",
        logs=cluster.logs,
    )
    assert total(after, "kubeplane_api_requests_total", code="NOT_FOUND") >= 1, "the failed get"
