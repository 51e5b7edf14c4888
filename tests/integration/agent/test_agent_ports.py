"""Issue 19 item 6: the node API and trustd on ports of the cluster's choosing.

Follows the guide's "Configuring Network Connectivity": a control plane node takes the node API
(used by the CLI) and trustd (used by the other nodes) inbound, a worker the node API (reached
through the endpoint node). Here both ports are moved off 50000/50001 with ``kubeplane gen config
--node-api-port --trustd-port``, and what is checked is what the table promises on the new
ports: the CLI reaches the control plane at ``host:port``, the worker gets its node API
certificate from trustd on the new port, ``-n WORKER`` is forwarded there, and the old ports are
closed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_harness import API_PORT, Agent, Cluster, port_open, wait_for

pytestmark = pytest.mark.integration

NODE_API_PORT = 51000
TRUSTD_PORT = 51001


def booted(cluster: Cluster, client_config: Path, *args: str) -> dict[str, Any] | None:
    """``version`` through ``args`` (endpoint, nodes) when it answers out of maintenance mode."""
    result = cluster.kp(*args, "version", "-o", "json", config=client_config, check=False)
    if result.returncode != 0:
        return None
    document: dict[str, Any] = yaml.safe_load(result.stdout)
    servers = document.get("servers") or [{}]
    return document if servers[0].get("maintenance") is False else None


def apply_insecure(cluster: Cluster, agent: Agent, config: Path) -> None:
    """The first config of a node in maintenance mode, which listens where it was started (50000)."""
    cluster.kp("-n", agent.address, "apply-config", "--insecure", "-f", str(config), config=None)


def test_node_api_and_trustd_on_configured_ports(cluster: Cluster, tmp_path: Path) -> None:
    controlplane = cluster.start_agent()
    worker = cluster.start_agent()
    out = tmp_path / "ports"
    cluster.kp(
        "gen", "config", "ports", f"https://{controlplane.address}:6443", "-o", str(out),
        "--node-api-port", str(NODE_API_PORT), "--trustd-port", str(TRUSTD_PORT),
        config=None,
    )  # fmt: skip
    admin = out / "kubeplaneconfig"
    context = yaml.safe_load(admin.read_text())["contexts"]["ports"]
    assert context["endpoints"] == [f"{controlplane.address}:{NODE_API_PORT}"]

    apply_insecure(cluster, controlplane, out / "controlplane.yaml")
    # The client config's endpoint carries the port: no -e needed.
    document = wait_for(
        lambda: booted(cluster, admin),
        timeout=90,
        what=f"{controlplane.address}:{NODE_API_PORT} to serve the node API",
        logs=cluster.logs,
    )
    assert document["servers"][0]["node"] == controlplane.address
    # The same through -e HOST:PORT; and the guide's ports are closed on the node.
    assert booted(cluster, admin, "-e", f"{controlplane.address}:{NODE_API_PORT}") is not None
    assert port_open(controlplane.address, TRUSTD_PORT)
    assert not port_open(controlplane.address, API_PORT)
    assert not port_open(controlplane.address, 50001)
    refused = cluster.kp("-e", controlplane.address, "version", config=admin, check=False)
    assert refused.returncode != 0

    # The worker holds no CA key: its node API certificate can only come from trustd, which it
    # finds on the control plane endpoint's host at the configured trustd port.
    apply_insecure(cluster, worker, out / "worker.yaml")
    proxied = wait_for(
        lambda: booted(cluster, admin, "-n", worker.address),
        timeout=90,
        what=f"{worker.address} to boot and answer through {controlplane.address}",
        logs=cluster.logs,
    )
    # Forwarded by the control plane node to the worker's node API on the configured port.
    (server,) = proxied["servers"]
    assert server["node"] == worker.address
    assert server["maintenance"] is False
    assert port_open(worker.address, NODE_API_PORT)
    assert not port_open(worker.address, API_PORT)
    log = (worker.paths.logs / "kubeplaned.log").read_text()
    assert f"trustd at {controlplane.address}:{TRUSTD_PORT} signed the node API certificate" in log

    # A node entry may name the port itself.
    explicit = booted(cluster, admin, "-n", f"{worker.address}:{NODE_API_PORT}")
    assert explicit is not None
    assert explicit["servers"][0]["maintenance"] is False
    # Both nodes at once through the one endpoint: each reply labelled with its node.
    both = booted(cluster, admin, "-n", f"{controlplane.address},{worker.address}")
    assert both is not None
    assert sorted(reply["node"] for reply in both["servers"]) == sorted(
        [controlplane.address, worker.address]
    )


def test_changing_the_ports_moves_the_listeners_at_the_reboot(cluster: Cluster, tmp_path: Path) -> None:
    """A changed ``machine.ports`` is refused live and takes effect with the reboot it needs."""
    agent = cluster.start_agent()
    out = tmp_path / "ports"
    cluster.kp(
        "gen", "config", "ports", f"https://{agent.address}:6443", "-o", str(out),
        "--node-api-port", str(NODE_API_PORT), config=None,
    )  # fmt: skip
    admin = out / "kubeplaneconfig"
    apply_insecure(cluster, agent, out / "controlplane.yaml")
    wait_for(lambda: booted(cluster, admin), timeout=90, what="the node to boot", logs=cluster.logs)
    assert port_open(agent.address, 50001)  # trustd's default: only the node API moved

    moved = '{"machine": {"ports": {"nodeAPI": 51010, "trustd": 51011}}}'
    live = cluster.kp("patch", "mc", "--immediate", "-p", moved, config=admin, check=False)
    assert live.returncode != 0
    assert "machine.ports" in live.stderr
    assert port_open(agent.address, NODE_API_PORT)

    cluster.kp("patch", "mc", "-p", moved, config=admin)
    wait_for(
        lambda: booted(cluster, admin, "-e", f"{agent.address}:51010"),
        timeout=90,
        what="the node API on 51010 after the reboot",
        logs=cluster.logs,
    )
    assert port_open(agent.address, 51011)
    assert not port_open(agent.address, NODE_API_PORT)
    assert not port_open(agent.address, 50001)
