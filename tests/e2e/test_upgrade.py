"""e2e: ``kubeplane upgrade-k8s`` on a local 3 control plane + 1 worker cluster.

Uses the shared 3+1 cluster of the e2e conftest (``cluster_3cp1w``, at v1.20.2, which
test_cluster.py has only looked at), aliased here as ``cluster``:

- ``cluster.env``: environment for running the CLI against it (``KUBEPLANECONFIG`` = its client
  config, ``KUBEPLANE_STATE`` = the state directory holding it, so the CLI finds its haproxy);
- ``cluster.kubeconfig``: path of its admin kubeconfig (server = the haproxy endpoint);
- ``cluster.endpoint``: ``https://10.5.0.1:6443``;
- ``cluster.control_plane`` / ``cluster.workers``: node IP addresses (3 and 1);
- ``cluster.haproxy``: its :class:`kubeplane.provision.loadbalancer.HAProxy` (admin socket).

The tests run in order on the same cluster: checks that must change nothing first (dry run, bad
targets, an unreachable node), then the upgrade itself (killed three times and re-run) with two
clients listing pods through the endpoint every 100 ms the whole time, over HTTP/1.1 on a kept-alive
connection and over HTTP/2, neither seeing a failed request; then the final state: every
pod's image, every running binary's ``--version``, ``health``. Last, one control plane node goes
down for good: the API keeps answering through the endpoint and ``health`` names that node.

The target images come through the cluster registry, which ``cluster create`` seeds with every
complete toolchain build in the cache (scripts/setup builds the target with
``KUBEPLANE_EXTRA_VERSIONS``).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from e2e_clients import ApiPoller, Http2Poller, Run, api_client, run_cli
from kubernetes import client as k8s_client

from kubeplane.provision import hostproc, leftovers, teardown

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(cluster_3cp1w: E2ECluster) -> E2ECluster:
    return cluster_3cp1w


TARGET = "v1.20.2-kp.1"
#: A version the path check accepts but whose images exist nowhere: the pre-pull must stop it.
MISSING = "v1.20.9"
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
KCPC = "kcpc"
PATCHED = re.compile(r"^ > patched (?P<path>\S+) = (?P<image>\S+) on node (?P<node>\S+)")
STEP_DONE = re.compile(r"^ < (?P<what>done|already at target, skipped) \((?P<seconds>[\d.]+)s\)")
STEP_START = re.compile(
    r"^\[(?P<index>\d+)/(?P<total>\d+)\] (?P<kind>\S+) (?P<component>\S+) (?P<where>.*?):"
)


def step_seconds(lines: Sequence[str]) -> list[tuple[str, str, float, str]]:
    """``(component, where, seconds, done|skipped)`` of every finished step in a run's output."""
    steps: list[tuple[str, str, float, str]] = []
    current: tuple[str, str] | None = None
    for line in lines:
        if match := STEP_START.match(line):
            current = (match["component"], match["where"])
        elif (match := STEP_DONE.match(line)) and current is not None:
            steps.append((*current, float(match["seconds"]), match["what"]))
    return steps


def kcpc_versions(env: Mapping[str, str], nodes: Sequence[str]) -> dict[tuple[str, str], int]:
    """``(node, component) -> kcpc version`` read with ``kubeplane get kcpc -o json``."""
    versions = {}
    for component in COMPONENTS:
        run = run_cli(env, "-n", ",".join(nodes), "get", KCPC, component, "-o", "json")
        assert run.returncode == 0, "\n".join(run.lines)
        for line in run.lines:
            if line.startswith("{"):
                document = yaml.safe_load(line)
                versions[(document["node"], component)] = int(document["metadata"]["version"])
    assert len(versions) == len(nodes) * len(COMPONENTS), versions
    return versions


def test_dry_run_changes_nothing(cluster: Any) -> None:
    before = kcpc_versions(cluster.env, cluster.control_plane)
    run = run_cli(cluster.env, "upgrade-k8s", "--to", TARGET, "--dry-run")
    assert run.returncode == 0, "\n".join(run.lines)
    output = "\n".join(run.lines)
    assert "dry run: nothing was changed" in output
    for node in cluster.control_plane:
        assert f"static-pod kube-apiserver on node {node}: " in output
    assert (
        f"kube-proxy cluster-wide: k8s.gcr.io/kube-proxy:v1.20.2 -> k8s.gcr.io/kube-proxy:{TARGET}" in output
    )
    # The upgrade guide's form: --nodes names one control plane node to talk through; the plan
    # still covers all of them (it crashed with a KeyError on a 3-node control plane).
    guide = run_cli(
        cluster.env, "-n", cluster.control_plane[1], "upgrade-k8s", "--from", "v1.20.2", "--to", TARGET,
        "--dry-run",
    )  # fmt: skip
    assert guide.returncode == 0, "\n".join(guide.lines)
    guide_output = "\n".join(guide.lines)
    assert "Traceback" not in guide_output
    for node in cluster.control_plane:
        for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            assert f"static-pod {component} on node {node}: " in guide_output
    assert kcpc_versions(cluster.env, cluster.control_plane) == before


