"""containerd's configuration file (version 2 TOML) for one node, rendered as text.

Pure rendering: the caller decides where the file goes and starts containerd with
``--config``. Everything containerd writes (socket, content store, state, the ``opt`` plugin's
directory) lives under the node's root directory, so several nodes on one machine never share
a containerd. Facts this config encodes (see ENVIRONMENT.md):

- ``restrict_oom_score_adj = true``: the CRI plugin asks runc for ``oom_score_adj = -998`` on pod
  sandboxes; kernels that refuse to lower it below the caller's own value make every pod fail
  with ``can't get final child's PID from pipe: EOF``. Restricting clamps the request instead.
- ``sandbox_image`` names the pause image kubelet's pods use; it must be importable or pullable.
- registry mirrors (``{"*": ["http://10.5.0.1:6000"]}``) are how air-gapped nodes pull upstream
  names such as ``k8s.gcr.io/kube-apiserver:v1.20.2`` from a local registry.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from kubeplane.config.paths import NodePaths

#: The pause image kubelet v1.20 expects by default.
DEFAULT_SANDBOX_IMAGE = "k8s.gcr.io/pause:3.2"
#: Where Debian's containernetworking-plugins puts the CNI plugins.
DEFAULT_CNI_BIN_DIR = "/usr/lib/cni"

_CRI = '"io.containerd.grpc.v1.cri"'


@dataclasses.dataclass(frozen=True)
class ContainerdPaths:
    """Where one node's containerd keeps its files, all below the node root."""

    config: Path
    socket: Path
    root: Path
    state: Path
    opt: Path
    cni_conf_dir: Path

    @classmethod
    def under(cls, node_root: Path) -> ContainerdPaths:
        node = NodePaths(node_root)
        return cls(
            config=node.containerd_config,
            socket=node.containerd_socket,
            root=node.containerd_root,
            state=node.containerd_state,
            opt=node.root / "opt/containerd",
            cni_conf_dir=node.cni_conf,
        )


@dataclasses.dataclass(frozen=True)
class RegistryConfig:
    """TLS and credentials for one registry host (``host[:port]``); unset fields are omitted."""

    insecure_skip_verify: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = None
    auth: str | None = None
    identity_token: str | None = None


def _str(value: str | Path) -> str:
    # JSON string escapes are a subset of TOML basic-string escapes.
    return json.dumps(str(value))


def _list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_str(value) for value in values) + "]"


def render_config(
    *,
    node_root: Path,
    sandbox_image: str = DEFAULT_SANDBOX_IMAGE,
    cni_bin_dir: str = DEFAULT_CNI_BIN_DIR,
    cni_conf_dir: Path | None = None,
    mirrors: Mapping[str, Sequence[str]] | None = None,
    registries: Mapping[str, RegistryConfig] | None = None,
    shim_cgroup: str | None = None,
) -> str:
    """The ``config.toml`` for the containerd of the node rooted at ``node_root``.

    ``mirrors`` maps a registry host (or ``"*"`` for every host) to the endpoints to pull from,
    in order; ``registries`` sets TLS verification, CA and credentials per registry host.
    ``shim_cgroup`` is the cgroup (in every v1 hierarchy, created by the caller) that the runc
    runtime moves each shim into, so the node's shims can be found by membership.
    """
    paths = ContainerdPaths.under(node_root)
    lines = [
        "version = 2",
        f"root = {_str(paths.root)}",
        f"state = {_str(paths.state)}",
        "",
        "[grpc]",
        f"  address = {_str(paths.socket)}",
        "",
        # The opt plugin otherwise claims /opt/containerd on the host.
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {_str(paths.opt)}",
        "",
        f"[plugins.{_CRI}]",
        f"  sandbox_image = {_str(sandbox_image)}",
        "  restrict_oom_score_adj = true",
        "",
        f"[plugins.{_CRI}.containerd]",
        '  default_runtime_name = "runc"',
        "",
        f"[plugins.{_CRI}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        *(
            ["", f"[plugins.{_CRI}.containerd.runtimes.runc.options]", f"  ShimCgroup = {_str(shim_cgroup)}"]
            if shim_cgroup
            else []
        ),
        "",
        f"[plugins.{_CRI}.cni]",
        f"  bin_dir = {_str(cni_bin_dir)}",
        f"  conf_dir = {_str(cni_conf_dir or paths.cni_conf_dir)}",
    ]
    for host, endpoints in sorted((mirrors or {}).items()):
        lines += ["", f"[plugins.{_CRI}.registry.mirrors.{_str(host)}]", f"  endpoint = {_list(endpoints)}"]
    for host, registry in sorted((registries or {}).items()):
        lines += _registry_lines(host, registry)
    return "\n".join(lines) + "\n"


def _registry_lines(host: str, registry: RegistryConfig) -> list[str]:
    prefix = f"[plugins.{_CRI}.registry.configs.{_str(host)}"
    tls = {
        "ca_file": registry.ca_file,
        "cert_file": registry.cert_file,
        "key_file": registry.key_file,
    }
    auth = {
        "username": registry.username,
        "password": registry.password,
        "auth": registry.auth,
        "identitytoken": registry.identity_token,
    }
    lines: list[str] = []
    if registry.insecure_skip_verify or any(tls.values()):
        lines += ["", f"{prefix}.tls]"]
        if registry.insecure_skip_verify:
            lines.append("  insecure_skip_verify = true")
        lines += [f"  {key} = {_str(value)}" for key, value in tls.items() if value]
    if any(auth.values()):
        lines += ["", f"{prefix}.auth]"]
        lines += [f"  {key} = {_str(value)}" for key, value in auth.items() if value]
    return lines
