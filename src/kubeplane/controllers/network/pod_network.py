"""PodNetworkController: the ``host-gw`` pod network of this node, kept in step with the Node
objects; its state in ``network/PodNetworkStatuses/current``.

Active only when ``cluster.network.cni.name`` is ``host-gw`` (see :mod:`kubeplane.services.cni`
for the model). A background task lists the cluster's Nodes with the kubelet's own credentials
(``/etc/kubernetes/kubelet.conf``: the node authorizer lets a node read every Node) and watches
them until a node's pod CIDR or InternalIP changes; its end queues a reconcile, which

1. writes the CNI conflist for this node's ``spec.podCIDR`` (containerd's CRI plugin watches the
   conf directory, so pods start once the controller manager allocated the CIDR; until then the
   node reports its network not ready);
2. makes kubeplane's routes (route protocol ``cni.ROUTE_PROTO``) exactly "every other node's pod
   CIDR via its InternalIP", never touching another route;
3. turns IPv4 forwarding on and writes the masquerade chain for traffic leaving the pod network;

then starts the next watch. Until the kubelet has its client certificate the task waits and
tries again every ``retry_interval`` seconds; so does an API server that does not answer.

Routes and rules stay when the agent stops (running pods keep their network through an agent
restart or upgrade); switching the CNI away from ``host-gw`` removes them and the conflist.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from kubeplane import fileio
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.config import MachineConfig
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import outputs
from kubeplane.resources import catalog
from kubeplane.runtime import ControllerLogger, Input, Output, ReconcileContext
from kubeplane.services import cni, kubelet, podnet

CNI_HOST_GW = "host-gw"
WATCH_TASK = "nodes"
STATUS_ID = "current"
CONFLIST_MODE = 0o644

#: Nodes by name, as far as the pod network cares.
Snapshot = Mapping[str, cni.NodeNet]


class Network(Protocol):
    """The node's network I/O (blocking; :mod:`kubeplane.services.podnet` in production)."""

    def on_link_networks(self) -> list[ipaddress.IPv4Network]: ...

    def sync_routes(self, routes: Sequence[cni.Route]) -> tuple[list[str], list[str]]: ...

    def enable_forwarding(self) -> bool: ...

    def apply_masquerade(self, rules: str) -> None: ...

    def remove_masquerade(self) -> None: ...


class HostNetwork:
    """:class:`Network` over netlink and iptables in the agent's network namespace."""

    def on_link_networks(self) -> list[ipaddress.IPv4Network]:
        return podnet.on_link_networks()

    def sync_routes(self, routes: Sequence[cni.Route]) -> tuple[list[str], list[str]]:
        return podnet.sync_routes(routes)

    def enable_forwarding(self) -> bool:
        return podnet.enable_forwarding()

    def apply_masquerade(self, rules: str) -> None:
        podnet.apply_masquerade(rules)

    def remove_masquerade(self) -> None:
        podnet.remove_masquerade()


@dataclasses.dataclass(frozen=True)
class _Settings:
    node: str
    pod_subnets: tuple[str, ...]