def test_bad_target_and_unsupported_path_fail_before_any_change(cluster: Any) -> None:
    before = kcpc_versions(cluster.env, cluster.control_plane)
    malformed = run_cli(cluster.env, "upgrade-k8s", "--to", "v1.20")
    assert malformed.returncode == 1
    assert "malformed target version (--to) 'v1.20'" in "\n".join(malformed.lines)
    unsupported = run_cli(cluster.env, "upgrade-k8s", "--to", "v1.22.0")
    assert unsupported.returncode == 1
    assert "unsupported upgrade path: v1.20.2 -> v1.22.0" in "\n".join(unsupported.lines)
    older = run_cli(cluster.env, "upgrade-k8s", "--to", "v1.20.1")
    assert older.returncode == 1
    assert "v1.20.1 is older than the running v1.20.2: refusing to downgrade" in "\n".join(older.lines)
    missing = run_cli(cluster.env, "upgrade-k8s", "--to", MISSING)
    assert missing.returncode == 1
    output = "\n".join(missing.lines)
    assert f"Error: nothing was changed: image k8s.gcr.io/kube-apiserver:{MISSING} cannot be pulled" in output
    assert not any(PATCHED.match(line) for line in missing.lines), output
    assert kcpc_versions(cluster.env, cluster.control_plane) == before
    assert all(status.in_rotation for status in cluster.haproxy.server_states().values())


def test_unreachable_node_fails_before_any_change(cluster: Any) -> None:
    before = kcpc_versions(cluster.env, cluster.control_plane)
    worker = next(node for node in cluster.state().nodes if node.role == "worker")
    agent = worker.processes["kubeplaned"]
    assert hostproc.is_running(agent), f"the agent of {worker.name} is not running"
    # A stopped agent keeps its socket: connections hang as they would to a frozen machine.
    os.kill(agent.pid, signal.SIGSTOP)
    try:
        run = run_cli(cluster.env, "upgrade-k8s", "--to", TARGET)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    output = "\n".join(run.lines)
    assert run.returncode == 1, output
    assert "Error: nothing was changed: node(s) not reachable through the node API:" in output
    assert f"{worker.name} ({worker.ip}):" in output
    assert kcpc_versions(cluster.env, cluster.control_plane) == before


def _second_apiserver_patched(second: str) -> Callable[[list[str]], bool]:
    # Killed right after the patch: the node is out of the rotation and its pod is restarting.
    return lambda lines: any(
        (m := PATCHED.match(line)) and m["node"] == second and "apiServer" in m["path"] for line in lines
    )


def _waiting_for_controller_manager(lines: list[str]) -> bool:
    # Killed while waiting for a new pod: the patch is applied, the pod is not verified yet.
    return any(line.startswith(" > waiting for pod kube-controller-manager on node ") for line in lines)


def _daemonset_patched(lines: list[str]) -> bool:
    # Killed between the DaemonSet patch and the machine configs' proxy image (the drift window).
    return any(line.startswith(" > set DaemonSet kube-system/kube-proxy image to ") for line in lines)


def running_versions(cluster: Any) -> dict[tuple[str, str], str]:
    """``(node, program) -> output of --version`` of every Kubernetes program running in a node."""
    found = {}
    for node in cluster.state().nodes:
        for pid in leftovers.netns_members(node.netns):
            try:
                program = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if program.startswith("kube-"):
                # The process's own executable (inside its container's root file system).
                result = subprocess.run(
                    [f"/proc/{pid}/exe", "--version"], capture_output=True, text=True, timeout=30, check=False
                )
                found[(node.name, program)] = result.stdout.strip() or result.stderr.strip()
    return found


