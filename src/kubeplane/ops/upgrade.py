"""``upgrade-k8s``: a rolling upgrade of the Kubernetes control plane, safe to re-run.

Phases (REFERENCE.md §5, done better):

1. :func:`prepare` — checks before any change: the target version parses, control plane nodes are
   discovered from Kubernetes Nodes (or given), every node answers on the node API, ``--from`` is
   detected from the first node's ``kcpc/kube-apiserver`` image and the path is supported (same
   minor or the next one). It returns the :class:`Observed` state; :func:`build_plan` turns it
   into the :class:`~kubeplane.plan.Plan` (pure data, what ``--dry-run`` prints).
2. :meth:`kubeplane.ops.upgrader.Upgrader.run` — the steps in order: pre-pull the target images
   on every node; then ``kube-apiserver`` on each control plane node in turn,
   ``kube-controller-manager`` on each, ``kube-scheduler`` on each; the ``kube-proxy`` DaemonSet
   together with every node's ``cluster.proxy.image`` (so the config and the cluster never
   drift); optionally each node's kubelet, one at a time; optionally a re-apply of the bootstrap
   manifests.

A component step re-reads ``kcpc/<component>`` on its node. At the target image already: skip,
and the expected config version is the current one. Otherwise patch the node's machine config
image (mode ``immediate``) and take the kcpc version that carries the new image. Either way wait
for the mirror pod ``k8s-app=<component>`` on that node to carry annotation
``kubeplane.dev/config-version`` equal to the expected version and be Ready. For kube-apiserver
the node leaves the load balancer's rotation before the patch and returns after its new pod is
Ready, so clients of the endpoint never reach an API server that is going away.

Images keep their configured repository (a mirror or a custom registry stays): only the tag
changes. Nothing is recorded between runs (see :mod:`kubeplane.plan`): every step decides
from live state, which is what makes re-running after any failure or kill continue the upgrade
without doing a finished step again.

Versions and image references are :mod:`kubeplane.ops.versions`; the executor is
:mod:`kubeplane.ops.upgrader`. The cluster is reached only through :class:`NodeAPI`,
:class:`KubeAPI` and :class:`Rotation`, which the CLI implements (and unit tests fake).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from kubeplane import config as machine_config
from kubeplane import plan as plan_module
from kubeplane.ops.errors import PreflightError
from kubeplane.ops.versions import Version, check_path, image_version, retag

T = TypeVar("T")

APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
COMPONENTS = (APISERVER, CONTROLLER_MANAGER, SCHEDULER)
PROXY = "kube-proxy"
KUBELET = "kubelet"
ETCD = "etcd"
MANIFESTS = "bootstrap-manifests"

KIND_PULL = "pre-pull"
KIND_STATIC_POD = "static-pod"
KIND_DAEMONSET = "daemonset"
KIND_KUBELET = "kubelet"
KIND_MANIFESTS = "manifests"

#: Where each image lives in the machine config (JSON pointer segments).
IMAGE_PATHS: Mapping[str, tuple[str, ...]] = {
    APISERVER: ("cluster", "apiServer", "image"),
    CONTROLLER_MANAGER: ("cluster", "controllerManager", "image"),
    SCHEDULER: ("cluster", "scheduler", "image"),
    PROXY: ("cluster", "proxy", "image"),
    KUBELET: ("machine", "kubelet", "image"),
}

PROXY_NAMESPACE = "kube-system"
CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")


# --- what the operation needs from the cluster ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClusterNode:
    """A Kubernetes Node: its name, the address the node API knows it by, and its role."""

    name: str
    address: str
    control_plane: bool = False


@dataclasses.dataclass(frozen=True)
class ComponentConfig:
    """A node's ``kcpc/<component>``: its resource version and image."""

    version: int
    image: str


@dataclasses.dataclass(frozen=True)
class PodState:
    """A mirror pod: its ``kubeplane.dev/config-version`` and ``kubeplane.dev/secrets-version``
    annotations, readiness and images."""

    name: str
    config_version: str | None
    ready: bool
    images: tuple[str, ...] = ()
    secrets_version: str | None = None


