"""The cached toolchain gives real, working parts: versioned binaries and loadable images.

Needs the toolchain built by scripts/setup (``kubeplane toolchain build --with-images``) in
``$KUBEPLANE_CACHE`` (default /var/cache/kubeplane), skopeo, and root for chroot and network
namespaces. kubeplane's own images (busybox, agnhost, cluster DNS) are ensured here: a cache hit
after scripts/setup; otherwise seconds (busybox, agnhost after a Kubernetes build) or about a
minute (the DNS image's debootstrap, which needs the Debian mirror).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dns.message
import dns.query
import dns.rcode
import fake_kube_api
import httpx
import pytest
import yaml
from fake_kube_api import SERVICES, SLICES, ZONE, FakeCluster, endpoint_slice, service

import kubeplane
from kubeplane import pki
from kubeplane.provision import dns_image, images, toolchain, workload_images

if TYPE_CHECKING:
    from conftest import NetNS, Processes

pytestmark = pytest.mark.integration

VERSION = kubeplane.DEFAULT_KUBERNETES_VERSION


@pytest.fixture(scope="module")
def paths() -> toolchain.ToolchainPaths:
    try:
        return toolchain.Toolchain().require(VERSION)
    except toolchain.ToolchainError as exc:
        pytest.fail(f"toolchain prerequisite missing: {exc}")


def _run(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr}{proc.stdout}"
    return proc.stdout


def _unpack_image(archive: Path, dest: Path) -> Path:
    (entry,) = images.read_manifest(archive)
    (layer_name,) = entry["Layers"]
    root = dest / "rootfs"
    root.mkdir()
    with tarfile.open(archive) as outer:
        layer = outer.extractfile(layer_name)
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            inner.extractall(root, filter="tar")
    return root


def _image_config(archive: Path) -> dict[str, Any]:
    """The ``config`` part of a docker-archive's image configuration (Entrypoint, Cmd, Env)."""
    (entry,) = images.read_manifest(archive)
    with tarfile.open(archive) as outer:
        member = outer.extractfile(entry["Config"])
        assert member is not None
        config: dict[str, Any] = json.loads(member.read())["config"]
        return config


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (chroot and a private network namespace); run it as root")


def test_kube_binaries_print_the_cached_version(paths: toolchain.ToolchainPaths) -> None:
    assert _run(str(paths.binary("kube-apiserver")), "--version").strip() == f"Kubernetes {VERSION}"
    for name in ("kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"):
        assert _run(str(paths.binary(name)), "--version").strip() == f"Kubernetes {VERSION}", name
    assert f'GitVersion:"{VERSION}"' in _run(str(paths.binary("kubectl")), "version", "--client")


@pytest.mark.parametrize("name", toolchain.IMAGES)
def test_skopeo_accepts_each_image(paths: toolchain.ToolchainPaths, name: str) -> None:
    archive = paths.image(name)
    info = json.loads(_run("skopeo", "inspect", f"docker-archive:{archive}"))
    assert info["Os"] == "linux" and info["Architecture"] == images.host_arch()
    assert len(info["Layers"]) == 1
    assert images.read_manifest(archive)[0]["RepoTags"] == [paths.image_ref(name)]


def test_pause_image_runs_under_chroot(paths: toolchain.ToolchainPaths, tmp_path: Path) -> None:
    _require_root()
    root = _unpack_image(paths.image("pause"), tmp_path)
    assert _run("chroot", str(root), "/pause", "-v").startswith("pause.c v")


def test_kube_proxy_image_has_working_iptables_and_conntrack(
    paths: toolchain.ToolchainPaths, tmp_path: Path
) -> None:
    _require_root()
    root = str(_unpack_image(paths.image("kube-proxy"), tmp_path))
    assert _run("chroot", root, "kube-proxy", "--version").strip() == f"Kubernetes {VERSION}"
    assert _run("chroot", root, "conntrack", "--version").startswith("conntrack v")
    # The image has no shell: the host's sh runs the chrooted commands inside a throwaway
    # network namespace, so the rules they write vanish with it.
    in_image = f"chroot {root}"
    script = f"""set -e
{in_image} iptables -t nat -N KUBE-SERVICES
{in_image} iptables -t nat -A KUBE-SERVICES -p tcp -m comment --comment kp-test --dport 443 -j RETURN
{in_image} ip6tables -t filter -N KUBE-FIREWALL
{in_image} iptables-save -t nat | {in_image} iptables-restore --test
{in_image} iptables-save -t nat
{in_image} ip6tables-save -t filter
"""
    out = _run("unshare", "--net", "sh", "-c", script)
    assert "-A KUBE-SERVICES -p tcp -m comment --comment kp-test -m tcp --dport 443 -j RETURN" in out
    assert ":KUBE-FIREWALL" in out


