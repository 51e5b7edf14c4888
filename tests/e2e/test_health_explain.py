"""e2e: ``kubeplane health --explain`` on the shared 1+1 cluster, with failures made for real.

1. On the healthy cluster: no diagnosis at all (no false alarm), every check listed as passed,
   and the text form says ``healthy`` with the checks it ran.
2. One case per injected failure, each undone in ``finally`` (and ``health`` must pass again
   before the next test, so no case sees another's leftovers):
   - the worker's kubelet service stopped through the node API (its Node stays Ready for the
     40 s grace period, so the health checks still pass: only the evidence tells);
   - a wrong ``extraArgs`` flag that crash-loops kube-apiserver (the guide's "an error on the
     server" on a single control plane node) and one that crash-loops kube-controller-manager:
     the diagnosis quotes the container's ``unknown flag`` log line;
   - the worker's control plane endpoint pointed at another cluster (the shared 3+1 cluster's
     load balancer): the worker's controllers get x509 "unknown authority" errors;
   - the CSR approval manifest's ClusterRoleBinding deleted from the cluster, and the worker's
     kubelet made to join again (the guide's ``nodes "X" not found``): its CSR stays pending;
     undone with the commands the diagnosis names.

Stale etcd data is made and diagnosed in test_reset.py (a reset that keeps etcd's data).
"""

from __future__ import annotations

import base64
import json
import subprocess
from typing import TYPE_CHECKING, Any

import pytest
from cryptography import x509
from e2e_clients import explain, wait_for_diagnosis, wait_until

from kubeplane.ops import health

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e


#: An ``extraArgs`` flag no Kubernetes component knows: the container exits right after start.
BOGUS_FLAG = "kubeplane-e2e-no-such-flag"


def _services_up(cluster: E2ECluster) -> bool:
    """Every supervised service of every node running and healthy. ``health`` passing is not
    enough: a kubelet that restarted a moment ago (another module's apply) leaves its Node Ready
    through the 40 s grace period while its own health endpoint is not up yet."""
    for node in (*cluster.control_plane, *cluster.workers):
        result = cluster.cli("-n", node, "service", "-o", "json")
        if result.returncode != 0:
            return False
        documents = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        if not documents or not all(
            d.get("state") == "Running" and (d.get("health") or {}).get("healthy") for d in documents
        ):
            return False
    return True


def test_healthy_cluster_gets_no_diagnosis(cluster_1cp1w: E2ECluster) -> None:
    passed = cluster_1cp1w.cli("health", "--wait-timeout", "3m")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    wait_until("every service of every node to be up", lambda: _services_up(cluster_1cp1w), timeout=120)

    code, document, elapsed = explain(cluster_1cp1w)
    print(f"health --explain on the healthy cluster: {elapsed:.1f}s")
    assert document["diagnoses"] == [], json.dumps(document["diagnoses"], indent=2)
    assert document["healthy"] is True
    assert [check["name"] for check in document["checks"]] == list(health.CHECK_NAMES)
    assert all(check["ok"] for check in document["checks"]), document["checks"]
    assert code == 0
    # It reads what is visible once; nothing waits for a timeout.
    assert elapsed < 30, f"health --explain took {elapsed:.1f}s on a healthy cluster"

    text = cluster_1cp1w.cli("health", "--explain", timeout=120)
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"healthy: {len(health.CHECK_NAMES)} checks passed, nothing to diagnose" in text.stdout
    for name in health.CHECK_NAMES:
        assert f"  checked: {name}" in text.stdout


