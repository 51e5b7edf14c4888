"""Static pods of the control plane: kube-apiserver, kube-controller-manager, kube-scheduler.

Pure functions from `ControlPlaneInputs` (plain data the K8sControlPlane controller maps the
machine config into) to Pod dicts the kubelet can run from its manifest directory. Owns the default
flags of each component, how `extraArgs` override them, which flags exist in which Kubernetes
version, the volumes that make every flag path resolvable inside the container, probes, and the
deterministic YAML serialisation used for golden files and for the bytes written to disk.

Design decisions:
- Flags are a mapping name → value rendered as ``--name=value`` sorted by name, so the command
  line (and therefore the file bytes) depends only on the inputs, and an `extraArgs` entry
  replaces the default flag of the same name instead of adding a second one (the original system
  appended duplicates and left the winner to the flag parser).
- The secrets directory is mounted at the same path inside the container as on the node, so a
  flag path means the same thing in both places and no path translation is needed.
- Rendering is keyed by the Kubernetes version of each component's image tag: during an upgrade
  the API server may already run a newer version than the scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Any

import yaml

from kubeplane.controllers.k8s import RenderError, files

__all__ = [
    "ANNOTATION_CONFIG_VERSION",
    "ANNOTATION_SECRETS_VERSION",
    "DEFAULT_AUDIT_LOG_DIR",
    "REMOVED_DEFAULT_FLAGS",
    "ComponentInputs",
    "ControlPlaneInputs",
    "ExtraVolume",
    "KubeVersion",
    "dump_yaml",
    "dump_yaml_documents",
    "flags_of",
    "has_pod_security_policy",
    "merge_flags",
    "render_apiserver",
    "render_controller_manager",
    "render_scheduler",
    "render_static_pods",
]

ANNOTATION_CONFIG_VERSION = "kubeplane.dev/config-version"
ANNOTATION_SECRETS_VERSION = "kubeplane.dev/secrets-version"

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")


@dataclass(frozen=True, order=True)
class KubeVersion:
    """A Kubernetes release, compared by (major, minor, patch); pre-release suffixes are ignored."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> KubeVersion:
        """Parse ``v1.20.2``, ``1.20`` or ``v1.21.0-rc.1`` (suffix ignored)."""
        match = _VERSION_RE.match(text.strip())
        if match is None:
            raise RenderError(f"{text!r} is not a Kubernetes version; expected something like v1.20.2")
        major, minor, patch = match.groups()
        return cls(int(major), int(minor), int(patch or 0))

    @classmethod
    def from_image(cls, image: str) -> KubeVersion:
        """The version in an image reference's tag (``k8s.gcr.io/kube-apiserver:v1.20.2[@sha256:...]``)."""
        reference = image.split("@", 1)[0]
        name, _, tag = reference.rpartition(":")
        # A colon before the last slash belongs to a registry port, not to a tag.
        if not name or "/" in tag:
            tag = ""
        match = _VERSION_RE.match(tag)
        if match is None:
            raise RenderError(
                f"cannot tell the Kubernetes version of image {image!r}: its tag is not a version; "
                "use an image tagged like v1.20.2 (rendering depends on the version)"
            )
        return cls.parse(tag)

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}.{self.patch}"


# Default flags that later Kubernetes releases removed; a binary refuses to start on an unknown
# flag, so a default is only rendered for versions before `removed_in`. Explicit extraArgs are
# passed through untouched: that is the user's call.
# - kube-apiserver --insecure-port: inert since v1.20 (only 0 allowed, kubernetes#95856), removed
#   in v1.24 (CHANGELOG-1.24).
# - kube-controller-manager --port: deprecated no-op, removed in v1.24 (CHANGELOG-1.24).
# - kube-scheduler --port: no-op once insecure serving went (kubernetes#96345), removed in v1.24.
# v1.20 still serves insecurely on 10251/10252 unless --port=0, so there the flag matters.
REMOVED_DEFAULT_FLAGS: tuple[tuple[str, str, KubeVersion], ...] = (
    (files.APISERVER, "insecure-port", KubeVersion(1, 24)),
    (files.CONTROLLER_MANAGER, "port", KubeVersion(1, 24)),
    (files.SCHEDULER, "port", KubeVersion(1, 24)),
)