@dataclasses.dataclass(frozen=True)
class RolloutState:
    """A DaemonSet's first container image and rollout counters."""

    image: str
    desired: int
    updated: int
    available: int
    generation: int = 0
    observed_generation: int = 0

    def complete(self, image: str) -> bool:
        """Whether every pod runs ``image`` and is available."""
        return (
            self.image == image
            and self.observed_generation >= self.generation
            and self.updated == self.desired
            and self.available == self.desired
        )


@dataclasses.dataclass(frozen=True)
class KubeletState:
    """A Node's kubelet version and readiness."""

    version: str
    ready: bool


class NodeAPI(Protocol):
    """The node API, addressed by node address (what the CLI's ``-n`` takes)."""

    #: False when the node API has no image pull call; pre-pulling is then left out of the plan.
    can_pull: bool

    async def check(self, node: str) -> None:
        """Raise when ``node`` does not answer (used before any change)."""

    async def component_config(self, node: str, component: str) -> ComponentConfig:
        """``kcpc/<component>`` on ``node``."""

    async def machine_config(self, node: str) -> str:
        """The node's current machine config (YAML)."""

    async def apply_config(self, node: str, data: str, *, mode: str) -> None:
        """Apply a machine config to ``node`` in ``mode`` (``immediate`` for control plane images)."""

    async def service_healthy(self, node: str, service: str) -> bool:
        """Whether the node's service (``etcd``, ``kubelet`` ...) runs and passes its health check."""

    async def pull_image(self, node: str, image: str) -> bool:
        """Pull ``image`` through the node's containerd; True when it was fetched, False if present."""

    async def manifests(self, node: str) -> list[dict[str, Any]]:
        """The Kubernetes objects of the node's bootstrap manifests (``controlplane/Manifests``)."""


class KubeAPI(Protocol):
    """The Kubernetes API (through the control plane endpoint)."""

    async def nodes(self) -> list[ClusterNode]:
        """Every Node with its first InternalIP; control plane by :data:`CONTROL_PLANE_LABELS`."""

    async def mirror_pod(self, *, node_name: str, component: str) -> PodState | None:
        """The kube-system pod labelled ``k8s-app=<component>`` on ``node_name``, if any."""

    async def daemonset(self, namespace: str, name: str) -> RolloutState | None:
        """A DaemonSet's state, None when it does not exist."""

    async def set_daemonset_image(self, namespace: str, name: str, *, container: str, image: str) -> None:
        """Change one container's image in a DaemonSet's pod template."""

    async def kubelet(self, node_name: str) -> KubeletState | None:
        """A Node's kubelet version and readiness, None when the Node does not exist."""

    async def apply_objects(self, objects: Sequence[Mapping[str, Any]]) -> None:
        """Server-side apply objects (creating or updating each; applying the same twice changes nothing)."""


class Rotation(Protocol):
    """The load balancer in front of the API servers (haproxy in a local cluster)."""

    async def drain(self, node: ClusterNode) -> None:
        """Stop sending new connections to the node's API server."""

    async def restore(self, node: ClusterNode) -> None:
        """Send connections to the node again (idempotent)."""

    async def serving(self) -> set[str]:
        """Addresses of the nodes the load balancer sends connections to and finds healthy."""


class NoRotation:
    """No load balancer the operation can steer: readiness checks alone protect the endpoint."""

    async def drain(self, node: ClusterNode) -> None:
        return None

    async def restore(self, node: ClusterNode) -> None:
        return None

    async def serving(self) -> set[str]:
        return set()


# --- options, planning -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    """What the user asked for (the CLI flags)."""

    to: str
    source: str | None = None
    #: The nodes the CLI talks through (``-n``): they must be Kubernetes Nodes, the first one
    #: gives the admin kubeconfig; the plan covers every control plane node regardless.
    via: tuple[str, ...] = ()
    allow_downgrade: bool = False
    pre_pull: bool = True
    upgrade_kubelet: bool = False
    sync_manifests: bool = False


