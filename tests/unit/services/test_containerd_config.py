"""containerd config rendering: the fields containerd reads, parsed back as TOML."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from kubeplane.services import containerd

pytestmark = pytest.mark.unit

ROOT = Path("/nodes/n1")


def cri(config: dict[str, Any]) -> dict[str, Any]:
    return config["plugins"]["io.containerd.grpc.v1.cri"]  # type: ignore[no-any-return]


def test_minimal_config_keeps_everything_under_the_node_root() -> None:
    config = tomllib.loads(containerd.render_config(node_root=ROOT))
    assert config["version"] == 2
    assert config["root"] == "/nodes/n1/var/lib/containerd"
    assert config["state"] == "/nodes/n1/run/containerd"
    assert config["grpc"]["address"] == "/nodes/n1/run/containerd/containerd.sock"
    assert config["plugins"]["io.containerd.internal.v1.opt"]["path"] == "/nodes/n1/opt/containerd"
    plugin = cri(config)
    assert plugin["restrict_oom_score_adj"] is True
    assert plugin["sandbox_image"] == "k8s.gcr.io/pause:3.2"
    assert plugin["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": "/nodes/n1/etc/cni/net.d"}
    assert plugin["containerd"]["runtimes"]["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert "registry" not in plugin


def test_paths_match_the_rendered_config() -> None:
    paths = containerd.ContainerdPaths.under(ROOT)
    config = tomllib.loads(containerd.render_config(node_root=ROOT))
    assert config["grpc"]["address"] == str(paths.socket)
    assert config["root"] == str(paths.root)
    assert paths.config == ROOT / "etc/containerd/config.toml"


def test_mirrors_and_registry_configs() -> None:
    text = containerd.render_config(
        node_root=ROOT,
        sandbox_image="registry.local/pause:3.2",
        cni_bin_dir="/opt/cni/bin",
        mirrors={
            "*": ["http://10.5.0.1:6000"],
            "docker.io": ["https://mirror.example", "https://registry-1.docker.io"],
        },
        registries={
            "10.5.0.1:6000": containerd.RegistryConfig(insecure_skip_verify=True),
            "private.example": containerd.RegistryConfig(
                ca_file="/etc/ca.pem", username="robot", password='p"w\\d'
            ),
        },
    )
    plugin = cri(tomllib.loads(text))
    assert plugin["sandbox_image"] == "registry.local/pause:3.2"
    assert plugin["cni"]["bin_dir"] == "/opt/cni/bin"
    assert plugin["registry"]["mirrors"] == {
        "*": {"endpoint": ["http://10.5.0.1:6000"]},
        "docker.io": {"endpoint": ["https://mirror.example", "https://registry-1.docker.io"]},
    }
    assert plugin["registry"]["configs"] == {
        "10.5.0.1:6000": {"tls": {"insecure_skip_verify": True}},
        "private.example": {
            "tls": {"ca_file": "/etc/ca.pem"},
            "auth": {"username": "robot", "password": 'p"w\\d'},
        },
    }


def test_registry_without_settings_renders_nothing() -> None:
    text = containerd.render_config(node_root=ROOT, registries={"plain.example": containerd.RegistryConfig()})
    assert "plain.example" not in text


def test_rendering_is_deterministic() -> None:
    kwargs: dict[str, Any] = {"node_root": ROOT, "mirrors": {"b": ["http://b"], "a": ["http://a"]}}
    assert containerd.render_config(**kwargs) == containerd.render_config(**kwargs)
    text = containerd.render_config(**kwargs)
    assert text.index('mirrors."a"') < text.index('mirrors."b"')
