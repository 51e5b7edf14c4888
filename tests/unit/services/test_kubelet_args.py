"""kubelet argument rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplane.services import kubelet

pytestmark = pytest.mark.unit

ROOT = Path("/nodes/n1")
SOCKET = ROOT / "run/containerd/containerd.sock"


def flags(args: list[str]) -> dict[str, str]:
    parsed = {}
    for arg in args:
        assert arg.startswith("--") and "=" in arg, arg
        name, value = arg[2:].split("=", 1)
        assert name not in parsed, f"flag {name} rendered twice"
        parsed[name] = value
    return parsed


def render(**overrides: object) -> dict[str, str]:
    kwargs: dict[str, object] = {
        "node_root": ROOT,
        "hostname": "n1",
        "node_ip": "10.5.0.2",
        "runtime_socket": SOCKET,
        "cgroup_root": "/kp-n1",
    }
    kwargs.update(overrides)
    return flags(kubelet.render_args(**kwargs))  # type: ignore[arg-type]


def test_defaults_encode_the_environment_facts() -> None:
    got = render()
    assert got["cgroup-driver"] == "cgroupfs"
    assert got["container-runtime"] == "remote"
    assert got["container-runtime-endpoint"] == "unix:///nodes/n1/run/containerd/containerd.sock"
    assert got["fail-swap-on"] == "false"
    assert got["cgroup-root"] == "/kp-n1"
    assert got["node-ip"] == "10.5.0.2"
    assert got["hostname-override"] == "n1"
    assert got["read-only-port"] == "0"
    assert got["pod-infra-container-image"] == "k8s.gcr.io/pause:3.2"
    assert "bootstrap-kubeconfig" not in got and "eviction-hard" not in got and "cluster-dns" not in got


def test_every_path_is_under_the_node_root() -> None:
    got = render()
    paths = kubelet.KubeletPaths.under(ROOT)
    assert got["root-dir"] == str(paths.root_dir)
    assert got["pod-manifest-path"] == str(paths.pod_manifest_path) == "/nodes/n1/etc/kubernetes/manifests"
    assert got["kubeconfig"] == str(paths.kubeconfig)
    for name in ("root-dir", "cert-dir", "pod-manifest-path", "kubeconfig", "volume-plugin-dir"):
        assert got[name].startswith("/nodes/n1/"), name


def test_bootstrap_and_optional_flags() -> None:
    got = render(
        bootstrap=True,
        client_ca_file=ROOT / "pki/ca.crt",
        cluster_dns=["10.96.0.10"],
        node_labels={"role": "worker", "a": "b"},
        eviction_hard={"nodefs.available": "1%", "imagefs.available": "1%"},
    )
    assert got["bootstrap-kubeconfig"] == "/nodes/n1/etc/kubernetes/bootstrap-kubelet.conf"
    assert got["rotate-certificates"] == "true"
    assert got["client-ca-file"] == "/nodes/n1/pki/ca.crt" and got["anonymous-auth"] == "false"
    assert got["cluster-dns"] == "10.96.0.10"
    assert got["node-labels"] == "a=b,role=worker"
    assert got["eviction-hard"] == "imagefs.available<1%,nodefs.available<1%"


def test_extra_args_replace_rendered_flags() -> None:
    got = render(extra_args={"v": "4", "max-pods": "20"})
    assert got["v"] == "4" and got["max-pods"] == "20"
