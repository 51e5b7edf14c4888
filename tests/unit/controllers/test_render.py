"""Static pods of the control plane: golden files plus the properties that matter.

Regenerate golden files after an intended change with ``KUBEPLANE_UPDATE_GOLDEN=1`` (see conftest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

import pytest
from kubernetes import client as k8s_client

from kubeplane.controllers.k8s import RenderError, files, render

pytestmark = pytest.mark.unit

# A fictional node root: rendering must place every node path under whatever root it is given.
NODE_ROOT = PurePosixPath("/nodes/cp1")

Pod = dict[str, Any]


def _container(pod: Pod) -> dict[str, Any]:
    containers = pod["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _flags(pod: Pod) -> list[tuple[str, str]]:
    command = _container(pod)["command"]
    pairs = []
    for arg in command[1:]:
        assert arg.startswith("--") and "=" in arg, arg
        name, value = arg[2:].split("=", 1)
        pairs.append((name, value))
    return pairs


def _flag_map(pod: Pod) -> dict[str, str]:
    return dict(_flags(pod))


def _with(inputs: render.ControlPlaneInputs, component: str, **changes: Any) -> render.ControlPlaneInputs:
    field = {
        files.APISERVER: "apiserver",
        files.CONTROLLER_MANAGER: "controller_manager",
        files.SCHEDULER: "scheduler",
    }[component]
    return dataclasses.replace(inputs, **{field: dataclasses.replace(inputs.component(component), **changes)})


def _at_version(inputs: render.ControlPlaneInputs, version: str) -> render.ControlPlaneInputs:
    for component in files.COMPONENTS:
        inputs = _with(inputs, component, image=f"k8s.gcr.io/{component}:{version}")
    return inputs


@pytest.mark.parametrize("component", files.COMPONENTS)
def test_static_pod_matches_golden(
    cp_inputs: render.ControlPlaneInputs, golden: Callable[[str, str], None], component: str
) -> None:
    pods = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)
    golden(f"static-pod-{component}.yaml", render.dump_yaml(pods[component]))


def test_rendering_is_deterministic(cp_inputs: render.ControlPlaneInputs) -> None:
    first = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)
    second = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)
    assert [render.dump_yaml(p) for p in first.values()] == [render.dump_yaml(p) for p in second.values()]


@pytest.mark.parametrize("component", files.COMPONENTS)
def test_pod_identity_labels_and_annotations(cp_inputs: render.ControlPlaneInputs, component: str) -> None:
    pod = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)[component]
    meta = pod["metadata"]
    assert (meta["name"], meta["namespace"]) == (component, "kube-system")
    assert meta["labels"] == {"k8s-app": component, "tier": "control-plane"}
    assert meta["annotations"] == {
        "kubeplane.dev/config-version": cp_inputs.component(component).config_version,
        "kubeplane.dev/secrets-version": "1",
    }
    spec = pod["spec"]
    assert spec["hostNetwork"] is True
    assert spec["priorityClassName"] == "system-cluster-critical"
    container = _container(pod)
    assert container["image"] == cp_inputs.component(component).image
    assert container["command"][0] == f"/usr/local/bin/{component}"
    assert container["resources"]["requests"]


def test_config_version_change_touches_only_its_component(cp_inputs: render.ControlPlaneInputs) -> None:
    before = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)
    after = render.render_static_pods(
        _with(cp_inputs, files.APISERVER, config_version="9", extra_args={"v": "2"}), node_root=NODE_ROOT
    )
    assert after[files.APISERVER] != before[files.APISERVER]
    assert after[files.CONTROLLER_MANAGER] == before[files.CONTROLLER_MANAGER]
    assert after[files.SCHEDULER] == before[files.SCHEDULER]


@pytest.mark.parametrize("component", files.COMPONENTS)
def test_flags_sorted_and_unique(cp_inputs: render.ControlPlaneInputs, component: str) -> None:
    names = [name for name, _ in _flags(render.render_static_pods(cp_inputs, node_root=NODE_ROOT)[component])]
    assert names == sorted(names)
    assert len(names) == len(set(names))


def test_extra_args_override_defaults_instead_of_duplicating(cp_inputs: render.ControlPlaneInputs) -> None:
    inputs = _with(
        cp_inputs,
        files.APISERVER,
        extra_args={
            "--profiling": "true",
            "enable-admission-plugins": "NodeRestriction",
            "feature-gates": "A=true",
        },
    )
    pod = render.render_apiserver(inputs, node_root=NODE_ROOT)
    names = [name for name, _ in _flags(pod)]
    assert names.count("profiling") == 1
    assert names.count("enable-admission-plugins") == 1
    flags = _flag_map(pod)
    assert flags["profiling"] == "true"
    assert flags["enable-admission-plugins"] == "NodeRestriction"
    assert flags["feature-gates"] == "A=true"
    assert names == sorted(names)


def test_extra_args_move_probes_with_port_and_bind_address(cp_inputs: render.ControlPlaneInputs) -> None:
    inputs = _with(
        cp_inputs, files.SCHEDULER, extra_args={"secure-port": "20259", "bind-address": "10.5.0.2"}
    )
    probe = _container(render.render_scheduler(inputs, node_root=NODE_ROOT))["livenessProbe"]["httpGet"]
    assert (probe["host"], probe["port"], probe["scheme"]) == ("10.5.0.2", 20259, "HTTPS")


def test_non_numeric_secure_port_is_refused(cp_inputs: render.ControlPlaneInputs) -> None:
    inputs = _with(cp_inputs, files.SCHEDULER, extra_args={"secure-port": "https"})
    with pytest.raises(RenderError, match="--secure-port=https is not a port number"):
        render.render_scheduler(inputs, node_root=NODE_ROOT)


def test_invalid_extra_arg_name_names_the_field(cp_inputs: render.ControlPlaneInputs) -> None:
    inputs = _with(cp_inputs, files.CONTROLLER_MANAGER, extra_args={"a=b": "c"})
    with pytest.raises(RenderError, match=r"cluster\.controllerManager\.extraArgs"):
        render.render_controller_manager(inputs, node_root=NODE_ROOT)


def test_probes(cp_inputs: render.ControlPlaneInputs) -> None:
    pods = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)
    api = _container(pods[files.APISERVER])
    assert api["livenessProbe"]["httpGet"] == {
        "host": "127.0.0.1",
        "path": "/livez",
        "port": 6443,
        "scheme": "HTTPS",
    }
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    cm = _container(pods[files.CONTROLLER_MANAGER])["livenessProbe"]["httpGet"]
    assert (cm["host"], cm["port"], cm["path"]) == ("127.0.0.1", 10257, "/healthz")
    sched = _container(pods[files.SCHEDULER])["livenessProbe"]["httpGet"]
    assert (sched["host"], sched["port"], sched["path"]) == ("127.0.0.1", 10259, "/healthz")
    assert _flag_map(pods[files.CONTROLLER_MANAGER])["bind-address"] == "127.0.0.1"


def test_local_api_port_is_the_secure_port(cp_inputs: render.ControlPlaneInputs) -> None:
    pod = render.render_apiserver(dataclasses.replace(cp_inputs, local_api_port=7443), node_root=NODE_ROOT)
    assert _flag_map(pod)["secure-port"] == "7443"
    assert _container(pod)["readinessProbe"]["httpGet"]["port"] == 7443


def test_apiserver_keeps_answering_while_it_stops_and_shares_its_port(
    cp_inputs: render.ControlPlaneInputs,
) -> None:
    # /readyz fails for the whole delay, so the load balancer (out after 2 failed checks 1 s
    # apart) stops sending connections before the listener closes; the replacement pod binds
    # next to the old one meanwhile.
    api = _flag_map(render.render_apiserver(cp_inputs, node_root=NODE_ROOT))
    assert api["shutdown-delay-duration"] == render.APISERVER_SHUTDOWN_DELAY == "3s"
    assert api["permit-port-sharing"] == "true"
    # A user's own value wins.
    inputs = _with(cp_inputs, files.APISERVER, extra_args={"shutdown-delay-duration": "10s"})
    assert _flag_map(render.render_apiserver(inputs, node_root=NODE_ROOT))["shutdown-delay-duration"] == "10s"


def test_v120_keeps_flags_that_later_releases_removed(cp_inputs: render.ControlPlaneInputs) -> None:
    pods = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)
    api = _flag_map(pods[files.APISERVER])
    assert api["insecure-port"] == "0"
    assert api["enable-admission-plugins"] == "NodeRestriction,PodSecurityPolicy"
    assert _flag_map(pods[files.CONTROLLER_MANAGER])["port"] == "0"
    assert _flag_map(pods[files.SCHEDULER])["port"] == "0"


def test_v125_omits_removed_flags_and_pod_security_policy(cp_inputs: render.ControlPlaneInputs) -> None:
    pods = render.render_static_pods(_at_version(cp_inputs, "v1.25.0"), node_root=NODE_ROOT)
    api = _flag_map(pods[files.APISERVER])
    assert "insecure-port" not in api
    assert api["enable-admission-plugins"] == "NodeRestriction"
    assert "port" not in _flag_map(pods[files.CONTROLLER_MANAGER])
    assert "port" not in _flag_map(pods[files.SCHEDULER])


def test_v124_drops_ports_but_keeps_pod_security_policy(cp_inputs: render.ControlPlaneInputs) -> None:
    pods = render.render_static_pods(_at_version(cp_inputs, "v1.24.3"), node_root=NODE_ROOT)
    api = _flag_map(pods[files.APISERVER])
    assert "insecure-port" not in api
    assert "PodSecurityPolicy" in api["enable-admission-plugins"]
    assert "port" not in _flag_map(pods[files.SCHEDULER])


def test_version_keying_is_per_component_during_an_upgrade(cp_inputs: render.ControlPlaneInputs) -> None:
    # Mid-upgrade the API server is already new while the scheduler still runs the old release.
    inputs = _with(cp_inputs, files.APISERVER, image="k8s.gcr.io/kube-apiserver:v1.24.0")
    pods = render.render_static_pods(inputs, node_root=NODE_ROOT)
    assert "insecure-port" not in _flag_map(pods[files.APISERVER])
    assert _flag_map(pods[files.SCHEDULER])["port"] == "0"


def test_explicit_extra_arg_for_a_removed_flag_is_passed_through(
    cp_inputs: render.ControlPlaneInputs,
) -> None:
    inputs = _with(_at_version(cp_inputs, "v1.25.0"), files.SCHEDULER, extra_args={"port": "0"})
    assert _flag_map(render.render_scheduler(inputs, node_root=NODE_ROOT))["port"] == "0"


@pytest.mark.parametrize("component", files.COMPONENTS)
def test_every_flag_path_is_in_the_layout_and_under_a_mount(
    cp_inputs: render.ControlPlaneInputs, component: str
) -> None:
    pod = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)[component]
    mounts = [PurePosixPath(m["mountPath"]) for m in _container(pod)["volumeMounts"]]
    layout = {files.secret_path(component, f, node_root=NODE_ROOT) for f in files.LAYOUT[component]}
    paths = [PurePosixPath(v) for _, v in _flags(pod) if v.startswith("/")]
    assert paths, "expected file flags"
    for path in paths:
        assert any(path.is_relative_to(mount) for mount in mounts), f"{path} is not under a mounted volume"
        secrets = files.secrets_dir(component, node_root=NODE_ROOT)
        if path.is_relative_to(secrets):
            assert path in layout, f"{path} is not a file of the {component} secrets layout"
        else:
            assert path == NODE_ROOT / "var/log/audit/kube/kube-apiserver.log"


@pytest.mark.parametrize("component", files.COMPONENTS)
def test_secrets_dir_is_mounted_read_only_at_the_same_path(
    cp_inputs: render.ControlPlaneInputs, component: str
) -> None:
    pod = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)[component]
    expected = str(NODE_ROOT / "system/secrets/kubernetes" / component)
    assert {"name": "secrets", "hostPath": {"path": expected}} in pod["spec"]["volumes"]
    assert {"name": "secrets", "mountPath": expected, "readOnly": True} in _container(pod)["volumeMounts"]


def test_node_root_and_secrets_root_relocate_every_path(cp_inputs: render.ControlPlaneInputs) -> None:
    inputs = dataclasses.replace(cp_inputs, secrets_root=PurePosixPath("state/secrets"))
    text = render.dump_yaml(render.render_apiserver(inputs, node_root=PurePosixPath("/other/root")))
    assert "/other/root/state/secrets/kube-apiserver/apiserver.crt" in text
    assert "/nodes/cp1" not in text
    assert "system/secrets" not in text


def test_extra_volumes_are_mounted(cp_inputs: render.ControlPlaneInputs) -> None:
    inputs = _with(
        cp_inputs,
        files.APISERVER,
        extra_volumes=(
            render.ExtraVolume("/var/log/audit", "/var/log/audit"),
            render.ExtraVolume("/a", "/b", True),
        ),
    )
    pod = render.render_apiserver(inputs, node_root=NODE_ROOT)
    assert pod["spec"]["volumes"][2:] == [
        {"name": "extra-0", "hostPath": {"path": "/var/log/audit"}},
        {"name": "extra-1", "hostPath": {"path": "/a"}},
    ]
    assert _container(pod)["volumeMounts"][2:] == [
        {"name": "extra-0", "mountPath": "/var/log/audit", "readOnly": False},
        {"name": "extra-1", "mountPath": "/b", "readOnly": True},
    ]


def test_relative_extra_volume_is_refused_with_its_field_path(cp_inputs: render.ControlPlaneInputs) -> None:
    inputs = _with(cp_inputs, files.SCHEDULER, extra_volumes=(render.ExtraVolume("/ok", "relative/path"),))
    with pytest.raises(RenderError, match=r"cluster\.scheduler\.extraVolumes\[0\]\.mountPath"):
        render.render_scheduler(inputs, node_root=NODE_ROOT)


def test_untagged_image_is_refused_with_the_image_name(cp_inputs: render.ControlPlaneInputs) -> None:
    inputs = _with(cp_inputs, files.APISERVER, image="registry.local:5000/kube-apiserver")
    with pytest.raises(RenderError, match=r"registry\.local:5000/kube-apiserver.*v1\.20\.2"):
        render.render_apiserver(inputs, node_root=NODE_ROOT)


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("k8s.gcr.io/kube-apiserver:v1.20.2", render.KubeVersion(1, 20, 2)),
        ("10.5.0.1:6000/kube-apiserver:v1.21.0-rc.1", render.KubeVersion(1, 21, 0)),
        ("k8s.gcr.io/kube-apiserver:v1.20.2@sha256:" + "0" * 64, render.KubeVersion(1, 20, 2)),
        ("kube-apiserver:1.25", render.KubeVersion(1, 25, 0)),
    ],
)
def test_version_from_image(image: str, expected: render.KubeVersion) -> None:
    assert render.KubeVersion.from_image(image) == expected


def test_versions_order_numerically() -> None:
    assert (
        render.KubeVersion.parse("v1.9.0") < render.KubeVersion.parse("v1.20.2") < render.KubeVersion(1, 24)
    )
    assert str(render.KubeVersion.parse("1.20")) == "v1.20.0"


@pytest.mark.parametrize("component", files.COMPONENTS)
def test_pod_is_a_valid_v1_pod(cp_inputs: render.ControlPlaneInputs, component: str) -> None:
    # Round-trip through the typed client models: any misspelt or misplaced field is dropped on
    # the way in and shows up as a difference.
    pod = render.render_static_pods(cp_inputs, node_root=NODE_ROOT)[component]
    api = k8s_client.ApiClient()
    model = api._ApiClient__deserialize(pod, "V1Pod")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(model) == pod