@dataclasses.dataclass(frozen=True)
class Timing:
    """How long and how often to wait; tests shrink them."""

    #: A component's pod must carry the new config and be Ready within this (the original's 3 min).
    pod_timeout: float = 180.0
    #: Polling interval of every wait.
    interval: float = 1.5
    #: The kcpc must reflect an applied config within this.
    config_timeout: float = 60.0
    #: A DaemonSet rollout or a kubelet restart may take longer than one pod.
    rollout_timeout: float = 300.0


@dataclasses.dataclass(frozen=True)
class Observed:
    """What :func:`prepare` read from the cluster: the input of :func:`build_plan` (pure)."""

    source: Version
    target: Version
    control_plane: tuple[ClusterNode, ...]
    #: ``(node address, component) -> image`` for every control plane node and component.
    images: Mapping[tuple[str, str], str]
    #: The kube-proxy DaemonSet image, None when it does not exist.
    proxy_image: str | None
    #: Every node's proxy image from its machine config (address -> image).
    config_proxy_images: Mapping[str, str]
    #: Nodes to pre-pull on (all reachable nodes) — empty when not pre-pulling.
    pull_nodes: tuple[ClusterNode, ...] = ()
    #: ``(node, kubelet version)`` for each node whose kubelet is upgraded, in order.
    kubelets: tuple[tuple[ClusterNode, str], ...] = ()
    sync_manifests: bool = False


def _pull_images(observed: Observed, node: ClusterNode) -> list[str]:
    images = (
        [retag(observed.images[(node.address, c)], observed.target) for c in COMPONENTS]
        if node.control_plane
        else []
    )
    proxy = observed.proxy_image or observed.config_proxy_images.get(node.address)
    if proxy is not None:
        images.append(retag(proxy, observed.target))
    return sorted(set(images))


def build_plan(observed: Observed) -> plan_module.Plan:
    """The upgrade's steps in execution order (see the module docstring)."""
    target = observed.target
    Step = plan_module.Step
    steps: list[plan_module.Step] = []
    for node in observed.pull_nodes:
        images = ",".join(_pull_images(observed, node))
        if images:
            steps.append(
                Step(kind=KIND_PULL, component="images", node=node.address, current="-", target=images)
            )
    for component in COMPONENTS:
        for node in observed.control_plane:
            current = observed.images[(node.address, component)]
            steps.append(
                Step(
                    kind=KIND_STATIC_POD,
                    component=component,
                    node=node.address,
                    current=current,
                    target=retag(current, target),
                )
            )
    notes: list[str] = []
    proxy_current = observed.proxy_image
    if proxy_current is None:
        notes.append(
            f"DaemonSet {PROXY_NAMESPACE}/{PROXY} not found: only the machine configs' proxy image changes"
        )
        proxy_current = next(iter(observed.config_proxy_images.values()), None)
    if proxy_current is not None:
        steps.append(
            Step(
                kind=KIND_DAEMONSET,
                component=PROXY,
                node="",
                current=proxy_current,
                target=retag(proxy_current, target),
            )
        )
    for node, version in observed.kubelets:
        steps.append(
            Step(kind=KIND_KUBELET, component=KUBELET, node=node.address, current=version, target=target.tag)
        )
    if observed.sync_manifests and observed.control_plane:
        steps.append(
            Step(
                kind=KIND_MANIFESTS,
                component=MANIFESTS,
                node=observed.control_plane[0].address,
                current="as applied at bootstrap",
                target="re-applied",
            )
        )
    return plan_module.Plan(
        title=f"upgrade Kubernetes {observed.source} -> {target}", steps=tuple(steps), notes=tuple(notes)
    )


# --- preflight ---------------------------------------------------------------------------------


