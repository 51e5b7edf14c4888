"""Where a node keeps its files, relative to the agent's root directory.

Every agent has a root (``/`` on a real machine, a per-node directory in a local cluster); the
layout below is the one place that spells node paths, so two agents on one machine never collide
and no layer hard-codes an absolute path. Pure path arithmetic: nothing here touches the disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The longest path a unix socket can be bound at on Linux: ``sun_path`` holds 108 bytes with the
#: closing NUL. The kubelet exits at start ("bind: invalid argument") on a longer one.
MAX_UNIX_SOCKET_PATH = 107
#: containerd refuses socket paths over 104 bytes, for its ttrpc socket too.
MAX_CONTAINERD_SOCKET_PATH = 104
#: The kubelet binds its pod-resources socket at a temporary name of up to 10 digits, then renames it.
_KUBELET_TEMP_SOCKET_NAME = 10


@dataclass(frozen=True)
class SocketPath:
    """The longest unix socket path a service binds under a node root, and its limit."""

    service: str
    path: str
    length: int
    limit: int

    def problem(self) -> str | None:
        if self.length <= self.limit:
            return None
        return (
            f"{self.service}'s unix socket {self.path} is {self.length} characters, over the "
            f"{self.limit} it may have"
        )


@dataclass(frozen=True)
class NodePaths:
    """The node's well-known paths under ``root``."""

    root: Path

    # -- agent state ------------------------------------------------------------------------------

    @property
    def system(self) -> Path:
        return self.root / "system"

    @property
    def config(self) -> Path:
        """The applied machine config (the only state that survives a restart)."""
        return self.system / "config.yaml"

    @property
    def staged_config(self) -> Path:
        """A config applied with ``--on-reboot``, promoted at the next reboot."""
        return self.system / "config.staged.yaml"

    @property
    def machine_files_record(self) -> Path:
        """What the agent wrote for ``machine.files`` (its appends, the files it created), so a
        restart or re-apply never appends twice and a removed entry can be undone."""
        return self.system / "machine-files.json"

    @property
    def agent_uploads(self) -> Path:
        """Where a build of the agent (a wheel or a directory) is put for ``kubeplane upgrade``;
        the node refuses a build from anywhere else."""
        return self.root / "var" / "lib" / "kubeplane" / "uploads"

    @property
    def agent_builds(self) -> Path:
        """Agent builds installed by ``kubeplane upgrade``, one directory per version; outside
        :attr:`system` so a reset's wipe of the state keeps the agent that runs."""
        return self.root / "var" / "lib" / "kubeplane" / "agent"

    @property
    def active_build(self) -> Path:
        """Which installed build the agent runs (absent: the one it was started with)."""
        return self.agent_builds / "active.json"

    @property
    def logs(self) -> Path:
        """One log file per service and per agent stream (``controller-runtime``, ``kubeplaned``)."""
        return self.root / "var" / "log" / "kubeplane"

    def log(self, stream: str) -> Path:
        return self.logs / f"{stream}.log"

    @property
    def secrets(self) -> Path:
        """Per-component secret directories (``kubernetes/<component>``, ``etcd``)."""
        return self.system / "secrets"

    # -- kubelet, containerd, etcd ------------------------------------------------------------

    @property
    def kubelet_manifests(self) -> Path:
        """The kubelet's static pod directory (files ``kubeplane-<component>.yaml``)."""
        return self.root / "etc" / "kubernetes" / "manifests"

    @property
    def kubernetes_etc(self) -> Path:
        """Kubeconfigs of the kubelet (``kubelet.conf``, ``bootstrap-kubelet.conf``)."""
        return self.root / "etc" / "kubernetes"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "var" / "lib" / "kubelet"

    @property
    def containerd_root(self) -> Path:
        return self.root / "var" / "lib" / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.root / "run" / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_state / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "etc" / "containerd" / "config.toml"

    @property
    def containerd_conf_d(self) -> Path:
        """Extra containerd config fragments (``*.toml``) the rendered config imports: the containerd
        guide's ``/var/cri/conf.d``, written through ``machine.files``."""
        return self.root / "var" / "cri" / "conf.d"

    def sockets(self) -> list[SocketPath]:
        """The longest unix socket path of each service of the node (a deep root can overrun them)."""
        ttrpc = f"{self.containerd_socket}.ttrpc"
        pod_resources = self.kubelet_root / "pod-resources"
        return [
            SocketPath("containerd", ttrpc, len(ttrpc), MAX_CONTAINERD_SOCKET_PATH),
            SocketPath(
                "kubelet",
                f"{pod_resources}/<{_KUBELET_TEMP_SOCKET_NAME}-digit temporary name>",
                len(str(pod_resources)) + 1 + _KUBELET_TEMP_SOCKET_NAME,
                MAX_UNIX_SOCKET_PATH,
            ),
        ]

    def socket_problem(self, service: str) -> str | None:
        """Why ``service`` cannot bind its sockets under this root, or None."""
        for socket in self.sockets():
            if socket.service == service and (problem := socket.problem()) is not None:
                return problem
        return None

    @property
    def resolv_conf(self) -> Path:
        """The node's resolver config (``machine.network.nameservers``)."""
        return self.root / "etc" / "resolv.conf"

    @property
    def replaced_resolv_conf(self) -> Path:
        """What ``/etc/resolv.conf`` held before kubeplane wrote it, restored when the
        nameservers leave the config."""
        return self.system / "network" / "resolv.conf.replaced"

    @property
    def ca_bundles(self) -> tuple[Path, ...]:
        """The machine's CA bundles, which ``machine.files`` may append to (the custom-CA guide):
        Debian's ``ca-certificates.crt`` and the guide's ``ca-certificates``."""
        certs = self.root / "etc" / "ssl" / "certs"
        return (certs / "ca-certificates.crt", certs / "ca-certificates")

    @property
    def hosts(self) -> Path:
        """The node's hosts file (``machine.network.extraHostEntries``)."""
        return self.root / "etc" / "hosts"

    @property
    def cni_conf(self) -> Path:
        return self.root / "etc" / "cni" / "net.d"

    @property
    def etcd_data(self) -> Path:
        return self.root / "var" / "lib" / "etcd"
