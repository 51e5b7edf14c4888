"""e2e: WireGuard between two nodes (issue 17, item 2), on a 1+1 cluster of its own created with
``cluster create --wireguard-cidr 10.1.29.0/24``, as the guide's quick start does.

Each node has ``wg0`` with its tunnel address (node N: the (N+1)th address, like on the cluster
network), run by a userspace ``wireguard-go`` under the node's agent. The control plane node and
the worker ping each other's tunnel address from inside their namespaces; ``wg show`` inside each
node lists the other as a peer with a recent handshake (the worker's with the control plane's
endpoint on port 51111 and a 5 s keepalive), and ``kubeplane get wireguard`` shows the same.
Removing the worker's wg0 with an ``--immediate`` patch stops its ``wireguard-go`` (the agent's
child) and the link goes with it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from e2e_clients import wait_until

from kubeplane.provision import netns

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

#: The --wireguard-cidr of the cluster_wireguard fixture.
WIREGUARD_CIDR = "10.1.29.0/24"
#: A handshake older than this is not "recent": WireGuard renews sessions every 2 minutes.
RECENT = 180


def inside(pid: int, *argv: str) -> str:
    """``argv`` in the node's network and mount namespaces (its UAPI sockets are the node's own)."""
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "-m", *argv], capture_output=True, text=True, check=True, timeout=30
    ).stdout


def tunnel_ip(node_ip: str) -> str:
    """The node's tunnel address: the same host number on the WireGuard network."""
    network = ipaddress.ip_network(WIREGUARD_CIDR)
    return str(network[int(node_ip.rsplit(".", 1)[1])])


def test_two_nodes_ping_each_other_over_the_tunnel(cluster_wireguard: E2ECluster) -> None:
    cluster = cluster_wireguard
    (controlplane,) = cluster.control_plane
    (worker,) = cluster.workers
    records = {node.ip: node for node in cluster.state().nodes}
    pids = {ip: records[ip].processes["kubeplaned"].pid for ip in (controlplane, worker)}

    def handshakes(ip: str) -> dict[str, int]:
        """``wg show wg0 latest-handshakes`` in node ``ip``: peer public key -> Unix time."""
        lines = inside(pids[ip], "wg", "show", "wg0", "latest-handshakes").splitlines()
        return {key: int(when) for key, when in (line.split("\t") for line in lines if line)}

    def public_key(ip: str) -> str:
        return inside(pids[ip], "wg", "show", "wg0", "public-key").strip()

    for ip in (controlplane, worker):
        assert f"inet {tunnel_ip(ip)}/24" in inside(pids[ip], "ip", "-o", "-4", "addr", "show", "dev", "wg0")
    for source, target in ((worker, controlplane), (controlplane, worker)):
        wait_until(
            f"{tunnel_ip(target)} answers ping from {records[source].name} over wg0",
            lambda s=source, t=target: netns.ping(tunnel_ip(t), netns=records[s].netns),
            timeout=60,
        )
    now = time.time()
    for ip, peer in ((controlplane, worker), (worker, controlplane)):
        seen = handshakes(ip)
        assert list(seen) == [public_key(peer)], f"{records[ip].name} peers: {seen}"
        assert now - RECENT < seen[public_key(peer)] <= now + 5, f"{records[ip].name}: no recent handshake"

    shown = inside(pids[worker], "wg", "show", "wg0")
    assert f"endpoint: {controlplane}:51111" in shown and "persistent keepalive: every 5 seconds" in shown
    assert "listening port: 51111" in inside(pids[controlplane], "wg", "show", "wg0")

    result = cluster.cli("-n", worker, "get", "wireguard", "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    (device,) = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    spec: dict[str, Any] = device["spec"]
    assert device["metadata"]["id"] == "wg0" and spec["publicKey"] == public_key(worker)
    (peer,) = spec["peers"]
    assert peer["publicKey"] == public_key(controlplane)
    assert peer["endpoint"] == f"{controlplane}:51111"
    assert peer["allowedIPs"] == [f"{tunnel_ip(controlplane)}/32"]
    assert peer["persistentKeepaliveInterval"] == 5


def test_removing_wg0_from_the_config_stops_its_wireguard_go(cluster_wireguard: E2ECluster) -> None:
    cluster = cluster_wireguard
    (worker,) = cluster.workers
    record = next(node for node in cluster.state().nodes if node.ip == worker)
    agent = record.processes["kubeplaned"].pid

    def wireguard_go() -> list[int]:
        """The agent's wireguard-go children."""
        found = []
        for child in Path(f"/proc/{agent}/task/{agent}/children").read_text().split():
            with contextlib.suppress(FileNotFoundError):  # it may just have exited
                if Path(f"/proc/{child}/comm").read_text().strip() == "wireguard-go":
                    found.append(int(child))
        return found

    (running,) = wireguard_go()
    result = cluster.cli(
        "-n", worker, "patch", "mc", "--immediate", "-p",
        json.dumps([{"op": "remove", "path": "/machine/network/interfaces"}]),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    wait_until("the worker's wireguard-go to stop", lambda: not wireguard_go(), timeout=60)
    assert not Path(f"/proc/{running}").exists()
    assert "wg0" not in inside(agent, "ip", "-o", "link", "show")
    shown = cluster.cli("-n", worker, "get", "wireguard", "-o", "json")
    assert shown.returncode == 0 and not shown.stdout.strip(), shown.stdout + shown.stderr
