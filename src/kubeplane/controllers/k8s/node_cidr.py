"""NodeCIDRController: every Node's pod CIDR (``spec.podCIDRs``), assigned by the control plane
nodes' agents instead of kube-controller-manager.

kube-controller-manager's node IPAM controller waits a fixed 10 s before it first lists the nodes
(its ``wait.Poll`` sleeps before the first try), and it starts every other controller's informers
only after that: on a new cluster every node waited that long for its pod CIDR, so for its network
and its Ready condition (docs/architecture.md, Cluster create performance). The static pod
kube-controller-manager is therefore rendered with ``--allocate-node-cidrs=false``, and this
controller does what its range allocator did, from the same flags:

- it runs on a control plane node whose ``controlplane/StaticPods/kube-controller-manager`` says
  ``--allocate-node-cidrs=false`` (so never beside a kube-controller-manager that allocates: not
  on a self-hosted control plane, whose DaemonSet allocates, nor when ``extraArgs`` turn it back
  on), with the local admin kubeconfig;
- the pools are that pod's ``--cluster-cidr`` (one per address family) cut into blocks of
  ``--node-cidr-mask-size-ipv4`` / ``-ipv6``, else ``--node-cidr-mask-size``, else /24 and /64,
  kube-controller-manager's defaults; at most 2^16 blocks per pool, its limit too;
- a node without ``spec.podCIDRs`` gets the lowest free block of each pool. Free means not
  overlapping any node's ``spec.podCIDRs`` in a list read while this node holds the etcd lock
  ``kubeplane:v1:nodeCIDRMutex``, so the control plane nodes take turns and none hands out a
  block another has just given; the patch carries the listed ``resourceVersion``, so a node that
  changed meanwhile is looked at again, never overwritten. A deleted node's block is free again
  with the next list, as kube-controller-manager frees it.

It watches the Nodes through its own API server (a background task) and assigns whenever a node
without a pod CIDR appears. Nodes that already have one, from kube-controller-manager on a
cluster made before, keep theirs: an existing cluster changes over without touching any node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.controllers.k8s import api_watch, etcd_access, files, render
from kubeplane.controllers.secrets import kubernetes as kubernetes_secrets
from kubeplane.resources import Resource, catalog
from kubeplane.runtime import ControllerLogger, Input, Output, ReconcileContext
from kubeplane.services import cni

#: Serialises the assignment across control plane nodes (the list and the patches under it).
NODE_CIDR_MUTEX = etcd_access.KEY_PREFIX + b"nodeCIDRMutex"
WATCH_TASK = "nodes"
#: kube-controller-manager's defaults and its limit on blocks per pool (``cidrset``).
DEFAULT_MASKS = {4: 24, 6: 64}
MAX_BLOCK_BITS = 16

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class NodeCIDRError(ValueError):
    """The pools cannot be made from the flags, or one is full; the message names what."""


@dataclasses.dataclass(frozen=True)
class Pool:
    """``subnet`` handed out in blocks of ``/mask``."""

    subnet: Network
    mask: int

    @property
    def size(self) -> int:
        return 1 << (self.mask - self.subnet.prefixlen)

    def block(self, index: int) -> Network:
        step = 1 << (self.subnet.max_prefixlen - self.mask)
        address = int(self.subnet.network_address) + index * step
        return ipaddress.ip_network((address, self.mask))

    def taken(self, used: Iterable[Network]) -> set[int]:
        """The indexes of the blocks that overlap any of ``used``."""
        shift = self.subnet.max_prefixlen - self.mask
        base = int(self.subnet.network_address)
        indexes: set[int] = set()
        for network in used:
            if network.version != self.subnet.version or not network.overlaps(self.subnet):
                continue
            first = max(int(network.network_address), base)
            last = min(int(network.broadcast_address), int(self.subnet.broadcast_address))
            indexes.update(range((first - base) >> shift, ((last - base) >> shift) + 1))
        return indexes


def pools(flags: Mapping[str, str]) -> tuple[Pool, ...]:
    """The pools kube-controller-manager would allocate from with ``flags`` (its command line)."""
    cidrs = [c.strip() for c in flags.get("cluster-cidr", "").split(",") if c.strip()]
    if not cidrs:
        raise NodeCIDRError("kube-controller-manager has no --cluster-cidr (cluster.network.podSubnets)")
    found: list[Pool] = []
    for cidr in cidrs:
        try:
            subnet = ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise NodeCIDRError(f"--cluster-cidr {cidr!r}: {exc}") from exc
        family = f"ipv{subnet.version}"
        raw = flags.get(f"node-cidr-mask-size-{family}") or flags.get("node-cidr-mask-size")
        try:
            mask = int(raw) if raw else DEFAULT_MASKS[subnet.version]
        except ValueError as exc:
            raise NodeCIDRError(f"--node-cidr-mask-size for {family}: {raw!r} is not a number") from exc
        if not subnet.prefixlen <= mask <= subnet.max_prefixlen:
            raise NodeCIDRError(f"--node-cidr-mask-size /{mask} does not fit in --cluster-cidr {subnet}")
        if mask - subnet.prefixlen > MAX_BLOCK_BITS:
            raise NodeCIDRError(
                f"--cluster-cidr {subnet} in /{mask} blocks: more than 2^{MAX_BLOCK_BITS} blocks "
                "(kube-controller-manager's limit); use a larger block or a smaller subnet"
            )
        if any(p.subnet.version == subnet.version for p in found):
            raise NodeCIDRError(f"--cluster-cidr has two IPv{subnet.version} subnets; one per family")
        found.append(Pool(subnet=subnet, mask=mask))
    return tuple(found)


@dataclasses.dataclass
class Assignment:
    """What :func:`assign` decided: the CIDRs for each node, by name, and the nodes no block was
    left for (oldest first), with the pool that is full."""

    cidrs: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    starved: list[str] = dataclasses.field(default_factory=list)
    full: str = ""


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name") or "")


def _age(node: Mapping[str, Any]) -> tuple[str, str]:
    """The order nodes get their blocks in: oldest first, by name among equals."""
    return str((node.get("metadata") or {}).get("creationTimestamp") or ""), _name(node)


def assign(pool_list: Sequence[Pool], nodes: Sequence[Mapping[str, Any]]) -> Assignment:
    """The pod CIDRs for each node of ``nodes`` that has none, oldest first: the lowest block of
    each pool that overlaps no node's CIDRs and no block given before it."""
    used: list[Network] = []
    for node in nodes:
        for cidr in cni.pod_cidrs(node):
            with contextlib.suppress(ValueError):  # the API server validated it; be safe anyway
                used.append(ipaddress.ip_network(cidr, strict=False))
    taken = [pool.taken(used) for pool in pool_list]
    result = Assignment()
    for node in sorted((node for node in nodes if not cni.pod_cidrs(node)), key=_age):
        name = _name(node)
        picked = [
            next((i for i in range(pool.size) if i not in indexes), None)
            for pool, indexes in zip(pool_list, taken, strict=True)
        ]
        full = [pool for pool, index in zip(pool_list, picked, strict=True) if index is None]
        if full:
            result.starved.append(name)
            result.full = f"no free /{full[0].mask} left in {full[0].subnet}"
            continue
        result.cidrs[name] = []
        for pool, indexes, index in zip(pool_list, taken, picked, strict=True):
            assert index is not None
            indexes.add(index)
            result.cidrs[name].append(str(pool.block(index)))
    return result