# PodSecurityPolicy (admission plugin and policy/v1beta1 API) was deprecated in v1.21 and removed
# in v1.25 (kubernetes.io docs, "Pod Security Policies").
_PSP_REMOVED_IN = KubeVersion(1, 25)

DEFAULT_AUDIT_LOG_DIR = PurePosixPath("var/log/audit/kube")

#: How long a stopping kube-apiserver keeps answering (``--shutdown-delay-duration``): its
#: ``/readyz`` fails from the first second, so a load balancer checking it (a local cluster's
#: haproxy: every second, out after two failures) has stopped sending it connections before the
#: listener closes. kubeplane's kube-apiserver build (``provision/toolchain.py``,
#: ``patch_shutdown_close``) also tells every HTTP/1.x client it answers in that time to
#: reconnect, so a client that sends a request during the delay is not left on a connection that
#: closes under it (one idle for the whole delay still is). The replacement pod serves beside
#: the old one meanwhile (``--permit-port-sharing``), and some of its own start-up requests to
#: itself reach the old one and are retried: a longer delay set in ``extraArgs`` lengthens that.
APISERVER_SHUTDOWN_DELAY = "3s"
#: The same flags for a kube-apiserver that something else waits to take the port of (a
#: self-hosted DaemonSet pod, a self-hosted bootstrap's temporary one): it lets go at once.
APISERVER_NO_SHUTDOWN_DELAY = MappingProxyType(
    {"permit-port-sharing": "false", "shutdown-delay-duration": "0s"}
)


def has_pod_security_policy(version: KubeVersion) -> bool:
    """Whether `version` still has the PodSecurityPolicy admission plugin and API."""
    return version < _PSP_REMOVED_IN


@dataclass(frozen=True)
class ExtraVolume:
    """A host path mounted into a control plane container (``extraVolumes`` in the config)."""

    host_path: str
    mount_path: str
    readonly: bool = False


@dataclass(frozen=True)
class ComponentInputs:
    """What differs per component: image, its kcpc resource version, extra args and volumes."""

    image: str
    config_version: str
    extra_args: Mapping[str, str] = field(default_factory=dict)
    extra_volumes: tuple[ExtraVolume, ...] = ()

    @property
    def version(self) -> KubeVersion:
        """The Kubernetes version of this component, from its image tag."""
        return KubeVersion.from_image(self.image)


@dataclass(frozen=True)
class ControlPlaneInputs:
    """Everything the three control plane static pods are rendered from."""

    advertise_address: str
    pod_cidrs: tuple[str, ...]
    service_cidrs: tuple[str, ...]
    apiserver: ComponentInputs
    controller_manager: ComponentInputs
    scheduler: ComponentInputs
    secrets_version: str
    dns_domain: str = "cluster.local"
    local_api_port: int = 6443
    etcd_servers: tuple[str, ...] = ("https://127.0.0.1:2379",)
    secrets_root: PurePosixPath = files.DEFAULT_SECRETS_ROOT
    audit_log_dir: PurePosixPath = DEFAULT_AUDIT_LOG_DIR
    """Relative to the node root; the only directory the API server writes to."""

    def component(self, name: str) -> ComponentInputs:
        """The per-component inputs of `name` (one of `files.COMPONENTS`)."""
        by_name = {
            files.APISERVER: self.apiserver,
            files.CONTROLLER_MANAGER: self.controller_manager,
            files.SCHEDULER: self.scheduler,
        }
        return by_name[name]


# Config field names, so errors point at what the user wrote.
_CONFIG_FIELD = {
    files.APISERVER: "cluster.apiServer",
    files.CONTROLLER_MANAGER: "cluster.controllerManager",
    files.SCHEDULER: "cluster.scheduler",
}


def merge_flags(defaults: Mapping[str, str], extra_args: Mapping[str, str], *, where: str) -> list[str]:
    """``--name=value`` for defaults overridden by `extra_args`, sorted by name.

    Names may be given with or without leading dashes; `where` names the config field in errors.
    """
    merged = dict(defaults)
    for raw_name, value in extra_args.items():
        name = raw_name.lstrip("-")
        if not name or "=" in name or any(c.isspace() for c in name):
            raise RenderError(
                f"{where}.extraArgs has an invalid flag name {raw_name!r}; "
                "use the flag name without dashes as key and its value as value"
            )
        merged[name] = value
    return [f"--{name}={merged[name]}" for name in sorted(merged)]


