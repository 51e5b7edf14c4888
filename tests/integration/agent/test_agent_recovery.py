"""Recovering a worker whose config points at a wrong control plane endpoint (README "Recovering a
node that cannot boot"): its boot waits for the node API certificate trustd would sign, and all
the while its API answers, so the config can be fixed as a user would.

The workers get their certificate from trustd on a real control plane agent; the wrong endpoint is
``127.0.0.1``, where nothing listens in a worker's network namespace (each attempt fails fast).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_harness import Agent, Cluster, json_lines, wait_for

pytestmark = pytest.mark.integration

WRONG_ENDPOINT = "https://127.0.0.1:6443"
WAITING = "the node API certificate from trustd (control plane endpoint https://127.0.0.1:6443)"


def worker_config(cluster: Cluster, endpoint: str, name: str) -> Path:
    document = yaml.safe_load(cluster.gen.worker.read_text())
    document["cluster"]["controlPlane"]["endpoint"] = endpoint
    path = cluster.tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def saved_endpoint(agent: Agent) -> str:
    endpoint: str = yaml.safe_load(agent.config_bytes() or b"")["cluster"]["controlPlane"]["endpoint"]
    return endpoint


def server_version(cluster: Cluster, agent: Agent, *, insecure: bool = False) -> dict[str, Any] | None:
    """The node's ``version`` reply, None while it does not answer (over mutual TLS by default)."""
    extra = ("--insecure",) if insecure else ()
    config = None if insecure else "admin"
    flag = "-n" if insecure else "-e"
    result = cluster.kp(flag, agent.address, "version", *extra, "-o", "json", config=config, check=False)
    if result.returncode != 0:
        return None
    server: dict[str, Any] = yaml.safe_load(result.stdout)["servers"][0]
    return server


def wait_stuck(cluster: Cluster, agent: Agent, *, insecure: bool = False) -> dict[str, Any]:
    """Wait until the node answers and says its boot waits for trustd at the wrong endpoint."""

    def stuck() -> dict[str, Any] | None:
        server = server_version(cluster, agent, insecure=insecure)
        return server if server and WAITING in server.get("waiting", "") else None

    found: dict[str, Any] = wait_for(
        stuck, timeout=30, what=f"{agent.address} to wait for its certificate", logs=cluster.logs
    )
    return found


def wait_running(cluster: Cluster, agent: Agent) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        server = server_version(cluster, agent)
        return server if server and server["phase"] == "running" else None

    found: dict[str, Any] = wait_for(
        running, timeout=30, what=f"{agent.address} to finish booting", logs=cluster.logs
    )
    return found


def test_a_worker_with_a_wrong_endpoint_stays_reachable_and_is_fixed(cluster: Cluster) -> None:
    control_plane = cluster.boot_agent()
    good = worker_config(cluster, f"https://{control_plane.address}:6443", "good")
    wrong = worker_config(cluster, WRONG_ENDPOINT, "wrong")
    worker = cluster.start_agent()

    # First boot with the wrong endpoint: the worker never had a certificate, so it serves the
    # maintenance API meanwhile, says what it waits for, and takes a config with --insecure.
    cluster.kp("-n", worker.address, "apply-config", "--insecure", "-f", str(wrong), config=None)
    stuck = wait_stuck(cluster, worker, insecure=True)
    assert stuck["maintenance"] is True and stuck["phase"] == "booting"
    assert "attempt" in stuck["waiting"]
    again = cluster.kp("-n", worker.address, "apply-config", "--insecure", "-f", str(wrong), config=None)
    assert "config unchanged; the node is still booting, waiting for " + WAITING in again.stdout
    applied = cluster.kp("-n", worker.address, "apply-config", "--insecure", "-f", str(good), config=None)
    assert "boots again with it" in applied.stdout
    running = wait_running(cluster, worker)
    assert running["maintenance"] is False and "waiting" not in running

    # The default apply of the wrong endpoint reboots the worker into a boot that cannot finish:
    # its API stays up over mutual TLS with the certificate it got last.
    cluster.kp("-e", worker.address, "apply-config", "-f", str(wrong))
    stuck = wait_stuck(cluster, worker)
    assert stuck["maintenance"] is False and stuck["phase"] == "booting"
    refused = cluster.kp("-e", worker.address, "apply-config", "-f", str(good), check=False)
    assert refused.returncode == 1
    assert "has not finished booting: it is waiting for " + WAITING in refused.stderr
    assert "Apply with --immediate" in refused.stderr and "--on-reboot and then" in refused.stderr
    tried = cluster.kp("-e", worker.address, "apply-config", "--mode", "try", "-f", str(good), check=False)
    assert tried.returncode == 1 and "--mode try would not help" in tried.stderr
    assert saved_endpoint(worker) == WRONG_ENDPOINT

    # --immediate fixes it: the boot retries with the corrected endpoint at once.
    applied = cluster.kp("-e", worker.address, "apply-config", "--immediate", "-f", str(good))
    assert "the unfinished boot retries with it now" in applied.stdout
    wait_running(cluster, worker)
    events = json_lines(cluster.kp("-e", worker.address, "events", "-o", "json").stdout)
    messages = [e["message"] for e in events if e["subject"] == "boot"]
    assert any(m.startswith("waiting for " + WAITING) for m in messages), messages
    assert messages[-1] == f"got the node API certificate from trustd: node {worker.address} booted as worker"


def test_on_reboot_then_reboot_fixes_a_worker_stuck_across_an_agent_restart(cluster: Cluster) -> None:
    control_plane = cluster.boot_agent()
    good = worker_config(cluster, f"https://{control_plane.address}:6443", "good")
    wrong = worker_config(cluster, WRONG_ENDPOINT, "wrong")
    worker = cluster.boot_agent(good)
    cluster.kp("-e", worker.address, "apply-config", "-f", str(wrong))
    wait_stuck(cluster, worker)

    # A machine restart keeps the certificate: the secure API answers again at once.
    worker.kill()
    worker.start()
    wait_stuck(cluster, worker)

    staged = cluster.kp("-e", worker.address, "apply-config", "--on-reboot", "-f", str(good))
    assert "takes effect at the next reboot" in staged.stdout
    cluster.kp("-e", worker.address, "reboot")
    wait_running(cluster, worker)
    assert (
        yaml.safe_load(worker.config_bytes() or b"")["cluster"]["controlPlane"]["endpoint"] != WRONG_ENDPOINT
    )