def test_stopped_kubelet_is_diagnosed_on_its_node(cluster_1cp1w: E2ECluster) -> None:
    worker = cluster_1cp1w.workers[0]
    stopped = cluster_1cp1w.cli("-n", worker, "service", "kubelet", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    try:
        code, document, elapsed = explain(cluster_1cp1w)
        print(f"health --explain with kubelet stopped: {elapsed:.1f}s")
        print(json.dumps(document["diagnoses"], indent=2))
        assert code == 1
        assert document["healthy"] is False
        found = [d for d in document["diagnoses"] if d["id"] == "kubelet-not-running"]
        assert [d["node"] for d in found] == [worker], json.dumps(document["diagnoses"], indent=2)
        assert "was stopped" in found[0]["cause"]
        assert any("service kubelet: state" in line for line in found[0]["evidence"])
        assert f"kubeplane -n {worker} logs kubelet" in found[0]["commands"]
    finally:
        started = cluster_1cp1w.cli("-n", worker, "service", "kubelet", "start")
        assert started.returncode == 0, started.stdout + started.stderr
        wait_until("kubelet to be healthy again", lambda: _kubelet_up(cluster_1cp1w, worker), timeout=120)
        passed = cluster_1cp1w.cli("health", "--wait-timeout", "2m")
        assert passed.returncode == 0, passed.stdout + passed.stderr


def _kubelet_up(cluster: E2ECluster, node: str) -> bool:
    result = cluster.cli("-n", node, "service", "kubelet", "-o", "json")
    if result.returncode != 0:
        return False
    document = json.loads(result.stdout.splitlines()[0])
    return bool(document.get("running") and document["health"]["healthy"])


def _machine_config(cluster: E2ECluster, node: str) -> dict[str, Any]:
    result = cluster.cli("-n", node, "get", "mc", "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    spec: dict[str, Any] = json.loads(result.stdout.splitlines()[0])["spec"]
    return spec


def _patch(cluster: E2ECluster, node: str, path: str, value: Any) -> None:
    """Set (or, with ``value`` None, remove) ``path`` in ``node``'s machine config, live."""
    op = {"op": "remove", "path": path} if value is None else {"op": "add", "path": path, "value": value}
    result = cluster.cli("-n", node, "patch", "mc", "--immediate", "-p", json.dumps([op]))
    assert result.returncode == 0, result.stdout + result.stderr


def _healthy_again(cluster: E2ECluster) -> None:
    passed = cluster.cli("health", "--wait-timeout", "4m", timeout=400)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    wait_until("every service of every node to be up", lambda: _services_up(cluster), timeout=120)


@pytest.mark.parametrize(
    ("component", "section", "diagnosis"),
    [
        ("kube-apiserver", "apiServer", "apiserver-not-running"),
        ("kube-controller-manager", "controllerManager", "component-not-running"),
    ],
)
def test_crash_looping_component_is_diagnosed_with_its_log_line(
    cluster_1cp1w: E2ECluster, component: str, section: str, diagnosis: str
) -> None:
    node = cluster_1cp1w.control_plane[0]
    path = f"/cluster/{section}/extraArgs"
    before = _machine_config(cluster_1cp1w, node)["cluster"].get(section, {}).get("extraArgs")
    _patch(cluster_1cp1w, node, path, {**(before or {}), BOGUS_FLAG: "1"})
    try:
        found = wait_for_diagnosis(cluster_1cp1w, diagnosis, node, quoting=f"unknown flag: --{BOGUS_FLAG}")
        assert component in found["cause"]
        assert any(f"logs -k kube-system/{component}-" in command for command in found["commands"])
    finally:
        _patch(cluster_1cp1w, node, path, before)
        _healthy_again(cluster_1cp1w)


def _in_node(cluster: E2ECluster, address: str, script: str) -> None:
    """Run ``sh -c script`` in the node's mount namespace (where its agent, at ``/``, keeps its files)."""
    (node,) = [n for n in cluster.state().nodes if n.ip == address]
    pid = node.processes["kubeplaned"].pid
    subprocess.run(["nsenter", "-t", str(pid), "-m", "sh", "-c", script], check=True, timeout=30)


def _rejoin_with_endpoint(cluster: E2ECluster, node: str, endpoint: str) -> None:
    """Give ``node`` the control plane ``endpoint`` (live: its node API keeps its certificate) and
    make its kubelet join again through it."""
    _patch(cluster, node, "/cluster/controlPlane/endpoint", endpoint)
    _kubelet_joins_again(cluster, node)


def _kubelet_joins_again(cluster: E2ECluster, node: str, *, before_start: str = "") -> None:
    """Stop ``node``'s kubelet, remove its client certificate, run the kubectl ``before_start``
    arguments if any, start it: it bootstraps with the token through the saved config's endpoint."""
    stopped = cluster.cli("-n", node, "service", "kubelet", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    _in_node(cluster, node, "rm -f /etc/kubernetes/kubelet.conf /var/lib/kubelet/pki/kubelet-client-*")
    if before_start:
        done = cluster.kubectl(*before_start.split())
        assert done.returncode == 0, done.stdout + done.stderr
    started = cluster.cli("-n", node, "service", "kubelet", "start")
    assert started.returncode == 0, started.stdout + started.stderr


def test_endpoint_of_another_cluster_is_diagnosed_on_the_node(
    cluster_1cp1w: E2ECluster, cluster_3cp1w: E2ECluster
) -> None:
    # The guide's x509 case: a node given the endpoint of another cluster (here the shared 3+1
    # cluster's load balancer) joins with its own cluster's CA, so TLS to that endpoint fails.
    worker = cluster_1cp1w.workers[0]
    before = _machine_config(cluster_1cp1w, worker)["cluster"]["controlPlane"]["endpoint"]
    assert before != cluster_3cp1w.endpoint
    try:
        _rejoin_with_endpoint(cluster_1cp1w, worker, cluster_3cp1w.endpoint)
        x509 = "x509: certificate signed by unknown authority"
        found = wait_for_diagnosis(cluster_1cp1w, "endpoint-other-cluster", worker, quoting=x509)
        assert "another cluster" in found["cause"]
        assert any(line.startswith("log kubelet: ") and x509 in line for line in found["evidence"])
        assert f"kubeplane -n {worker} get machineconfig -o yaml" in found["commands"]
        # Not blamed on the pod network although the node is NotReady.
        _, document, _ = explain(cluster_1cp1w)
        assert "node-not-ready" not in {d["id"] for d in document["diagnoses"]}, document["diagnoses"]
    finally:
        _rejoin_with_endpoint(cluster_1cp1w, worker, before)
        _healthy_again(cluster_1cp1w)


def _hostname(cluster: E2ECluster, node: str) -> str:
    result = cluster.cli("-n", node, "get", "nodeaddresses", "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    return str(json.loads(result.stdout.splitlines()[0])["spec"]["hostname"])


def _pending_csrs(cluster: E2ECluster, hostname: str) -> list[str]:
    result = cluster.kubectl("get", "csr", "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    return [
        csr["metadata"]["name"]
        for csr in json.loads(result.stdout)["items"]
        if not (csr.get("status") or {}).get("conditions")
        and hostname in _csr_subject(csr["spec"]["request"])
    ]


def _csr_subject(request: str) -> str:
    return x509.load_pem_x509_csr(base64.b64decode(request)).subject.rfc4514_string()


def test_deleted_csr_approval_binding_leaves_the_node_unregistered(cluster_1cp1w: E2ECluster) -> None:
    # The guide's `nodes "X" not found` with its CSR pending: the bootstrap manifests were applied,
    # then the binding that lets kube-controller-manager approve node CSRs was deleted.
    cluster = cluster_1cp1w
    cp, worker = cluster.control_plane[0], cluster.workers[0]
    host = _hostname(cluster, worker)
    binding = "auto-approve-csrs-for-group"
    deleted = cluster.kubectl("delete", "clusterrolebinding", binding)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    try:
        _kubelet_joins_again(cluster, worker, before_start=f"delete node {host}")
        found = wait_for_diagnosis(
            cluster, "node-not-registered", worker, quoting=f"{binding} missing", timeout=240
        )
        assert f'nodes "{host}" not found' in found["cause"] and "nothing approves it" in found["cause"]
        assert any(line.endswith(": Pending") and line.startswith("CSR ") for line in found["evidence"])
        manifest = f"kubeplane -n {cp} get manifests 01-csr-approver-role-binding -o yaml"
        assert manifest in found["commands"], found["commands"]
        approve = [c for c in found["commands"] if c.startswith("kubectl certificate approve ")]
        assert approve, found["commands"]
        # Not blamed on a kubelet that does not run: it runs, waiting for its certificate.
        _, document, _ = explain(cluster)
        assert "kubelet-not-running" not in {d["id"] for d in document["diagnoses"]}, document["diagnoses"]
    finally:
        # The fix the diagnosis names: create the manifest's objects again, approve what is pending.
        shown = cluster.cli("-n", cp, "get", "manifests", "01-csr-approver-role-binding", "-o", "json")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        for item in json.loads(shown.stdout.splitlines()[0])["spec"]["items"]:
            created = subprocess.run(
                [*cluster.kubectl_argv(), "apply", "-f", "-"],
                input=json.dumps(item), capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert created.returncode == 0, created.stdout + created.stderr
        for name in _pending_csrs(cluster, host):
            cluster.kubectl("certificate", "approve", name)
        _healthy_again(cluster)
