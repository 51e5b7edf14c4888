"""The objects of a self-hosted control plane, rendered from the same inputs as the static pods.

A self-hosted control plane (what the original's older releases bootstrapped, and what
``convert-k8s`` converts from) is made of:

- DaemonSets ``kube-system/kube-apiserver``, ``kube-controller-manager``, ``kube-scheduler``:
  the pod templates are the static pods of :mod:`kubeplane.controllers.k8s.render` (same flags,
  probes and resources), bent into cluster-wide form: secrets come from Secret volumes instead of
  node directories, the node-specific ``--advertise-address`` becomes ``$(POD_IP)`` (the node's
  address, as the pods use the host network), the API server audits to its log (``-``) instead of
  a node directory, the static pod version annotations are dropped (``convert-k8s`` tells the
  static pods that replace these apart by their secrets-version annotation) and the template is
  annotated for the pod-checkpointer. They run on nodes labelled
  ``node-role.kubernetes.io/master`` and tolerate the control plane taints.
- Secrets ``kube-system/<component>`` holding exactly the files of
  :data:`kubeplane.controllers.k8s.files.LAYOUT`. ``kube-system/kube-controller-manager`` holds
  ``service-account.key``: in this mode the service account key exists nowhere else, which is
  why the conversion reads it back from there (the aggregator CA is kept nowhere at all, which is
  why the conversion mints a new one).
- The ``pod-checkpointer`` (:mod:`kubeplane.checkpointer`): a ServiceAccount, a ClusterRole to
  list pods, a Role to read Secrets and ConfigMaps and its own DaemonSet in kube-system, their
  bindings, and a
  DaemonSet whose pods mount the node's kubelet manifest directory and the checkpoint state
  directory, with the grace period in ``CHECKPOINTER_GRACE_PERIOD``.

Node paths: a DaemonSet has one pod template for every node, but in a local cluster every node
has its own root directory. ``node_root`` may therefore contain ``$(NODE_NAME)``: the host path
volume mounts the part before it and ``subPathExpr`` (expanded per pod from the downward API)
selects the node's directory below it; on a real machine the node root is ``/``.

Everything here is pure; applying the objects and the bootstrap sequence belong to callers.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from kubeplane.controllers.k8s import RenderError, files, render

__all__ = [
    "ANNOTATION_CHECKPOINT",
    "CHECKPOINTER",
    "CONTROL_PLANE_NODE_SELECTOR",
    "SelfHostedInputs",
    "render_checkpointer",
    "render_daemonset",
    "render_daemonsets",
    "render_secrets",
    "render_self_hosted",
]

ANNOTATION_CHECKPOINT = "checkpointer.alpha.coreos.com/checkpoint"
CHECKPOINTER = "pod-checkpointer"
NAMESPACE = "kube-system"
CONTROL_PLANE_NODE_SELECTOR = {"node-role.kubernetes.io/master": ""}
CONTROL_PLANE_TOLERATIONS = [
    {"key": "node-role.kubernetes.io/master", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
]
NODE_NAME_VAR = "$(NODE_NAME)"
# Inside the checkpointer's container; the host side comes from `node_root`.
_CONTAINER_MANIFEST_DIR = "/etc/kubernetes/manifests"
_CONTAINER_STATE_DIR = "/var/lib/kubeplane/checkpointer"
# Secret files are keys; components run as root, so owner-read is all they need.
_SECRET_VOLUME_MODE = 0o400
DEFAULT_MANIFEST_DIR = PurePosixPath("etc/kubernetes/manifests")
DEFAULT_STATE_DIR = PurePosixPath("var/lib/kubeplane/checkpointer")


@dataclasses.dataclass(frozen=True)
class SelfHostedInputs:
    """What the self-hosted objects are rendered from, beyond the static pod inputs.

    `node_root`: the node root directory on the host, absolute, optionally with ``$(NODE_NAME)``
    (``/`` on a real machine); `manifest_dir` and `state_dir` are relative to it.
    `components`: per-component inputs where they differ from `control_plane` — the node keeps
    one config per component, and only the controller manager's carries the pod CIDRs (render
    a DaemonSet from another component's inputs and ``--cluster-cidr`` comes out empty).
    """

    control_plane: render.ControlPlaneInputs
    checkpointer_image: str
    components: Mapping[str, render.ControlPlaneInputs] = dataclasses.field(default_factory=dict)
    node_root: str = "/"
    manifest_dir: PurePosixPath = DEFAULT_MANIFEST_DIR
    state_dir: PurePosixPath = DEFAULT_STATE_DIR
    grace_period_seconds: int = 300
    kubelet_url: str = "http://127.0.0.1:10255/pods"


def _labels(component: str) -> dict[str, str]:
    return {"k8s-app": component, "tier": "control-plane"}


def _meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NAMESPACE, **extra}


def _env_field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _daemonset(name: str, labels: dict[str, str], pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(name, labels=labels),
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {ANNOTATION_CHECKPOINT: "true"}},
                "spec": {
                    **pod_spec,
                    "nodeSelector": dict(CONTROL_PLANE_NODE_SELECTOR),
                    "tolerations": copy.deepcopy(CONTROL_PLANE_TOLERATIONS),
                },
            },
        },
    }


_RENDERERS = {
    files.APISERVER: render.render_apiserver,
    files.CONTROLLER_MANAGER: render.render_controller_manager,
    files.SCHEDULER: render.render_scheduler,
}
_INPUT_FIELD = {
    files.APISERVER: "apiserver",
    files.CONTROLLER_MANAGER: "controller_manager",
    files.SCHEDULER: "scheduler",
}


def render_daemonset(component: str, inputs: SelfHostedInputs) -> dict[str, Any]:
    """The DaemonSet of control plane `component` (one of `files.COMPONENTS`)."""
    if component not in _RENDERERS:
        raise RenderError(
            f"unknown control plane component {component!r}: expected one of {files.COMPONENTS}"
        )
    own_inputs = inputs.components.get(component, inputs.control_plane)
    cp = dataclasses.replace(own_inputs, advertise_address="$(POD_IP)")
    if component == files.APISERVER:
        # Defaults first so a user's extraArgs still win. Not the static pod's shutdown delay and
        # shared port: convert-k8s replaces each pod out of the load balancer's rotation and the
        # static pod waits for the port to be free (kubelet_static_pod.py), so a delay would only
        # lengthen each node's hand-over; and with a shared port a pod checkpoint would serve
        # beside a running pod instead of waiting for it to go.
        own = cp.apiserver
        extra = {"audit-log-path": "-", **render.APISERVER_NO_SHUTDOWN_DELAY, **own.extra_args}
        cp = dataclasses.replace(cp, apiserver=dataclasses.replace(own, extra_args=extra))
    if component == files.CONTROLLER_MANAGER:
        # No agent assigns pod CIDRs beside a self-hosted control plane (node_cidr.py): this does.
        own = cp.controller_manager
        cp = dataclasses.replace(
            cp,
            controller_manager=dataclasses.replace(
                own, extra_args={"allocate-node-cidrs": "true", **own.extra_args}
            ),
        )
    # Rendered for a root of "/": the paths are inside the container, where the Secret is mounted.
    pod = _RENDERERS[component](cp, node_root=PurePosixPath("/"))
    spec = pod["spec"]
    container = spec["containers"][0]
    flags = render.flags_of(container["command"])
    dropped = {"audit-log"} if flags.get("audit-log-path") == "-" else set()
    secrets_mount = str(
        files.secrets_dir(component, node_root=PurePosixPath("/"), secrets_root=cp.secrets_root)
    )
    volumes = []
    for rendered in spec["volumes"]:
        volume = rendered
        if volume["name"] == "secrets":
            volume = {
                "name": "secrets",
                "secret": {"secretName": component, "defaultMode": _SECRET_VOLUME_MODE},
            }
        if volume["name"] not in dropped:
            volumes.append(volume)
    spec["volumes"] = volumes
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] not in dropped]
    assert any(m["mountPath"] == secrets_mount for m in container["volumeMounts"])
    if component == files.APISERVER:
        container["env"] = [_env_field("POD_IP", "status.podIP")]
    return _daemonset(component, _labels(component), spec)


def render_daemonsets(inputs: SelfHostedInputs) -> dict[str, dict[str, Any]]:
    """The three control plane DaemonSets keyed by component, in `files.COMPONENTS` order."""
    return {component: render_daemonset(component, inputs) for component in files.COMPONENTS}


def render_secrets(secret_files: Mapping[str, Mapping[str, bytes]]) -> list[dict[str, Any]]:
    """Secrets ``kube-system/<component>`` from component → file name → content.

    Every file of the component's :data:`files.LAYOUT` must be given (the DaemonSet's flags point
    at all of them), and nothing else.
    """
    secrets = []
    for component in files.COMPONENTS:
        given = secret_files.get(component)
        if given is None:
            raise RenderError(f"no secret files given for {component}; expected {_names(component)}")
        expected = [file.name for file in files.LAYOUT[component]]
        missing = [name for name in expected if name not in given]
        unknown = sorted(set(given) - set(expected))
        if missing or unknown:
            raise RenderError(
                f"secret files of {component} do not match its layout: missing {missing}, unexpected "
                f"{unknown}; give exactly {_names(component)}"
            )
        secrets.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": _meta(component, labels=_labels(component)),
                "type": "Opaque",
                "data": {name: base64.b64encode(given[name]).decode() for name in expected},
            }
        )
    return secrets


def _names(component: str) -> str:
    return ", ".join(file.name for file in files.LAYOUT[component])


def _split_node_root(node_root: str) -> tuple[str, str]:
    """(host path to mount, sub path expression prefix) of a node root with an optional variable."""
    path = PurePosixPath(node_root)
    if not path.is_absolute():
        raise RenderError(f"node root {node_root!r} must be an absolute path")
    parts = path.parts[1:]
    with_vars = [i for i, part in enumerate(parts) if "$(" in part]
    if len(with_vars) > 1 or any(parts[i] != NODE_NAME_VAR for i in with_vars):
        raise RenderError(
            f"node root {node_root!r}: the only variable allowed is one whole path element {NODE_NAME_VAR}"
        )
    index = with_vars[0] if with_vars else len(parts)
    return str(PurePosixPath("/", *parts[:index])), "/".join(parts[index:])


def _relative(path: PurePosixPath, what: str) -> str:
    if path.is_absolute() or ".." in path.parts:
        raise RenderError(f"{what} {str(path)!r} must be relative to the node root, without '..'")
    return str(path)


def render_checkpointer(inputs: SelfHostedInputs) -> list[dict[str, Any]]:
    """ServiceAccount, RBAC and the DaemonSet of the pod-checkpointer, in apply order."""
    if inputs.grace_period_seconds < 0:
        raise RenderError(
            f"checkpointer grace period must not be negative, got {inputs.grace_period_seconds}"
        )
    host_base, sub = _split_node_root(inputs.node_root)
    manifest_rel = _relative(inputs.manifest_dir, "kubelet manifest dir")
    state_rel = _relative(inputs.state_dir, "checkpointer state dir")

    def sub_path(rel: str) -> str:
        return f"{sub}/{rel}" if sub else rel

    host_state_dir = str(PurePosixPath(inputs.node_root) / state_rel)
    labels = {"k8s-app": CHECKPOINTER, "tier": "control-plane"}
    container = {
        "name": CHECKPOINTER,
        "image": inputs.checkpointer_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/bin/python3", "-m", "kubeplane.checkpointer"],
        "env": [
            _env_field("NODE_NAME", "spec.nodeName"),
            _env_field("POD_NAME", "metadata.name"),
            _env_field("POD_NAMESPACE", "metadata.namespace"),
            {
                "name": "CHECKPOINTER_SERVER",
                "value": f"https://localhost:{inputs.control_plane.local_api_port}",
            },
            {"name": "CHECKPOINTER_KUBELET_URL", "value": inputs.kubelet_url},
            {"name": "CHECKPOINTER_MANIFEST_DIR", "value": _CONTAINER_MANIFEST_DIR},
            {"name": "CHECKPOINTER_STATE_DIR", "value": _CONTAINER_STATE_DIR},
            # $(NODE_NAME) in a value is expanded by the kubelet from the variable above.
            {"name": "CHECKPOINTER_HOST_STATE_DIR", "value": host_state_dir},
            {"name": "CHECKPOINTER_GRACE_PERIOD", "value": str(inputs.grace_period_seconds)},
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "volumeMounts": [
            {
                "name": "node-root",
                "mountPath": _CONTAINER_MANIFEST_DIR,
                "subPathExpr": sub_path(manifest_rel),
            },
            {"name": "node-root", "mountPath": _CONTAINER_STATE_DIR, "subPathExpr": sub_path(state_rel)},
        ],
    }
    pod_spec = {
        "hostNetwork": True,
        "priorityClassName": "system-node-critical",
        "serviceAccountName": CHECKPOINTER,
        "containers": [container],
        "volumes": [{"name": "node-root", "hostPath": {"path": host_base, "type": "Directory"}}],
    }
    subject = [{"kind": "ServiceAccount", "name": CHECKPOINTER, "namespace": NAMESPACE}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(CHECKPOINTER)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": CHECKPOINTER},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": CHECKPOINTER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CHECKPOINTER},
            "subjects": subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(CHECKPOINTER),
            "rules": [
                {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get"]},
                # Its own DaemonSet only: a checkpoint whose DaemonSet was deleted removes every
                # checkpoint at once rather than after the grace period.
                {
                    "apiGroups": ["apps"],
                    "resources": ["daemonsets"],
                    "resourceNames": [CHECKPOINTER],
                    "verbs": ["get"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(CHECKPOINTER),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CHECKPOINTER},
            "subjects": subject,
        },
        _daemonset(CHECKPOINTER, labels, pod_spec),
    ]


def render_self_hosted(
    inputs: SelfHostedInputs, secret_files: Mapping[str, Mapping[str, bytes]]
) -> list[dict[str, Any]]:
    """Every object of the self-hosted control plane in apply order: the Secrets, the control
    plane DaemonSets, then the checkpointer (so its first round already finds them)."""
    return [
        *render_secrets(secret_files),
        *render_daemonsets(inputs).values(),
        *render_checkpointer(inputs),
    ]
