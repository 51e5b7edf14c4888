"""The "Configuring Corporate Proxies" guide, followed on the shared 1+1 cluster.

The guide sets ``machine.env`` (``http_proxy``, ``https_proxy``, ``no_proxy``); the promise is
that the node's image pulls then go through the proxy. The proxy is Debian's tinyproxy, run by
this module as a child process listening on the cluster's host bridge (where the cluster's
registry also listens), with a log of its own. ``no_proxy`` names the cluster's own addresses, as
the guide suggests (the API server endpoint by its port, the nodes), but not the registry: so
both kinds of pulls a node makes must show up in tinyproxy's log:

- containerd's CRI pulls, for a pod the kubelet starts (``kubectl run``);
- the agent's own pulls (the node API's ImagePull, what ``kubeplane upgrade`` uses).

Each pull asks for a tag pushed just before under a fresh name, so no node already has it. The
cluster is left as it was: the patch is removed again and the cluster is healthy.

The guide's next step, the DNS nameservers, goes in the same patch and shows in the node's
``/etc/resolv.conf``. Its NTP servers run chronyd in the node (tests/integration/agent/
test_agent_time_sync.py follows that part with a real NTP server).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from e2e_clients import wait_until

from kubeplane.api import Credentials, NodeClient
from kubeplane.config import client as client_config
from kubeplane.provision import registry

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

#: An image every local cluster's registry holds (pushed by ``cluster create``).
SOURCE_IMAGE = "library/busybox:latest"
#: The repository (a Docker Hub name, so the node pulls it through its ``*`` mirror) of the probes.
PROBE_REPOSITORY = "kpe2e/proxy-probe"


def free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def tinyproxy(cluster_1cp1w: E2ECluster, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """tinyproxy on the cluster's bridge address, allowing the cluster's nodes: ``(URL, log)``."""
    binary = shutil.which("tinyproxy")
    if binary is None:
        pytest.fail("tinyproxy is not installed (Debian package tinyproxy; scripts/setup installs it)")
    host = urlsplit(cluster_1cp1w.endpoint).hostname or ""
    port = free_port(host)
    log = tmp_path / "tinyproxy.log"
    conf = tmp_path / "tinyproxy.conf"
    conf.write_text(
        f"Port {port}\nListen {host}\nTimeout 600\nMaxClients 20\n"
        f'LogFile "{log}"\nLogLevel Info\n'
        + "".join(f"Allow {address}\n" for address in cluster_1cp1w.control_plane + cluster_1cp1w.workers)
    )
    proxy = subprocess.Popen(
        [binary, "-d", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:

        def listening() -> bool:
            assert proxy.poll() is None, f"tinyproxy exited with {proxy.returncode}: {log.read_text()}"
            with socket.socket() as client:
                return client.connect_ex((host, port)) == 0

        wait_until(f"tinyproxy on {host}:{port}", listening, timeout=30)
        yield f"http://{host}:{port}", log
    finally:
        proxy.terminate()  # by the PID we started, never by name
        try:
            proxy.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()


def push_probe(host: str, tag: str) -> str:
    """Copy the source image to ``PROBE_REPOSITORY:tag`` in the registry; the image name to pull."""
    result = subprocess.run(
        [
            "skopeo",
            "copy",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            f"docker://{host}:{registry.REGISTRY_PORT}/{SOURCE_IMAGE}",
            f"docker://{host}:{registry.REGISTRY_PORT}/{PROBE_REPOSITORY}:{tag}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return f"{PROBE_REPOSITORY}:{tag}"


def proxied_manifest_requests(log: Path, tag: str) -> list[str]:
    """tinyproxy's request lines for the probe's manifest (any method: HEAD resolves, GET fetches)."""
    wanted = f"/v2/{PROBE_REPOSITORY}/manifests/{tag}"
    return [
        line for line in log.read_text(errors="replace").splitlines() if "Request" in line and wanted in line
    ]


async def agent_pull(cluster: E2ECluster, node: str, image: str) -> list[dict[str, object]]:
    """The node API's ImagePull on ``node`` (the agent's own ``ctr`` pull), as the CLI would call it."""
    _, context = client_config.current(client_config.load(cluster.client_config), cluster.name)
    credentials = Credentials(ca=context.ca_pem, cert=context.client.cert, key=context.client.key)
    async with NodeClient(context.endpoints, credentials=credentials, nodes=[node]) as client:
        return [reply.unwrap() for reply in await client.image_pull(image, timeout=600)]


def node_name(cluster: E2ECluster, address: str) -> str:
    result = cluster.kubectl("get", "nodes", "-o", "json")
    assert result.returncode == 0, result.stderr
    for item in json.loads(result.stdout)["items"]:
        if any(a["address"] == address for a in item["status"]["addresses"] if a["type"] == "InternalIP"):
            return str(item["metadata"]["name"])
    raise AssertionError(f"no node has the address {address}: {result.stdout}")


def service_environ(cluster: E2ECluster, node: str, service: str) -> dict[str, str]:
    """The environment the running ``service`` of ``node`` started with (``/proc/PID/environ``)."""
    listed = cluster.cli("-n", node, "service", service, "-o", "json")
    if listed.returncode != 0:
        return {}
    pid = json.loads(listed.stdout.splitlines()[0]).get("pid")
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes() if pid else b""
    except OSError:  # it exited in between
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def services_have(cluster: E2ECluster, node: str, proxy: str | None) -> bool:
    """Whether containerd and the kubelet of ``node`` run with ``http_proxy`` = ``proxy`` (None: unset)."""
    for service in ("containerd", "kubelet"):
        environ = service_environ(cluster, node, service)
        if not environ or environ.get("http_proxy") != proxy:
            return False
    return True


def node_file(cluster: E2ECluster, node: str, path: str) -> str:
    """A file of ``node`` as ``kubeplane read`` prints it ("" when the read fails)."""
    result = cluster.cli("-n", node, "read", path)
    return result.stdout if result.returncode == 0 else ""


def pod_image_id(cluster: E2ECluster, pod: str) -> str:
    result = cluster.kubectl("get", "pod", pod, "-o", "json")
    if result.returncode != 0:
        return ""
    statuses = json.loads(result.stdout).get("status", {}).get("containerStatuses") or []
    return str(statuses[0].get("imageID") or "") if statuses else ""


def test_corporate_proxy_carries_the_nodes_pulls(
    cluster_1cp1w: E2ECluster, tinyproxy: tuple[str, Path]
) -> None:
    proxy_url, proxy_log = tinyproxy
    cluster = cluster_1cp1w
    worker = cluster.workers[0]
    host = urlsplit(cluster.endpoint).hostname or ""
    endpoint_port = urlsplit(cluster.endpoint).port
    config = cluster.cli("-n", worker, "get", "mc", "-o", "json")
    assert config.returncode == 0, config.stdout + config.stderr
    machine = json.loads(config.stdout.splitlines()[0])["spec"]["machine"]
    assert "env" not in machine, "the test adds machine.env and removes it after"
    nameservers = machine["network"]["nameservers"]
    assert host not in nameservers

    # "To make use of a proxy": the guide's machine.env, applied the default way (the node's
    # services restart and read their environment again). The registry is not in no_proxy.
    no_proxy = ",".join([f"{host}:{endpoint_port}", *cluster.control_plane, *cluster.workers, "127.0.0.1"])
    env = {"http_proxy": proxy_url, "https_proxy": proxy_url, "no_proxy": no_proxy}
    pod = f"proxy-probe-{secrets.token_hex(3)}"
    try:
        # "Additionally, configure the DNS nameservers": in the same patch, so one restart applies both.
        patch = [
            {"op": "add", "path": "/machine/env", "value": env},
            {"op": "replace", "path": "/machine/network/nameservers", "value": [host]},
        ]
        result = cluster.cli("-n", worker, "patch", "mc", "-p", json.dumps(patch))
        assert result.returncode == 0, result.stdout + result.stderr
        wait_until(
            "containerd and the kubelet to run with the proxy",
            lambda: services_have(cluster, worker, proxy_url),
        )
        health = cluster.cli("health", "--wait-timeout", "5m")
        assert health.returncode == 0, health.stdout + health.stderr
        wait_until(
            f"nameserver {host} in {worker}'s /etc/resolv.conf",
            lambda: f"nameserver {host}" in node_file(cluster, worker, "/etc/resolv.conf").splitlines(),
            timeout=60,
        )

        # A pod on the node: containerd pulls its image through the proxy.
        tag = f"cri-{secrets.token_hex(4)}"
        image = push_probe(host, tag)
        overrides = {"spec": {"nodeName": node_name(cluster, worker)}}
        run = cluster.kubectl(
            "run", pod, f"--image={image}", "--restart=Never", f"--overrides={json.dumps(overrides)}",
            "--command", "--", "sleep", "3600",
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        wait_until(f"pod {pod} to have pulled {image}", lambda: pod_image_id(cluster, pod) != "", timeout=240)
        assert proxied_manifest_requests(proxy_log, tag), proxy_log.read_text()

        # The agent's own pull (the node API's ImagePull) goes through it too.
        tag = f"agent-{secrets.token_hex(4)}"
        image = push_probe(host, tag)
        replies = asyncio.run(agent_pull(cluster, worker, image))
        assert replies == [{"image": image, "pulled": True}]
        assert proxied_manifest_requests(proxy_log, tag), proxy_log.read_text()
    finally:
        cluster.kubectl("delete", "pod", pod, "--ignore-not-found", "--wait=false")
        undo_patch = [
            {"op": "remove", "path": "/machine/env"},
            {"op": "replace", "path": "/machine/network/nameservers", "value": nameservers},
        ]
        undo = cluster.cli("-n", worker, "patch", "mc", "-p", json.dumps(undo_patch))
        assert undo.returncode == 0, undo.stdout + undo.stderr
        wait_until(
            "containerd and the kubelet to run without the proxy",
            lambda: services_have(cluster, worker, None),
        )
        health = cluster.cli("health", "--wait-timeout", "5m")
        assert health.returncode == 0, health.stdout + health.stderr
