"""e2e: the control plane a node agent builds (issues 5 and 6), on the shared 1+1 cluster.

Everything goes through the ``kubeplane`` CLI and kubectl, as a user would: the resources the
controllers publish, the static pods' mirror pods with their annotations, the bootstrap
manifests in the API server, node roles and approved CSRs, ``kubeplane kubeconfig``, a refused
second bootstrap, a worker without CA keys, extra manifests where one bad entry blocks nothing,
and an ``extraArgs`` patch that rolls only kube-apiserver. The tests that change the cluster run
last in this module and leave it healthy.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from e2e_clients import wait_until

from kubeplane.provision import netns, toolchain

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
CONFIG_VERSION = "kubeplane.dev/config-version"
SECRETS_VERSION = "kubeplane.dev/secrets-version"


def resources(cluster: E2ECluster, node: str, *args: str) -> list[dict[str, Any]]:
    result = cluster.cli("-n", node, "get", *args, "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def kube_json(cluster: E2ECluster, *args: str) -> dict[str, Any]:
    result = cluster.kubectl("get", *args, "-o", "json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def mirror_pods(cluster: E2ECluster) -> dict[str, dict[str, Any]]:
    pods = kube_json(cluster, "pods", "-n", "kube-system")["items"]
    return {
        p["metadata"]["labels"]["k8s-app"]: p
        for p in pods
        if p["metadata"].get("labels", {}).get("k8s-app") in COMPONENTS
        and any(o.get("kind") == "Node" for o in p["metadata"].get("ownerReferences", []))
    }


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def kcpc_versions(cluster: E2ECluster, node: str) -> dict[str, int]:
    return {r["metadata"]["id"]: r["metadata"]["version"] for r in resources(cluster, node, "kcpc")}


def test_controllers_publish_the_control_plane_resources(cluster_1cp1w: E2ECluster) -> None:
    node = cluster_1cp1w.control_plane[0]
    assert {r["metadata"]["id"] for r in resources(cluster_1cp1w, node, "staticpods")} == set(COMPONENTS)
    assert set(kcpc_versions(cluster_1cp1w, node)) == {*COMPONENTS, "system-manifests", "extra-manifests"}
    statuses = resources(cluster_1cp1w, node, "staticpodstatus")
    assert len(statuses) == 3 and all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in s["spec"]["podStatus"]["conditions"])
        for s in statuses
    ), statuses
    manifests = {r["metadata"]["id"] for r in resources(cluster_1cp1w, node, "manifests")}
    assert {"00-kubelet-bootstrapping-token", "01-csr-node-bootstrap", "10-kube-proxy"} <= manifests
    (bootstrap,) = resources(cluster_1cp1w, node, "bs")
    assert bootstrap["spec"]["selfHostedControlPlane"] is False
    table = cluster_1cp1w.cli("-n", node, "get", "bs")
    assert table.stdout.split("\n")[0].split()[-2:] == ["SELF", "HOSTED"]


def test_mirror_pods_are_ready_and_carry_the_versions(cluster_1cp1w: E2ECluster) -> None:
    node = cluster_1cp1w.control_plane[0]
    versions = kcpc_versions(cluster_1cp1w, node)
    pods = mirror_pods(cluster_1cp1w)
    assert set(pods) == set(COMPONENTS)
    for component, pod in pods.items():
        annotations = pod["metadata"]["annotations"]
        assert annotations[CONFIG_VERSION] == str(versions[component]), (component, annotations)
        assert annotations[SECRETS_VERSION], (component, annotations)
        assert ready(pod), (component, pod["status"])


def test_bootstrap_manifests_exist_in_the_api_server(cluster_1cp1w: E2ECluster) -> None:
    bindings = {b["metadata"]["name"] for b in kube_json(cluster_1cp1w, "clusterrolebindings")["items"]}
    assert {"create-csrs-for-bootstrapping", "auto-approve-csrs-for-group", "system:default-sa"} <= bindings
    assert kube_json(cluster_1cp1w, "daemonset", "kube-proxy", "-n", "kube-system")["metadata"]["name"]
    secrets = kube_json(cluster_1cp1w, "secrets", "-n", "kube-system")["items"]
    assert any(s["metadata"]["name"].startswith("bootstrap-token-") for s in secrets)


def test_nodes_have_roles_and_their_csrs_were_approved(cluster_1cp1w: E2ECluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in kube_json(cluster_1cp1w, "nodes")["items"]}
    control_plane = nodes[f"{cluster_1cp1w.name}-controlplane-1"]
    labels = control_plane["metadata"]["labels"]
    assert "node-role.kubernetes.io/control-plane" in labels and "node-role.kubernetes.io/master" in labels
    taints = {(t["key"], t["effect"]) for t in control_plane["spec"].get("taints", [])}
    assert ("node-role.kubernetes.io/master", "NoSchedule") in taints
    worker = nodes[f"{cluster_1cp1w.name}-worker-1"]
    assert not any(label.startswith("node-role.kubernetes.io/") for label in worker["metadata"]["labels"])
    csrs = kube_json(cluster_1cp1w, "csr")["items"]
    assert csrs, "the kubelets bootstrapped without any CSR"
    for csr in csrs:
        conditions = {c["type"] for c in csr.get("status", {}).get("conditions", [])}
        assert "Approved" in conditions and csr["status"].get("certificate"), csr["metadata"]["name"]


def test_kubeconfig_from_the_node_works_with_kubectl(cluster_1cp1w: E2ECluster, tmp_path: Path) -> None:
    node = cluster_1cp1w.control_plane[0]
    result = cluster_1cp1w.cli("-n", node, "kubeconfig", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    (written,) = [p for p in tmp_path.iterdir() if p.is_file()]
    assert written.stat().st_mode & 0o077 == 0, oct(written.stat().st_mode)
    binary = toolchain.Toolchain().require("v1.20.2").binary("kubectl")
    nodes = subprocess.run(
        [str(binary), "--kubeconfig", str(written), "get", "nodes", "-o", "name"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert nodes.returncode == 0, nodes.stderr
    assert len(nodes.stdout.split()) == 2


def test_containers_and_their_logs_through_cri(cluster_1cp1w: E2ECluster) -> None:
    node = cluster_1cp1w.control_plane[0]
    listed = cluster_1cp1w.cli("-n", node, "containers", "-k")
    assert listed.returncode == 0, listed.stderr
    assert "kube-apiserver" in listed.stdout and "k8s.gcr.io/pause:3.2" in listed.stdout
    pod = f"kube-system/kube-apiserver-{cluster_1cp1w.name}-controlplane-1:kube-apiserver"
    logs = cluster_1cp1w.cli("-n", node, "logs", "-k", "--tail", "5", pod)
    assert logs.returncode == 0, logs.stderr
    assert 1 <= len(logs.stdout.splitlines()) <= 5, logs.stdout


def test_a_workload_runs_on_the_pod_network(cluster_1cp1w: E2ECluster) -> None:
    """A pod (not hostNetwork) lands on the worker with an address of the bridge CNI's pod range."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "e2e-workload", "namespace": "default"},
        "spec": {"containers": [{"name": "pause", "image": "k8s.gcr.io/pause:3.2"}]},
    }
    created = subprocess.run(
        [*cluster_1cp1w.kubectl_argv(), "apply", "-f", "-"],
        input=json.dumps(pod),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert created.returncode == 0, created.stderr

    def running() -> bool:
        status = kube_json(cluster_1cp1w, "pod", "e2e-workload", "-n", "default")["status"]
        return status.get("phase") == "Running" and bool(status.get("podIP"))

    wait_until("the workload pod to run", running)
    status = kube_json(cluster_1cp1w, "pod", "e2e-workload", "-n", "default")["status"]
    assert status["hostIP"] in cluster_1cp1w.workers
    assert status["podIP"].startswith("10.244."), status["podIP"]


def test_a_second_bootstrap_is_refused_and_changes_nothing(cluster_1cp1w: E2ECluster) -> None:
    node = cluster_1cp1w.control_plane[0]
    before = cluster_1cp1w.cli("-n", node, "etcd", "members", "-o", "json").stdout
    refused = cluster_1cp1w.cli("-n", node, "bootstrap")
    assert refused.returncode == 1
    assert "bootstrap" in refused.stderr and "FAILED_PRECONDITION" in refused.stderr, refused.stderr
    assert cluster_1cp1w.cli("-n", node, "etcd", "members", "-o", "json").stdout == before
    worker = cluster_1cp1w.workers[0]
    on_worker = cluster_1cp1w.cli("-n", worker, "bootstrap")
    assert on_worker.returncode == 1 and "worker" in on_worker.stderr, on_worker.stderr


def test_the_worker_holds_no_cluster_ca_key(cluster_1cp1w: E2ECluster) -> None:
    worker = cluster_1cp1w.workers[0]
    (config,) = resources(cluster_1cp1w, worker, "mc")
    spec = config["spec"]
    assert "key" not in (spec["machine"].get("ca") or {})
    for section in ("ca", "aggregatorCA", "serviceAccount"):
        assert "key" not in (spec["cluster"].get(section) or {}), section
    assert not (spec["cluster"].get("etcd") or {}).get("ca", {}).get("key")
    node = next(n for n in cluster_1cp1w.state().nodes if n.ip == worker)
    keys = [p for p in Path(node.root_dir).rglob("*.key") if "ca" in p.name]
    assert not keys, keys


def test_one_bad_extra_manifest_blocks_nothing(cluster_1cp1w: E2ECluster) -> None:
    node = cluster_1cp1w.control_plane[0]
    good = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e2e-good", "namespace": "default"}}
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name", "namespace": "default"}}
    bad_url = "http://127.0.0.1:1/missing.yaml"
    patch = [
        {"op": "add", "path": "/cluster/extraManifests", "value": [bad_url]},
        {
            "op": "add",
            "path": "/cluster/inlineManifests",
            "value": [
                {"name": "e2e-good", "contents": yaml.safe_dump(good)},
                {"name": "e2e-bad", "contents": yaml.safe_dump(bad)},
            ],
        },
    ]
    result = cluster_1cp1w.cli("-n", node, "patch", "mc", "--immediate", "-p", json.dumps(patch))
    assert result.returncode == 0, result.stdout + result.stderr

    def errors() -> dict[str, str]:
        (status,) = resources(cluster_1cp1w, node, "ms")
        return dict(status["spec"].get("errors") or {})

    def good_applied() -> bool:
        return cluster_1cp1w.kubectl("get", "configmap", "e2e-good", "-n", "default").returncode == 0

    def bad_reported() -> bool:
        return any("e2e-bad" in manifest for manifest in errors())

    try:
        wait_until("the good inline manifest to be applied", good_applied)
        wait_until("the bad inline manifest to be reported in ManifestStatuses", bad_reported, timeout=60)
        logs = cluster_1cp1w.cli("-n", node, "logs", "controller-runtime")
        assert bad_url in logs.stdout, "the failed download is not logged with its URL"
        assert {"10-kube-proxy", "00-kubelet-bootstrapping-token"} <= set(
            resources(cluster_1cp1w, node, "ms")[0]["spec"]["manifestsApplied"]
        )
    finally:
        # The cluster is shared: take the broken manifests out again, so later modules (health
        # --explain on a healthy cluster) do not find this test's failures.
        undo = [
            {"op": "remove", "path": "/cluster/extraManifests"},
            {"op": "remove", "path": "/cluster/inlineManifests"},
        ]
        result = cluster_1cp1w.cli("-n", node, "patch", "mc", "--immediate", "-p", json.dumps(undo))
        assert result.returncode == 0, result.stdout + result.stderr
        wait_until("the manifest errors to clear", lambda: not errors(), timeout=60)


def test_extra_args_patch_rolls_only_kube_apiserver(cluster_1cp1w: E2ECluster) -> None:
    node = cluster_1cp1w.control_plane[0]
    before = kcpc_versions(cluster_1cp1w, node)
    patch = [{"op": "add", "path": "/cluster/apiServer/extraArgs", "value": {"v": "1"}}]
    result = cluster_1cp1w.cli("-n", node, "patch", "mc", "--immediate", "-p", json.dumps(patch))
    assert result.returncode == 0, result.stdout + result.stderr
    after = kcpc_versions(cluster_1cp1w, node)
    assert after["kube-apiserver"] > before["kube-apiserver"]
    assert {c: after[c] for c in COMPONENTS[1:]} == {c: before[c] for c in COMPONENTS[1:]}

    def rolled() -> bool:
        result = cluster_1cp1w.kubectl("get", "pods", "-n", "kube-system", "-o", "json")
        if result.returncode != 0:
            return False  # the API server is restarting
        pods = mirror_pods(cluster_1cp1w)
        apiserver = pods.get("kube-apiserver")
        return (
            apiserver is not None
            and apiserver["metadata"]["annotations"][CONFIG_VERSION] == str(after["kube-apiserver"])
            and ready(apiserver)
        )

    wait_until("kube-apiserver to run with the new config version", rolled)
    pods = mirror_pods(cluster_1cp1w)
    for component in COMPONENTS[1:]:
        assert pods[component]["metadata"]["annotations"][CONFIG_VERSION] == str(before[component])
    health = cluster_1cp1w.cli("health", "--wait-timeout", "3m")
    assert health.returncode == 0, health.stdout + health.stderr


def _host_mount_points(cluster: E2ECluster) -> set[str]:
    """The host's mount points, less those that others make and remove while this test runs
    beside them (scripts/test-tiers runs the integration tier and the other e2e half at once):
    network namespaces other than this cluster's nodes' (the integration tier's ``kpt-*``, other
    clusters' ``kp-<name>-*``) and mounts in other e2e sessions' directories."""
    own_netns = f"/run/netns/{netns.BRIDGE_PREFIX}{cluster.name}-"
    session = str(cluster.directory.parent.parent)
    points = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    return {
        point
        for point in points
        if (not point.startswith("/run/netns/") or point.startswith(own_netns))
        and (not point.startswith("/tmp/kpe2e-") or point.startswith(session))
    }


def test_nodes_are_machines_and_a_reboot_touches_nothing_outside_the_node(cluster_1cp1w: E2ECluster) -> None:
    state = cluster_1cp1w.state()
    host_machine_id = Path("/etc/machine-id").read_text().strip()
    for node in state.nodes:
        pid = node.processes["kubeplaned"].pid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"--root" not in argv, f"{node.name}: the agent must run with the default root, /"
        inside = subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "-u", "sh", "-c", "hostname; cat /etc/machine-id; ls /system"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert inside[0] == node.name
        assert inside[1] != host_machine_id
        assert "config.yaml" in inside[2:]

    # A full stop and start of a node's services (reboot) at --root / leaves the host's mounts
    # alone and kills no process outside the node. The old sweep killed every process naming
    # /run/containerd/containerd.sock (the host containerd's socket too): a host process that
    # names it must survive, and so must the other node.
    worker = next(node for node in state.nodes if node.role == "worker")
    other = next(node for node in state.nodes if node.role != "worker")
    bystander = subprocess.Popen(["sh", "-c", "sleep 600", "/run/containerd/containerd.sock"])
    try:
        mounts = _host_mount_points(cluster_1cp1w)
        result = cluster_1cp1w.cli("-n", worker.ip, "reboot")
        assert result.returncode == 0, result.stdout + result.stderr

        def back() -> bool:
            services = cluster_1cp1w.cli("-n", worker.ip, "service", "-o", "json")
            documents = [json.loads(line) for line in services.stdout.splitlines() if line.strip()]
            up = {d["id"] for d in documents if d.get("state") == "Running" and d["health"]["healthy"]}
            node = cluster_1cp1w.kubectl("get", "node", worker.name, "-o", "json")
            return {"containerd", "kubelet"} <= up and node.returncode == 0 and ready(json.loads(node.stdout))

        wait_until(f"{worker.name} to come back from the reboot", back)
        assert bystander.poll() is None, "a host process naming /run/containerd/containerd.sock was killed"
        assert Path(f"/proc/{other.processes['kubeplaned'].pid}").exists(), "the other node's agent died"
        assert _host_mount_points(cluster_1cp1w) == mounts
    finally:
        bystander.kill()
        bystander.wait()


def test_a_kubelet_only_change_restarts_the_kubelet_alone(cluster_1cp1w: E2ECluster) -> None:
    node = cluster_1cp1w.control_plane[0]

    def pids() -> dict[str, int | None]:
        services = cluster_1cp1w.cli("-n", node, "service", "-o", "json")
        assert services.returncode == 0, services.stdout + services.stderr
        documents = [json.loads(line) for line in services.stdout.splitlines() if line.strip()]
        return {d["id"]: d["pid"] for d in documents}

    before = pids()
    patch = [{"op": "add", "path": "/machine/kubelet/extraArgs", "value": {"v": "1"}}]
    result = cluster_1cp1w.cli("-n", node, "patch", "mc", "-p", json.dumps(patch))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "only the kubelet restarts" in result.stdout + result.stderr

    def restarted() -> bool:
        now = pids()
        return now.get("kubelet") not in (None, before["kubelet"]) and now.get("etcd") is not None

    wait_until("the kubelet to restart", restarted)
    after = pids()
    assert after["etcd"] == before["etcd"], "etcd restarted for a kubelet-only change"
    assert after["containerd"] == before["containerd"], "containerd restarted for a kubelet-only change"
    health = cluster_1cp1w.cli("health", "--wait-timeout", "3m")
    assert health.returncode == 0, health.stdout + health.stderr
