"""The registry guides of the original documentation, followed step by step on local clusters.

"Configuring Certificate Authorities" (on the shared 1+1 cluster): a registry served over TLS
with a certificate from a CA of the test's own, on the cluster's host bridge. Without the CA both
kinds of pulls a node makes fail with a certificate error: containerd's CRI pulls (a pod) and the
agent's own (the node API's ImagePull). The guide's ``machine.files`` entry appends the CA's PEM
to ``/etc/ssl/certs/ca-certificates``; then both pulls succeed. The entry is removed again and the
cluster is healthy, as it was.

"Configuring Pull Through Cache" and "Air-gapped Environments" (three fresh 1+0 clusters, one at
a time). The internet registries are played by an *upstream* ``docker-registry`` on the host's
loopback (so no node can reach it) holding a copy of the images local clusters run; in front of
it one caching proxy per upstream host (``kubeplane registry cache start``, as the guide runs one
``registry:2`` per upstream):

1. the first cluster, created with ``--registry-mirror docker.io=... --registry-mirror
   k8s.gcr.io=...`` pointing at the caches, comes up pulling every image through them (the caches'
   logs show the nodes' pulls, the upstream's log the caches' fetches, and the cluster's own
   registry serves nothing);
2. the upstream is stopped, and a second cluster with the same mirrors comes up: containerd on
   its node pulls every image from the warm caches, which can no longer ask the upstream (the
   guide's promise, "the second boot ... is faster" with the images local, is measured by
   ``bench/bench_registry_cache.py``);
3. the air-gapped procedure runs: ``kubeplane images --local``, each image pulled (from the warm
   caches: the upstream is gone) and pushed to an internal registry under the guide's ``sed``
   name; the third cluster, created with ``--registry-mirror '*'=<internal registry>`` only,
   comes up from it alone.

Last, the air-gapped registry lacks an image: the control plane node is told to run a scheduler
image that was never pushed, and ``kubeplane health`` fails within its deadline naming that image
and the registry's answer, rather than waiting on a pod that never gets Ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import E2ECluster, _cluster, run_kubeplane
from e2e_clients import wait_until
from test_proxy import agent_pull, node_name, pod_image_id

from kubeplane import api, pki
from kubeplane.config import toolchain_cache
from kubeplane.provision import hostproc, registry, toolchain

pytestmark = pytest.mark.e2e

#: The guide's CA bundle name (Go programs, containerd and ctr among them, read every file there).
CA_BUNDLE = "/etc/ssl/certs/ca-certificates"
#: An image every local cluster's registry holds, copied to the TLS registry under fresh tags.
SOURCE_IMAGE = "library/busybox:latest"
CA_PROBE = "kpe2e/ca-probe"
CACHE_CLUSTER = ("e2erc", "10.5.51.0/24", "10.5.51.1")
WARM_CACHE_CLUSTER = ("e2erw", "10.5.52.0/24", "10.5.52.1")
AIRGAP_CLUSTER = ("e2eag", "10.5.53.0/24", "10.5.53.1")
#: The registries local clusters pull from (the guide runs a cache for each of five).
CACHED_HOSTS = ("docker.io", "k8s.gcr.io")
LOOPBACK = "127.0.0.1"
#: Where the caches and the internal registry listen: every bridge made later reaches them.
ANY_ADDRESS = "0.0.0.0"


def free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def skopeo_copy(source: str, target: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["skopeo", "copy", "--quiet", *flags, f"docker://{source}", f"docker://{target}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def pod_events(cluster: E2ECluster, pod: str) -> str:
    result = cluster.kubectl("get", "events", "--field-selector", f"involvedObject.name={pod}", "-o", "json")
    if result.returncode != 0:
        return ""
    return "\n".join(str(event.get("message")) for event in json.loads(result.stdout).get("items") or [])


def run_pod(cluster: E2ECluster, pod: str, image: str, node: str) -> None:
    overrides = {"spec": {"nodeName": node_name(cluster, node)}}
    run = cluster.kubectl(
        "run", pod, f"--image={image}", "--restart=Never", f"--overrides={json.dumps(overrides)}",
        "--command", "--", "sleep", "3600",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


def node_file(cluster: E2ECluster, node: str, path: str) -> str:
    result = cluster.cli("-n", node, "read", path)
    return result.stdout if result.returncode == 0 else ""


def test_custom_ca_is_trusted_by_both_pulls(cluster_1cp1w: E2ECluster, tmp_path: Path) -> None:
    cluster = cluster_1cp1w
    worker = cluster.workers[0]
    host = urlsplit(cluster.endpoint).hostname or ""
    config = cluster.cli("-n", worker, "get", "mc", "-o", "json")
    assert config.returncode == 0, config.stdout + config.stderr
    assert '"files"' not in config.stdout, "the test adds machine.files and removes them after"

    # A CA of our own and a registry certificate for the bridge address, from kubeplane's PKI.
    authority = pki.new_ca("kpe2e registry CA")
    leaf = pki.issue(ca=authority, common_name="kpe2e registry", ip_addresses=[host], usages=("server",))
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.crt").write_bytes(authority.cert)  # skopeo's --dest-cert-dir trusts *.crt
    (tmp_path / "tls.crt").write_bytes(leaf.cert)
    (tmp_path / "tls.key").write_bytes(leaf.key)
    tls = registry.TLS(certificate=tmp_path / "tls.crt", key=tmp_path / "tls.key", ca=certs / "ca.crt")
    secure = registry.Registry(directory=tmp_path / "registry", address=host, port=free_port(host), tls=tls)
    pods: list[str] = []
    added = False
    try:
        secure.start()
        tags = {kind: f"{kind}-{secrets.token_hex(4)}" for kind in ("cri", "agent", "cri-ca", "agent-ca")}
        for tag in tags.values():
            copied = skopeo_copy(
                f"{host}:{registry.REGISTRY_PORT}/{SOURCE_IMAGE}",
                f"{secure.host}/{CA_PROBE}:{tag}",
                "--src-tls-verify=false",
                f"--dest-cert-dir={certs}",
            )
            assert copied.returncode == 0, copied.stderr
        image = {kind: f"{secure.host}/{CA_PROBE}:{tag}" for kind, tag in tags.items()}

        # Without the CA: the agent's pull and containerd's pull both refuse the certificate.
        with pytest.raises(api.APIError) as refused:
            asyncio.run(agent_pull(cluster, worker, image["agent"]))
        assert "certificate signed by unknown authority" in str(refused.value), str(refused.value)
        pods.append(f"ca-probe-{secrets.token_hex(3)}")
        run_pod(cluster, pods[-1], image["cri"], worker)
        wait_until(
            f"pod {pods[-1]} to fail pulling with a certificate error",
            lambda: "certificate signed by unknown authority" in pod_events(cluster, pods[-1]),
            timeout=120,
        )
        assert pod_image_id(cluster, pods[-1]) == ""

        # The guide: append the PEM to the CA bundle with machine.files (the node's services restart).
        pem = authority.cert.decode()
        entry = {"content": pem, "permissions": 0o644, "path": CA_BUNDLE, "op": "append"}
        add = [{"op": "add", "path": "/machine/files", "value": [entry]}]
        patched = cluster.cli("-n", worker, "patch", "mc", "-p", json.dumps(add))
        assert patched.returncode == 0, patched.stdout + patched.stderr
        added = True
        wait_until(
            f"the CA in {worker}'s {CA_BUNDLE}", lambda: pem.strip() in node_file(cluster, worker, CA_BUNDLE)
        )
        health = cluster.cli("health", "--wait-timeout", "5m")
        assert health.returncode == 0, health.stdout + health.stderr

        replies = asyncio.run(agent_pull(cluster, worker, image["agent-ca"]))
        assert replies == [{"image": image["agent-ca"], "pulled": True}]
        pods.append(f"ca-probe-{secrets.token_hex(3)}")
        run_pod(cluster, pods[-1], image["cri-ca"], worker)
        wait_until(
            f"pod {pods[-1]} to have pulled over TLS",
            lambda: pod_image_id(cluster, pods[-1]) != "",
            timeout=240,
        )
        answered = {
            p.reference
            for p in registry.pulls(secure.log)
            if p.kind == "manifests" and p.status == 200 and p.client == worker
        }
        assert {tags["cri-ca"], tags["agent-ca"]} <= answered, secure.log.read_text()[-2000:]
    finally:
        for pod in pods:
            cluster.kubectl("delete", "pod", pod, "--ignore-not-found", "--wait=false")
        secure.stop()
        if added:
            remove = [{"op": "remove", "path": "/machine/files"}]
            undo = cluster.cli("-n", worker, "patch", "mc", "-p", json.dumps(remove))
            assert undo.returncode == 0, undo.stdout + undo.stderr
            # The agent removes the file its append created: the node trusts what it did before.
            wait_until(
                f"{CA_BUNDLE} to be gone from {worker}", lambda: node_file(cluster, worker, CA_BUNDLE) == ""
            )
            health = cluster.cli("health", "--wait-timeout", "5m")
            assert health.returncode == 0, health.stdout + health.stderr


def local_cluster(
    env: dict[str, str], spec: tuple[str, str, str], *mirrors: str
) -> contextlib.AbstractContextManager[E2ECluster]:
    """A 1+0 cluster (the control plane node runs the workloads too) with these ``--registry-mirror``
    values, destroyed (and checked for leftovers) when the block ends."""
    name, cidr, _ = spec
    untainted = json.dumps({"cluster": {"allowSchedulingOnMasters": True}})
    args = (
        "--config-patch",
        untainted,
        *(arg for mirror in mirrors for arg in ("--registry-mirror", mirror)),
    )
    return contextlib.contextmanager(_cluster)(
        env, name=name, cidr=cidr, controlplanes=1, workers=0, extra_args=args
    )


@pytest.fixture(scope="module")
def upstream(
    cluster_1cp1w: E2ECluster,
    toolchain_paths: toolchain.ToolchainPaths,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[registry.Registry]:
    """The stand-in for the internet registries, on loopback only: a copy of the registry storage
    that ``cluster create`` keeps in the toolchain cache (the shared cluster's creation made it)."""
    seed = toolchain_paths.root.parent.parent / toolchain_cache.REGISTRY_STORAGE_DIR
    internet = registry.Registry(
        directory=tmp_path_factory.mktemp("upstream"), address=LOOPBACK, port=free_port(LOOPBACK)
    )
    assert registry.restore_storage(seed, internet.storage), f"no registry storage copy in {seed}"
    try:
        internet.start()
        yield internet
    finally:
        internet.stop()


@pytest.fixture(scope="module")
def caches(
    e2e_env: dict[str, str], upstream: registry.Registry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[int, Path]]]:
    """``kubeplane registry cache start`` for each upstream host: ``{host: (port, log)}``."""
    root = tmp_path_factory.mktemp("caches")
    started: dict[str, tuple[int, Path]] = {}
    try:
        for host in CACHED_HOSTS:
            port = free_port(ANY_ADDRESS)
            result = run_kubeplane(
                e2e_env, "registry", "cache", "start", "--name", host, "--upstream", upstream.url,
                "--port", str(port), "--root", str(root),
            )  # fmt: skip
            assert result.returncode == 0, result.stdout + result.stderr
            started[host] = (port, root / host / "registry.log")
        yield started
    finally:
        stopped = run_kubeplane(e2e_env, "registry", "cache", "stop", "--purge", "--root", str(root))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def local_images(env: dict[str, str]) -> list[str]:
    """``kubeplane images --local``: the guide's list, one ``HOST/PATH:TAG`` per line."""
    listed = run_kubeplane(env, "images", "--local")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return listed.stdout.split()