def test_busybox_image_runs_its_shell_tar_and_nslookup(tmp_path: Path) -> None:
    _require_root()
    image = workload_images.Builder().ensure_busybox()
    assert images.read_manifest(image.archive)[0]["RepoTags"] == [image.refs[0]]
    info = json.loads(_run("skopeo", "inspect", f"docker-archive:{image.archive}"))
    assert len(info["Layers"]) == 1
    root = _unpack_image(image.archive, tmp_path)
    assert (root / "bin" / "sh").readlink() == Path("/bin/busybox")
    out = _run("chroot", str(root), "/bin/sh", "-c", "tar --help 2>&1 | head -1; nslookup 2>&1 | head -1; id")
    assert f"BusyBox v{image.refs[0].rpartition(':')[2]}" in out
    assert "uid=0(root) gid=0(root)" in out
    # kubectl cp is tar through exec: a round trip through the image's tar.
    script = "mkdir /tmp/d && echo hi >/tmp/d/f && tar -cf - -C /tmp d | tar -xf - -C /root && cat /root/d/f"
    assert _run("chroot", str(root), "/bin/sh", "-c", script).strip() == "hi"


def test_agnhost_image_serves_netexec_and_has_busybox_sh_and_tar(
    tmp_path: Path, netns: NetNS, processes: Processes, wait_until: Callable[..., Any]
) -> None:
    _require_root()
    image = workload_images.Builder().ensure_agnhost()
    # The VERSION file's tag, then the one Kubernetes 1.20.2's own e2e framework asks for.
    assert image.refs == (
        "k8s.gcr.io/e2e-test-images/agnhost:2.25",
        "k8s.gcr.io/e2e-test-images/agnhost:2.21",
    )
    assert images.read_manifest(image.archive)[0]["RepoTags"] == [image.refs[0]]
    config = _image_config(image.archive)
    assert config["Entrypoint"] == ["/agnhost"] and config["Cmd"] == ["pause"]
    root = _unpack_image(image.archive, tmp_path)
    assert (root / "agnhost-2").readlink() == Path("agnhost")
    assert (root / "uploads").is_dir() and (root / "localhost.crt").is_file()
    help_text = _run("chroot", str(root), "/agnhost", "--help")
    assert "netexec" in help_text and "pause" in help_text
    # kubectl exec -- sh and kubectl cp (tar through exec) need these: a round trip through tar.
    out = _run("chroot", str(root), "/bin/sh", "-c", "tar --help 2>&1 | head -1")
    assert out.startswith("BusyBox v")
    script = "mkdir /tmp/d && echo hi >/tmp/d/f && tar -cf - -C /tmp d | tar -xf - -C /root && cat /root/d/f"
    assert _run("chroot", str(root), "/bin/sh", "-c", script).strip() == "hi"
    # The echo server e2e tests and the README use, in a private network namespace.
    processes.start(
        ["chroot", root, "/agnhost", "netexec", "--http-port=8080"], name="agnhost", netns=netns.name
    )
    url = f"http://{netns.node_ip}:8080"
    wait_until(
        lambda: httpx.get(f"{url}/echo?msg=hi", timeout=2).text == "hi", timeout=20, what="netexec /echo"
    )
    assert httpx.get(f"{url}/clientip", timeout=2).text.startswith(f"{netns.host_ip}:")


@pytest.fixture
def host_side_api(netns: NetNS) -> Iterator[tuple[FakeCluster, int]]:
    """The fake API server on the host's end of ``netns``'s veth, where the node side reaches it."""
    with fake_kube_api.serve(netns.host_ip) as served:
        yield served


