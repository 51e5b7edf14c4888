"""e2e: ``kubeplane reset`` of a control plane node of the shared 3+1 cluster, and its rejoin.

As the third seed's "Resetting a Machine" guide runs it, with our CLI:

1. refused: with etcd stopped on another control plane node (``health --explain`` says so), a
   graceful reset would leave two members of which one is healthy, below the quorum of two: the
   reset is refused before anything changed (the node is not even cordoned), naming the reason;
2. graceful ``reset --reboot`` of the third control plane node: a workload that preferred that
   node moves to another one, etcd has two voting members, the Node object is gone, the API
   answers through the endpoint, and the node waits in maintenance mode;
3. rejoin: the same machine gets its config back with ``apply-config --insecure`` and comes back
   as a new etcd member; ``health`` passes (test_upgrade.py runs on this cluster next and needs
   three voters).
4. stale etcd data, made for real: a graceful reset that keeps etcd's data (``--wipe`` without
   ``etcd``) and the config given back: etcd starts from the data of the member the reset removed,
   its peers refuse it, and ``health --explain`` says so (``etcd-stale-data``) naming the fix,
   ``reset --graceful=false --wipe etcd --reboot``; run as named, the node joins again.
5. a reset for a broken cluster, ``--graceful=false``: no drain, no leave, so etcd still lists the
   node's member; the cleanup the README documents follows from a healthy control plane node,
   ``etcd remove-member NAME`` and ``kubectl delete node NAME``, and the machine rejoins.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from e2e_clients import wait_for_diagnosis, wait_until

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

AGNHOST = "k8s.gcr.io/e2e-test-images/agnhost:2.21"


def voters(cluster: E2ECluster, node: str) -> set[str]:
    result = cluster.cli("-n", node, "etcd", "members", "-o", "json")
    if result.returncode != 0:
        return set()
    members = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return {m["name"] for m in members if not m["learner"]}


def etcd_healthy(cluster: E2ECluster, node: str) -> bool:
    result = cluster.cli("-n", node, "service", "etcd", "-o", "json")
    if result.returncode != 0:
        return False
    document = json.loads(result.stdout.splitlines()[0])
    return bool(document.get("running") and document["health"]["healthy"])


def hostname_of(cluster: E2ECluster, node: str) -> str:
    result = cluster.cli("-n", node, "get", "nodeaddresses", "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    return str(json.loads(result.stdout.splitlines()[0])["spec"]["hostname"])


def node_spec(cluster: E2ECluster, name: str) -> dict[str, Any]:
    """The Node's spec, read with bounded requests: while an etcd member is stopped, a request
    the load balancer sent to that node's kube-apiserver just before its health check dropped it
    hangs, and the next one goes elsewhere."""
    found: dict[str, Any] = {}

    def read() -> bool:
        result = cluster.kubectl("--request-timeout=5s", "get", "node", name, "-o", "json")
        if result.returncode == 0:
            found.update(json.loads(result.stdout)["spec"])
        return result.returncode == 0

    wait_until(f"Node {name} to be readable", read, timeout=60)
    return found


def workload(preferred: str) -> str:
    """A Deployment whose pod prefers ``preferred`` (and tolerates the control plane taints)."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [preferred]}]}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "moving", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "moving"}},
            "template": {
                "metadata": {"labels": {"app": "moving"}},
                "spec": {
                    # The control plane taints only: a pod tolerating every taint would also
                    # tolerate the cordon's (node.kubernetes.io/unschedulable) and come back.
                    "tolerations": [
                        {"key": key, "operator": "Exists", "effect": "NoSchedule"}
                        for key in ("node-role.kubernetes.io/master", "node-role.kubernetes.io/control-plane")
                    ],
                    "affinity": {
                        "nodeAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {"weight": 100, "preference": term}
                            ]
                        }
                    },
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "pause", "image": AGNHOST, "args": ["pause"]}],
                },
            },
        },
    }
    return yaml.safe_dump(deployment)