def repositories(images: list[str], host: str | None = None) -> set[str]:
    """The repository paths (what a mirror serves) of ``images``, of registry ``host`` or all."""
    return {
        image.split("/", 1)[1].rsplit(":", 1)[0]
        for image in images
        if host is None or image.split("/", 1)[0] == host
    }


def node_pulls(log: Path, cluster: E2ECluster) -> set[str]:
    """Repositories whose manifest one of ``cluster``'s nodes fetched (200) from a registry."""
    nodes = {*cluster.control_plane, *cluster.workers}
    return {
        p.repository
        for p in registry.pulls(log)
        if p.client in nodes and p.kind == "manifests" and p.status == 200
    }


#: Set by the pull-through test once the first cluster came up through the caches.
WARM: dict[str, bool] = {}


def cache_mirrors(spec: tuple[str, str, str], caches: dict[str, tuple[int, Path]]) -> list[str]:
    """``--registry-mirror HOST=URL`` values pointing each cached host at its cache, reached from
    the cluster ``spec``'s bridge address."""
    _, _, bridge = spec
    return [f"{host}=http://{bridge}:{port}" for host, (port, _) in caches.items()]


def assert_pulled_through_caches(
    images: list[str], caches: dict[str, tuple[int, Path]], cluster: E2ECluster
) -> None:
    """``cluster``'s nodes pulled each cached host's images through its cache ("this can be
    verified via registry logs"), and the cluster's own registry (its mirror for every other host)
    served nothing."""
    for host, (_, log) in caches.items():
        assert repositories(images, host) <= node_pulls(log, cluster), log.read_text()[-3000:]
    assert node_pulls(cluster.registry_log, cluster) == set()