def _drop_removed(component: str, defaults: dict[str, str], version: KubeVersion) -> dict[str, str]:
    removed = {flag for comp, flag, since in REMOVED_DEFAULT_FLAGS if comp == component and version >= since}
    return {name: value for name, value in defaults.items() if name not in removed}


def flags_of(command: Sequence[str]) -> dict[str, str]:
    """The flags of a rendered component's command (``[binary, "--name=value", ...]``) by name."""
    return dict(arg[2:].split("=", 1) for arg in command[1:])


def _probe_host(flags: Mapping[str, str]) -> str:
    # Probes run in the node's network namespace (hostNetwork); loopback reaches a wildcard bind.
    bind = flags.get("bind-address", "0.0.0.0")  # noqa: S104 - a default to compare against
    return "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind  # noqa: S104


def _port(value: str) -> int:
    if not value.isdigit():
        raise RenderError(f"--secure-port={value} is not a port number; fix it in extraArgs")
    return int(value)


def _http_probe(flags: Mapping[str, str], *, path: str, default_port: int, liveness: bool) -> dict[str, Any]:
    """An HTTPS probe on the component's secure port, as the final flags set it."""
    # Liveness is patient (a slow start or an etcd hiccup must not restart the pod); readiness
    # reacts within seconds so a load balancer and upgrade waits see the truth quickly.
    timing = (
        {"initialDelaySeconds": 15, "periodSeconds": 10, "failureThreshold": 8}
        if liveness
        else {"periodSeconds": 1, "failureThreshold": 3}
    )
    return {
        "httpGet": {
            "host": _probe_host(flags),
            "path": path,
            "port": _port(flags.get("secure-port", str(default_port))),
            "scheme": "HTTPS",
        },
        **timing,
        "timeoutSeconds": 15,
    }


def _volumes(
    component: str, inputs: ControlPlaneInputs, *, node_root: PurePosixPath
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container volumeMounts): the secrets dir plus the component's extra volumes."""
    secrets = str(files.secrets_dir(component, node_root=node_root, secrets_root=inputs.secrets_root))
    volumes: list[dict[str, Any]] = [{"name": "secrets", "hostPath": {"path": secrets}}]
    mounts: list[dict[str, Any]] = [{"name": "secrets", "mountPath": secrets, "readOnly": True}]
    if component == files.APISERVER:
        if inputs.audit_log_dir.is_absolute():
            raise RenderError(
                f"audit log dir {str(inputs.audit_log_dir)!r} must be relative to the node root; "
                "drop the leading '/'"
            )
        audit = str(node_root / inputs.audit_log_dir)
        volumes.append({"name": "audit-log", "hostPath": {"path": audit, "type": "DirectoryOrCreate"}})
        mounts.append({"name": "audit-log", "mountPath": audit, "readOnly": False})
    for index, extra in enumerate(inputs.component(component).extra_volumes):
        where = f"{_CONFIG_FIELD[component]}.extraVolumes[{index}]"
        for label, path in (("hostPath", extra.host_path), ("mountPath", extra.mount_path)):
            if not PurePosixPath(path).is_absolute():
                raise RenderError(f"{where}.{label} {path!r} must be an absolute path")
        name = f"extra-{index}"
        volumes.append({"name": name, "hostPath": {"path": extra.host_path}})
        mounts.append({"name": name, "mountPath": extra.mount_path, "readOnly": extra.readonly})
    return volumes, mounts


def _static_pod(
    component: str,
    inputs: ControlPlaneInputs,
    *,
    node_root: PurePosixPath,
    defaults: dict[str, str],
    probes: Callable[[Mapping[str, str]], dict[str, Any]],
    requests: dict[str, str],
) -> dict[str, Any]:
    own = inputs.component(component)
    defaults = _drop_removed(component, defaults, own.version)
    command = [
        f"/usr/local/bin/{component}",
        *merge_flags(defaults, own.extra_args, where=_CONFIG_FIELD[component]),
    ]
    volumes, mounts = _volumes(component, inputs, node_root=node_root)
    container: dict[str, Any] = {
        "name": component,
        "image": own.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        **probes(flags_of(command)),
        "resources": {"requests": requests},
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": component,
            "namespace": "kube-system",
            "labels": {"k8s-app": component, "tier": "control-plane"},
            "annotations": {
                ANNOTATION_CONFIG_VERSION: own.config_version,
                ANNOTATION_SECRETS_VERSION: inputs.secrets_version,
            },
        },
        "spec": {
            "hostNetwork": True,
            "priorityClassName": "system-cluster-critical",
            "containers": [container],
            "volumes": volumes,
        },
    }


