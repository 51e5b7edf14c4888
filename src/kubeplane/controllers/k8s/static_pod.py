"""ControlPlaneStaticPodController: kcpc + secrets status → ``controlplane/StaticPods``.

For each of kube-apiserver, kube-controller-manager and kube-scheduler the pod is rendered by
:mod:`~kubeplane.controllers.k8s.render` from that component's kcpc alone, with annotations
``kubeplane.dev/config-version`` = the kcpc's resource version and
``kubeplane.dev/secrets-version`` = the ``SecretStatuses static-pods`` version. Rendering each pod
from its own kcpc is what keeps a change to one component from restarting the others.

Secrets gate the pods: no StaticPods exist until the secrets status says ready (a pod started
before its certificates are on disk only crash-loops). When the status disappears (machine no
longer a control plane node) the pods are torn down; when it is merely not ready (new
certificates being written) the pods already published stay as they are, so the control plane
keeps running while secrets are refreshed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import control_plane, files, outputs, render
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, ReconcileContext

_RENDERERS: dict[str, Callable[..., dict[str, Any]]] = {
    files.APISERVER: render.render_apiserver,
    files.CONTROLLER_MANAGER: render.render_controller_manager,
    files.SCHEDULER: render.render_scheduler,
}


def component_inputs(
    data: Mapping[str, Any], *, config_version: str, secrets_version: str, secrets_root: PurePosixPath
) -> render.ControlPlaneInputs:
    """Renderer inputs for one component from its kcpc spec (fields it does not use stay neutral)."""
    own = render.ComponentInputs(
        image=str(data["image"]),
        config_version=config_version,
        extra_args={str(k): str(v) for k, v in data.get("extraArgs", {}).items()},
        extra_volumes=tuple(
            render.ExtraVolume(
                host_path=str(volume["hostPath"]),
                mount_path=str(volume["mountPath"]),
                readonly=bool(volume.get("readonly", False)),
            )
            for volume in data.get("extraVolumes", ())
        ),
    )
    return render.ControlPlaneInputs(
        advertise_address=str(data.get("advertiseAddress", "")),
        pod_cidrs=tuple(data.get("podCIDRs", ())),
        service_cidrs=tuple(data.get("serviceCIDRs", ())),
        # The renderer of a component reads only its own entry.
        apiserver=own,
        controller_manager=own,
        scheduler=own,
        secrets_version=secrets_version,
        dns_domain=str(data.get("dnsDomain", "cluster.local")),
        local_api_port=int(data.get("localAPIServerPort", 6443)),
        etcd_servers=tuple(data.get("etcdServers", control_plane.LOCAL_ETCD_SERVERS)),
        secrets_root=secrets_root,
    )


class ControlPlaneStaticPodController:
    """Renders the control plane static pods once secrets are ready (see module docstring)."""

    name = "k8s.ControlPlaneStaticPodController"
    inputs = (
        Input(catalog.CONFIG_NAMESPACE, catalog.KUBERNETES_CONTROL_PLANE_CONFIGS),
        Input(catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, catalog.STATIC_POD_SECRETS_ID),
    )
    outputs = (Output(catalog.STATIC_PODS),)

    def __init__(self, *, paths: NodePaths) -> None:
        self.node_root = PurePosixPath(paths.root)
        # The secrets controller writes under paths.secrets; flag paths must point at the same place.
        self.secrets_root = PurePosixPath(paths.secrets.relative_to(paths.root)) / "kubernetes"

    async def reconcile(self, ctx: ReconcileContext) -> None:
        namespace = catalog.CONTROLPLANE_NAMESPACE
        status = ctx.find(namespace, catalog.SECRET_STATUSES, catalog.STATIC_POD_SECRETS_ID)
        if status is None:
            ctx.cleanup(namespace, catalog.STATIC_PODS, ())
            return
        if not isinstance(status.spec, catalog.SecretStatusSpec) or not status.spec.ready:
            ctx.logger.info("waiting for control plane secrets to be ready before rendering static pods")
            return
        keep = []
        for component, renderer in _RENDERERS.items():
            config = ctx.find(catalog.CONFIG_NAMESPACE, catalog.KUBERNETES_CONTROL_PLANE_CONFIGS, component)
            if config is None:
                continue
            inputs = component_inputs(
                config.spec.to_dict(),
                config_version=str(config.metadata.version),
                secrets_version=status.spec.version,
                secrets_root=self.secrets_root,
            )
            pod = renderer(inputs, node_root=self.node_root)
            before = ctx.find(namespace, catalog.STATIC_PODS, component)
            after = outputs.publish(
                ctx, namespace, catalog.STATIC_PODS, component, catalog.StaticPodSpec(pod=pod)
            )
            if before is None or before.metadata.version != after.metadata.version:
                ctx.logger.info(
                    "rendered static pod %s (config-version %s, secrets-version %s)",
                    component,
                    inputs.apiserver.config_version,
                    inputs.secrets_version,
                )
            keep.append(component)
        ctx.cleanup(namespace, catalog.STATIC_PODS, keep)