class Lock(Protocol):
    """The etcd lock the control plane nodes take turns with (:meth:`EtcdClient.lock`)."""

    def lock(self, name: bytes, *, ttl: int = 10) -> contextlib.AbstractAsyncContextManager[bytes]: ...


class EtcdLocks(Protocol):
    async def client(self, secrets: Resource) -> Lock: ...


@dataclasses.dataclass
class Outcome:
    """One pass of :func:`assign_pending`: the CIDRs written, by node name, and the nodes left
    without one because a pool is full (a conflict is not counted: that node changed, and its
    change comes back through the watch)."""

    done: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    starved: set[str] = dataclasses.field(default_factory=set)


async def assign_pending(
    api: kube.KubeClient, pool_list: Sequence[Pool], logger: ControllerLogger
) -> Outcome:
    """List the nodes and give each without a pod CIDR its blocks (call it under the lock)."""
    nodes = await api.list(kube.NODES_PATH)
    plan = assign(pool_list, nodes)
    if plan.starved:
        logger.warning("%s: no pod CIDR for node %s", plan.full, ", ".join(plan.starved))
    versions = {_name(node): (node.get("metadata") or {}).get("resourceVersion") for node in nodes}
    outcome = Outcome(starved=set(plan.starved))
    for name, cidrs in plan.cidrs.items():
        patch = {
            "metadata": {"resourceVersion": versions[name]},
            "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs},
        }
        try:
            await api.patch(kube.node_path(name), patch, patch_type="merge")
        except (client_errors.KubeConflict, client_errors.KubeNotFound):
            # Changed or deleted since the list: the watch brings it back if it still needs one.
            logger.debug("node %s changed before its pod CIDR was written; looking again", name)
            continue
        logger.info("assigned pod CIDR %s to node %s", ",".join(cidrs), name)
        outcome.done[name] = cidrs
    return outcome


def _worth_a_look(kind: str, node: Mapping[str, Any], starved: set[str]) -> bool:
    """Whether a watch event may let a pass assign something: a node without a CIDR that is not
    waiting for a full pool, or a deleted node that frees blocks a waiting node needs."""
    name = _name(node)
    if kind == "DELETED":
        return bool(starved - {name})
    return kind in ("ADDED", "MODIFIED") and not cni.pod_cidrs(node) and name not in starved


