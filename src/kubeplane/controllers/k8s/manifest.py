"""ManifestController: ``system-manifests`` kcpc + ``RootSecrets k8s`` → ``controlplane/Manifests``.

One Manifest per id of :func:`~kubeplane.controllers.k8s.manifests.render_bootstrap_manifests`
(``00-kubelet-bootstrapping-token`` ... ``11-kube-config-in-cluster``); ids that the inputs no
longer produce (``05-flannel`` after switching CNI) are removed. The bootstrap token is the only
input taken from the root secrets, so the kcpc itself carries no secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeplane.controllers.k8s import control_plane, manifests, outputs, render
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, OutputKind, ReconcileContext

K8S_ROOT_SECRETS_ID = "k8s"


def manifest_inputs(data: Mapping[str, Any], *, bootstrap_token: str) -> manifests.ManifestInputs:
    """Renderer inputs from the ``system-manifests`` kcpc spec and the bootstrap token."""
    return manifests.ManifestInputs(
        kubernetes_version=render.KubeVersion.parse(str(data["kubernetesVersion"])),
        server=str(data["server"]),
        bootstrap_token=bootstrap_token,
        pod_cidrs=tuple(str(cidr) for cidr in data.get("podCIDRs") or ()),
        dns_service_ip=str(data["dnsServiceIP"]),
        proxy_image=str(data["proxyImage"]),
        dns_domain=str(data.get("dnsDomain", "cluster.local")),
        cni=str(data.get("cni", manifests.CNI_FLANNEL)),
        proxy_enabled=bool(data.get("proxyEnabled", True)),
        proxy_mode=str(data.get("proxyMode", "iptables")),
        proxy_extra_args={str(k): str(v) for k, v in (data.get("proxyExtraArgs") or {}).items()},
        coredns_enabled=bool(data.get("corednsEnabled", True)),
        coredns_image=str(data["corednsImage"]),
    )


class ManifestController:
    """Publishes the bootstrap manifests (see module docstring)."""

    name = "k8s.ManifestController"
    inputs = (
        Input(
            catalog.CONFIG_NAMESPACE, catalog.KUBERNETES_CONTROL_PLANE_CONFIGS, control_plane.SYSTEM_MANIFESTS
        ),
        Input(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, K8S_ROOT_SECRETS_ID),
    )
    # Shared: ExtraManifestController writes the same type in the ``extras`` namespace.
    outputs = (Output(catalog.MANIFESTS, OutputKind.SHARED),)

    async def reconcile(self, ctx: ReconcileContext) -> None:
        namespace = catalog.CONTROLPLANE_NAMESPACE
        config = ctx.find(
            catalog.CONFIG_NAMESPACE, catalog.KUBERNETES_CONTROL_PLANE_CONFIGS, control_plane.SYSTEM_MANIFESTS
        )
        secrets = ctx.find(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, K8S_ROOT_SECRETS_ID)
        if config is None or secrets is None:
            ctx.cleanup(namespace, catalog.MANIFESTS, ())
            return
        token = str(secrets.spec.to_dict().get("bootstrapToken", ""))
        rendered = manifests.render_bootstrap_manifests(
            manifest_inputs(config.spec.to_dict(), bootstrap_token=token)
        )
        for manifest_id, items in rendered.items():
            outputs.publish(ctx, namespace, catalog.MANIFESTS, manifest_id, catalog.ManifestSpec(items=items))
        ctx.cleanup(namespace, catalog.MANIFESTS, rendered)
