"""e2e: a 1+1 local cluster becomes 3+1 and goes back, through ``cluster add`` / ``cluster remove``.

On the shared session cluster ``cluster_1cp1w`` (CI has no time for another one), with an API
poller running throughout: two control plane nodes are added (three etcd members, health passes),
one of them is stopped as a lost machine would be (the API still answers; removing a *healthy*
member then is refused, because the two left would need both for a quorum), then both are removed
in one command (one member again, health passes). The poller opens a new connection for every
``GET /readyz``, as a ``kubectl get --raw /readyz`` loop does, so haproxy spreads its requests over
every node in rotation and each stage is seen by it: it sees no failure while nodes are added and
removed. Losing a machine is different: a request in flight on the lost node's API server at that
moment cannot be saved (haproxy forwards TCP and retries only connections that were refused), so
at most one request may fail, and only between the loss and haproxy's health checks taking the
node out (``inter 1s fall 2``). The removal of the only control plane node is refused. Whatever
fails, the cluster is taken back to its 1+1 nodes and waited healthy, since the modules after this
one use it.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pytest
import yaml

from kubeplane.provision import teardown

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

#: How long the restore in ``finally`` may take to bring the shared cluster back to health.
RESTORE_TIMEOUT = "5m"
#: Seconds after a node is lost in which haproxy may still send it a request (two failed checks
#: one second apart, plus the check's own timeout).
DETECTION_WINDOW = 4.0


class ReadyzPoller:
    """``GET /readyz`` through the endpoint every ``interval`` s, one new connection each time."""

    def __init__(self, kubeconfig: Path, *, interval: float = 0.1) -> None:
        document = yaml.safe_load(kubeconfig.read_text())
        cluster = document["clusters"][0]["cluster"]
        user = document["users"][0]["user"]
        server = urlparse(cluster["server"])
        self._host, self._port = server.hostname or "", server.port or 443
        self._context = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
        with tempfile.TemporaryDirectory() as directory:
            cert, key = Path(directory, "crt"), Path(directory, "key")
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            self._context.load_cert_chain(cert, key)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="readyz-poller", daemon=True)
        self.requests = 0
        self.failures: list[str] = []
        #: ``time.monotonic()`` of each failure, in the order of :attr:`failures`.
        self.failed_at: list[float] = []

    def _get(self) -> None:
        connection = http.client.HTTPSConnection(self._host, self._port, context=self._context, timeout=5)
        try:
            connection.request("GET", "/readyz")
            response = connection.getresponse()
            body = response.read().decode(errors="replace")
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {body[:200]}")
        finally:
            connection.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.requests += 1
            try:
                self._get()
            except Exception as exc:
                self.failed_at.append(time.monotonic())
                self.failures.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {str(exc)[:200]}")
            self._stop.wait(self._interval)

    def __enter__(self) -> ReadyzPoller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _members(cluster: E2ECluster) -> list[dict[str, Any]]:
    result = cluster.cli("-n", cluster.control_plane[0], "etcd", "members", "-o", "json", timeout=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def _health(cluster: E2ECluster, timeout: str = "3m") -> None:
    result = cluster.cli("health", "--wait-timeout", timeout, timeout=400)
    assert result.returncode == 0, f"health failed:\n{result.stdout}\n{result.stderr}"


def _extra_nodes(cluster: E2ECluster) -> list[str]:
    original = {*cluster.control_plane, *cluster.workers}
    return [node.name for node in cluster.state().nodes if node.ip not in original]


def _restore(cluster: E2ECluster) -> None:
    """Take the shared cluster back to its 1+1 nodes and wait until it is healthy."""
    extra = _extra_nodes(cluster)
    if extra:
        result = cluster.cli(
            "cluster",
            "remove",
            "--name",
            cluster.name,
            *extra,
            "--wait-timeout",
            RESTORE_TIMEOUT,
            timeout=600,
        )
        assert result.returncode == 0, f"restoring {cluster.name} failed:\n{result.stdout}\n{result.stderr}"
    _health(cluster, RESTORE_TIMEOUT)


def test_removing_the_only_control_plane_node_is_refused(cluster_1cp1w: E2ECluster) -> None:
    cluster = cluster_1cp1w
    before = cluster.state()
    only = before.nodes[0]
    assert only.role == "controlplane"
    result = cluster.cli("cluster", "remove", "--name", cluster.name, only.name, timeout=120)
    assert result.returncode != 0
    assert f"refusing to remove {only.name}" in result.stderr
    assert "1 control plane node(s) and 1 etcd member(s)" in result.stderr
    assert cluster.state().to_dict() == before.to_dict()
    assert len(_members(cluster)) == 1


def test_one_control_plane_becomes_three_and_goes_back(cluster_1cp1w: E2ECluster) -> None:
    cluster = cluster_1cp1w
    try:
        with ReadyzPoller(cluster.kubeconfig) as poller:
            dry = cluster.cli("cluster", "add", "--name", cluster.name, "--controlplanes", "2", "--dry-run")
            assert dry.returncode == 0, dry.stderr
            assert f"{cluster.name}-controlplane-2" in dry.stdout
            assert [n.name for n in cluster.state().nodes if n.role == "controlplane"] == [
                f"{cluster.name}-controlplane-1"
            ]

            started = time.monotonic()
            added = cluster.cli(
                "cluster", "add", "--name", cluster.name, "--controlplanes", "2", "-o", "json", timeout=900
            )
            add_seconds = time.monotonic() - started
            assert added.returncode == 0, f"cluster add failed:\n{added.stdout}\n{added.stderr}"
            shown = json.loads(added.stdout)
            new = [
                n
                for n in shown["nodes"]
                if n["role"] == "controlplane" and n["ip"] not in cluster.control_plane
            ]
            assert [n["name"] for n in new] == [
                f"{cluster.name}-controlplane-2",
                f"{cluster.name}-controlplane-3",
            ]
            assert all(n["agent"] == "running" for n in new)
            members = _members(cluster)
            assert sorted(m["name"] for m in members) == sorted(
                [f"{cluster.name}-controlplane-{i}" for i in (1, 2, 3)]
            )
            assert not any(m["learner"] for m in members)
            _health(cluster)
            servers = cluster.haproxy.server_states()
            assert sorted(servers) == sorted(m["name"] for m in members)
            print(f"added 2 control plane nodes in {add_seconds:.1f}s; poller {poller.requests} requests")

            # One added node is lost: the API keeps answering through the other two.
            lost = cluster.state().node(new[0]["name"])
            lost_from = time.monotonic()
            teardown.stop_node(lost)
            lost_until = time.monotonic() + DETECTION_WINDOW
            before = poller.requests
            time.sleep(10)
            assert poller.requests > before
            # Removing a healthy member now would leave two members of which one is down.
            refused = cluster.cli("cluster", "remove", "--name", cluster.name, new[1]["name"], timeout=120)
            assert refused.returncode != 0
            assert f"refusing to remove control plane node {new[1]['name']}" in refused.stderr
            assert "etcd has 3 member(s), 2 healthy" in refused.stderr
            assert len(_members(cluster)) == 3

            started = time.monotonic()
            removed = cluster.cli(
                "cluster",
                "remove",
                "--name",
                cluster.name,
                lost.name,
                new[1]["name"],
                "-o",
                "yaml",
                timeout=600,
            )
            remove_seconds = time.monotonic() - started
            assert removed.returncode == 0, f"cluster remove failed:\n{removed.stdout}\n{removed.stderr}"
            assert [n["name"] for n in yaml.safe_load(removed.stdout)["nodes"]] == [
                f"{cluster.name}-controlplane-1",
                f"{cluster.name}-worker-1",
            ]
            members = _members(cluster)
            assert [m["name"] for m in members] == [f"{cluster.name}-controlplane-1"]
            _health(cluster)
            assert sorted(cluster.haproxy.server_states()) == [f"{cluster.name}-controlplane-1"]
            state = cluster.state()
            assert state.network is not None
            assert all(not Path(f"/run/netns/{n['name']}").exists() for n in new)
            assert {n.netns for n in state.nodes} == set(state.network.netns)
        print(
            f"removed 2 control plane nodes in {remove_seconds:.1f}s; poller {poller.requests} requests, "
            f"{len(poller.failures)} failures: {poller.failures}"
        )
        assert poller.requests > 100
        outside = [
            failure
            for failure, at in zip(poller.failures, poller.failed_at, strict=True)
            if not lost_from <= at <= lost_until
        ]
        assert outside == [], "requests failed while nodes were added or removed"
        assert len(poller.failures) <= 1, "more than the one request in flight on the lost node failed"
    finally:
        _restore(cluster)
        assert [n.name for n in cluster.state().nodes] == [
            f"{cluster.name}-controlplane-1",
            f"{cluster.name}-worker-1",
        ]
        assert all(n.joined for n in cluster.state().nodes)
