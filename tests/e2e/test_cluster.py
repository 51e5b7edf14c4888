"""e2e: ``kubeplane cluster create|show|destroy`` and ``kubeplane health`` on local clusters.

Acceptance of the main job: a 1+1 cluster whose nodes kubectl sees Ready, that ``health`` passes
and whose images came through the local registry; a 3+1 cluster with three etcd members and the
three static pods on each control plane node (test_upgrade.py later upgrades that cluster and
then takes one control plane node down). Destroy leaving nothing behind is asserted by the
fixtures after each cluster.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from kubeplane.config import defaults
from kubeplane.controllers.k8s import kubelet_csr
from kubeplane.ops import health
from kubeplane.provision import netns, registry

if TYPE_CHECKING:
    from collections.abc import Callable
    from subprocess import CompletedProcess

    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


def _ready(node: dict) -> bool:  # type: ignore[type-arg]
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def _host_links() -> set[str]:
    return {link["ifname"] for link in netns._ip_json("link", "show")}


def _host_netns() -> set[str]:
    return set(os.listdir(netns.NETNS_DIR)) if netns.NETNS_DIR.exists() else set()


def test_bad_config_patch_fails_before_touching_the_network(
    e2e_env: dict[str, str], kubeplane: Callable[..., CompletedProcess[str]]
) -> None:
    result = kubeplane(
        e2e_env,
        "cluster",
        "create",
        "--name",
        "e2ebad",
        "--cidr",
        "10.5.27.0/24",
        "--config-patch",
        '[{"op": "replace", "path": "/machine/nosuchfield", "value": 1}]',
    )
    assert result.returncode == 1
    assert "/machine has no key 'nosuchfield'" in result.stderr and "nothing was created" in result.stderr
    assert "create network" not in result.stdout + result.stderr
    # Nothing of this cluster's network: its bridge, node namespaces and veths (other clusters'
    # links and namespaces come and go meanwhile: the other e2e half and the integration tier).
    assert netns.link_info(netns.bridge_name("e2ebad")) is None
    veth = netns.veth_name("e2ebad", 1).removesuffix("1")  # kv<hash>n<index>
    assert not [name for name in _host_links() if name.startswith(veth) and name[len(veth) :].isdigit()]
    assert not [name for name in _host_netns() if name.startswith(netns.bridge_name("e2ebad") + "-")]
    assert not (Path(e2e_env["KUBEPLANE_STATE"]) / "e2ebad").exists()


def test_1cp1w_kubectl_sees_both_nodes_ready(cluster_1cp1w: E2ECluster) -> None:
    result = cluster_1cp1w.kubectl("get", "nodes", "-o", "json")
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["e2e1-controlplane-1", "e2e1-worker-1"]
    assert all(_ready(n) for n in nodes), [n["status"]["conditions"] for n in nodes]


def test_1cp1w_worker_kubelet_certificate_was_signed_by_a_control_plane_agent(
    cluster_1cp1w: E2ECluster,
) -> None:
    # On a new cluster kube-controller-manager signs nothing for its first 10 s or more; the
    # control plane node's agent approves and signs the worker's bootstrap request at once.
    result = cluster_1cp1w.kubectl("get", "csr", "-o", "json")
    assert result.returncode == 0, result.stderr
    signed_here = []
    for item in json.loads(result.stdout)["items"]:
        spec, status = item["spec"], item.get("status") or {}
        if spec["signerName"] != kubelet_csr.SIGNER or not spec["username"].startswith("system:bootstrap:"):
            continue
        request = x509.load_pem_x509_csr(base64.b64decode(spec["request"]))
        (common_name,) = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        reasons = {c.get("reason") for c in status.get("conditions") or () if c["type"] == "Approved"}
        if common_name.value == "system:node:e2e1-worker-1" and kubelet_csr.REASON in reasons:
            assert status.get("certificate"), item["metadata"]["name"]
            signed_here.append(item["metadata"]["name"])
    assert signed_here, "no bootstrap CSR of the worker was approved and signed by kubeplane"


def test_1cp1w_health_passes(cluster_1cp1w: E2ECluster) -> None:
    result = cluster_1cp1w.cli("health", "--wait-timeout", "2m")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "waiting for etcd to be healthy: OK" in lines
    assert "waiting for all k8s nodes to report ready: OK" in lines
    assert "waiting for the cluster DNS to be ready: OK" in lines
    assert sum(line.endswith(": OK") for line in lines) == len(health.CHECK_NAMES)


def test_1cp1w_show_lists_nodes_roles_and_endpoint(cluster_1cp1w: E2ECluster) -> None:
    result = cluster_1cp1w.cli("cluster", "show", "--name", "e2e1", "-o", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["endpoint"] == "https://10.5.21.1:6443"
    assert [(n["name"], n["role"], n["ip"], n["agent"]) for n in document["nodes"]] == [
        ("e2e1-controlplane-1", "controlplane", "10.5.21.2", "running"),
        ("e2e1-worker-1", "worker", "10.5.21.3", "running"),
    ]


def test_1cp1w_containerd_pulled_every_image_through_the_registry(cluster_1cp1w: E2ECluster) -> None:
    wanted = {"pause", *COMPONENTS, "kube-proxy"}
    nodes = {"10.5.21.2", "10.5.21.3"}
    # A healthy cluster does not wait for the kube-proxy DaemonSet: its pulls may still be under way.
    deadline = time.monotonic() + 120
    while True:
        pulled = registry.pulled_repositories(cluster_1cp1w.registry_log)
        clients = {p.client.rsplit(":", 1)[0] for p in registry.pulls(cluster_1cp1w.registry_log)}
        if (wanted <= pulled and nodes <= clients) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert wanted <= pulled, f"pulled through the registry: {sorted(pulled)}"
    # Both nodes pulled (the worker needs pause and kube-proxy at least).
    assert nodes <= clients, clients


def test_3cp1w_etcd_has_three_members(cluster_3cp1w: E2ECluster) -> None:
    for node in cluster_3cp1w.control_plane:
        result = cluster_3cp1w.cli("-n", node, "etcd", "members", "-o", "json")
        assert result.returncode == 0, result.stderr
        members = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        names = {m.get("name") for m in members}
        assert names == {f"e2e3-controlplane-{i}" for i in (1, 2, 3)}, members


def test_3cp1w_each_control_plane_node_runs_the_static_pods(cluster_3cp1w: E2ECluster) -> None:
    result = cluster_3cp1w.kubectl("get", "pods", "-n", "kube-system", "-o", "json")
    assert result.returncode == 0, result.stderr
    pods = json.loads(result.stdout)["items"]
    for ip in cluster_3cp1w.control_plane:
        running = {
            p["metadata"]["labels"].get("k8s-app")
            for p in pods
            if p["status"].get("hostIP") == ip and p["status"].get("phase") == "Running"
        }
        assert set(COMPONENTS) <= running, f"node {ip} runs {running}"


def test_3cp1w_every_node_has_its_own_pod_cidr_from_the_agents(cluster_3cp1w: E2ECluster) -> None:
    # Three control plane agents assign the pod CIDRs (kube-controller-manager's node IPAM is off):
    # taking turns under an etcd lock, they never give one block twice.
    result = cluster_3cp1w.kubectl("get", "nodes", "-o", "json")
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)["items"]
    (subnet,) = (ipaddress.ip_network(s) for s in defaults.DEFAULT_POD_SUBNETS)
    blocks = {n["metadata"]["name"]: n["spec"].get("podCIDRs") or [] for n in nodes}
    assert all(len(cidrs) == 1 for cidrs in blocks.values()), blocks
    networks = [ipaddress.ip_network(cidrs[0]) for cidrs in blocks.values()]
    assert all(net.prefixlen == 24 and net.subnet_of(subnet) for net in networks), blocks
    assert len(set(networks)) == len(nodes) == 4, blocks
    pods = cluster_3cp1w.kubectl(
        "get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-controller-manager", "-o", "json"
    )
    assert pods.returncode == 0, pods.stderr
    items = json.loads(pods.stdout)["items"]
    assert len(items) == 3, [pod["metadata"]["name"] for pod in items]
    for pod in items:
        command = pod["spec"]["containers"][0]["command"]
        assert "--allocate-node-cidrs=false" in command, pod["metadata"]["name"]
