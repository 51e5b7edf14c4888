"""kubelet's command line for one node, rendered as an argument list.

Pure rendering: the caller runs ``[kubelet_binary, *render_args(...)]``. Every directory kubelet
writes to (root dir, certificates, static pod manifests, the flexvolume plugin directory it
would otherwise create under ``/usr/libexec``) lives under the node's root directory, so several
kubelets can share one machine. Facts this encodes (see ENVIRONMENT.md), for v1.20 on cgroup v1:

- ``--cgroup-driver=cgroupfs`` and ``--container-runtime=remote`` with containerd's socket;
- ``--cgroup-root`` must already exist in every cgroup v1 hierarchy (the caller creates it);
- ``--fail-swap-on=false``: machines here may have swap on;
- ``--read-only-port=0``: the unauthenticated read-only port is never wanted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from kubeplane.config.paths import NodePaths

#: ``--node-status-update-frequency`` (see :func:`render_args`).
NODE_STATUS_UPDATE_FREQUENCY = "2s"


@dataclasses.dataclass(frozen=True)
class KubeletPaths:
    """Where one node's kubelet keeps its files, all below the node root."""

    root_dir: Path
    cert_dir: Path
    pod_manifest_path: Path
    kubeconfig: Path
    bootstrap_kubeconfig: Path
    volume_plugin_dir: Path

    @classmethod
    def under(cls, node_root: Path) -> KubeletPaths:
        node = NodePaths(node_root)
        return cls(
            root_dir=node.kubelet_root,
            cert_dir=node.kubelet_root / "pki",
            pod_manifest_path=node.kubelet_manifests,
            kubeconfig=node.kubernetes_etc / "kubelet.conf",
            bootstrap_kubeconfig=node.kubernetes_etc / "bootstrap-kubelet.conf",
            volume_plugin_dir=node.root / "usr/libexec/kubernetes/kubelet-plugins/volume/exec",
        )


def render_args(
    *,
    node_root: Path,
    hostname: str,
    node_ip: str,
    runtime_socket: Path,
    cgroup_root: str,
    bootstrap: bool = False,
    sandbox_image: str = "k8s.gcr.io/pause:3.2",
    client_ca_file: Path | None = None,
    cluster_dns: Sequence[str] = (),
    cluster_domain: str = "cluster.local",
    node_labels: Mapping[str, str] | None = None,
    eviction_hard: Mapping[str, str] | None = None,
    verbosity: int = 2,
    extra_args: Mapping[str, str] | None = None,
) -> list[str]:
    """kubelet's flags for the node rooted at ``node_root``.

    ``bootstrap=True`` adds ``--bootstrap-kubeconfig`` and certificate rotation (a worker
    joining with a token); otherwise ``--kubeconfig`` must already hold working credentials.
    ``eviction_hard=None`` keeps kubelet's defaults. ``extra_args`` (flag name without dashes
    → value) come last and replace a rendered flag of the same name.
    """
    paths = KubeletPaths.under(node_root)
    flags: dict[str, str] = {
        "cgroup-driver": "cgroupfs",
        "container-runtime": "remote",
        "container-runtime-endpoint": f"unix://{runtime_socket}",
        "pod-infra-container-image": sandbox_image,
        "root-dir": str(paths.root_dir),
        "cert-dir": str(paths.cert_dir),
        "pod-manifest-path": str(paths.pod_manifest_path),
        "volume-plugin-dir": str(paths.volume_plugin_dir),
        "kubeconfig": str(paths.kubeconfig),
        "cgroup-root": cgroup_root,
        "fail-swap-on": "false",
        "hostname-override": hostname,
        "node-ip": node_ip,
        "read-only-port": "0",
        # How often the kubelet computes its node status (it posts only a change, or every 5 min;
        # the lease is the heartbeat): 10 s by default, so a node became Ready up to 10 s after
        # its network did. Every 2 s costs a local computation, not API writes.
        "node-status-update-frequency": NODE_STATUS_UPDATE_FREQUENCY,
        "cluster-domain": cluster_domain,
        "v": str(verbosity),
    }
    if bootstrap:
        flags["bootstrap-kubeconfig"] = str(paths.bootstrap_kubeconfig)
        flags["rotate-certificates"] = "true"
    if client_ca_file is not None:
        flags["client-ca-file"] = str(client_ca_file)
        flags["anonymous-auth"] = "false"
    if cluster_dns:
        flags["cluster-dns"] = ",".join(cluster_dns)
    if node_labels:
        flags["node-labels"] = ",".join(f"{key}={value}" for key, value in sorted(node_labels.items()))
    if eviction_hard is not None:
        flags["eviction-hard"] = ",".join(
            f"{signal}<{value}" for signal, value in sorted(eviction_hard.items())
        )
    for name, value in (extra_args or {}).items():
        flags.pop(name, None)
        flags[name] = value
    return [f"--{name}={value}" for name, value in flags.items()]
