"""e2e: ``kubeplane endpoint set`` moves the shared 1 control plane + 1 worker cluster to a new
load balancer and back.

Uses ``cluster_1cp1w`` of the e2e conftest. The new endpoint is a second load balancer in front of
the same API server: an address of its own on the cluster's bridge (added here, removed at the
end) where a TCP forwarder started by the test listens on another port. A
``kube-public/cluster-info`` ConfigMap like kubeadm's is created first (kubeplane makes none) so
that the test sees it follow.

With a client listing pods through the OLD endpoint the whole time, the change runs through the
CLI; then the kube-apiserver serving certificate carries the old and the new endpoint's address,
kubectl works through the new endpoint with the cluster CA, every kubelet's kubeconfig,
kube-proxy's and cluster-info's name the new endpoint, and ``health`` passes. Running it again
changes nothing. The finally switches the cluster back with the same command (the old endpoint's
address stays in the certificate; so does the new one's, harmlessly, since it is gone) and stops
the forwarder.

A single API server restarts with its new certificates (twice), so the poller sees the API go away
for those restarts; what must never happen is a client of the old endpoint refused by TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from cryptography.hazmat.primitives.serialization import Encoding
from e2e_clients import APISERVER_PORT, ApiPoller, run_cli, serving_certificate

from kubeplane import pki

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

NEW_PORT = 7443
STEP_DONE = re.compile(r"^ < (?P<what>done|already at target, skipped) \((?P<seconds>[\d.]+)s\)")
CLUSTER_INFO = "cluster-info"


@pytest.fixture(scope="module")
def cluster(cluster_1cp1w: E2ECluster) -> E2ECluster:
    return cluster_1cp1w


class Forwarder:
    """A TCP load balancer on ``listen`` in front of ``backends`` (round robin), in a thread."""

    def __init__(self, listen: tuple[str, int], backends: Sequence[tuple[str, int]]) -> None:
        self._listen = listen
        self._backends = list(backends)
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="forwarder", daemon=True)
        self.connections = 0

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, *self._listen))
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            # Connections still open (kubelets, kube-proxy) end here, inside the loop: a pipe left
            # to the garbage collector after the loop closed fails in whatever code runs then.
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.run_until_complete(server.wait_closed())
            self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        host, port = self._backends[self._next % len(self._backends)]
        self._next += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        with contextlib.suppress(asyncio.CancelledError):  # the forwarder stops: so does the connection
            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    def __enter__(self) -> Forwarder:
        self._thread.start()
        assert self._started.wait(10), "the forwarder did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def serving_names(address: str) -> set[str]:
    """The names in the certificate the kube-apiserver on ``address`` presents."""
    info = pki.cert_info(serving_certificate(address).public_bytes(Encoding.PEM))
    return {*info.dns_names, *info.ip_addresses}


def server_of(kubeconfig_text: str) -> str:
    return str(yaml.safe_load(kubeconfig_text)["clusters"][0]["cluster"]["server"])


def configmap_server(cluster: Any, namespace: str, name: str) -> str:
    result = cluster.kubectl("-n", namespace, "get", "configmap", name, "-o", "jsonpath={.data.kubeconfig}")
    assert result.returncode == 0, result.stderr
    return server_of(result.stdout)


def kubelet_server(cluster: Any, node: str) -> str:
    result = cluster.cli("-n", node, "read", "etc/kubernetes/kubelet.conf")
    assert result.returncode == 0, result.stderr
    return server_of(result.stdout)


def free_address(cluster: Any) -> str:
    """An address of the cluster's network that no node and not the host uses."""
    network = cluster.state().network
    taken = {network.host_ip, *cluster.control_plane, *cluster.workers}
    for host in reversed(list(ipaddress.ip_network(network.cidr).hosts())):
        if str(host) not in taken:
            return str(host)
    raise AssertionError(f"no free address in {network.cidr}")


