"""e2e: machine.network applied inside a node (issue 17, item 1), on the shared 1+1 cluster.

An ``--immediate`` patch gives the worker an extra address on eth0, a route through the bridge
with a metric, and an extra host entry: they show in ``kubeplane get addresses`` / ``get routes``
/ ``get netstatus``, the address answers pings from the host and is on eth0 inside the node, the
route is in the node's routing table (not the host's), and the entry is in the node's /etc/hosts
(not the host's). A second ``--immediate`` patch that drops the interface entry removes the
address and the route live while the provisioner's address and default route stay; an interface
the node lacks is reported by name and changes nothing. The worker's original network config is
restored at the end, and the cluster must be healthy again.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from e2e_clients import wait_until

from kubeplane.provision import netns

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

ALIAS = "e2e-extra-address"
#: A network no cluster uses, routed through the bridge by the test's route.
ROUTED = "10.77.0.0/24"
METRIC = 123


def resources(cluster: E2ECluster, node: str, *args: str) -> list[dict[str, Any]]:
    result = cluster.cli("-n", node, "get", *args, "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def patch(cluster: E2ECluster, node: str, operations: list[dict[str, Any]]) -> None:
    result = cluster.cli("-n", node, "patch", "mc", "--immediate", "-p", json.dumps(operations))
    assert result.returncode == 0, result.stdout + result.stderr


def inside(pid: int, *argv: str) -> str:
    """``argv`` in the node's network and mount namespaces (through its agent's process)."""
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "-m", *argv], capture_output=True, text=True, check=True, timeout=30
    ).stdout


def pings(address: str) -> bool:
    return netns.ping(address)  # from the host over the cluster's bridge (the host has no ping binary)


def test_an_extra_address_and_host_entry_are_applied_and_removed_live(cluster_1cp1w: E2ECluster) -> None:
    worker = cluster_1cp1w.workers[0]
    record = next(node for node in cluster_1cp1w.state().nodes if node.ip == worker)
    pid = record.processes["kubeplaned"].pid
    extra = worker.rsplit(".", 1)[0] + ".200"
    gateway = worker.rsplit(".", 1)[0] + ".1"  # the host's address on the cluster's bridge
    route_id = f"eth0/{ROUTED}/{METRIC}"
    (config,) = resources(cluster_1cp1w, worker, "mc")
    original = config["spec"]["machine"].get("network", {})
    assert not pings(extra), f"{extra} answers before the test gave it to a node"

    def addresses() -> dict[str, dict[str, Any]]:
        return {r["metadata"]["id"]: r["spec"] for r in resources(cluster_1cp1w, worker, "addresses")}

    def status() -> dict[str, Any]:
        found = resources(cluster_1cp1w, worker, "netstatus")
        return found[0]["spec"] if found else {}

    def on_eth0() -> str:
        return inside(pid, "ip", "-o", "-4", "addr", "show", "dev", "eth0")

    def routes() -> dict[str, dict[str, Any]]:
        return {r["metadata"]["id"]: r["spec"] for r in resources(cluster_1cp1w, worker, "routes")}

    def node_route() -> str:
        return inside(pid, "ip", "-4", "route", "show", ROUTED)

    try:
        patch(
            cluster_1cp1w,
            worker,
            [
                {
                    "op": "add",
                    "path": "/machine/network/interfaces",
                    "value": [
                        {
                            "interface": "eth0",
                            "cidr": f"{extra}/24",
                            "routes": [{"network": ROUTED, "gateway": gateway, "metric": METRIC}],
                        }
                    ],
                },
                {
                    "op": "add",
                    "path": "/machine/network/extraHostEntries",
                    "value": [{"ip": extra, "aliases": [ALIAS]}],
                },
            ],
        )
        wait_until(f"{extra} in `get addresses`", lambda: f"eth0/{extra}/24" in addresses(), timeout=60)
        assert addresses()[f"eth0/{extra}/24"]["owned"] is True
        assert status()["errors"] == [] and status()["extraHostEntries"] == [f"{extra} {ALIAS}"]
        assert f"inet {extra}/24" in on_eth0() and f"inet {worker}/24" in on_eth0()
        wait_until(f"{extra} to answer pings from the host", lambda: pings(extra), timeout=30)
        assert f"{extra} {ALIAS}" in inside(pid, "cat", "/etc/hosts")
        assert ALIAS not in Path("/etc/hosts").read_text(), "the host's /etc/hosts was written"
        (eth0,) = resources(cluster_1cp1w, worker, "links")
        assert eth0["metadata"]["id"] == "eth0" and eth0["spec"]["up"] is True
        wait_until(f"{ROUTED} in `get routes`", lambda: route_id in routes(), timeout=30)
        assert routes()[route_id]["gateway"] == gateway and routes()[route_id]["owned"] is True
        assert f"via {gateway} dev eth0" in node_route() and f"metric {METRIC}" in node_route()
        assert (
            ROUTED
            not in subprocess.run(
                ["ip", "-4", "route", "show"], capture_output=True, text=True, check=True
            ).stdout
        ), "the route went into the host's table"
        default_before = inside(pid, "ip", "-4", "route", "show", "default")

        # The address leaves the config: gone live, the provisioner's address stays.
        patch(cluster_1cp1w, worker, [{"op": "remove", "path": "/machine/network/interfaces"}])
        wait_until(f"{extra} to leave eth0", lambda: f"inet {extra}/" not in on_eth0(), timeout=60)
        assert f"inet {worker}/24" in on_eth0()
        wait_until(f"{extra} to leave `get addresses`", lambda: not addresses(), timeout=30)
        assert not pings(extra)
        wait_until(f"{ROUTED} to leave the node's table", lambda: node_route() == "", timeout=30)
        assert route_id not in routes()
        assert inside(pid, "ip", "-4", "route", "show", "default") == default_before

        # An interface the node lacks: named in the status, nothing applied.
        patch(
            cluster_1cp1w,
            worker,
            [
                {
                    "op": "add",
                    "path": "/machine/network/interfaces",
                    "value": [{"interface": "eth9", "cidr": f"{extra}/24"}],
                }
            ],
        )
        wait_until("the missing interface to be reported", lambda: bool(status().get("errors")), timeout=60)
        assert status()["errors"] == [
            "machine.network.interfaces[0].interface: interface eth9 does not exist on this node"
        ]
        assert f"inet {extra}/" not in on_eth0() and not addresses()
    finally:
        patch(cluster_1cp1w, worker, [{"op": "replace", "path": "/machine/network", "value": original}])
        wait_until("the worker's network config restored", lambda: not status().get("errors"), timeout=60)
        wait_until(
            f"{ALIAS} to leave the node's /etc/hosts", lambda: ALIAS not in inside(pid, "cat", "/etc/hosts")
        )
        health = cluster_1cp1w.cli("health", "--wait-timeout", "3m")
        assert health.returncode == 0, health.stdout + health.stderr
