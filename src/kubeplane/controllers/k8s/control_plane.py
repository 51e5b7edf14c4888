"""K8sControlPlaneController: machine config → ``config/KubernetesControlPlaneConfigs`` (kcpc).

One kcpc per control plane component (``kube-apiserver``, ``kube-controller-manager``,
``kube-scheduler``) and per manifest set (``system-manifests``, ``extra-manifests``). Each holds
exactly the settings its consumer renders from and nothing else, because the resource version of
a component's kcpc is that static pod's ``kubeplane.dev/config-version``: a change that touches
one component (``cluster.apiServer.extraArgs``) must bump only that kcpc, and the state makes an
update with an equal spec a no-op, so the other components keep their version and do not restart.

Spec fields (camelCase, as ``get kcpc -o yaml`` shows them):

- components: ``image``, ``extraArgs``, ``extraVolumes`` [{hostPath, mountPath, readonly}];
  kube-apiserver adds ``advertiseAddress``, ``endpoint``, ``localAPIServerPort``, ``etcdServers``,
  ``serviceCIDRs``, ``dnsDomain``; kube-controller-manager adds ``podCIDRs``, ``serviceCIDRs``;
- ``system-manifests``: the inputs of :func:`manifests.render_bootstrap_manifests` except the
  bootstrap token, which is a secret and comes from ``secrets/RootSecrets/k8s``;
- ``extra-manifests``: ``urls`` [{id, url, priority}], ``headers``, ``inline`` [{id, name,
  contents, priority}] — custom CNI URLs get priority ``05`` so the network comes first, extra
  manifests and inline manifests ``99``; ids are ``<priority>-<url or name>`` as in the original,
  the URL without credentials (:func:`redact_url`): readers see the ids.

Only control plane nodes get kcpcs; on any other node (or without a machine config) they are
removed. The advertise address is the node's first address (``network/NodeAddresses``); until it
is known nothing is published, since kube-apiserver cannot be rendered without it.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from kubeplane.config import MachineConfig
from kubeplane.config import models as config_models
from kubeplane.controllers.k8s import files, outputs, render
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, ReconcileContext

SYSTEM_MANIFESTS = "system-manifests"
EXTRA_MANIFESTS = "extra-manifests"
IDS = (*files.COMPONENTS, SYSTEM_MANIFESTS, EXTRA_MANIFESTS)

#: etcd runs on every control plane node; kube-apiserver talks to the local member only.
LOCAL_ETCD_SERVERS = ("https://127.0.0.1:2379",)

CNI_PRIORITY = "05"
EXTRA_PRIORITY = "99"


def redact_url(url: str) -> str:
    """``url`` as readers and logs may see it: user info and query string (where a download's
    credentials or tokens travel) replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(
        (parts.scheme, netloc, parts.path, "***" if parts.query else "", "***" if parts.fragment else "")
    )


def _volumes(volumes: list[config_models.Volume] | None) -> list[dict[str, Any]]:
    return [
        {"hostPath": volume.host_path, "mountPath": volume.mount_path, "readonly": bool(volume.readonly)}
        for volume in volumes or ()
    ]


def _component(
    image: str, section: config_models.ControllerManager | config_models.APIServer | None
) -> dict[str, Any]:
    return {
        "image": image,
        "extraArgs": dict(section.extra_args or {}) if section else {},
        "extraVolumes": _volumes(section.extra_volumes if section else None),
    }


def component_configs(config: config_models.Config, *, advertise_address: str) -> dict[str, dict[str, Any]]:
    """The kcpc spec of every id in :data:`IDS` for a control plane node's config."""
    cluster = config.cluster
    apiserver = {
        **_component(cluster.api_server_image, cluster.api_server),
        "advertiseAddress": advertise_address,
        "endpoint": cluster.control_plane.endpoint,
        "localAPIServerPort": cluster.local_api_server_port,
        "etcdServers": list(LOCAL_ETCD_SERVERS),
        "serviceCIDRs": cluster.service_subnets,
        "dnsDomain": cluster.dns_domain,
    }
    controller_manager = {
        **_component(cluster.controller_manager_image, cluster.controller_manager),
        "podCIDRs": cluster.pod_subnets,
        "serviceCIDRs": cluster.service_subnets,
    }
    scheduler = _component(cluster.scheduler_image, cluster.scheduler)
    proxy, coredns = cluster.proxy, cluster.core_dns
    system_manifests = {
        # PodSecurityPolicy and friends exist or not depending on the API server's version.
        "kubernetesVersion": str(render.KubeVersion.from_image(cluster.api_server_image)),
        "server": cluster.control_plane.endpoint,
        "podCIDRs": cluster.pod_subnets,
        "dnsServiceIP": cluster.dns_service_ip,
        "dnsDomain": cluster.dns_domain,
        "cni": cluster.cni_name,
        "proxyEnabled": not (proxy and proxy.disabled),
        "proxyImage": cluster.proxy_image,
        "proxyMode": (proxy.mode if proxy else None) or "iptables",
        "proxyExtraArgs": dict((proxy.extra_args if proxy else None) or {}),
        "corednsEnabled": not (coredns and coredns.disabled),
        "corednsImage": cluster.coredns_image,
    }
    cni = cluster.network.cni if cluster.network else None
    cni_urls = cni.urls if cni is not None and cni.name == "custom" else None
    urls = [(CNI_PRIORITY, url) for url in cni_urls or ()]
    urls += [(EXTRA_PRIORITY, url) for url in cluster.extra_manifests or ()]
    extra_manifests = {
        "urls": [
            {"id": f"{priority}-{redact_url(url)}", "url": url, "priority": priority}
            for priority, url in urls
        ],
        "headers": dict(cluster.extra_manifest_headers or {}),
        "inline": [
            {
                "id": f"{EXTRA_PRIORITY}-{manifest.name}",
                "name": manifest.name,
                "contents": manifest.contents,
                "priority": EXTRA_PRIORITY,
            }
            for manifest in cluster.inline_manifests or ()
        ],
    }
    return {
        files.APISERVER: apiserver,
        files.CONTROLLER_MANAGER: controller_manager,
        files.SCHEDULER: scheduler,
        SYSTEM_MANIFESTS: system_manifests,
        EXTRA_MANIFESTS: extra_manifests,
    }


class K8sControlPlaneController:
    """Publishes the kcpc of every control plane component and manifest set (see module docstring)."""

    name = "k8s.K8sControlPlaneController"
    inputs = (
        Input(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID),
        Input(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID),
    )
    outputs = (Output(catalog.KUBERNETES_CONTROL_PLANE_CONFIGS),)

    async def reconcile(self, ctx: ReconcileContext) -> None:
        namespace, kcpc = catalog.CONFIG_NAMESPACE, catalog.KUBERNETES_CONTROL_PLANE_CONFIGS
        resource = ctx.find(namespace, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID)
        config = MachineConfig.from_dict(resource.spec.to_dict()).model if resource else None
        if config is None or not config.machine.is_control_plane:
            ctx.cleanup(namespace, kcpc, ())
            return
        addresses = ctx.find(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID)
        spec = addresses.spec if addresses else None
        if not isinstance(spec, catalog.NodeAddressesSpec) or not spec.addresses:
            ctx.logger.info("waiting for the node's addresses to pick the API server advertise address")
            return
        configs = component_configs(config, advertise_address=spec.addresses[0])
        for config_id, data in configs.items():
            outputs.publish(
                ctx, namespace, kcpc, config_id, catalog.KubernetesControlPlaneConfigSpec(data=data)
            )
        ctx.cleanup(namespace, kcpc, configs)