def test_upgrade_killed_three_times_completes_without_failed_requests(cluster: Any) -> None:
    second = cluster.control_plane[1]
    kill_points = (_second_apiserver_patched(second), _waiting_for_controller_manager, _daemonset_patched)
    runs: list[Run] = []
    with ApiPoller(Path(cluster.kubeconfig)) as probe, Http2Poller(Path(cluster.kubeconfig)) as h2_probe:
        for kill_when in kill_points:
            run = run_cli(cluster.env, "upgrade-k8s", "--to", TARGET, kill_when=kill_when)
            assert run.killed, "the run ended before its kill point:\n" + "\n".join(run.lines)
            runs.append(run)
        final = run_cli(cluster.env, "upgrade-k8s", "--to", TARGET)
        runs.append(final)
    assert final.returncode == 0, "\n".join(final.lines)
    for run in runs:
        print(f"run ended (killed={run.killed}, exit {run.returncode}) after: {run.lines[-1]}")
    print(
        f"API requests through the endpoint: {probe.requests}, failed: {len(probe.failures)} "
        f"(keep-alive connection closed by a stopping API server: {len(probe.closed)}); over HTTP/2: "
        f"{h2_probe.requests}, failed: {len(h2_probe.failures)}, sent again after a GOAWAY: "
        f"{len(h2_probe.retried)}, longest gap {h2_probe.longest_gap:.1f}s"
    )
    for failure in [*probe.failures, *h2_probe.failures]:
        print(f"  {failure}")

    # Nothing was changed twice: each image path on each node was patched exactly once.
    patched = Counter(
        (m["node"], m["path"]) for run in runs for line in run.lines if (m := PATCHED.match(line))
    )
    assert set(patched.values()) == {1}, patched
    # Every component on every node was patched by some run (a proxy image patch may have landed
    # unreported in the instant before a kill: the next run then found it done).
    component_paths = {(node, path) for node, path in patched if not path.endswith("/proxy/image")}
    assert len(component_paths) == len(cluster.control_plane) * len(COMPONENTS), patched
    daemonset_sets = [line for run in runs for line in run.lines if line.startswith(" > set DaemonSet")]
    assert len(daemonset_sets) == 1, daemonset_sets
    # The node a kill left drained was taken out again only by the run that patched it.
    drains = Counter(line for run in runs for line in run.lines if "out of the load balancer" in line)
    assert len(drains) == len(cluster.control_plane) and set(drains.values()) == {1}, drains

    core = k8s_client.CoreV1Api(api_client(Path(cluster.kubeconfig), retries=True))
    for component in (*COMPONENTS, "kube-proxy"):
        pods = core.list_namespaced_pod("kube-system", label_selector=f"k8s-app={component}").items
        assert pods, component
        for pod in pods:
            assert pod.spec is not None and pod.metadata is not None
            images = [str(container.image) for container in pod.spec.containers]
            assert [image.rsplit(":", 1)[1] for image in images] == [TARGET], (pod.metadata.name, images)
    version = k8s_client.VersionApi(api_client(Path(cluster.kubeconfig), retries=True)).get_code()
    assert version.git_version == TARGET
    # The rotation was restored for every node, even the one a kill left drained.
    states = cluster.haproxy.server_states()
    assert len(states) == len(cluster.control_plane)
    assert all(status.in_rotation for status in states.values()), states
    versions = running_versions(cluster)
    programs = Counter(program for _, program in versions)
    # kube-controller-manager's process name is cut to 15 characters by the kernel.
    assert programs == {"kube-apiserver": 3, "kube-controller": 3, "kube-scheduler": 3, "kube-proxy": 4}, (
        versions
    )
    assert set(versions.values()) == {f"Kubernetes {TARGET}"}, versions
    health = cluster.cli("health", "--wait-timeout", "3m")
    assert health.returncode == 0, health.stdout + health.stderr
    steps = [s for run in runs for s in step_seconds(run.lines) if s[3] == "done" and s[0] in COMPONENTS]
    if steps:
        print(f"median seconds per component-node step: {statistics.median(s[2] for s in steps):.1f}")
    # A client as kubectl and client-go are (HTTP/2: a stopping API server says GOAWAY first, and
    # a GET it left unanswered is sent again) sees no failure at all.
    assert h2_probe.failures == [], f"{len(h2_probe.failures)} of {h2_probe.requests} HTTP/2 requests failed"
    assert set(h2_probe.versions) == {"HTTP/2"}, h2_probe.versions
    # A request sent again because a stopping API server ended its connection: at most one per
    # API server restart (the poller has one connection at a time).
    assert len(h2_probe.retried) <= len(cluster.control_plane), h2_probe.retried
    # Nor does an HTTP/1.1 client without retries on its kept-alive connection: a stopping API
    # server keeps answering for its shutdown delay and ends each answer with "Connection: close"
    # (kubeplane's kube-apiserver build), so the client reconnects, through the load balancer, to
    # another node before any idle connection is closed under it.
    assert probe.failures == [], f"{len(probe.failures)} of {probe.requests} API requests failed"


def test_one_control_plane_node_down_keeps_the_api_answering(cluster_3cp1w: E2ECluster) -> None:
    """Runs last on the shared 3+1 cluster: it takes a node down for good."""
    down = cluster_3cp1w.state().nodes[1]
    assert down.role == "controlplane"
    teardown.stop_node(down)
    cluster_3cp1w.haproxy.wait_status(down.name, until="out", timeout=15)
    for _ in range(5):
        result = cluster_3cp1w.kubectl("get", "nodes")
        assert result.returncode == 0, result.stderr
    health = cluster_3cp1w.cli("health", "--wait-timeout", "90s")
    assert health.returncode == 1
    assert f"failing nodes: {down.ip}\n" in health.stderr, health.stdout + health.stderr
    assert "waiting for the Kubernetes API to answer through the endpoint: OK" in health.stdout
