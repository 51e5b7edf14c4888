"""Self-hosted control plane objects: golden files plus the properties the conversion relies on.

Regenerate golden files after an intended change with ``KUBEPLANE_UPDATE_GOLDEN=1`` (see conftest).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

import pytest

from kubeplane.controllers.k8s import RenderError, files, render, selfhosted

pytestmark = pytest.mark.unit

IMAGE = "kubeplane/pod-checkpointer:0.1.0"


@pytest.fixture
def inputs(cp_inputs: render.ControlPlaneInputs) -> selfhosted.SelfHostedInputs:
    return selfhosted.SelfHostedInputs(
        control_plane=cp_inputs, checkpointer_image=IMAGE, node_root="/clusters/c1/nodes/$(NODE_NAME)"
    )


def secret_files() -> dict[str, dict[str, bytes]]:
    return {c: {f.name: f"{c}/{f.name}".encode() for f in files.LAYOUT[c]} for c in files.COMPONENTS}


@pytest.mark.parametrize("component", files.COMPONENTS)
def test_daemonset_matches_golden(
    inputs: selfhosted.SelfHostedInputs, golden: Callable[[str, str], None], component: str
) -> None:
    golden(f"selfhosted-{component}.yaml", render.dump_yaml(selfhosted.render_daemonset(component, inputs)))


def test_checkpointer_matches_golden(
    inputs: selfhosted.SelfHostedInputs, golden: Callable[[str, str], None]
) -> None:
    golden(
        "selfhosted-pod-checkpointer.yaml", render.dump_yaml_documents(selfhosted.render_checkpointer(inputs))
    )


def _template(ds: dict[str, Any]) -> dict[str, Any]:
    return dict(ds["spec"]["template"])


def _flags(ds: dict[str, Any]) -> dict[str, str]:
    command = _template(ds)["spec"]["containers"][0]["command"]
    return dict(arg[2:].split("=", 1) for arg in command[1:])


@pytest.mark.parametrize("component", files.COMPONENTS)
def test_daemonset_is_a_checkpointed_host_network_control_plane_pod(
    inputs: selfhosted.SelfHostedInputs, component: str
) -> None:
    ds = selfhosted.render_daemonset(component, inputs)
    template = _template(ds)
    assert (ds["metadata"]["name"], ds["metadata"]["namespace"]) == (component, "kube-system")
    assert template["metadata"]["labels"] == {"k8s-app": component, "tier": "control-plane"}
    assert ds["spec"]["selector"]["matchLabels"] == template["metadata"]["labels"]
    # convert-k8s tells the static pods apart by their secrets-version annotation.
    assert template["metadata"]["annotations"] == {"checkpointer.alpha.coreos.com/checkpoint": "true"}
    spec = template["spec"]
    assert spec["hostNetwork"] is True
    assert spec["nodeSelector"] == {"node-role.kubernetes.io/master": ""}
    assert {t["key"] for t in spec["tolerations"]} == {
        "node-role.kubernetes.io/master",
        "node-role.kubernetes.io/control-plane",
    }
    assert not [v for v in spec["volumes"] if "hostPath" in v], "no node-specific host paths"
    assert {"name": "secrets", "secret": {"secretName": component, "defaultMode": 0o400}} in spec["volumes"]


@pytest.mark.parametrize("component", files.COMPONENTS)
def test_flags_are_the_static_pod_flags_except_node_specific_ones(
    inputs: selfhosted.SelfHostedInputs, component: str
) -> None:
    static = render.render_static_pods(inputs.control_plane, node_root=PurePosixPath("/"))[component]
    static_flags = dict(arg[2:].split("=", 1) for arg in static["spec"]["containers"][0]["command"][1:])
    ds_flags = _flags(selfhosted.render_daemonset(component, inputs))
    differing = {k for k in static_flags.keys() | ds_flags.keys() if static_flags.get(k) != ds_flags.get(k)}
    expected = {
        files.APISERVER: {
            "advertise-address",
            "audit-log-path",
            "permit-port-sharing",
            "shutdown-delay-duration",
        },
        # No agent assigns pod CIDRs beside a self-hosted control plane: its own does.
        files.CONTROLLER_MANAGER: {"allocate-node-cidrs"},
    }.get(component, set())
    assert differing == expected
    if component == files.CONTROLLER_MANAGER:
        assert (static_flags["allocate-node-cidrs"], ds_flags["allocate-node-cidrs"]) == ("false", "true")
    if component == files.APISERVER:
        assert ds_flags["advertise-address"] == "$(POD_IP)"
        # convert-k8s hands each node over out of the rotation: a delay would only slow it.
        assert (static_flags["shutdown-delay-duration"], ds_flags["shutdown-delay-duration"]) == ("3s", "0s")
        assert (static_flags["permit-port-sharing"], ds_flags["permit-port-sharing"]) == ("true", "false")
        env = _template(selfhosted.render_daemonset(component, inputs))["spec"]["containers"][0]["env"]
        assert env == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def test_each_daemonset_renders_from_its_own_component_inputs(
    inputs: selfhosted.SelfHostedInputs,
) -> None:
    # As on a node: only the controller manager's config carries the pod CIDRs. Rendered from the
    # API server's inputs it got `--cluster-cidr=` and crash-looped ("failed to parse cidr value").
    own = dataclasses.replace(inputs.control_plane, pod_cidrs=("10.244.0.0/16",))
    bare = dataclasses.replace(inputs.control_plane, pod_cidrs=())
    split = dataclasses.replace(inputs, control_plane=bare, components={files.CONTROLLER_MANAGER: own})
    flags = _flags(selfhosted.render_daemonset(files.CONTROLLER_MANAGER, split))
    assert flags["cluster-cidr"] == "10.244.0.0/16"
    # The others fall back to control_plane.
    assert _flags(selfhosted.render_daemonset(files.SCHEDULER, split)) == _flags(
        selfhosted.render_daemonset(files.SCHEDULER, dataclasses.replace(inputs, control_plane=bare))
    )


def test_user_audit_log_path_wins_and_keeps_its_volume(inputs: selfhosted.SelfHostedInputs) -> None:
    own = dataclasses.replace(inputs.control_plane.apiserver, extra_args={"audit-log-path": "/var/log/a.log"})
    changed = dataclasses.replace(
        inputs, control_plane=dataclasses.replace(inputs.control_plane, apiserver=own)
    )
    ds = selfhosted.render_daemonset(files.APISERVER, changed)
    assert _flags(ds)["audit-log-path"] == "/var/log/a.log"
    assert any(v["name"] == "audit-log" for v in _template(ds)["spec"]["volumes"])


def test_secrets_hold_the_layout_and_the_service_account_key() -> None:
    secrets = {s["metadata"]["name"]: s for s in selfhosted.render_secrets(secret_files())}
    assert list(secrets) == list(files.COMPONENTS)
    cm = secrets[files.CONTROLLER_MANAGER]
    assert cm["metadata"]["namespace"] == "kube-system"
    # The conversion reads exactly this key back.
    assert (
        base64.b64decode(cm["data"]["service-account.key"]) == b"kube-controller-manager/service-account.key"
    )
    for component, secret in secrets.items():
        assert list(secret["data"]) == [f.name for f in files.LAYOUT[component]]


def test_secret_files_must_match_the_layout() -> None:
    given = secret_files()
    del given[files.CONTROLLER_MANAGER]["service-account.key"]
    given[files.SCHEDULER]["extra.pem"] = b"x"
    with pytest.raises(RenderError, match=r"kube-controller-manager.*missing \['service-account.key'\]"):
        selfhosted.render_secrets(given)
    given = secret_files()
    given[files.SCHEDULER]["extra.pem"] = b"x"
    with pytest.raises(RenderError, match=r"kube-scheduler.*unexpected \['extra.pem'\]"):
        selfhosted.render_secrets(given)


def test_checkpointer_daemonset_mounts_the_nodes_directories(inputs: selfhosted.SelfHostedInputs) -> None:
    objects = selfhosted.render_checkpointer(inputs)
    assert [o["kind"] for o in objects] == [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "DaemonSet",
    ]
    ds = objects[-1]
    assert ds["metadata"]["name"] == "pod-checkpointer"
    spec = _template(ds)["spec"]
    assert spec["volumes"] == [
        {"name": "node-root", "hostPath": {"path": "/clusters/c1/nodes", "type": "Directory"}}
    ]
    container = spec["containers"][0]
    assert [m["subPathExpr"] for m in container["volumeMounts"]] == [
        "$(NODE_NAME)/etc/kubernetes/manifests",
        "$(NODE_NAME)/var/lib/kubeplane/checkpointer",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CHECKPOINTER_GRACE_PERIOD"] == "300"
    assert (
        env["CHECKPOINTER_HOST_STATE_DIR"] == "/clusters/c1/nodes/$(NODE_NAME)/var/lib/kubeplane/checkpointer"
    )
    # Env vars are expanded in order: NODE_NAME must come before the values that use it.
    assert [e["name"] for e in container["env"]].index("NODE_NAME") == 0


def test_checkpointer_on_a_real_machine_mounts_below_root(inputs: selfhosted.SelfHostedInputs) -> None:
    real = dataclasses.replace(inputs, node_root="/", grace_period_seconds=30)
    spec = _template(selfhosted.render_checkpointer(real)[-1])["spec"]
    assert spec["volumes"][0]["hostPath"]["path"] == "/"
    mounts = spec["containers"][0]["volumeMounts"]
    assert [m["subPathExpr"] for m in mounts] == [
        "etc/kubernetes/manifests",
        "var/lib/kubeplane/checkpointer",
    ]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["CHECKPOINTER_GRACE_PERIOD"] == "30"


@pytest.mark.parametrize(
    "bad", ["relative/root", "/nodes/x$(NODE_NAME)", "/$(OTHER)/x", "/a/$(NODE_NAME)/$(NODE_NAME)"]
)
def test_bad_node_roots_are_refused(inputs: selfhosted.SelfHostedInputs, bad: str) -> None:
    with pytest.raises(RenderError, match="node root"):
        selfhosted.render_checkpointer(dataclasses.replace(inputs, node_root=bad))


def test_self_hosted_objects_in_apply_order(inputs: selfhosted.SelfHostedInputs) -> None:
    objects = selfhosted.render_self_hosted(inputs, secret_files())
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds[:3] == [("Secret", c) for c in files.COMPONENTS]
    assert kinds[3:6] == [("DaemonSet", c) for c in files.COMPONENTS]
    assert kinds[-1] == ("DaemonSet", "pod-checkpointer")
