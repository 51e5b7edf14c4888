"""e2e: a 1+1 local cluster becomes 3+1, moves to a new endpoint, loses a node and goes back to 1+1,
through ``cluster add``, ``endpoint set`` and ``cluster remove`` (issue 16's acceptance).

On the shared session cluster ``cluster_1cp1w`` (CI has no time for another one), with an API
poller running throughout: two control plane nodes are added (three etcd members, health passes);
the cluster moves to a new endpoint, a second haproxy (the guide's load balancer: TCP mode, SSL
health checks on ``/readyz``) on an address of its own, with ``endpoint set``; one added node is
then stopped as a lost machine would be (the API still answers through both endpoints; removing a
*healthy* member then is refused, because the two left would need both for a quorum), then both are
removed in one command (one member again, health passes). The etcd member list is checked at every
stage.

The pollers: one opens a new connection for every ``GET /readyz`` through the old endpoint, as a
``kubectl get --raw /readyz`` loop does, so haproxy spreads its requests over every node in
rotation and each stage is seen by it; once the endpoint moved, another does the same through the
new endpoint, as clients given the new kubeconfig do. Neither sees a failure while nodes are added,
the endpoint moves and nodes are removed. (The new load balancer is not steered by ``endpoint
set``, which drains nodes only in the rotation of the endpoint it moves from: a client of the new
one during the change meets every API server restart as a health-checked balancer does; and
``cluster remove`` drains only the cluster's own haproxy, so the test takes the two nodes out of
the new one first, as its operator would.) During the endpoint change two more clients list pods
through the old endpoint on kept connections, over HTTP/1.1 and HTTP/2: each API server restarts
twice (new certificate SANs, then its own endpoint), out of the old endpoint's rotation, so new
connections never meet a stopping server; a kept connection it closes at that moment is what HTTP
lets a client retry (:func:`e2e_clients.closed_before_response`, the HTTP/2 GOAWAY), at most once
per restart, and nothing else may fail.

Losing a machine is different: a request in flight on the lost node's API server at that moment
cannot be saved (haproxy forwards TCP and retries only connections that were refused or not
answered), so at most one request per poller may fail, and only one sent between the loss and
haproxy's health checks taking the node out (``inter 1s fall 2``). The removal of the only control
plane node is refused. Whatever fails, the cluster is taken back to its 1+1 nodes and its old
endpoint and waited healthy, since the modules after this one use it.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pytest
import yaml
from e2e_clients import APISERVER_PORT, ApiPoller, Http2Poller, run_cli
from test_endpoint_change import (
    CLUSTER_INFO,
    configmap_server,
    create_cluster_info,
    free_address,
    kubelet_server,
    outcomes,
    serving_names,
)

from kubeplane.provision import loadbalancer as lb
from kubeplane.provision import teardown

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

#: How long the restore in ``finally`` may take to bring the shared cluster back to health.
RESTORE_TIMEOUT = "5m"
#: Seconds after a node is lost in which haproxy may still send it a request (two failed checks
#: one second apart, plus the check's own timeout).
DETECTION_WINDOW = 4.0
#: The new endpoint's port (on an address of its own).
NEW_PORT = 7443


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
        #: ``time.monotonic()`` when each failed request was sent, in the order of :attr:`failures`.
        self.failed_at: list[float] = []

    def _get(self) -> None:
        connection = http.client.HTTPSConnection(self._host, self._port, context=self._context, timeout=5)
        try:
            connection.request("GET", "/readyz")
            response = connection.getresponse()
            body = response.read().decode(errors="replace")
            if response.status != 200:
                # The failing checks ("[-]...") name why; the passing ones before them do not.
                failing = [line for line in body.splitlines() if line.startswith("[-]")]
                raise RuntimeError(f"HTTP {response.status}: {'; '.join(failing) or body[:200]}")
        finally:
            connection.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.requests += 1
            sent = time.monotonic()
            try:
                self._get()
            except Exception as exc:
                self.failed_at.append(sent)
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


def _lb_log_around(cluster: E2ECluster, failures: list[str]) -> str:
    """The cluster haproxy's log lines of the seconds the ``failures`` (``HH:MM:SS ...``) happened
    in, and its server state changes: which node answered, read before the teardown removes them."""
    if cluster.haproxy is None or not cluster.haproxy.log.exists():
        return "(no haproxy log)"
    seconds = {failure.split(" ", 1)[0] for failure in failures}
    lines = [
        line
        for line in cluster.haproxy.log.read_text(errors="replace").splitlines()
        if any(f":{second}" in line for second in seconds) or "Server " in line
    ]
    return "haproxy log:\n" + "\n".join(lines[-60:])


def _health(cluster: E2ECluster, timeout: str = "3m") -> None:
    result = cluster.cli("health", "--wait-timeout", timeout, timeout=400)
    assert result.returncode == 0, f"health failed:\n{result.stdout}\n{result.stderr}"


def _extra_nodes(cluster: E2ECluster) -> list[str]:
    original = {*cluster.control_plane, *cluster.workers}
    return [node.name for node in cluster.state().nodes if node.ip not in original]


class NewEndpoint:
    """A second load balancer for the cluster: haproxy on a free address of the cluster's bridge
    (added here, removed at the end), port :data:`NEW_PORT`, in front of ``backends``."""

    def __init__(self, cluster: E2ECluster, directory: Path, backends: dict[str, str]) -> None:
        self.address = free_address(cluster)
        self.url = f"https://{self.address}:{NEW_PORT}"
        network = cluster.state().network
        assert network is not None
        self._bridge = network.bridge
        self._haproxy = lb.HAProxy(directory=directory)
        self._backends = [
            lb.Backend(name=name, address=ip, port=APISERVER_PORT) for name, ip in backends.items()
        ]
        self.kubeconfig = directory / "kubeconfig"
        document = yaml.safe_load(cluster.kubeconfig.read_text())
        for entry in document["clusters"]:
            entry["cluster"]["server"] = self.url
        self.kubeconfig.write_text(yaml.safe_dump(document))

    def __enter__(self) -> NewEndpoint:
        subprocess.run(["ip", "addr", "add", f"{self.address}/32", "dev", self._bridge], check=True)
        try:
            self._haproxy.write_config(bind_address=self.address, backends=self._backends, port=NEW_PORT)
            self._haproxy.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def drain(self, *names: str) -> None:
        """Take these nodes out of this load balancer's rotation, as its operator does before
        removing them (``cluster remove`` steers only the cluster's own haproxy)."""
        for name in names:
            self._haproxy.set_server_state(name, "drain")
        for name in names:
            self._haproxy.wait_status(name, until="out")

    def __exit__(self, *_: object) -> None:
        try:
            self._haproxy.stop()
        finally:
            subprocess.run(["ip", "addr", "del", f"{self.address}/32", "dev", self._bridge], check=False)


def _restore(cluster: E2ECluster, *, endpoint: str | None = None) -> None:
    """Take the shared cluster back to its 1+1 nodes (and to ``endpoint``) and wait until it is
    healthy."""
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
    if endpoint is not None:
        back = run_cli(cluster.env, "endpoint", "set", endpoint, echo=True)
        assert back.returncode == 0, "\n".join(back.lines)
    _health(cluster, RESTORE_TIMEOUT)


def _move_endpoint(cluster: E2ECluster, new: NewEndpoint, old: str) -> None:
    """``endpoint set`` to ``new`` with two clients on kept connections through the old endpoint;
    every reference follows, the old and new names are in each serving certificate, a re-run
    changes nothing."""
    old_host = old.removeprefix("https://").rsplit(":", 1)[0]
    create_cluster_info(cluster, old)
    dry = run_cli(cluster.env, "endpoint", "set", new.url, "--dry-run")
    assert dry.returncode == 0, "\n".join(dry.lines)
    assert "dry run: nothing was changed" in "\n".join(dry.lines)

    with ApiPoller(cluster.kubeconfig) as kept, Http2Poller(cluster.kubeconfig) as h2:
        run = run_cli(cluster.env, "endpoint", "set", new.url, echo=True)
    output = "\n".join(run.lines)
    assert run.returncode == 0, output
    restarts = 2 * sum(node.role == "controlplane" for node in cluster.state().nodes)
    print(
        f"endpoint set {run.seconds:.1f}s; kept HTTP/1.1 connections {kept.requests} requests, "
        f"{len(kept.failures)} failed ({len(kept.closed)} closed by a stopping API server); HTTP/2 "
        f"{h2.requests} requests, {len(h2.failures)} failed, {len(h2.retried)} sent again after a GOAWAY"
    )
    for failure in [*kept.failures, *h2.failures, *h2.retried]:
        print(f"  {failure}")
    assert [f for f in kept.failures if f not in kept.closed] == []
    assert len(kept.closed) <= restarts, kept.closed
    assert h2.failures == [], h2.failures
    assert len(h2.retried) <= restarts, h2.retried
    assert set(h2.versions) == {"HTTP/2"}, h2.versions

    for node in cluster.state().nodes:
        if node.role == "controlplane":
            assert {old_host, new.address} <= serving_names(node.ip), node.name
        assert kubelet_server(cluster, node.ip) == new.url, node.name
    assert configmap_server(cluster, "kube-system", "kubeconfig-in-cluster") == new.url
    assert configmap_server(cluster, "kube-public", CLUSTER_INFO) == new.url
    assert "kubeconfig --force" in output and f"--server={new.url}" in output, output
    _health(cluster)
    again = run_cli(cluster.env, "endpoint", "set", new.url)
    assert again.returncode == 0, "\n".join(again.lines)
    assert set(outcomes(again.lines)) == {"already at target, skipped"}, "\n".join(again.lines)


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


def test_one_control_plane_becomes_three_moves_endpoint_and_goes_back(
    cluster_1cp1w: E2ECluster, tmp_path: Path
) -> None:
    cluster = cluster_1cp1w
    old = cluster.endpoint
    names = [f"{cluster.name}-controlplane-{i}" for i in (1, 2, 3)]
    moved = False
    # The new endpoint outlives the finally's restore: the nodes reach the API through it until
    # they are moved back.
    lb_stack = contextlib.ExitStack()
    try:
        with ReadyzPoller(cluster.kubeconfig) as poller:
            dry = cluster.cli("cluster", "add", "--name", cluster.name, "--controlplanes", "2", "--dry-run")
            assert dry.returncode == 0, dry.stderr
            assert f"{cluster.name}-controlplane-2" in dry.stdout
            assert [n.name for n in cluster.state().nodes if n.role == "controlplane"] == names[:1]

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
            assert [n["name"] for n in new] == names[1:]
            assert all(n["agent"] == "running" for n in new)
            members = _members(cluster)
            assert sorted(m["name"] for m in members) == names
            assert not any(m["learner"] for m in members)
            _health(cluster)
            servers = cluster.haproxy.server_states()
            assert sorted(servers) == names
            print(f"added 2 control plane nodes in {add_seconds:.1f}s; poller {poller.requests} requests")

            control_planes = {n.name: n.ip for n in cluster.state().nodes if n.role == "controlplane"}
            endpoint = lb_stack.enter_context(NewEndpoint(cluster, tmp_path, control_planes))
            moved = True
            _move_endpoint(cluster, endpoint, old)
            assert sorted(m["name"] for m in _members(cluster)) == names
            # Clients move to the new endpoint once the change is done; one polls it from now on.
            with ReadyzPoller(endpoint.kubeconfig) as new_poller:
                # One added node is lost: the API keeps answering through the other two.
                lost = cluster.state().node(new[0]["name"])
                lost_from = time.monotonic()
                teardown.stop_node(lost)
                lost_until = time.monotonic() + DETECTION_WINDOW
                before = poller.requests, new_poller.requests
                time.sleep(10)
                assert poller.requests > before[0] and new_poller.requests > before[1]
                # Removing a healthy member now would leave two members of which one is down.
                refused = cluster.cli(
                    "cluster", "remove", "--name", cluster.name, new[1]["name"], timeout=120
                )
                assert refused.returncode != 0
                assert f"refusing to remove control plane node {new[1]['name']}" in refused.stderr
                assert "etcd has 3 member(s), 2 healthy" in refused.stderr
                assert len(_members(cluster)) == 3

                endpoint.drain(lost.name, new[1]["name"])
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
                    names[0],
                    f"{cluster.name}-worker-1",
                ]
                assert [m["name"] for m in _members(cluster)] == names[:1]
                _health(cluster)
                assert sorted(cluster.haproxy.server_states()) == names[:1]
                state = cluster.state()
                assert state.network is not None
                assert all(not Path(f"/run/netns/{n['name']}").exists() for n in new)
                assert {n.netns for n in state.nodes} == set(state.network.netns)
        print(
            f"removed 2 control plane nodes in {remove_seconds:.1f}s; poller {poller.requests} requests, "
            f"{len(poller.failures)} failures: {poller.failures}; through the new endpoint "
            f"{new_poller.requests} requests, {len(new_poller.failures)} failures: {new_poller.failures}"
        )
        assert poller.requests > 100 and new_poller.requests > 100
        for probe in (poller, new_poller):
            outside = [
                failure
                for failure, at in zip(probe.failures, probe.failed_at, strict=True)
                if not lost_from <= at <= lost_until
            ]
            assert outside == [], (
                "requests failed while nodes were added or removed or the endpoint moved\n"
                + _lb_log_around(cluster, outside)
            )
            assert len(probe.failures) <= 1, "more than the one request in flight on the lost node failed"
    finally:
        # Back to the old endpoint (with one API server, which restarts: no poller runs now).
        with lb_stack:
            try:
                _restore(cluster, endpoint=old if moved else None)
            finally:
                cluster.kubectl(
                    "-n", "kube-public", "delete", "configmap", CLUSTER_INFO, "--ignore-not-found"
                )
        assert [n.name for n in cluster.state().nodes] == [names[0], f"{cluster.name}-worker-1"]
        assert all(n.joined for n in cluster.state().nodes)
        for node in cluster.state().nodes:
            assert kubelet_server(cluster, node.ip) == old, node.name