class PodNetworkController:
    """Keeps the host-gw pod network of this node in step with the Nodes (see module docstring)."""

    name = "network.PodNetworkController"
    inputs = (
        Input(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID),
        Input(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID),
    )
    outputs = (Output(catalog.POD_NETWORK_STATUSES),)

    def __init__(
        self,
        *,
        paths: NodePaths,
        network: Network | None = None,
        retry_interval: float = 2.0,
        watch_timeout: int = 300,
        kube_client: Callable[[str], kube.KubeClient] = kube.KubeClient,
    ) -> None:
        self.paths = paths
        self.kube_client = kube_client
        self.network = network or HostNetwork()
        self.retry_interval = retry_interval
        self.watch_timeout = watch_timeout
        self._settings: _Settings | None = None
        self._nodes: Snapshot | None = None
        self._dirty = False
        self._installed = False
        self._masquerade = ""

    @property
    def conflist(self) -> Path:
        return self.paths.cni_conf / cni.CONFLIST_NAME

    @property
    def kubeconfig(self) -> Path:
        return kubelet.KubeletPaths.under(self.paths.root).kubeconfig

    async def reconcile(self, ctx: ReconcileContext) -> None:
        settings = self._read_settings(ctx)
        if settings != self._settings:
            await ctx.stop_task(WATCH_TASK)
            self._settings, self._nodes, self._dirty = settings, None, False
        if settings is None:
            if self._installed:
                await asyncio.to_thread(self._remove)
            ctx.cleanup(catalog.NETWORK_NAMESPACE, catalog.POD_NETWORK_STATUSES, ())
            return
        task = ctx.task(WATCH_TASK)
        if task is not None and task.done():
            await ctx.stop_task(WATCH_TASK)
            snapshot: Snapshot | None = None if task.cancelled() else task.result()
            if snapshot is not None and snapshot != self._nodes:
                self._nodes, self._dirty = snapshot, True
        if self._nodes is not None and self._dirty:
            try:
                status = await asyncio.to_thread(self._apply, settings, self._nodes, ctx.logger)
                self._dirty = False
            except (podnet.PodNetworkError, OSError) as exc:
                ctx.logger.error("cannot apply the pod network, will retry: %s", exc)
                status = catalog.PodNetworkStatusSpec(error=str(exc))
                ctx.requeue_after(self.retry_interval)
            outputs.publish(ctx, catalog.NETWORK_NAMESPACE, catalog.POD_NETWORK_STATUSES, STATUS_ID, status)
        if ctx.task(WATCH_TASK) is None:
            ctx.start_task(WATCH_TASK, self._observe(self._nodes, ctx.logger))

    @staticmethod
    def _read_settings(ctx: ReconcileContext) -> _Settings | None:
        resource = ctx.find(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID)
        addresses = ctx.find(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID)
        if resource is None or addresses is None:
            return None
        cluster = MachineConfig.from_dict(resource.spec.to_dict()).model.cluster
        spec = addresses.spec
        if cluster.cni_name != CNI_HOST_GW or not isinstance(spec, catalog.NodeAddressesSpec):
            return None
        return _Settings(node=spec.hostname, pod_subnets=tuple(cluster.pod_subnets))

    def _apply(
        self, settings: _Settings, nodes: Snapshot, logger: ControllerLogger
    ) -> catalog.PodNetworkStatusSpec:
        """Conflist, routes, forwarding, masquerading for ``nodes`` (blocking: runs in a thread)."""
        own = nodes.get(settings.node)
        pod_cidr = cni.ipv4_pod_cidr(own) if own is not None else None
        self._installed = True
        if pod_cidr is not None:
            self.conflist.parent.mkdir(parents=True, exist_ok=True)
            conflist = cni.render_conflist(pod_cidr=pod_cidr)
            if fileio.write_if_changed(self.conflist, conflist, mode=CONFLIST_MODE):
                logger.info("pod CIDR %s: wrote %s", pod_cidr, self.conflist)
            masquerade = cni.masquerade_rules(pod_cidr=pod_cidr, cluster_pod_subnets=settings.pod_subnets)
            if masquerade != self._masquerade:
                self.network.apply_masquerade(masquerade)
                self._masquerade = masquerade
        if self.network.enable_forwarding():
            logger.info("turned on IPv4 forwarding")
        routes, skipped = cni.desired_routes(
            settings.node, nodes.values(), on_link=self.network.on_link_networks()
        )
        changed, removed = self.network.sync_routes(routes)
        for route in routes:
            if route.cidr in changed:
                logger.info("routing pod CIDR %s of node %s via %s", route.cidr, route.node, route.via)
        for cidr in removed:
            logger.info("removed the route to pod CIDR %s", cidr)
        return catalog.PodNetworkStatusSpec(
            pod_cidr=pod_cidr or "",
            routes=[{"cidr": route.cidr, "via": route.via, "node": route.node} for route in routes],
            skipped=[{"node": node, "reason": reason} for node, reason in skipped],
        )

    def _remove(self) -> None:
        """Undo what this controller installed (the CNI left ``host-gw``)."""
        self.network.sync_routes(())
        self.network.remove_masquerade()
        self.conflist.unlink(missing_ok=True)
        self._installed, self._masquerade = False, ""

    async def _observe(self, known: Snapshot | None, logger: ControllerLogger) -> Snapshot | None:
        """The Nodes once they differ from ``known`` (the background task; None after a failure,
        having waited ``retry_interval``)."""
        try:
            text = await asyncio.to_thread(self.kubeconfig.read_text)
            config = await asyncio.to_thread(kube.inline_files, text)
        except (OSError, client_errors.KubeconfigError):
            await asyncio.sleep(self.retry_interval)  # the kubelet has no client certificate yet
            return None
        try:
            async with self.kube_client(config) as api:
                return await watch_nodes(api, known, timeout=self.watch_timeout)
        except client_errors.KubeError as exc:
            logger.info("cannot list or watch the Nodes, will retry: %s", exc)
            await asyncio.sleep(self.retry_interval)
            return None


async def watch_nodes(api: kube.KubeClient, known: Snapshot | None, *, timeout: int) -> Snapshot:
    """List the Nodes; when they are ``known`` already, watch until that changes or the server ends
    the watch after ``timeout`` seconds. Returns the current Nodes."""
    items, version = await api.list_with_version(kube.NODES_PATH)
    nodes = {node.name: node for node in map(cni.node_net, items)}
    if nodes == known:
        events = api.watch(kube.NODES_PATH, version, timeout_seconds=timeout)
        async with contextlib.aclosing(events):
            async for kind, obj in events:
                if kind == "BOOKMARK":
                    continue
                node = cni.node_net(obj)
                if kind == "DELETED":
                    nodes.pop(node.name, None)
                else:
                    nodes[node.name] = node
                if nodes != known:
                    break
    return nodes
