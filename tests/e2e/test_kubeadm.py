"""e2e: a kubeadm cluster built by ``cluster create --kubeadm`` goes HA with ``kubeplane kubeadm ha``.

The fifth seed's starting point, for real: ``kubeadm init`` on one node, a worker joined with
``kubeadm join``, every node reached by SSH. Then the guide's conversion, as a user runs it:
``--dry-run`` first (nothing changes), then a run SIGKILLed while the first new control plane
node's ``kubeadm join`` runs (it runs detached on the node, so it goes on), then the same command
again, which finds everything before it done, waits for that join instead of starting another and
finishes. From the moment the load balancer serves the re-signed certificate (the guide's check
that kubectl works through it) two clients poll the API through it, HTTP/1.1 without retries and
HTTP/2: no request may fail, through the restarts and both etcd member additions. Afterwards
everything the guide changes is checked where it lives (certificate SANs, the kubeconfigs on the
nodes, kube-proxy, kubeadm-config, cluster-info), ``kubeadm upgrade plan`` passes, the workload
still runs, and losing the original control plane node leaves the API answering through the
endpoint with the new members holding etcd quorum.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from conftest import E2ECluster, _cluster
from e2e_clients import ApiPoller, Http2Poller, run_cli, wait_until

from kubeplane.clients import ssh
from kubeplane.ops import kubeadm_ha
from kubeplane.provision import kubeadm, state, teardown, toolchain

pytestmark = pytest.mark.e2e

ETCDCTL = [
    "etcdctl",
    "--endpoints",
    "https://127.0.0.1:2379",
    "--cacert",
    "/etc/kubernetes/pki/etcd/ca.crt",
    "--cert",
    "/etc/kubernetes/pki/etcd/healthcheck-client.crt",
    "--key",
    "/etc/kubernetes/pki/etcd/healthcheck-client.key",
]


@pytest.fixture(scope="module")
def kubeadm_cluster(
    e2e_env: dict[str, str], toolchain_paths: toolchain.ToolchainPaths
) -> Iterator[E2ECluster]:
    yield from _cluster(
        e2e_env, name="e2eka", cidr="10.5.35.0/24", controlplanes=1, workers=1, extra_args=("--kubeadm",)
    )


def _node(cluster: E2ECluster, name: str) -> state.NodeState:
    return cluster.state().node(f"{cluster.name}-{name}")


def on_node(cluster: E2ECluster, name: str, command: str, *, check: bool = True) -> ssh.Result:
    """``command`` on node ``name`` over SSH with the cluster's key, as an operator runs it."""
    return asyncio.run(
        kubeadm.run(cluster.directory, _node(cluster, name), command, timeout=180, check=check)
    )


def read_on_node(cluster: E2ECluster, name: str, path: str) -> str:
    return on_node(cluster, name, f"cat {path}").stdout


def kubectl_json(cluster: E2ECluster, *args: str) -> Any:
    result = cluster.kubectl(*args, "-o", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def etcd_members(cluster: E2ECluster, node: str) -> list[dict[str, Any]]:
    result = cluster.kubectl(
        "-n", "kube-system", "exec", f"etcd-{node}", "--", *ETCDCTL, "member", "list", "-w", "json"
    )
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout)["members"])


