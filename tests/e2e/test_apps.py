"""A first application on a local cluster, through kubectl as a user runs it, offline: a
Deployment spread over two nodes behind a Service, found by name from a pod on a third node
(cluster DNS), a headless Service, SRV, upstream forwarding, NXDOMAIN, pod to pod across nodes,
Services from the host, ``exec``/``logs -f``/``port-forward``/``attach``/``cp``, a new Service
resolving within about a second, and DNS scaled to zero and back.

Runs on the shared 3+1 cluster (created with ``--dns-upstream`` at its bridge address, where this
module serves a small upstream resolver for ``*.upstream.test``), before the modules that upgrade
it or take a node down.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.rcode
import dns.rrset
import pytest
import yaml
from conftest import E2ECluster
from e2e_clients import wait_until

pytestmark = pytest.mark.e2e

AGNHOST = "k8s.gcr.io/e2e-test-images/agnhost:2.21"
UPSTREAM_NAME = "www.upstream.test"
UPSTREAM_ANSWER = "192.0.2.77"
ZONE = "cluster.local"


def manifests(server_nodes: tuple[str, str], client_node: str) -> str:
    """The echo Deployment (agnhost netexec) on ``server_nodes``, its Services, a busybox client."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "echo"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "echo"}},
            "template": {
                "metadata": {"labels": {"app": "echo"}},
                "spec": {
                    "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": list(server_nodes),
                                            }
                                        ]
                                    }
                                ]
                            }
                        },
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": {"app": "echo"}},
                                    "topologyKey": "kubernetes.io/hostname",
                                }
                            ]
                        },
                    },
                    "containers": [
                        {
                            "name": "echo",
                            "image": AGNHOST,
                            "args": ["netexec", "--http-port=8080"],
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "readinessProbe": {
                                "httpGet": {"path": "/healthz", "port": 8080},
                                "periodSeconds": 1,
                            },
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "echo"},
        "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "echo-hl"},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "echo"},
            "ports": [{"name": "http", "port": 8080}],
        },
    }
    client = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {
            "nodeName": client_node,
            "containers": [{"name": "client", "image": "busybox", "command": ["sleep", "3600"]}],
        },
    }
    return yaml.safe_dump_all([deployment, service, headless, client])