def create_cluster_info(cluster: Any, server: str) -> None:
    """A ``kube-public/cluster-info`` as kubeadm makes it: a kubeconfig with the CA and the endpoint."""
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "contexts": [],
        "users": [],
    }
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CLUSTER_INFO, "namespace": "kube-public"},
        "data": {"kubeconfig": yaml.safe_dump(kubeconfig)},
    }
    result = subprocess.run(
        [*cluster.kubectl_argv(), "apply", "-f", "-"],
        input=yaml.safe_dump(manifest),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def outcomes(lines: Sequence[str]) -> list[str]:
    return [m["what"] for line in lines if (m := STEP_DONE.match(line))]


def test_a_url_that_is_not_https_host_port_is_refused(cluster: Any) -> None:
    result = cluster.cli("endpoint", "set", "http://example.test")
    assert result.returncode != 0
    assert "https://HOST:PORT" in result.stderr


def test_an_endpoint_that_is_not_this_cluster_is_refused_before_any_change(cluster: Any) -> None:
    # The node API port answers TLS with the node's OS CA, not the cluster CA.
    result = cluster.cli("endpoint", "set", f"https://{cluster.control_plane[0]}:50000")
    assert result.returncode != 0
    assert "nothing was changed" in result.stderr, result.stderr
    assert "CA did not issue" in result.stderr or "does not answer TLS" in result.stderr, result.stderr


def test_the_endpoint_moves_to_a_new_load_balancer_and_back(cluster: Any) -> None:
    old = cluster.endpoint
    old_host = old.removeprefix("https://").rsplit(":", 1)[0]
    address = free_address(cluster)
    new = f"https://{address}:{NEW_PORT}"
    bridge = cluster.state().network.bridge
    nodes = (*cluster.control_plane, *cluster.workers)
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", bridge], check=True)
    forwarder = Forwarder((address, NEW_PORT), [(node, APISERVER_PORT) for node in cluster.control_plane])
    try:
        with forwarder:
            create_cluster_info(cluster, old)
            try:
                dry = run_cli(cluster.env, "endpoint", "set", new, "--dry-run")
                output = "\n".join(dry.lines)
                assert dry.returncode == 0, output
                assert "dry run: nothing was changed" in output
                assert f"endpoint kubelet on node {cluster.workers[0]}: {old} -> {new}" in output
                assert address not in serving_names(cluster.control_plane[0])

                with ApiPoller(Path(cluster.kubeconfig)) as probe:
                    run = run_cli(cluster.env, "endpoint", "set", new, echo=True)
                output = "\n".join(run.lines)
                assert run.returncode == 0, output
                print(
                    f"API requests through the old endpoint: {probe.requests}, failed: "
                    f"{len(probe.failures)}, longest gap {probe.longest_gap:.1f}s, run {run.seconds:.0f}s, "
                    f"connections through the new endpoint: {forwarder.connections}"
                )
                for failure in probe.failures:
                    print(f"  {failure}")
                # The API server restarts (one node), but the old endpoint is never refused by TLS.
                refused = [f for f in probe.failures if "CERTIFICATE_VERIFY_FAILED" in f or "SSLCert" in f]
                assert refused == []

                for node in cluster.control_plane:
                    assert {old_host, address} <= serving_names(node), node
                kubectl = cluster.kubectl("--server", new, "get", "nodes", "-o", "name")
                assert kubectl.returncode == 0, kubectl.stderr
                assert len(kubectl.stdout.split()) == len(nodes)
                for node in nodes:
                    assert kubelet_server(cluster, node) == new, node
                assert configmap_server(cluster, "kube-system", "kubeconfig-in-cluster") == new
                assert configmap_server(cluster, "kube-public", CLUSTER_INFO) == new
                # The user is told how to get a kubeconfig for the new endpoint.
                assert "kubeconfig --force" in output and f"--server={new}" in output, output
                health = cluster.cli("health", "--wait-timeout", "3m")
                assert health.returncode == 0, health.stdout + health.stderr

                again = run_cli(cluster.env, "endpoint", "set", new)
                assert again.returncode == 0, "\n".join(again.lines)
                assert set(outcomes(again.lines)) == {"already at target, skipped"}, "\n".join(again.lines)
            finally:
                back = run_cli(cluster.env, "endpoint", "set", old, echo=True)
                assert back.returncode == 0, "\n".join(back.lines)
                cluster.kubectl("-n", "kube-public", "delete", "configmap", CLUSTER_INFO)
        for node in nodes:
            assert kubelet_server(cluster, node) == old, node
        assert configmap_server(cluster, "kube-system", "kubeconfig-in-cluster") == old
        health = cluster.cli("health", "--wait-timeout", "3m")
        assert health.returncode == 0, health.stdout + health.stderr
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", bridge], check=False)
