"""Apply-mode rules, changed paths and diffs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeplane import config

pytestmark = pytest.mark.unit


def patch(doc: config.MachineConfig, path: str, value: Any) -> config.MachineConfig:
    return config.apply_json_patch(doc, [{"op": "add", "path": path, "value": value}])


def test_no_change_allows_every_mode(minimal: config.MachineConfig) -> None:
    result = config.allowed_modes(minimal, minimal.copy())
    assert result.unchanged and result.modes == ("reboot", "immediate", "on-reboot")
    assert config.diff(minimal, minimal) == ""


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("/cluster/apiServer/image", "k8s.gcr.io/kube-apiserver:v1.20.5"),
        ("/machine/time/disabled", True),
        ("/machine/certSANs", ["10.5.0.9"]),
        ("/machine/network", {"hostname": "node-9"}),
    ],
)
def test_immediate_allowed_under_live_subtrees(minimal: config.MachineConfig, path: str, value: Any) -> None:
    result = config.allowed_modes(minimal, patch(minimal, path, value))
    assert result.allows("immediate") and result.refusal("immediate") is None
    assert result.blocking == ()


def test_other_changes_need_a_reboot(minimal: config.MachineConfig) -> None:
    new = patch(minimal, "/machine/kubelet/image", "ghcr.io/talos-systems/kubelet:v1.20.5")
    new = patch(new, "/cluster/apiServer/image", "k8s.gcr.io/kube-apiserver:v1.20.5")
    result = config.allowed_modes(minimal, new)
    assert result.modes == ("reboot", "on-reboot")
    assert result.changed == ("machine.kubelet.image", "cluster.apiServer.image")
    assert result.refusal("immediate") == (
        "machine.kubelet.image changed: --immediate is only allowed for changes under cluster, machine.time, "
        "machine.certSANs, machine.network; apply with a reboot (default) or --on-reboot"
    )
    assert (
        "-    image: ghcr.io/talos-systems/kubelet:v1.20.2\n+    image: ghcr.io/talos-systems/kubelet:v1.20.5"
        in (config.diff(minimal, new))
    )


def test_changed_paths_are_specific() -> None:
    old = {"machine": {"type": "init", "certSANs": ["a"], "env": {"a": "1"}}, "cluster": {"x": [1, 2]}}
    new = {"machine": {"type": "init", "certSANs": ["a", "b"], "env": {"b": "1"}}, "cluster": {"x": [1, 3]}}
    assert config.changed_paths(old, new) == [
        "machine.certSANs[1]",
        "machine.env.a",
        "machine.env.b",
        "cluster.x[1]",
    ]
    assert config.changed_paths({"a": 1}, {"a": True}) == ["a"]
    assert config.changed_paths({"machine": {}}, {"machinery": {}}) == ["machine", "machinery"]


PATHS = st.sampled_from(
    [
        ("cluster", "clusterName"),
        ("cluster", "apiServer", "image"),
        ("machine", "time", "disabled"),
        ("machine", "certSANs"),
        ("machine", "network", "hostname"),
        ("machine", "kubelet", "image"),
        ("machine", "sysctls"),
        ("machine", "install", "disk"),
        ("machine", "timeZone"),
        ("machine", "networkd"),
        ("debug",),
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(PATHS, st.integers(0, 3)), max_size=4))
def test_immediate_iff_every_change_is_under_a_live_subtree(
    minimal: config.MachineConfig, changes: list[tuple[tuple[str, ...], int]]
) -> None:
    old = minimal.to_dict()
    new = minimal.to_dict()
    for path, value in changes:
        node = new
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    result = config.allowed_modes(old, new)
    prefixes = ("cluster", "machine.time", "machine.certSANs", "machine.network")
    live = all(
        any(".".join(path) == prefix or ".".join(path).startswith(prefix + ".") for prefix in prefixes)
        for path, _ in changes
    )
    assert "reboot" in result.modes and "on-reboot" in result.modes
    assert result.allows("immediate") == (live or not result.changed)
    assert set(result.blocking) <= set(result.changed)
    assert config.allowed_modes(old, old).allows("immediate")