@dataclasses.dataclass(frozen=True)
class _Settings:
    kubeconfig: str = dataclasses.field(repr=False)
    pools: tuple[Pool, ...]
    etcd: Resource = dataclasses.field(repr=False, compare=False)
    etcd_version: int


def controller_manager_flags(resource: Resource | None) -> dict[str, str] | None:
    """The flags of the kube-controller-manager static pod ``resource``, or None."""
    if resource is None or not isinstance(resource.spec, catalog.StaticPodSpec):
        return None
    containers = (resource.spec.to_dict()["pod"].get("spec") or {}).get("containers") or ()
    return render.flags_of(containers[0]["command"]) if containers else None


class NodeCIDRController(api_watch.WatchingController[_Settings]):
    """Assigns the Nodes' pod CIDRs in kube-controller-manager's place (see module docstring)."""

    name = "k8s.NodeCIDRController"
    inputs = (
        Input(catalog.CONTROLPLANE_NAMESPACE, catalog.STATIC_PODS, files.CONTROLLER_MANAGER),
        Input(catalog.RUNTIME_NAMESPACE, catalog.BOOTSTRAP_STATUSES, catalog.BOOTSTRAP_STATUS_ID),
        Input(
            catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, kubernetes_secrets.KUBERNETES_SECRETS_ID
        ),
        Input(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID),
    )
    outputs: tuple[Output, ...] = ()  # it writes to the API server only
    task_name = WATCH_TASK
    task_what = "assigning pod CIDRs"

    def __init__(
        self,
        *,
        etcd: EtcdLocks | None = None,
        retry_interval: float = 1.0,
        watch_timeout: int = 300,
        lock_ttl: int = 10,
        kube_client: Callable[[str], kube.KubeClient] = kube.KubeClient,
    ) -> None:
        super().__init__()
        self.etcd: EtcdLocks = etcd or etcd_access.EtcdConnection()
        self.retry_interval = retry_interval
        self.watch_timeout = watch_timeout
        self.lock_ttl = lock_ttl
        self.kube_client = kube_client
        self._refused: str | None = None

    def _read_settings(self, ctx: ReconcileContext) -> _Settings | None:
        pod = ctx.find(catalog.CONTROLPLANE_NAMESPACE, catalog.STATIC_PODS, files.CONTROLLER_MANAGER)
        bootstrap = ctx.find(
            catalog.RUNTIME_NAMESPACE, catalog.BOOTSTRAP_STATUSES, catalog.BOOTSTRAP_STATUS_ID
        )
        kubeconfig = kubernetes_secrets.local_admin_kubeconfig(ctx)
        etcd = ctx.find(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID)
        flags = controller_manager_flags(pod)
        if flags is None or flags.get("allocate-node-cidrs", "false") != "false":
            return None  # not a control plane node, or its kube-controller-manager allocates
        if bootstrap is None or not isinstance(bootstrap.spec, catalog.BootstrapStatusSpec):
            return None
        if bootstrap.spec.self_hosted_control_plane:  # its DaemonSet allocates
            return None
        if kubeconfig is None or etcd is None:
            return None
        try:
            pool_list = pools(flags)
        except NodeCIDRError as exc:
            if str(exc) != self._refused:  # said once
                ctx.logger.warning("not assigning pod CIDRs: %s", exc)
                self._refused = str(exc)
            return None
        self._refused = None
        return _Settings(
            kubeconfig=kubeconfig,
            pools=pool_list,
            etcd=etcd,
            etcd_version=etcd.metadata.version,
        )

    async def _watch(self, settings: _Settings, logger: ControllerLogger) -> None:
        """List the nodes, assign what is missing, then follow the changes; again after any break.

        A node left without a CIDR because a pool is full is looked at again when a node is
        deleted (its blocks are free then), not at each of its status updates.
        """
        starved: set[str] = set()

        async def look(api: kube.KubeClient) -> None:
            nonlocal starved
            client = await self.etcd.client(settings.etcd)
            async with client.lock(NODE_CIDR_MUTEX, ttl=self.lock_ttl):
                starved = (await assign_pending(api, settings.pools, logger)).starved

        async def listed(api: kube.KubeClient, items: api_watch.Items) -> None:
            if any(not cni.pod_cidrs(node) for node in items):
                await look(api)

        async def changed(api: kube.KubeClient, kind: str, node: dict[str, Any]) -> None:
            if _worth_a_look(kind, node, starved):
                await look(api)

        await api_watch.follow(
            lambda: self.kube_client(settings.kubeconfig),
            kube.NODES_PATH,
            listed=listed,
            changed=changed,
            logger=logger,
            retry_interval=self.retry_interval,
            watch_timeout=self.watch_timeout,
            what="pod CIDRs",
        )
