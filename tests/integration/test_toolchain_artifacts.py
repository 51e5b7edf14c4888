"""The cached toolchain gives real, working parts: versioned binaries and loadable images.

Needs the toolchain built by scripts/setup (``kubeplane toolchain build``) in ``$KUBEPLANE_CACHE``
(default /var/cache/kubeplane), skopeo, and root for chroot and network namespaces. The busybox
workload image is ensured here (a cache hit after scripts/setup, seconds otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

import kubeplane
from kubeplane.provision import images, toolchain, workload_images

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
