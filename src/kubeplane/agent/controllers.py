"""Which controllers a node runs.

Every node registers the same set: controllers that only concern control plane nodes read the
machine type themselves and produce nothing on workers (and clean up what they made before a
node changed role), so a config change never needs a different controller set.
"""

from __future__ import annotations

from kubeplane.config.paths import NodePaths
from kubeplane.controllers.config.machine_type import MachineTypeController
from kubeplane.controllers.k8s import (
    bootstrap_status,
    control_plane,
    extra_manifest,
    kubelet_csr,
    kubelet_static_pod,
    manifest,
    manifest_apply,
    mirror_status,
    node_cidr,
    static_pod,
)
from kubeplane.controllers.network import machine_network, pod_network, vip
from kubeplane.controllers.secrets import etcd as etcd_secrets
from kubeplane.controllers.secrets import kubernetes as kubernetes_secrets
from kubeplane.controllers.secrets import render as render_secrets
from kubeplane.controllers.secrets import render_etcd, root
from kubeplane.controllers.timesync import time_sync
from kubeplane.runtime import Controller
from kubeplane.services import wireguard_io


def for_node(*, paths: NodePaths, wireguard: wireguard_io.Daemons) -> list[Controller]:
    """The controllers of a node whose files live under ``paths``; ``wireguard`` runs the
    processes behind its WireGuard devices (the node stops them when it stops)."""
    return [
        MachineTypeController(),
        root.RootSecretsController(),
        etcd_secrets.EtcdSecretsController(),
        kubernetes_secrets.KubernetesSecretsController(),
        render_secrets.RenderSecretsStaticPodController(paths=paths),
        render_etcd.RenderEtcdSecretsController(paths=paths),
        control_plane.K8sControlPlaneController(),
        static_pod.ControlPlaneStaticPodController(paths=paths),
        kubelet_static_pod.KubeletStaticPodController(paths=paths),
        manifest.ManifestController(),
        extra_manifest.ExtraManifestController(ca_bundles=paths.ca_bundles),
        bootstrap_status.BootstrapStatusController(),
        manifest_apply.ManifestApplyController(),
        kubelet_csr.KubeletCSRController(),
        node_cidr.NodeCIDRController(),
        mirror_status.MirrorPodStatusController(),
        pod_network.PodNetworkController(paths=paths),
        machine_network.MachineNetworkController(paths=paths, wireguard=wireguard),
        vip.VipController(),
        time_sync.TimeSyncController(paths=paths),
    ]