def test_pull_through_caches_serve_the_first_cluster(
    e2e_env: dict[str, str], upstream: registry.Registry, caches: dict[str, tuple[int, Path]]
) -> None:
    images = local_images(e2e_env)
    with local_cluster(e2e_env, CACHE_CLUSTER, *cache_mirrors(CACHE_CLUSTER, caches)) as cluster:
        assert_pulled_through_caches(images, caches, cluster)
        # The caches fetched them from the upstream.
        fetched = {p.repository for p in registry.pulls(upstream.log) if p.client == LOOPBACK}
        assert repositories(images) <= fetched, upstream.log.read_text()[-3000:]
    WARM["caches"] = True


def internet_gone(upstream: registry.Registry) -> None:
    """Stop the upstream (again: safe) and check it is gone; the caches keep what they fetched."""
    if not WARM.get("caches"):
        pytest.fail("needs test_pull_through_caches_serve_the_first_cluster to have warmed the caches")
    upstream.stop()
    assert upstream.record is not None and not hostproc.is_running(upstream.record)


def test_a_second_cluster_boots_from_the_warm_caches_with_the_upstream_stopped(
    e2e_env: dict[str, str], upstream: registry.Registry, caches: dict[str, tuple[int, Path]]
) -> None:
    internet_gone(upstream)
    fetched_before = len(registry.pulls(upstream.log))
    images = local_images(e2e_env)
    # ``cluster create`` returns once the cluster is healthy: every image was pulled.
    with local_cluster(e2e_env, WARM_CACHE_CLUSTER, *cache_mirrors(WARM_CACHE_CLUSTER, caches)) as cluster:
        assert_pulled_through_caches(images, caches, cluster)
    # Nothing reached the upstream (it is stopped: its log did not grow).
    assert len(registry.pulls(upstream.log)) == fetched_before