def select_control_plane(nodes: Sequence[ClusterNode], via: Sequence[str]) -> tuple[ClusterNode, ...]:
    """Every control plane node; ``via`` (the nodes the CLI talks through) must be among ``nodes``."""
    by_key = {key: node for node in nodes for key in (node.address, node.name)}
    unknown = [name for name in via if name not in by_key]
    if unknown:
        raise PreflightError(
            f"node(s) {', '.join(unknown)} given with -n are not Kubernetes Nodes (known: "
            f"{', '.join(f'{n.name} ({n.address})' for n in nodes) or 'none'})"
        )
    found = tuple(node for node in nodes if node.control_plane)
    if not found:
        raise PreflightError(
            "no control plane nodes found: no Kubernetes Node is labelled "
            f"{' or '.join(CONTROL_PLANE_LABELS)}"
        )
    return found


class Reachable(Protocol):
    """The part of a node API :func:`check_reachable` uses (``certs renew`` shares it)."""

    async def check(self, node: str) -> None:
        """Raise when ``node`` does not answer."""


async def check_reachable(node_api: Reachable, nodes: Sequence[ClusterNode]) -> None:
    """Raise a :class:`PreflightError` naming every node of ``nodes`` that does not answer."""
    results = await asyncio.gather(*(node_api.check(node.address) for node in nodes), return_exceptions=True)
    failed = [
        f"{node.name} ({node.address}): {result}"
        for node, result in zip(nodes, results, strict=True)
        if isinstance(result, BaseException)
    ]
    if failed:
        raise PreflightError(
            "nothing was changed: node(s) not reachable through the node API:\n  "
            + "\n  ".join(failed)
            + "\nbring them back (or fix the endpoint), then re-run"
        )


async def kube_read(call: Awaitable[T], *, what: str) -> T:
    """``call``'s result; any failure is a :class:`PreflightError` saying nothing was changed."""
    try:
        return await call
    except Exception as exc:
        raise PreflightError(
            f"nothing was changed: cannot {what} through the Kubernetes API: {exc}; "
            "check the endpoint (--endpoint) and the kubeconfig"
        ) from exc


async def prepare(*, options: Options, node_api: NodeAPI, kube: KubeAPI) -> Observed:
    """Every check before any change, and the cluster state the plan is built from."""
    target = Version.parse(options.to, what="target version (--to)")
    source_given = Version.parse(options.source, what="source version (--from)") if options.source else None
    nodes = await kube_read(kube.nodes(), what="list Kubernetes Nodes")
    control_plane = select_control_plane(nodes, options.via)
    cp_addresses = {node.address for node in control_plane}
    others = tuple(node for node in nodes if node.address not in cp_addresses)
    await check_reachable(node_api, (*control_plane, *others))
    images: dict[tuple[str, str], str] = {}
    for node in control_plane:
        for component in COMPONENTS:
            images[(node.address, component)] = (
                await node_api.component_config(node.address, component)
            ).image
    source = source_given or image_version(images[(control_plane[0].address, APISERVER)])
    check_path(source, target, allow_downgrade=options.allow_downgrade)
    config_proxy_images = {
        node.address: machine_config.load(
            await node_api.machine_config(node.address)
        ).model.cluster.proxy_image
        for node in control_plane
    }
    daemonset = await kube_read(
        kube.daemonset(PROXY_NAMESPACE, PROXY), what=f"read DaemonSet {PROXY_NAMESPACE}/{PROXY}"
    )
    kubelets: list[tuple[ClusterNode, str]] = []
    if options.upgrade_kubelet:
        for node in (*control_plane, *others):
            state = await kube.kubelet(node.name)
            kubelets.append((node, state.version if state else "unknown"))
    return Observed(
        source=source,
        target=target,
        control_plane=control_plane,
        images=images,
        proxy_image=daemonset.image if daemonset else None,
        config_proxy_images=config_proxy_images,
        pull_nodes=(*control_plane, *others) if options.pre_pull and node_api.can_pull else (),
        kubelets=tuple(kubelets),
        sync_manifests=options.sync_manifests,
    )