def render_apiserver(inputs: ControlPlaneInputs, *, node_root: PurePosixPath) -> dict[str, Any]:
    """The kube-apiserver static pod for a node whose root directory is `node_root`."""
    component = files.APISERVER

    def path(file: files.SecretFile) -> str:
        return str(files.secret_path(component, file, node_root=node_root, secrets_root=inputs.secrets_root))

    admission = ["NodeRestriction"]
    if has_pod_security_policy(inputs.apiserver.version):
        admission.append("PodSecurityPolicy")
    # Since v1.20 the issuer is required; kubeadm's in-cluster default keeps tokens valid for any
    # endpoint change, which the HA conversion relies on.
    issuer = f"https://kubernetes.default.svc.{inputs.dns_domain}"
    defaults = {
        "advertise-address": inputs.advertise_address,
        "allow-privileged": "true",
        "api-audiences": issuer,
        # A file rather than stdout, so the container log stays readable for troubleshooting;
        # rotation bounds the disk it takes.
        "audit-log-maxbackup": "3",
        "audit-log-maxsize": "50",
        "audit-log-path": str(node_root / inputs.audit_log_dir / "kube-apiserver.log"),
        "audit-policy-file": path(files.AUDIT_POLICY),
        "authorization-mode": "Node,RBAC",
        "bind-address": "0.0.0.0",  # noqa: S104 - the API server serves the node's addresses
        "client-ca-file": path(files.CA_CRT),
        "enable-admission-plugins": ",".join(admission),
        "enable-bootstrap-token-auth": "true",
        "encryption-provider-config": path(files.ENCRYPTION_CONFIG),
        "etcd-cafile": path(files.ETCD_CA_CRT),
        "etcd-certfile": path(files.ETCD_CLIENT_CRT),
        "etcd-keyfile": path(files.ETCD_CLIENT_KEY),
        "etcd-servers": ",".join(inputs.etcd_servers),
        "insecure-port": "0",
        "kubelet-client-certificate": path(files.APISERVER_KUBELET_CLIENT_CRT),
        "kubelet-client-key": path(files.APISERVER_KUBELET_CLIENT_KEY),
        "kubelet-preferred-address-types": "InternalIP,ExternalIP,Hostname",
        "profiling": "false",
        "proxy-client-cert-file": path(files.FRONT_PROXY_CLIENT_CRT),
        "proxy-client-key-file": path(files.FRONT_PROXY_CLIENT_KEY),
        "requestheader-allowed-names": "front-proxy-client",
        "requestheader-client-ca-file": path(files.AGGREGATOR_CA_CRT),
        "requestheader-extra-headers-prefix": "X-Remote-Extra-",
        "requestheader-group-headers": "X-Remote-Group",
        "requestheader-username-headers": "X-Remote-User",
        "secure-port": str(inputs.local_api_port),
        # A changed static pod's replacement starts while the old one is still in its shutdown
        # delay (kubelet 1.20 runs the two pods' workers side by side): both bind the port with
        # SO_REUSEPORT instead of the new one crash-looping until the old one exits.
        "permit-port-sharing": "true",
        "shutdown-delay-duration": APISERVER_SHUTDOWN_DELAY,
        "service-account-issuer": issuer,
        "service-account-key-file": path(files.SERVICE_ACCOUNT_PUB),
        "service-account-signing-key-file": path(files.SERVICE_ACCOUNT_KEY),
        "service-cluster-ip-range": ",".join(inputs.service_cidrs),
        "tls-cert-file": path(files.APISERVER_CRT),
        "tls-min-version": "VersionTLS12",
        "tls-private-key-file": path(files.APISERVER_KEY),
    }

    def probes(flags: Mapping[str, str]) -> dict[str, Any]:
        port = inputs.local_api_port
        return {
            "livenessProbe": _http_probe(flags, path="/livez", default_port=port, liveness=True),
            "readinessProbe": _http_probe(flags, path="/readyz", default_port=port, liveness=False),
        }

    return _static_pod(
        component,
        inputs,
        node_root=node_root,
        defaults=defaults,
        probes=probes,
        requests={"cpu": "200m", "memory": "512Mi"},
    )


