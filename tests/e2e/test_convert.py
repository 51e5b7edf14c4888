"""e2e: ``kubeplane convert-k8s`` on a real self-hosted cluster (``cluster_selfhosted`` fixture).

One self-hosted cluster (3 control planes + 1 worker) serves the whole module, so the tests run
in order and each starts where the previous one left the cluster:

1. the cluster is self-hosted and healthy, and a workload is created on the worker;
2. steps 1-4 of the guide's manual procedure: ``get bs``, the service account key and a new
   aggregator CA patched in with ``patch mc --immediate``, ``get staticpods`` and
   ``get manifests`` on every control plane node; still self-hosted and healthy;
3. an interactive run through a pseudo-terminal answered ``no`` at the first prompt reuses the
   CA patched in by hand, aborts and leaves the control plane self-hosted and healthy;
4. ``convert-k8s --force`` SIGKILLed at each phase (after the config patch, after the
   checkpointer deletion, after the key removal, between the kube-controller-manager and
   kube-scheduler DaemonSet deletions that precede it in a run's first pass), then re-run
   to completion, while a client polls the API through the endpoint: kube-apiserver is handed
   over node by node out of the load balancer's rotation, so no request fails (the reference
   replaces every API server at once). Over HTTP/2 (as kubectl and client-go talk) nothing may
   fail; over HTTP/1.1 the one allowance is ``upgrade-k8s``'s, a kept-alive connection a
   stopping API server closes as a request goes out, at most one per node;
5. the final state: not self-hosted, the static pods Ready, DaemonSets and checkpoints gone, the
   workload still running the same pod, ``health`` passes.
"""

from __future__ import annotations

import base64
import json
import os
import pty
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from e2e_clients import KUBEPLANE, ApiPoller, Http2Poller, Run, api_client, run_cli
from kubernetes import client as k8s_client

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e


COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
DAEMONSETS = (*COMPONENTS, "pod-checkpointer")
CHECKPOINT_OF = "checkpointer.alpha.coreos.com/checkpoint-of"
SECRETS_VERSION = "kubeplane.dev/secrets-version"
WORKLOAD = "pause-before-conversion"
RUN_TIMEOUT = 900
#: The guide's manual step 3: a new aggregator CA, made with openssl (docs/convert.md).
OPENSSL_CA = ("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
FIRST_PROMPT = "confirm disabling pod-checkpointer to proceed with control plane update [yes/no]:"

#: Output lines after which a run is SIGKILLed, in the order the conversion reaches them.
#: Lines of the progress display (`` > `` is what happens inside a step) a run is killed at.
KILL_POINTS = {
    "after config patch": " > waiting for static pod definitions to be generated",
    "after checkpointer deletion": " > waiting for pod-checkpointer pods to terminate",
    "after key removal": " > waiting for the kube-apiserver static pod to be rendered",
    "between DaemonSet deletions": ' > deleting daemonset "kube-scheduler"',
}


def apis(cluster: E2ECluster) -> tuple[Any, Any]:
    """(CoreV1Api, AppsV1Api) of the cluster, with retries."""
    client = api_client(cluster.kubeconfig)
    return k8s_client.CoreV1Api(client), k8s_client.AppsV1Api(client)


def _last_line_starts(prefix: str) -> Callable[[list[str]], bool]:
    return lambda lines: lines[-1].startswith(prefix)


def convert_args(cluster: E2ECluster, *extra: str) -> tuple[str, ...]:
    return ("-n", cluster.control_plane[0], "convert-k8s", "--endpoint", cluster.endpoint, *extra)


def self_hosted(cluster: E2ECluster) -> bool:
    result = cluster.cli("-n", cluster.control_plane[0], "get", "bs", "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    return bool(json.loads(result.stdout.splitlines()[0])["spec"]["selfHostedControlPlane"])


def self_hosted_problems(cluster: E2ECluster) -> list[str]:
    """Why the self-hosted control plane is not healthy: a DaemonSet not Ready everywhere, or a
    static (non-checkpoint) control plane pod, which the agents must not write in this mode."""
    core, apps = apis(cluster)
    problems = []
    daemonsets = {ds.metadata.name: ds for ds in apps.list_namespaced_daemon_set("kube-system").items}
    for name in DAEMONSETS:
        ds = daemonsets.get(name)
        desired = ds.status.desired_number_scheduled if ds else 0
        ready = ds.status.number_ready if ds else 0
        if not desired or ready < desired:
            problems.append(f"DaemonSet {name}: {ready}/{desired} ready")
    for pod in core.list_namespaced_pod("kube-system").items:
        annotations = pod.metadata.annotations or {}
        if annotations.get(SECRETS_VERSION) and CHECKPOINT_OF not in annotations:
            problems.append(f"static pod {pod.metadata.name}")
    return problems


def wait_for(what: str, check: Callable[[], list[str]], *, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while problems := check():
        assert time.monotonic() < deadline, f"{what}: {problems}"
        time.sleep(3)


def checkpoint_problems(cluster: E2ECluster) -> list[str]:
    """Checkpoints (their mirror pods) that are not where they belong: each control plane node
    runs exactly one active checkpoint, its own checkpointer's, and never one of another node's pod."""
    core, _ = apis(cluster)
    pods = core.list_namespaced_pod("kube-system").items
    node_of = {p.metadata.name: p.spec.node_name for p in pods}
    problems = []
    for node in (n.name for n in cluster.state().nodes if n.role == "controlplane"):
        parents = [
            p.metadata.annotations[CHECKPOINT_OF]
            for p in pods
            if p.spec.node_name == node and CHECKPOINT_OF in (p.metadata.annotations or {})
        ]
        own = len(parents) == 1 and parents[0].startswith("pod-checkpointer-")
        if not own or node_of.get(parents[0]) != node:
            problems.append(f"{node}: checkpoints of {[(parent, node_of.get(parent)) for parent in parents]}")
    return problems


def checkpointer_diagnostics(cluster: E2ECluster) -> str:
    """What each control plane node's checkpointers did and what its kubelet runs: printed when a
    conversion run fails, so a failure in CI can be understood from its log alone."""
    report = []
    for node in cluster.control_plane:
        listed = cluster.cli("-n", node, "containers", "-k", "-o", "json")
        report.append(f"== {node}: containers -k\n{listed.stdout}{listed.stderr}")
        containers = [json.loads(doc) for doc in listed.stdout.splitlines() if doc.strip()]
        for container in containers:
            if container.get("name") != "pod-checkpointer":
                continue
            ref = f"{container['namespace']}/{container['pod']}:{container['name']}"
            logs = cluster.cli("-n", node, "logs", "-k", "--tail", "80", ref)
            report.append(f"== {node}: logs {ref} ({container.get('state')})\n{logs.stdout}{logs.stderr}")
    for node in cluster.state().nodes:
        manifests = Path(node.root_dir) / "etc" / "kubernetes" / "manifests"
        listed_files = sorted(p.name for p in manifests.iterdir()) if manifests.is_dir() else "missing"
        report.append(f"== {node.name}: {manifests.name}: {listed_files}")
    return "\n".join(report)


def workload_pods(cluster: E2ECluster) -> list[Any]:
    core, _ = apis(cluster)
    return list(core.list_namespaced_pod("default", label_selector=f"app={WORKLOAD}").items)


def test_self_hosted_cluster_runs_daemonsets_and_a_workload(cluster_selfhosted: E2ECluster) -> None:
    cluster = cluster_selfhosted
    assert self_hosted(cluster)
    wait_for("self-hosted control plane healthy", lambda: self_hosted_problems(cluster))
    wait_for("one checkpoint per node, its checkpointer's", lambda: checkpoint_problems(cluster), timeout=60)
    worker = cluster.state().nodes[-1]
    assert worker.role == "worker"
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": WORKLOAD, "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": WORKLOAD}},
            "template": {
                "metadata": {"labels": {"app": WORKLOAD}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": worker.name},
                    "containers": [{"name": "pause", "image": "k8s.gcr.io/pause:3.2"}],
                },
            },
        },
    }
    apis(cluster)[1].create_namespaced_deployment("default", deployment)

    def not_running() -> list[str]:
        pods = workload_pods(cluster)
        running = [p for p in pods if p.status.phase == "Running"]
        return [] if running else [f"{p.metadata.name}: {p.status.phase}" for p in pods] or ["no pod"]

    wait_for("workload running", not_running)


def test_dry_run_prints_the_plan_and_changes_nothing(cluster_selfhosted: E2ECluster) -> None:
    cluster = cluster_selfhosted
    before = cluster.cli("-n", cluster.control_plane[0], "get", "mc", "-o", "yaml")
    assert before.returncode == 0, before.stderr
    result = cluster.cli("-n", cluster.control_plane[0], "convert-k8s", "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "convert-k8s (self-hosted: true)" in result.stdout
    for ip in cluster.control_plane:
        assert f"patch machine config on node {ip}: self-hosted -> " in result.stdout
    for ip in cluster.control_plane:  # the API servers, node by node behind the load balancer
        assert f"hand over kube-apiserver on node {ip}: DaemonSet pod -> static pod" in result.stdout
    for component in COMPONENTS[1:]:
        assert f"replace {component} cluster-wide: DaemonSet -> static pods on " in result.stdout
    assert result.stdout.rstrip().endswith("dry run: nothing was changed")
    # Nothing moved: still self-hosted, the same machine config, and no operation Lease taken.
    assert self_hosted(cluster)
    after = cluster.cli("-n", cluster.control_plane[0], "get", "mc", "-o", "yaml")
    assert after.stdout == before.stdout
    lease = cluster.kubectl("-n", "kube-system", "get", "lease", "kubeplane-cluster-operation")
    assert lease.returncode != 0 and "NotFound" in lease.stderr, lease.stdout + lease.stderr


def test_manual_steps_patch_the_keys_and_render_static_pods(
    cluster_selfhosted: E2ECluster, tmp_path: Path
) -> None:
    """Steps 1-4 of the guide's manual procedure (docs/convert.md), as a user types them; the
    automated runs that follow must reuse what they patched in."""
    cluster = cluster_selfhosted
    nodes = ",".join(cluster.control_plane)
    assert self_hosted(cluster)
    key = cluster.kubectl(
        "-n",
        "kube-system",
        "get",
        "secrets",
        "kube-controller-manager",
        "-o",
        r"jsonpath={.data.service\-account\.key}",
    )
    assert key.returncode == 0 and key.stdout, key.stderr
    patch = [{"op": "add", "path": "/cluster/serviceAccount", "value": {"key": key.stdout}}]
    patched = cluster.cli("-n", nodes, "patch", "mc", "--immediate", "-p", json.dumps(patch))
    assert patched.returncode == 0, patched.stdout + patched.stderr
    made = subprocess.run(
        [*OPENSSL_CA, "-days", "3650", "-subj", "/CN=front-proxy", "-keyout", "agg.key", "-out", "agg.crt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    value = {
        "crt": base64.b64encode((tmp_path / "agg.crt").read_bytes()).decode(),
        "key": base64.b64encode((tmp_path / "agg.key").read_bytes()).decode(),
    }
    patch = [{"op": "add", "path": "/cluster/aggregatorCA", "value": value}]
    patched = cluster.cli("-n", nodes, "patch", "mc", "--immediate", "-p", json.dumps(patch))
    assert patched.returncode == 0, patched.stdout + patched.stderr

    def not_rendered() -> list[str]:
        problems = []
        for kind, expected in (("staticpods", set(COMPONENTS)), ("manifests", None)):
            result = cluster.cli("-n", nodes, "get", kind, "-o", "json")
            assert result.returncode == 0, result.stdout + result.stderr
            documents = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
            for ip in cluster.control_plane:
                ids = {d["metadata"]["id"] for d in documents if d.get("node") == ip}
                if (expected is not None and ids != expected) or not ids:
                    problems.append(f"{ip} {kind}: {sorted(ids)}")
        return problems

    wait_for("static pods and manifests rendered on every control plane node", not_rendered, timeout=120)
    # Still self-hosted: nothing is handed over until the initialized key is removed.
    assert self_hosted(cluster)
    wait_for("self-hosted control plane healthy after the patches", lambda: self_hosted_problems(cluster))


def test_interactive_no_at_first_prompt_keeps_it_self_hosted(cluster_selfhosted: E2ECluster) -> None:
    cluster = cluster_selfhosted
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [KUBEPLANE, *convert_args(cluster)],
        env={**os.environ, **cluster.env},
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        start_new_session=True,
    )
    os.close(secondary)
    output = b""
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        answered = False
        while True:
            assert time.monotonic() < deadline, output.decode(errors="replace")
            ready, _, _ = select.select([primary], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(primary, 4096)
                except OSError:  # EIO: the process closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            if not answered and FIRST_PROMPT.encode() in output:
                os.write(primary, b"no\n")
                answered = True
            if process.poll() is not None and not ready:
                break
        process.wait(timeout=30)
    finally:
        os.close(primary)
        if process.poll() is None:
            process.kill()
            process.wait()
    text = output.decode(errors="replace").replace("\r\n", "\n")
    print(text)
    assert answered, text
    assert process.returncode == 1, text
    assert "aborted" in text
    assert "deleting daemonset" not in text
    assert self_hosted(cluster)
    wait_for("self-hosted control plane healthy after 'no'", lambda: self_hosted_problems(cluster))


def test_killed_at_each_phase_then_rerun_completes(cluster_selfhosted: E2ECluster) -> None:
    cluster = cluster_selfhosted
    runs: list[tuple[str, Run]] = []
    with (
        ApiPoller(cluster.kubeconfig, interval=0.2) as poller,
        Http2Poller(cluster.kubeconfig, interval=0.2) as h2,
    ):
        for phase, line in KILL_POINTS.items():
            run = run_cli(
                cluster.env, *convert_args(cluster, "--force"), kill_when=_last_line_starts(line), echo=True
            )
            runs.append((phase, run))
            if not run.killed:
                print(checkpointer_diagnostics(cluster))
            assert run.killed, f"the run ended before its kill point ({phase}):\n" + "\n".join(run.lines)
        final = run_cli(cluster.env, *convert_args(cluster, "--force"), echo=True)
        runs.append(("final", final))
        if final.returncode != 0:
            print(checkpointer_diagnostics(cluster))
    for phase, run in runs:
        print(f"run killed {phase}: {run.seconds:.0f}s, last line: {run.lines[-1]}")
    print(
        f"API requests through the endpoint: {poller.requests}, failed: {len(poller.failures)} "
        f"(keep-alive connection closed by a stopping API server: {len(poller.closed)}), "
        f"longest gap without a successful request: {poller.longest_gap:.1f}s"
    )
    print(
        f"over HTTP/2: {h2.requests}, failed: {len(h2.failures)}, sent again after a GOAWAY: "
        f"{len(h2.retried)}, longest gap: {h2.longest_gap:.1f}s"
    )
    for failure in [*poller.failures, *h2.failures, *h2.retried]:
        print(f"  {failure}")
    assert final.returncode == 0, "\n".join(final.lines)
    # Every control plane node left the rotation for its hand-over (in whichever run reached it).
    drained = {
        line.split("taking node ", 1)[1].split()[0]
        for _, run in runs
        for line in run.lines
        if "out of the load balancer rotation" in line and "taking node " in line
    }
    assert len(drained) == len(cluster.control_plane), [line for _, run in runs for line in run.lines]
    others = [failure for failure in poller.failures if failure not in poller.closed]
    assert others == [], f"{len(poller.failures)} of {poller.requests} API requests failed"
    assert len(poller.closed) <= len(cluster.control_plane), poller.closed
    # As kubectl and client-go talk (HTTP/2; a GET a GOAWAY left unanswered is sent again, at most
    # once per API server stop): no failure.
    assert h2.failures == [], f"{len(h2.failures)} of {h2.requests} HTTP/2 requests failed"
    assert set(h2.versions) == {"HTTP/2"}, h2.versions
    assert len(h2.retried) <= len(cluster.control_plane), h2.retried
    assert "conversion process completed successfully" in final.lines
    # The aggregator CA patched in by hand is reused by every run.
    assert not any("generating new CA" in line for _, run in runs for line in run.lines)
    assert any("reusing the aggregator CA" in line for line in runs[0][1].lines)


def test_converted_cluster_runs_static_pods(cluster_selfhosted: E2ECluster) -> None:
    cluster = cluster_selfhosted
    assert not self_hosted(cluster)
    core, apps = apis(cluster)
    names = {node.ip: node.name for node in cluster.state().nodes}

    def static_pods_not_ready() -> list[str]:
        pods = core.list_namespaced_pod("kube-system").items
        problems = []
        for ip in cluster.control_plane:
            for component in COMPONENTS:
                mine = [
                    p
                    for p in pods
                    if p.spec.node_name == names[ip]
                    and (p.metadata.labels or {}).get("k8s-app") == component
                    and (p.metadata.annotations or {}).get(SECRETS_VERSION)
                    and any(ref.kind == "Node" for ref in p.metadata.owner_references or ())
                ]
                ready = [
                    p
                    for p in mine
                    if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
                ]
                if not ready:
                    problems.append(f"{names[ip]}/{component}: {len(mine)} static pods, none Ready")
        return problems

    wait_for("static control plane pods Ready", static_pods_not_ready)
    left = {ds.metadata.name for ds in apps.list_namespaced_daemon_set("kube-system").items} & set(DAEMONSETS)
    assert not left, f"DaemonSets left: {left}"
    checkpoints = [
        p.metadata.name
        for p in core.list_namespaced_pod("kube-system").items
        if CHECKPOINT_OF in (p.metadata.annotations or {})
    ]
    assert not checkpoints, checkpoints
    running = [p for p in workload_pods(cluster) if p.status.phase == "Running"]
    assert running, "the workload created before the conversion no longer runs"
    health = cluster.cli("health", "--wait-timeout", "3m")
    assert health.returncode == 0, health.stdout + health.stderr