class Upstream:
    """A resolver on the cluster's bridge address: ``www.upstream.test`` A, NXDOMAIN otherwise."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, 53))
        self.sock.settimeout(0.2)
        self.queries: list[str] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            query = dns.message.from_wire(data)
            name = str(query.question[0].name).rstrip(".")
            self.queries.append(name)
            reply = dns.message.make_response(query)
            if name == UPSTREAM_NAME:
                reply.answer.append(dns.rrset.from_text(name + ".", 30, "IN", "A", UPSTREAM_ANSWER))
            else:
                reply.set_rcode(dns.rcode.NXDOMAIN)
            self.sock.sendto(reply.to_wire(), peer)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture(scope="module")
def upstream(cluster_3cp1w: E2ECluster) -> Iterator[Upstream]:
    address = cluster_3cp1w.state().network.host_ip  # type: ignore[union-attr]
    server = Upstream(address)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def app(cluster_3cp1w: E2ECluster, upstream: Upstream) -> Iterator[E2ECluster]:
    cluster = cluster_3cp1w
    nodes = json.loads(ok(cluster, "get", "nodes", "-o", "json"))["items"]
    names = sorted(node["metadata"]["name"] for node in nodes)
    workers = [name for name in names if "-worker-" in name]
    planes = [name for name in names if "-controlplane-" in name]
    manifest = manifests((workers[0], planes[1]), client_node=planes[2])
    applied = subprocess.run(
        [*cluster.kubectl_argv(), "apply", "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    started = time.monotonic()
    ok(cluster, "rollout", "status", "deployment/echo", "--timeout=180s", timeout=200)
    ok(cluster, "wait", "--for=condition=Ready", "pod/client", "--timeout=120s", timeout=140)
    print(f"echo Deployment and client pod ready in {time.monotonic() - started:.1f}s")
    try:
        yield cluster
    finally:
        cluster.kubectl(
            "delete", "deployment/echo", "service/echo", "service/echo-hl", "pod/client", "--wait=false"
        )


def ok(cluster: E2ECluster, *args: str, timeout: float = 60) -> str:
    result = subprocess.run(
        [*cluster.kubectl_argv(), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def in_client(cluster: E2ECluster, script: str) -> subprocess.CompletedProcess[str]:
    """``sh -c SCRIPT`` in the client pod (busybox); its result whatever the exit status."""
    return subprocess.run(
        [*cluster.kubectl_argv(), "exec", "client", "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def lookup(cluster: E2ECluster, name: str, record: str = "a") -> subprocess.CompletedProcess[str]:
    return in_client(cluster, f"nslookup -type={record} {name}")


def echo_pods(cluster: E2ECluster) -> dict[str, str]:
    """Pod name → pod IP of the echo Deployment."""
    pods = json.loads(ok(cluster, "get", "pods", "-l", "app=echo", "-o", "json"))["items"]
    return {pod["metadata"]["name"]: pod["status"]["podIP"] for pod in pods}


def test_service_names_resolve_from_a_pod_on_a_third_node_and_reach_both_replicas(app: E2ECluster) -> None:
    pods = echo_pods(app)
    assert len(pods) == 2
    for name in ("echo", "echo.default", f"echo.default.svc.{ZONE}"):
        seen: set[str] = set()
        for _ in range(30):
            # getaddrinfo: the search path and ndots the kubelet wrote into the pod's resolv.conf
            answer = in_client(app, f"wget -qO- http://{name}/hostname")
            assert answer.returncode == 0, f"{name}: {answer.stderr}"
            seen.add(answer.stdout.strip())
            if seen == set(pods):
                break
        assert seen == set(pods), f"{name} reached {seen}, not both replicas {set(pods)}"


def test_headless_srv_upstream_and_nxdomain(app: E2ECluster, upstream: Upstream) -> None:
    pods = echo_pods(app)
    headless = lookup(app, f"echo-hl.default.svc.{ZONE}")
    assert headless.returncode == 0, headless.stdout + headless.stderr
    assert set(re.findall(r"Address: (\S+)", headless.stdout)) >= set(pods.values()), headless.stdout

    srv = lookup(app, f"_http._tcp.echo.default.svc.{ZONE}", "srv")
    assert srv.returncode == 0 and f"80 echo.default.svc.{ZONE}" in srv.stdout, srv.stdout

    outside = lookup(app, UPSTREAM_NAME)
    assert outside.returncode == 0 and UPSTREAM_ANSWER in outside.stdout, outside.stdout + outside.stderr
    assert UPSTREAM_NAME in upstream.queries

    missing = lookup(app, f"nope.default.svc.{ZONE}")
    assert missing.returncode != 0 and "NXDOMAIN" in missing.stdout + missing.stderr, missing.stdout


def test_pods_reach_each_other_across_nodes_with_their_own_addresses(app: E2ECluster) -> None:
    client_ip = json.loads(ok(app, "get", "pod", "client", "-o", "json"))["status"]["podIP"]
    for pod_ip in echo_pods(app).values():
        answer = in_client(app, f"wget -qO- http://{pod_ip}:8080/clientip")
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip().rsplit(":", 1)[0] == client_ip  # no masquerade between pods


def test_the_host_reaches_a_service_through_kube_proxy(app: E2ECluster) -> None:
    cluster_ip = json.loads(ok(app, "get", "service", "echo", "-o", "json"))["spec"]["clusterIP"]
    with urllib.request.urlopen(f"http://{cluster_ip}/hostname", timeout=10) as response:
        assert response.read().decode().strip() in echo_pods(app)


def test_exec_logs_port_forward_cp_and_attach_from_the_host(app: E2ECluster, tmp_path: Path) -> None:
    assert ok(app, "exec", "client", "--", "cat", "/etc/hostname").strip() == "client"

    pod = sorted(echo_pods(app))[0]
    follow = subprocess.Popen(
        [*app.kubectl_argv(), "logs", "-f", pod], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline(), "kubectl logs -f printed nothing"
    finally:
        follow.kill()
        follow.wait(timeout=10)

    forward = subprocess.Popen(
        [*app.kubectl_argv(), "port-forward", f"pod/{pod}", ":8080"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # Forwarding from 127.0.0.1:PORT -> 8080
        port = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert port, line
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/hostname", timeout=10) as response:
            assert response.read().decode().strip() == pod
    finally:
        forward.kill()
        forward.wait(timeout=10)

    local = tmp_path / "note.txt"
    local.write_text("copied\n")
    ok(app, "cp", str(local), "client:/tmp/note.txt")
    assert ok(app, "exec", "client", "--", "cat", "/tmp/note.txt") == "copied\n"
    back = local.with_name("back.txt")
    ok(app, "cp", "client:/tmp/note.txt", str(back))
    assert back.read_text() == "copied\n"

    # The container outlives its echo by a few seconds: when it exits the runtime closes the attach
    # streams, and output written just before that may never reach kubectl (CI saw exactly that).
    attached = subprocess.run(
        [*app.kubectl_argv(), "run", "attach-me", "--image=busybox", "--restart=Never", "--attach", "--rm",
         "-i", "--", "sh", "-c", "read line; echo got:$line; sleep 3"],
        input="hello\n", capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "got:hello" in attached.stdout, attached.stdout + attached.stderr


def test_a_new_service_resolves_within_seconds(app: E2ECluster) -> None:
    name = f"new.default.svc.{ZONE}"
    assert lookup(app, name).returncode != 0
    # The client polls every 0.1 s and prints how many tries it took once the name resolves.
    poll = subprocess.Popen(
        [*app.kubectl_argv(), "exec", "client", "--", "sh", "-c",
         f"i=0; until nslookup {name} >/dev/null 2>&1; do i=$((i+1)); sleep 0.1; done; echo $i"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1)  # the loop is running
        ok(app, "create", "service", "clusterip", "new", "--tcp=80:8080")
        # From when the Service exists (kubectl create returned): on a loaded machine kubectl
        # itself may take seconds, which says nothing about the cluster DNS.
        created = time.monotonic()
        out, _ = poll.communicate(timeout=30)
        took = time.monotonic() - created
    finally:
        poll.kill()
        app.kubectl("delete", "service", "new", "--wait=false")
    print(f"new Service resolvable {took:.2f}s after kubectl create returned (includes exec overhead)")
    assert out.strip().isdigit()
    assert took < 3.0, f"the new Service took {took:.1f}s to resolve"


def test_dns_scaled_to_zero_and_back(app: E2ECluster) -> None:
    name = f"echo.default.svc.{ZONE}"
    ok(app, "-n", "kube-system", "scale", "deployment/coredns", "--replicas=0")
    try:
        wait_until(
            "lookups to fail without DNS replicas", lambda: lookup(app, name).returncode != 0, timeout=60
        )
    finally:
        ok(app, "-n", "kube-system", "scale", "deployment/coredns", "--replicas=2")
    started = time.monotonic()
    wait_until("lookups to answer again", lambda: lookup(app, name).returncode == 0, timeout=90)
    print(f"DNS answered {time.monotonic() - started:.1f}s after scaling back to 2 replicas")


def test_kubectl_run_busybox_resolves_on_the_small_cluster(cluster_1cp1w: E2ECluster) -> None:
    # create returned once a DNS pod was Ready; kube-proxy on the pod's node may still be writing
    # the Service's rules (its sync takes seconds on a busy machine), so allow those seconds.
    started = time.monotonic()
    tries: list[str] = []
    while time.monotonic() - started < 60:
        argv = [*cluster_1cp1w.kubectl_argv(), "run", f"lookup-{len(tries)}", "--image=busybox"]
        argv += ["--restart=Never", "--rm", "-i", "--", "nslookup", f"kubernetes.default.svc.{ZONE}"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
        tries.append(result.stdout + result.stderr)
        if result.returncode == 0 and "Address" in result.stdout:
            print(f"kubectl run busybox resolved after {len(tries)} tries, {time.monotonic() - started:.1f}s")
            return
        time.sleep(2)
    pytest.fail("kubectl run busybox never resolved the kubernetes Service:\n" + "\n---\n".join(tries))
