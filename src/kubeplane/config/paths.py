"""Where a node keeps its files, relative to the agent's root directory.

Every agent has a root (``/`` on a real machine, a per-node directory in a local cluster); the
layout below is the one place that spells node paths, so two agents on one machine never collide
and no layer hard-codes an absolute path. Pure path arithmetic: nothing here touches the disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
        """Extra containerd config fragments merged into the rendered one (the containerd guide)."""
        return self.root / "etc" / "containerd" / "conf.d"

    @property
    def cni_conf(self) -> Path:
        return self.root / "etc" / "cni" / "net.d"

    @property
    def etcd_data(self) -> Path:
        return self.root / "var" / "lib" / "etcd"