def test_air_gapped_cluster_from_an_internal_registry_filled_from_the_caches(
    e2e_env: dict[str, str],
    upstream: registry.Registry,
    caches: dict[str, tuple[int, Path]],
    tmp_path: Path,
) -> None:
    # The internet goes away (the previous test stopped it already when it ran).
    internet_gone(upstream)

    # "Preparing the Internal Registry": empty, on every address (the cluster's bridge comes later).
    internal = registry.Registry(
        directory=tmp_path / "internal", address=ANY_ADDRESS, port=free_port(ANY_ADDRESS)
    )
    try:
        internal.start()
        # "for image in `talosctl images`": pull each one (from the warm cache of its registry:
        # the upstream is gone), re-tag with the guide's sed (the first component replaced by the
        # internal registry), push.
        images = local_images(e2e_env)
        for image in images:
            host, rest = image.split("/", 1)
            port, _ = caches[host]
            copied = skopeo_copy(
                f"{LOOPBACK}:{port}/{rest}",
                f"{LOOPBACK}:{internal.port}/{rest}",
                "--src-tls-verify=false",
                "--dest-tls-verify=false",
            )
            assert copied.returncode == 0, (
                f"{image} from the cache with the upstream stopped: {copied.stderr}"
            )
        # "We can now verify that the images are pushed to the registry": /v2/_catalog.
        assert set(internal.catalog()) == repositories(images)

        _, _, bridge = AIRGAP_CLUSTER
        with local_cluster(e2e_env, AIRGAP_CLUSTER, f"*=http://{bridge}:{internal.port}") as cluster:
            # "verify that the cluster is air-gapped by inspecting the registry logs".
            assert repositories(images) <= node_pulls(internal.log, cluster), internal.log.read_text()[-3000:]
            assert node_pulls(cluster.registry_log, cluster) == set()
            for _, log in caches.values():
                assert node_pulls(log, cluster) == set()
            missing_image_is_named(cluster)
    finally:
        internal.stop()


def missing_image_is_named(cluster: E2ECluster) -> None:
    """An image the internal registry lacks: ``kubeplane health`` names it within its deadline."""
    node = cluster.control_plane[0]
    missing = f"k8s.gcr.io/kube-scheduler:v1.20.2-missing-{secrets.token_hex(3)}"
    patch = [{"op": "replace", "path": "/cluster/scheduler/image", "value": missing}]
    patched = cluster.cli("-n", node, "patch", "mc", "-p", json.dumps(patch))
    assert patched.returncode == 0, patched.stdout + patched.stderr

    def scheduler_image() -> str:
        listed = cluster.kubectl(
            "-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-scheduler", "-o", "json"
        )
        if listed.returncode != 0:
            return ""
        items = json.loads(listed.stdout).get("items") or []
        return str(items[0]["spec"]["containers"][0]["image"]) if items else ""

    wait_until("the scheduler's static pod to name the new image", lambda: scheduler_image() == missing)
    started = time.monotonic()
    health = cluster.cli("health", "--wait-timeout", "60s")
    elapsed = time.monotonic() - started
    assert health.returncode != 0, health.stdout + health.stderr
    report = health.stdout + health.stderr
    assert f"image {missing} cannot be pulled" in report, report
    assert elapsed < 150, f"kubeplane health took {elapsed:.0f}s with a 60s deadline"
