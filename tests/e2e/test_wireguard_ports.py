"""e2e: WireGuard between two nodes (issue 17, item 2) and moved node API and trustd ports (issue
19, item 6), on a 1+1 cluster of its own created with ``cluster create --wireguard-cidr
10.1.29.0/24 --node-api-port 51000 --trustd-port 51001``.

WireGuard, as the guide's quick start does it: each node has ``wg0`` with its tunnel address (node
N: the (N+1)th address, like on the cluster network), run by a userspace ``wireguard-go`` under the
node's agent. The control plane node and the worker ping each other's tunnel address from inside
their namespaces; ``wg show`` inside each node lists the other as a peer with a recent handshake
(the worker's with the control plane's endpoint on port 51111 and a 5 s keepalive), and
``kubeplane get wireguard`` shows the same. Removing the worker's wg0 with an ``--immediate``
patch stops its ``wireguard-go`` (the agent's child) and the link goes with it.

Ports, as the guide "Configuring Network Connectivity" lists them (TCP inbound: the node API, its
apid, for the CLI; trustd, for the nodes' certificates), on the ports the flags moved them to.
From the host, over the cluster bridge: both nodes' node API answers on 51000 and nothing listens
on 50000 or 50001 any more; trustd answers a TLS handshake on 51001 with the control plane node's
certificate, on the control plane node only. The worker serves its node API with the certificate
trustd signed for it (its events say so), and the CLI reaches it with ``-n WORKER``, forwarded by
the control plane node on the moved port. The context ``cluster create`` wrote has the endpoint
``CP:51000``, a bare ``-e CP`` (port 50000) finds nothing there, and ``kubeplane health`` passes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from e2e_clients import wait_until

from kubeplane import pki
from kubeplane.config import client as client_config
from kubeplane.provision import netns

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

#: The --wireguard-cidr of the cluster_wireguard fixture.
WIREGUARD_CIDR = "10.1.29.0/24"
#: A handshake older than this is not "recent": WireGuard renews sessions every 2 minutes.
RECENT = 180
#: The --node-api-port and --trustd-port of the cluster_wireguard fixture.
NODE_API_PORT = 51000
TRUSTD_PORT = 51001
#: The ports they moved from: nothing may listen there any more.
DEFAULT_PORTS = (50000, 50001)


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


def listens(ip: str, port: int) -> bool:
    """Whether ``ip:port`` accepts a TCP connection from the host (over the cluster bridge): a
    refusal is False; no answer at all fails the test (the node is unreachable, not closed)."""
    try:
        with socket.create_connection((ip, port), timeout=10):
            return True
    except ConnectionRefusedError:
        return False


def tls_certificate(
    ip: str, port: int, *, ca: bytes, client: tuple[Path, Path] | None = None
) -> x509.Certificate:
    """The certificate ``ip:port`` presents in a TLS handshake verified against ``ca`` and issued
    for ``ip``; ``client`` (certificate and key files) is presented if given: the node API asks
    for one."""
    context = ssl.create_default_context(cadata=ca.decode())
    context.set_alpn_protocols(["h2"])  # gRPC
    if client is not None:
        context.load_cert_chain(*client)
    with (
        socket.create_connection((ip, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=ip) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def server_version(cluster: E2ECluster, *args: str) -> dict[str, Any] | None:
    """What ``kubeplane ARGS version -o json`` says of the one node asked, or None if it fails."""
    result = cluster.cli(*args, "version", "-o", "json", timeout=60)
    if result.returncode != 0:
        return None
    (server,) = json.loads(result.stdout)["servers"]
    return dict(server)


def test_the_node_api_and_trustd_answer_on_the_moved_ports_only(cluster_wireguard: E2ECluster) -> None:
    cluster = cluster_wireguard
    (controlplane,) = cluster.control_plane
    (worker,) = cluster.workers
    context = client_config.load(cluster.client_config).contexts[cluster.name]
    # Until trustd signed its certificate a worker serves the maintenance API on 50000.
    wait_until(
        "the worker to serve its node API on the moved port",
        lambda: server_version(cluster, "-n", worker) is not None,
        timeout=120,
    )
    for node in (controlplane, worker):
        assert listens(node, NODE_API_PORT), f"{node}: no node API on {NODE_API_PORT}"
        for port in DEFAULT_PORTS:
            assert not listens(node, port), f"{node}: something still listens on {port}"
    trustd = tls_certificate(controlplane, TRUSTD_PORT, ca=context.ca_pem)
    assert trustd.issuer == x509.load_pem_x509_certificate(context.ca_pem).subject
    assert not listens(worker, TRUSTD_PORT), "a worker holds no CA key: it serves no trustd"


def test_the_worker_got_its_node_api_certificate_from_trustd(
    cluster_wireguard: E2ECluster, tmp_path: Path
) -> None:
    cluster = cluster_wireguard
    (worker,) = cluster.workers
    context = client_config.load(cluster.client_config).contexts[cluster.name]
    client = (tmp_path / "admin.crt", tmp_path / "admin.key")
    client[0].write_bytes(context.client.cert)
    client[1].touch(mode=0o600)
    client[1].write_bytes(context.client.key)
    served = tls_certificate(worker, NODE_API_PORT, ca=context.ca_pem, client=client)
    organizations = [a.value for a in served.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert organizations == [pki.NODE_ORG], organizations  # what trustd signs, and only that
    result = cluster.cli("-n", worker, "events", "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    messages = [json.loads(line)["message"] for line in result.stdout.splitlines() if line.strip()]
    assert any(m.startswith("got the node API certificate from trustd") for m in messages), messages


def test_the_cli_reaches_the_nodes_on_the_moved_port_and_the_cluster_is_healthy(
    cluster_wireguard: E2ECluster,
) -> None:
    cluster = cluster_wireguard
    (controlplane,) = cluster.control_plane
    (worker,) = cluster.workers
    info = cluster.cli("config", "info", "-o", "json")
    assert info.returncode == 0, info.stdout + info.stderr
    document = json.loads(info.stdout)
    assert document["endpoints"] == [f"{controlplane}:{NODE_API_PORT}"]
    assert document["nodes"] == [controlplane, worker]
    # -n WORKER: the control plane node forwards the call to the worker's (moved) node API.
    names = {node.ip: node.name for node in cluster.state().nodes}
    for node in (controlplane, worker):
        server = server_version(cluster, "-n", node)
        assert server is not None and server["node"] == names[node], server
    assert server_version(cluster, "-e", f"{controlplane}:{NODE_API_PORT}", "-n", worker) is not None
    bare = cluster.cli("-e", controlplane, "version", timeout=60)  # a bare endpoint means 50000
    assert bare.returncode != 0 and f"{controlplane}:50000" in bare.stderr, bare.stdout + bare.stderr
    assert "Connection refused" in bare.stderr, bare.stderr
    health = cluster.cli("health", "--wait-timeout", "5m")
    assert health.returncode == 0, health.stdout + health.stderr


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