def test_kubeadm_builds_the_cluster_the_guide_starts_from(kubeadm_cluster: E2ECluster) -> None:
    cluster = kubeadm_cluster
    nodes = kubectl_json(cluster, "get", "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["e2eka-controlplane-1", "e2eka-worker-1"]
    assert all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"]) for n in nodes
    )
    cp_ip = cluster.control_plane[0]
    # kubeadm's own objects, before any HA: no endpoint but the node, cluster-info naming it.
    config = yaml.safe_load(
        kubectl_json(cluster, "-n", "kube-system", "get", "configmap", "kubeadm-config")["data"][
            "ClusterConfiguration"
        ]
    )
    assert not config.get("controlPlaneEndpoint")
    info = kubectl_json(cluster, "-n", "kube-public", "get", "configmap", "cluster-info")["data"][
        "kubeconfig"
    ]
    assert kubeadm_ha.kubeconfig_server(info) == f"https://{cp_ip}:6443"
    # An operator on the node: the kubeadm unit's kubelet under systemctl, the guide's crictl pipeline.
    assert on_node(cluster, "controlplane-1", "systemctl is-active kubelet").stdout.strip() == "active"
    pod_id = on_node(
        cluster, "controlplane-1", "crictl pods | grep kube-controller-manager | cut -d' ' -f1"
    ).stdout
    assert len(pod_id.strip()) == 13, pod_id
    assert on_node(cluster, "worker-1", "kubeadm version -o short").stdout.strip() == "v1.20.2"
    # kubeadm's DNS add-on phase deployed kubeplane's cluster DNS under CoreDNS's name: it answers.
    dns = kubectl_json(cluster, "-n", "kube-system", "get", "deployment", "coredns")
    assert dns["spec"]["template"]["spec"]["containers"][0]["image"] == "docker.io/kubeplane/coredns:1.7.0"
    assert dns["status"].get("readyReplicas") == 2
    # A workload that must keep running through the conversion.
    created = cluster.kubectl(
        "create", "deployment", "echo", "--replicas=2", "--image=k8s.gcr.io/e2e-test-images/agnhost:2.25",
        "--", "/agnhost", "netexec", "--http-port=8080",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    wait_until(
        "the echo Deployment to be Ready",
        lambda: kubectl_json(cluster, "get", "deployment", "echo")["status"].get("readyReplicas") == 2,
        timeout=120,
    )


def test_the_control_plane_goes_ha_through_a_killed_run_without_a_failed_request(
    kubeadm_cluster: E2ECluster,
) -> None:
    cluster = kubeadm_cluster
    host_ip = cluster.state().network.host_ip  # type: ignore[union-attr]
    endpoint = f"https://{host_ip}:6443"
    cp1 = f"{cluster.name}-controlplane-1"
    old_sans = kubeadm_ha.cert_sans(
        read_on_node(cluster, "controlplane-1", kubeadm_ha.APISERVER_CERT).encode()
    )

    dry = cluster.cli("kubeadm", "ha", "--name", cluster.name, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "10 steps" in dry.stdout and "dry run: nothing was changed" in dry.stdout
    assert "haproxy" not in cluster.state().processes
    assert len(cluster.state().nodes) == 2, "a dry run records no new node"

    # Through the endpoint, once it exists: the admin kubeconfig with the load balancer's address.
    through_lb = cluster.directory / "kubeconfig-lb"
    through_lb.write_text(kubeadm_ha.with_server(cluster.kubeconfig.read_text(), endpoint))
    pollers: list[Any] = []
    started = threading.Event()

    def start_pollers(lines: list[str]) -> None:
        # From the moment the load balancer serves a certificate valid for its address (the guide
        # checks kubectl through it only then): until step 2 re-signed it, TLS must refuse it.
        if not started.is_set() and any(line.startswith("[3/10]") for line in lines):
            started.set()
            pollers.extend([ApiPoller(through_lb), Http2Poller(through_lb)])
            for poller in pollers:
                poller.__enter__()

    def kill_in_first_join(lines: list[str]) -> bool:
        start_pollers(lines)
        return any(f"> {cluster.name}-controlplane-2: [certs] Generating" in line for line in lines)

    try:
        first = run_cli(
            cluster.env,
            "kubeadm",
            "ha",
            "--name",
            cluster.name,
            kill_when=kill_in_first_join,
            timeout=900,
            echo=True,
        )
        assert first.killed, "\n".join(first.lines)
        # The join the killed run started goes on, detached from it.
        started_join = read_on_node(cluster, "controlplane-2", f"{kubeadm_ha.JOBS_DIR}/join.pid").strip()
        rerun = run_cli(cluster.env, "kubeadm", "ha", "--name", cluster.name, timeout=900, echo=True)
        assert rerun.returncode == 0, "\n".join(rerun.lines)
    finally:
        for poller in pollers:
            poller.__exit__()
    output = "\n".join(rerun.lines)
    print(f"first run {first.seconds:.0f}s (killed), re-run {rerun.seconds:.0f}s")
    for poller in pollers:
        print(f"{type(poller).__name__}: {poller.requests} requests, {len(poller.failures)} failed, "
              f"longest gap {poller.longest_gap:.1f}s: {poller.failures}")  # fmt: skip
    assert started.is_set() and all(poller.requests > 100 for poller in pollers)
    assert [poller.failures for poller in pollers] == [[], []]
    # Everything before the join was done by the killed run; the join it started was waited for.
    for step in range(1, 8):
        assert f"[{step}/10]" in output
    assert output.count("already at target, skipped") >= 7, output
    rerun_join = read_on_node(cluster, "controlplane-2", f"{kubeadm_ha.JOBS_DIR}/join.pid").strip()
    assert rerun_join == started_join, "the re-run waited for the join under way instead of starting one"
    assert "added as a learner" in output and "promoted to a voting member" in output

    # The guide's changes, where they live.
    new_sans = kubeadm_ha.cert_sans(
        read_on_node(cluster, "controlplane-1", kubeadm_ha.APISERVER_CERT).encode()
    )
    assert set(old_sans) | {host_ip} <= set(new_sans)
    for path in kubeadm_ha.CONTROL_PLANE_KUBECONFIGS:
        assert kubeadm_ha.kubeconfig_server(read_on_node(cluster, "controlplane-1", path)) == endpoint, path
    assert (
        kubeadm_ha.kubeconfig_server(read_on_node(cluster, "worker-1", kubeadm_ha.KUBELET_CONF)) == endpoint
    )
    proxy = kubectl_json(cluster, "-n", "kube-system", "get", "configmap", "kube-proxy")["data"][
        "kubeconfig.conf"
    ]
    assert kubeadm_ha.kubeconfig_server(proxy) == endpoint
    config = yaml.safe_load(
        kubectl_json(cluster, "-n", "kube-system", "get", "configmap", "kubeadm-config")["data"][
            "ClusterConfiguration"
        ]
    )
    assert config["controlPlaneEndpoint"] == f"{host_ip}:6443"
    assert host_ip in config["apiServer"]["certSANs"]
    info = kubectl_json(cluster, "-n", "kube-public", "get", "configmap", "cluster-info")["data"][
        "kubeconfig"
    ]
    assert kubeadm_ha.kubeconfig_server(info) == endpoint
    members = etcd_members(cluster, cp1)
    assert sorted(m["name"] for m in members) == [f"{cluster.name}-controlplane-{i}" for i in (1, 2, 3)]
    nodes = kubectl_json(cluster, "get", "nodes")["items"]
    assert sum(kubeadm_ha.is_control_plane(n) for n in nodes) == 3
    # The local cluster's own record follows the endpoint.
    assert kubeadm_ha.kubeconfig_server(cluster.kubeconfig.read_text()) == endpoint

    upgrade = on_node(cluster, "controlplane-1", "kubeadm upgrade plan 2>&1", check=False)
    assert upgrade.code == 0, upgrade.stdout
    assert kubectl_json(cluster, "get", "deployment", "echo")["status"].get("readyReplicas") == 2

    # Losing the original control plane node: the API answers through the endpoint, the two new
    # members keep etcd's quorum (a write goes through).
    teardown.stop_node(cluster.state().node(cp1))
    lost_at = time.monotonic()

    def writes() -> bool:
        # cluster.kubeconfig names the endpoint now (checked above).
        name = f"after-loss-{int(time.monotonic() * 1000)}"
        return cluster.kubectl("create", "configmap", name, "--request-timeout=5s").returncode == 0

    wait_until("a write through the endpoint after losing the first node", writes, timeout=60)
    print(f"API writable through the endpoint {time.monotonic() - lost_at:.1f}s after the loss")
    members = etcd_members(cluster, f"{cluster.name}-controlplane-2")
    assert len(members) == 3
    health = cluster.kubectl(
        "-n", "kube-system", "exec", f"etcd-{cluster.name}-controlplane-2", "--", *ETCDCTL,
        "endpoint", "health", "--cluster",
    )  # fmt: skip
    healthy = [line for line in (health.stdout + health.stderr).splitlines() if " is healthy" in line]
    assert len(healthy) == 2, health.stdout + health.stderr