def test_dns_image_answers_from_debian_python_in_a_private_network_namespace(
    tmp_path: Path,
    netns: NetNS,
    processes: Processes,
    host_side_api: tuple[FakeCluster, int],
    wait_until: Callable[..., Any],
) -> None:
    _require_root()
    try:
        image = dns_image.Builder().ensure()
    except Exception as exc:
        pytest.fail(f"cannot build the cluster DNS image (needs debootstrap and a Debian mirror): {exc}")
    assert images.read_manifest(image.archive)[0]["RepoTags"] == [
        f"kubeplane/cluster-dns:{kubeplane.__version__}"
    ]
    config = _image_config(image.archive)
    assert config["Entrypoint"] == ["/usr/bin/python3", "-m", "kubeplane.dns"]
    assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]
    root = _unpack_image(image.archive, tmp_path)
    # Nothing of kubeplane but the add-on's import closure, and Debian's libraries, not the venv's.
    packed = {
        p.relative_to(root / "usr/lib/python3/dist-packages/kubeplane").as_posix()
        for p in (root / "usr/lib/python3/dist-packages/kubeplane").rglob("*.py")
    }
    assert {p.split("/")[0] for p in packed} == {"__init__.py", "clients", "dns", "guard.py", "retry.py"}
    probe = "import dns.version, httpx, kubeplane.clients.kube as k; "
    probe += "print(httpx.__version__, dns.version.version, httpx.__file__, k.__file__)"
    httpx_version, dnspython_version, httpx_file, kube_file = _run(
        "chroot", str(root), "/usr/bin/python3", "-c", probe
    ).split()
    assert httpx_version.startswith("0.23.") and dnspython_version.startswith("2.3."), (
        httpx_version,
        dnspython_version,
    )
    assert httpx_file.startswith("/usr/lib/python3/dist-packages/") and kube_file.startswith(
        "/usr/lib/python3/dist-packages/"
    )

    state, api_port = host_side_api
    state.put(SERVICES, service("web", "10.96.0.50"))
    state.put(SERVICES, service("db", "None"))
    state.put(SLICES, endpoint_slice("db", "10.244.1.5", "db-0"))
    (root / "Corefile").write_text(
        f""".:53 {{
    errors
    health {netns.node_ip}:8080
    ready {netns.node_ip}:8181
    kubernetes {ZONE} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    loadbalance
}}
"""
    )
    cluster_entry = {
        "server": f"http://{netns.host_ip}:{api_port}",
        "certificate-authority-data": base64.b64encode(pki.new_ca("fake").cert).decode(),
    }
    (root / "kubeconfig").write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": cluster_entry}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    # As a runtime would start it: the image's environment only, its entrypoint, the manifest's args.
    started = processes.start(
        [
            "chroot",
            root,
            "/usr/bin/env",
            "-i",
            *config["Env"],
            *config["Entrypoint"],
            "-conf",
            "/Corefile",
            "--kubeconfig",
            "/kubeconfig",
        ],
        name="cluster-dns",
        netns=netns.name,
    )
    ready = f"http://{netns.node_ip}:8181/ready"
    wait_until(
        lambda: httpx.get(ready, timeout=2).status_code == 200,
        timeout=30,
        what="the image's /ready",
        logs=started.tail,
    )

    def ask(name: str, rdtype: str = "A") -> dns.message.Message:
        return dns.query.udp(dns.message.make_query(name, rdtype), netns.node_ip, timeout=2, port=53)

    def addresses(name: str) -> list[str]:
        return sorted(rdata.to_text() for rrset in ask(name).answer for rdata in rrset)

    assert addresses(f"web.default.svc.{ZONE}") == ["10.96.0.50"]
    assert addresses(f"db-0.db.default.svc.{ZONE}") == ["10.244.1.5"]
    srv = ask(f"_http._tcp.web.default.svc.{ZONE}", "SRV")
    assert [r.to_text() for rrset in srv.answer for r in rrset] == [f"0 100 80 web.default.svc.{ZONE}."]
    assert ask(f"nope.default.svc.{ZONE}").rcode() == dns.rcode.NXDOMAIN
    # The watch (httpx 0.23's streaming) delivers a new Service: nothing lists again while a watch
    # stream is open, so only the watch can (quiet machine: well under a second; the window is
    # for a loaded CI machine).
    state.put(SERVICES, service("api", "10.96.0.60"))
    wait_until(
        lambda: addresses(f"api.default.svc.{ZONE}") == ["10.96.0.60"], timeout=10, what="the new Service"
    )
    assert started.process.poll() is None, started.tail()