def render_controller_manager(inputs: ControlPlaneInputs, *, node_root: PurePosixPath) -> dict[str, Any]:
    """The kube-controller-manager static pod for a node whose root directory is `node_root`."""
    component = files.CONTROLLER_MANAGER

    def path(file: files.SecretFile) -> str:
        return str(files.secret_path(component, file, node_root=node_root, secrets_root=inputs.secrets_root))

    kubeconfig = path(files.KUBECONFIG)
    defaults = {
        # The agents assign the nodes' pod CIDRs (controllers/k8s/node_cidr.py): this one's node
        # IPAM controller waits 10 s before its first node list, and delays every informer.
        "allocate-node-cidrs": "false",
        "authentication-kubeconfig": kubeconfig,
        "authorization-kubeconfig": kubeconfig,
        # Loopback only: nothing outside the node needs it, and the probe comes from the node.
        "bind-address": "127.0.0.1",
        "cluster-cidr": ",".join(inputs.pod_cidrs),
        "cluster-signing-cert-file": path(files.CA_CRT),
        "cluster-signing-key-file": path(files.CA_KEY),
        "configure-cloud-routes": "false",
        "controllers": "*,tokencleaner",
        # Client-side rate limit of its API client (defaults 20/s, burst 30). At start, with
        # use-service-account-credentials, it fetches a token per controller and runs discovery
        # before any informer starts: about 100 requests, 5 s at the default limit, all of it
        # before the first DaemonSet or ReplicaSet pod is created.
        "kube-api-burst": "200",
        "kube-api-qps": "50",
        "kubeconfig": kubeconfig,
        "leader-elect": "true",
        "port": "0",
        "profiling": "false",
        "root-ca-file": path(files.CA_CRT),
        "secure-port": "10257",
        "service-account-private-key-file": path(files.SERVICE_ACCOUNT_KEY),
        "service-cluster-ip-range": ",".join(inputs.service_cidrs),
        "use-service-account-credentials": "true",
    }

    def probes(flags: Mapping[str, str]) -> dict[str, Any]:
        return {"livenessProbe": _http_probe(flags, path="/healthz", default_port=10257, liveness=True)}

    return _static_pod(
        component,
        inputs,
        node_root=node_root,
        defaults=defaults,
        probes=probes,
        requests={"cpu": "50m", "memory": "256Mi"},
    )


def render_scheduler(inputs: ControlPlaneInputs, *, node_root: PurePosixPath) -> dict[str, Any]:
    """The kube-scheduler static pod for a node whose root directory is `node_root`."""
    component = files.SCHEDULER
    kubeconfig = str(
        files.secret_path(component, files.KUBECONFIG, node_root=node_root, secrets_root=inputs.secrets_root)
    )
    defaults = {
        "authentication-kubeconfig": kubeconfig,
        "authorization-kubeconfig": kubeconfig,
        "bind-address": "127.0.0.1",
        "kubeconfig": kubeconfig,
        "leader-elect": "true",
        "port": "0",
        "profiling": "false",
        "secure-port": "10259",
    }

    def probes(flags: Mapping[str, str]) -> dict[str, Any]:
        return {"livenessProbe": _http_probe(flags, path="/healthz", default_port=10259, liveness=True)}

    return _static_pod(
        component,
        inputs,
        node_root=node_root,
        defaults=defaults,
        probes=probes,
        requests={"cpu": "10m", "memory": "64Mi"},
    )


def render_static_pods(inputs: ControlPlaneInputs, *, node_root: PurePosixPath) -> dict[str, dict[str, Any]]:
    """All three static pods keyed by component name, in `files.COMPONENTS` order."""
    return {
        files.APISERVER: render_apiserver(inputs, node_root=node_root),
        files.CONTROLLER_MANAGER: render_controller_manager(inputs, node_root=node_root),
        files.SCHEDULER: render_scheduler(inputs, node_root=node_root),
    }


def dump_yaml(obj: Any) -> str:
    """Deterministic YAML of a rendered object: keys in rendering order, block style, no aliases."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def dump_yaml_documents(objects: list[dict[str, Any]]) -> str:
    """Several objects as one multi-document YAML stream."""
    return "".join(f"---\n{dump_yaml(obj)}" for obj in objects)


class _Dumper(yaml.SafeDumper):
    """SafeDumper for files humans read: no anchors, multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # Embedded files (Corefile, kubeconfig) stay readable instead of becoming one escaped line.
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)