def ready_pod_node(cluster: E2ECluster) -> str | None:
    result = cluster.kubectl("get", "pods", "-l", "app=moving", "-o", "json")
    if result.returncode != 0:
        return None
    for pod in json.loads(result.stdout)["items"]:
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        if conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp"):
            return str(pod["spec"]["nodeName"])
    return None


def test_reset_refuses_to_break_quorum_then_resets_and_the_node_rejoins(
    cluster_3cp1w: E2ECluster, tmp_path: Path
) -> None:
    cluster = cluster_3cp1w
    first, second, node = cluster.control_plane
    host = hostname_of(cluster, node)
    assert voters(cluster, first) == {hostname_of(cluster, cp) for cp in cluster.control_plane}

    saved = saved_config(cluster, node, tmp_path / "controlplane.yaml")  # to give the machine back

    # 1. Refused while it would cost the quorum.
    stopped = cluster.cli("-n", second, "service", "etcd", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    try:
        # health --explain names it: a stopped etcd on a node that joined (not "waiting to join").
        found = wait_for_diagnosis(cluster, "etcd-not-running", second, quoting="Service stopped", timeout=60)
        assert "was stopped" in found["cause"], found["cause"]
        refused = cluster.cli("-n", node, "reset", "--reboot", timeout=300)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"refusing a graceful reset of {host}" in refused.stderr, refused.stderr
        assert "below the quorum of 2" in refused.stderr, refused.stderr
        spec = node_spec(cluster, host)
        assert not spec.get("unschedulable"), "a refused reset must not cordon the node"
    finally:
        started = cluster.cli("-n", second, "service", "etcd", "start")
        assert started.returncode == 0, started.stdout + started.stderr
        wait_until("etcd on the second node to be healthy again", lambda: etcd_healthy(cluster, second))

    # 2. A graceful reset with a workload on the node.
    applied = subprocess.run(
        [*cluster.kubectl_argv(), "apply", "-f", "-"],
        input=workload(host),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    try:
        wait_until(f"the workload to run on {host}", lambda: ready_pod_node(cluster) == host, timeout=180)
        started_at = time.monotonic()
        result = cluster.cli("-n", node, "reset", "--reboot", timeout=600)
        took = time.monotonic() - started_at
        print(f"reset of {host}: {took:.1f}s\n{result.stdout}")
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"node {host}: cordoned, evicted" in result.stdout and "default/moving-" in result.stdout
        assert (
            f"is in maintenance mode: give it a config with `kubeplane -n {node} apply-config --insecure"
            in (result.stdout)
        )

        assert voters(cluster, first) == {hostname_of(cluster, first), hostname_of(cluster, second)}
        gone = cluster.kubectl("get", "node", host)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout + gone.stderr
        readyz = cluster.kubectl("get", "--raw", "/readyz")
        assert readyz.returncode == 0 and readyz.stdout.strip() == "ok", readyz.stdout + readyz.stderr
        wait_until("the workload to run on another node", lambda: ready_pod_node(cluster) not in (None, host))
        # Only a node in maintenance mode takes a config without a client certificate.
        waiting = cluster.cli("-n", node, "apply-config", "--insecure", "--file", str(saved), "--dry-run")
        assert waiting.returncode == 0, waiting.stdout + waiting.stderr
        assert "dry run, nothing applied" in waiting.stdout, waiting.stdout
    finally:
        cluster.kubectl("delete", "deployment", "moving", "--wait=false")

    # 3. The same machine rejoins with its config.
    started_at = time.monotonic()
    rejoin = cluster.cli("-n", node, "apply-config", "--insecure", "--file", str(saved), timeout=120)
    assert rejoin.returncode == 0, rejoin.stdout + rejoin.stderr
    wait_until(
        "the node to be an etcd voter again",
        lambda: voters(cluster, first) == {hostname_of(cluster, cp) for cp in (first, second)} | {host},
        timeout=300,
    )
    health = cluster.cli("health", "--wait-timeout", "5m", timeout=400)
    assert health.returncode == 0, health.stdout + health.stderr
    print(f"rejoin of {host}: healthy after {time.monotonic() - started_at:.1f}s")


def saved_config(cluster: E2ECluster, node: str, path: Path) -> Path:
    """The node's machine config in a file (the admin may read it whole, secrets included)."""
    shown = cluster.cli("-n", node, "get", "mc", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    path.write_text(yaml.safe_dump(json.loads(shown.stdout.splitlines()[0])["spec"], sort_keys=False))
    return path


def test_etcd_data_kept_by_a_reset_is_diagnosed_as_stale_and_the_named_fix_works(
    cluster_3cp1w: E2ECluster, tmp_path: Path
) -> None:
    cluster = cluster_3cp1w
    first, _, node = cluster.control_plane
    host = hostname_of(cluster, node)
    everyone = {hostname_of(cluster, cp) for cp in cluster.control_plane}
    wait_until("three etcd voters", lambda: voters(cluster, first) == everyone, timeout=300)
    saved = saved_config(cluster, node, tmp_path / "controlplane.yaml")

    reset = cluster.cli("-n", node, "reset", "--reboot", "--wipe", "state,kubelet,containerd", timeout=600)
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert voters(cluster, first) == everyone - {host}
    rejoin = cluster.cli("-n", node, "apply-config", "--insecure", "--file", str(saved), timeout=120)
    assert rejoin.returncode == 0, rejoin.stdout + rejoin.stderr
    try:
        found = wait_for_diagnosis(cluster, "etcd-stale-data", node, quoting="removed", timeout=240)
        assert "stale data" in found["cause"]
        fix = f"kubeplane -n {node} reset --graceful=false --wipe etcd --reboot"
        assert found["commands"][0] == fix, found["commands"]
    finally:
        # The fix, as the diagnosis names it.
        fixed = cluster.cli(
            "-n", node, "reset", "--graceful=false", "--wipe", "etcd", "--reboot", timeout=600
        )
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        wait_until(
            "the node to be an etcd voter again", lambda: voters(cluster, first) == everyone, timeout=300
        )
        health = cluster.cli("health", "--wait-timeout", "5m", timeout=400)
        assert health.returncode == 0, health.stdout + health.stderr


def test_a_forced_reset_is_cleaned_up_with_remove_member_and_the_node_rejoins(
    cluster_3cp1w: E2ECluster, tmp_path: Path
) -> None:
    cluster = cluster_3cp1w
    first, _, node = cluster.control_plane
    host = hostname_of(cluster, node)
    everyone = {hostname_of(cluster, cp) for cp in cluster.control_plane}
    wait_until("three etcd voters", lambda: voters(cluster, first) == everyone, timeout=300)
    saved = saved_config(cluster, node, tmp_path / "controlplane.yaml")

    forced = cluster.cli("-n", node, "reset", "--graceful=false", "--reboot", timeout=600)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "cordoned" not in forced.stdout, forced.stdout
    # Nothing left etcd: the member is still listed, its Node still there.
    assert voters(cluster, first) == everyone
    assert cluster.kubectl("get", "node", host).returncode == 0

    removed = cluster.cli("-n", first, "etcd", "remove-member", host)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert voters(cluster, first) == everyone - {host}
    deleted = cluster.kubectl("delete", "node", host)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    readyz = cluster.kubectl("get", "--raw", "/readyz")
    assert readyz.returncode == 0 and readyz.stdout.strip() == "ok", readyz.stdout + readyz.stderr

    rejoin = cluster.cli("-n", node, "apply-config", "--insecure", "--file", str(saved), timeout=120)
    assert rejoin.returncode == 0, rejoin.stdout + rejoin.stderr
    wait_until("the node to be an etcd voter again", lambda: voters(cluster, first) == everyone, timeout=300)
    health = cluster.cli("health", "--wait-timeout", "5m", timeout=400)
    assert health.returncode == 0, health.stdout + health.stderr
