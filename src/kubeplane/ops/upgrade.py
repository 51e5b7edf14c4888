"""``upgrade-k8s``: a rolling upgrade of the Kubernetes control plane, safe to re-run.

Phases (REFERENCE.md §5, done better):

1. :func:`prepare` — checks before any change: the target version parses, control plane nodes are
   discovered from Kubernetes Nodes (or given), every node answers on the node API, ``--from`` is
   detected from the first node's ``kcpc/kube-apiserver`` image and the path is supported (same
   minor or the next one). It returns an :class:`Upgrade`: the :class:`~kubeplane.ops.plan.Plan`
   (pure data, what ``--dry-run`` prints) plus what executing it needs.
2. :meth:`Upgrade.run` — the steps in order: pre-pull the target images on every node; then
   ``kube-apiserver`` on each control plane node in turn, ``kube-controller-manager`` on each,
   ``kube-scheduler`` on each; the ``kube-proxy`` DaemonSet together with every node's
   ``cluster.proxy.image`` (so the config and the cluster never drift); optionally each node's
   kubelet, one at a time; optionally a re-apply of the bootstrap manifests.

A component step re-reads ``kcpc/<component>`` on its node. At the target image already: skip,
and the expected config version is the current one. Otherwise patch the node's machine config
image (mode ``immediate``) and take the kcpc version that carries the new image. Either way wait
for the mirror pod ``k8s-app=<component>`` on that node to carry annotation
``kubeplane.dev/config-version`` equal to the expected version and be Ready. For kube-apiserver
the node leaves the load balancer's rotation before the patch and returns after its new pod is
Ready, so clients of the endpoint never reach an API server that is going away.

Images keep their configured repository (a mirror or a custom registry stays): only the tag
changes. Nothing is recorded between runs (see :mod:`kubeplane.ops.plan`): every step decides
from live state, which is what makes re-running after any failure or kill continue the upgrade
without doing a finished step again.

The cluster is reached only through :class:`NodeAPI`, :class:`KubeAPI` and :class:`Rotation`,
which the CLI implements (and unit tests fake).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from kubeplane import config as machine_config
from kubeplane.clients import kube as kube_client
from kubeplane.ops import plan as plan_module
from kubeplane.ops.errors import OpsError, PreflightError, WaitTimeout

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

_VERSION = re.compile(r"^v?(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)(?P<suffix>[-+][0-9A-Za-z.+-]+)?$")


# --- versions and images -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Version:
    """A Kubernetes version such as ``v1.20.2`` or a local build ``v1.20.2-kp.1``."""

    major: int
    minor: int
    patch: int
    suffix: str = ""

    @classmethod
    def parse(cls, text: str, *, what: str = "version") -> Version:
        """Parse ``1.20.2``, ``v1.20.2`` or ``v1.20.2-kp.1``; raise PreflightError otherwise."""
        match = _VERSION.match(text.strip())
        if match is None:
            raise PreflightError(
                f"malformed {what} {text!r}: expected a Kubernetes version like v1.20.2 or v1.20.2-kp.1"
            )
        return cls(
            major=int(match["major"]),
            minor=int(match["minor"]),
            patch=int(match["patch"]),
            suffix=match["suffix"] or "",
        )

    @property
    def tag(self) -> str:
        """The image tag: ``v1.20.2-kp.1``."""
        return f"v{self.major}.{self.minor}.{self.patch}{self.suffix}"

    def __str__(self) -> str:
        return self.tag


def check_path(source: Version, target: Version, *, allow_downgrade: bool = False) -> None:
    """Allow the same minor version or the next one; anything else is an unsupported path.

    A target older than the running version is refused unless ``allow_downgrade``: an older
    kube-apiserver may not read what a newer one stored. Builds of the same release
    (``v1.20.2`` and ``v1.20.2-kp.1``) are the same version here, in either direction.
    """
    if (target.major, target.minor, target.patch) < (source.major, source.minor, source.patch):
        if not allow_downgrade:
            raise PreflightError(
                f"{target} is older than the running {source}: refusing to downgrade "
                "(pass --allow-downgrade if that is what you want)"
            )
        if source.major == target.major and source.minor - target.minor in (0, 1):
            return
    if source.major != target.major or target.minor not in (source.minor, source.minor + 1):
        raise PreflightError(
            f"unsupported upgrade path: {source} -> {target} "
            f"(supported: within {source.major}.{source.minor} or to {source.major}.{source.minor + 1})"
        )


def split_image(image: str) -> tuple[str, str | None]:
    """``(repository, tag)`` of an image reference; a registry port is not a tag, a digest is dropped."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, None


def retag(image: str, version: Version) -> str:
    """``image`` with its tag set to ``version``; the repository (registry host and path) is kept."""
    repository, _ = split_image(image)
    return f"{repository}:{version.tag}"


def image_version(image: str) -> Version:
    """The Kubernetes version an image's tag names (raises PreflightError when it names none)."""
    _, tag = split_image(image)
    if tag is None:
        raise PreflightError(f"image {image!r} has no tag to read the version from: pass --from")
    return Version.parse(tag, what=f"version in the tag of image {image}")


def image_patch(document: Mapping[str, Any], path: Sequence[str], value: str) -> list[dict[str, Any]]:
    """A JSON patch setting ``path`` to ``value``, creating the missing parent mappings.

    The guide warns that a plain ``replace`` fails when the config has no ``cluster.apiServer.image``
    key; ``add`` on the first missing level (with the rest nested in its value) works either way.
    """
    node: Any = document
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping) or key not in node or node[key] is None:
            value_tree: Any = value
            for inner in reversed(path[depth + 1 :]):
                value_tree = {inner: value_tree}
            return [{"op": "add", "path": "/" + "/".join(path[: depth + 1]), "value": value_tree}]
        node = node[key]
    return [{"op": "replace", "path": "/" + "/".join(path), "value": value}]


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
    """A mirror pod: its ``kubeplane.dev/config-version`` annotation, readiness and images."""

    name: str
    config_version: str | None
    ready: bool
    images: tuple[str, ...] = ()


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


def _select_control_plane(nodes: Sequence[ClusterNode], via: Sequence[str]) -> tuple[ClusterNode, ...]:
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


async def _check_reachable(node_api: NodeAPI, nodes: Sequence[ClusterNode]) -> None:
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


async def _kube_read(call: Awaitable[T], *, what: str) -> T:
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
    nodes = await _kube_read(kube.nodes(), what="list Kubernetes Nodes")
    control_plane = _select_control_plane(nodes, options.via)
    cp_addresses = {node.address for node in control_plane}
    others = tuple(node for node in nodes if node.address not in cp_addresses)
    await _check_reachable(node_api, (*control_plane, *others))
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
    daemonset = await _kube_read(
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


# --- execution ---------------------------------------------------------------------------------

Sleep = Callable[[float], Awaitable[None]]


class Upgrader:
    """Runs an upgrade plan's steps, each deciding from live state (see the module docstring)."""

    def __init__(
        self,
        *,
        observed: Observed,
        node_api: NodeAPI,
        kube: KubeAPI,
        rotation: Rotation,
        progress: plan_module.Progress,
        timing: Timing = Timing(),
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.observed = observed
        self.node_api = node_api
        self.kube = kube
        self.rotation = rotation
        self.progress = progress
        self.timing = timing
        self._sleep = sleep
        self._clock = clock
        known = (*observed.control_plane, *observed.pull_nodes, *(node for node, _ in observed.kubelets))
        self._nodes = {node.address: node for node in known}

    async def run(self, plan: plan_module.Plan, *, resume: str) -> list[plan_module.StepResult]:
        """Execute ``plan``; raises :class:`~kubeplane.ops.plan.StepFailed` naming the step and ``resume``.

        A failed pre-pull raises its :class:`PreflightError` instead: nothing was changed yet.
        """
        try:
            return await plan_module.execute(
                plan, self.run_step, progress=self.progress, resume=resume, clock=self._clock
            )
        except plan_module.StepFailed as failed:
            if isinstance(failed.cause, PreflightError):
                raise failed.cause from failed
            raise

    async def run_step(self, step: plan_module.Step) -> plan_module.Outcome:
        """One step, by kind."""
        handlers = {
            KIND_PULL: self._pull,
            KIND_STATIC_POD: self._static_pod,
            KIND_DAEMONSET: self._proxy,
            KIND_KUBELET: self._kubelet,
            KIND_MANIFESTS: self._manifests,
        }
        return await handlers[step.kind](step)

    def _steer(self, component: str) -> bool:
        """Whether the step takes its node out of the rotation: API servers, when others can serve."""
        return component == APISERVER and len(self.observed.control_plane) > 1

    # -- waiting --

    async def _wait(
        self, check: Callable[[], Awaitable[str | None]], *, timeout: float, describe: str
    ) -> None:
        """Poll ``check`` (None: done; text: why not yet) until done; retryable API errors are retried."""
        deadline = self._clock() + timeout
        self.progress.info(f"waiting for {describe}")
        while True:
            try:
                reason = await check()
            except Exception as exc:
                if not kube_client.is_retryable(exc):
                    raise
                reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            if reason is None:
                return
            self.progress.retrying(reason)
            if self._clock() >= deadline:
                raise WaitTimeout(f"timed out after {timeout:g}s waiting for {describe}: {reason}")
            await self._sleep(self.timing.interval)

    async def _wait_pod(self, node: ClusterNode, component: str, expected: int) -> None:
        async def check() -> str | None:
            pod = await self.kube.mirror_pod(node_name=node.name, component=component)
            if pod is None:
                return f"no pod labelled k8s-app={component} on node {node.name} yet"
            if pod.config_version != str(expected):
                return f'config version mismatch: got "{pod.config_version}", expected "{expected}"'
            if not pod.ready:
                return f"pod {pod.name} on node {node.name} is not Ready yet"
            return None

        await self._wait(
            check,
            timeout=self.timing.pod_timeout,
            describe=f"pod {component} on node {node.name} to run config version {expected} and be Ready",
        )

    async def _wait_config(self, node: ClusterNode, component: str, image: str, *, older_than: int) -> int:
        found: list[int] = []

        async def check() -> str | None:
            config = await self.node_api.component_config(node.address, component)
            if config.image != image or config.version <= older_than:
                return (
                    f"kcpc/{component} on {node.address} is at version {config.version} with {config.image}"
                )
            found.append(config.version)
            return None

        await self._wait(
            check, timeout=self.timing.config_timeout, describe=f"kcpc/{component} to carry {image}"
        )
        return found[-1]

    # -- config patches --

    async def _set_image(self, node: str, key: str, image: str, *, mode: str = "immediate") -> bool:
        """Set a machine config image on ``node``; False when it was already ``image``."""
        document = machine_config.load(await self.node_api.machine_config(node))
        path = IMAGE_PATHS[key]
        current: Any = document.to_dict()
        for segment in path:
            current = current.get(segment) if isinstance(current, Mapping) else None
        if current == image:
            return False
        patched = machine_config.apply_json_patch(document, image_patch(document.to_dict(), path, image))
        await self.node_api.apply_config(node, patched.to_yaml(), mode=mode)
        self.progress.info(f"patched /{'/'.join(path)} = {image} on node {node} (mode {mode})")
        return True

    # -- steps --

    async def _pull(self, step: plan_module.Step) -> plan_module.Outcome:
        fetched = []
        for image in step.target.split(","):
            try:
                if await self.node_api.pull_image(step.node, image):
                    fetched.append(image)
            except Exception as exc:
                # Pre-pulls come before the first change, so this failure is still a preflight one.
                raise PreflightError(
                    f"nothing was changed: image {image} cannot be pulled on node {step.node}: {exc}\n"
                    f"check that {self.observed.target} is a version whose images the node's registry "
                    "(or its mirrors) holds, then re-run"
                ) from exc
        if fetched:
            self.progress.info(f"pulled {', '.join(fetched)} on node {step.node}")
        return plan_module.CHANGED if fetched else plan_module.SKIPPED

    async def _static_pod(self, step: plan_module.Step) -> plan_module.Outcome:
        node = self._nodes[step.node]
        component = step.component
        current = await self.node_api.component_config(node.address, component)
        image = retag(current.image, self.observed.target)
        if current.image == image:
            outcome, expected = plan_module.SKIPPED, current.version
            self.progress.info(
                f"{component} on node {node.address} already runs {image} (config version {expected})"
            )
        else:
            outcome = plan_module.CHANGED
        try:
            if outcome is plan_module.CHANGED:
                await self._drain(node, component)
                await self._set_image(node.address, component, image)
                expected = await self._wait_config(node, component, image, older_than=current.version)
            await self._wait_pod(node, component, expected)
        except BaseException:
            if self._steer(component):
                # A failed step never leaves its node out of the rotation; the step's own
                # error is the one reported.
                with contextlib.suppress(Exception):
                    await self.rotation.restore(node)
            raise
        if self._steer(component):
            # Also when skipping: a run killed between drain and restore left the node drained.
            await self.rotation.restore(node)
        return outcome

    async def _drain(self, node: ClusterNode, component: str) -> None:
        """Take ``node`` out of the rotation, unless no other node would serve the API."""
        if not self._steer(component):
            return
        others = await self.rotation.serving() - {node.address}
        if not others:
            self.progress.info(
                f"keeping node {node.name} in the load balancer rotation: no other API server is serving"
            )
            return
        self.progress.info(f"taking node {node.name} out of the load balancer rotation")
        await self.rotation.drain(node)

    async def _proxy(self, step: plan_module.Step) -> plan_module.Outcome:
        changed = False
        daemonset = await self.kube.daemonset(PROXY_NAMESPACE, PROXY)
        image = retag(daemonset.image, self.observed.target) if daemonset else None
        if daemonset is None:
            self.progress.info(f"DaemonSet {PROXY_NAMESPACE}/{PROXY} does not exist: nothing to roll out")
        elif daemonset.image != image:
            assert image is not None
            await self.kube.set_daemonset_image(PROXY_NAMESPACE, PROXY, container=PROXY, image=image)
            self.progress.info(f"set DaemonSet {PROXY_NAMESPACE}/{PROXY} image to {image}")
            changed = True
        for node in self.observed.control_plane:
            document = machine_config.load(await self.node_api.machine_config(node.address))
            configured = retag(document.model.cluster.proxy_image, self.observed.target)
            changed = await self._set_image(node.address, PROXY, configured) or changed
        if daemonset is not None and image is not None:

            async def check() -> str | None:
                state = await self.kube.daemonset(PROXY_NAMESPACE, PROXY)
                if state is None:
                    return f"DaemonSet {PROXY_NAMESPACE}/{PROXY} disappeared"
                if state.complete(image):
                    return None
                return (
                    f"rollout of {PROXY}: {state.updated} updated, {state.available} available "
                    f"of {state.desired} (image {state.image})"
                )

            await self._wait(check, timeout=self.timing.rollout_timeout, describe=f"the {PROXY} rollout")
        return plan_module.CHANGED if changed else plan_module.SKIPPED

    async def _kubelet(self, step: plan_module.Step) -> plan_module.Outcome:
        node = self._nodes[step.node]
        document = machine_config.load(await self.node_api.machine_config(node.address))
        image = retag(document.model.machine.kubelet_image, self.observed.target)
        # Not live-reconfigurable, but the change concerns the kubelet alone: in the default mode
        # the node restarts only its kubelet (etcd and the static pods' containers keep running).
        changed = await self._set_image(node.address, KUBELET, image, mode="reboot")

        async def check() -> str | None:
            state = await self.kube.kubelet(node.name)
            if state is None:
                return f"Node {node.name} is not registered"
            if state.version != self.observed.target.tag or not state.ready:
                return f"kubelet on {node.name} reports {state.version}, ready={state.ready}"
            return None

        await self._wait(
            check,
            timeout=self.timing.rollout_timeout,
            describe=f"kubelet {self.observed.target} on {node.name}",
        )
        if node.control_plane:
            # The next node's kubelet restarts only once this one's control plane serves again.
            await self._wait_etcd(node)
            for component in COMPONENTS:
                config = await self.node_api.component_config(node.address, component)
                await self._wait_pod(node, component, config.version)
        return plan_module.CHANGED if changed else plan_module.SKIPPED

    async def _wait_etcd(self, node: ClusterNode) -> None:
        async def check() -> str | None:
            if await self.node_api.service_healthy(node.address, ETCD):
                return None
            return f"etcd on {node.name} is not healthy yet"

        await self._wait(
            check, timeout=self.timing.pod_timeout, describe=f"etcd on {node.name} to be healthy"
        )

    async def _manifests(self, step: plan_module.Step) -> plan_module.Outcome:
        objects = await self.node_api.manifests(step.node)
        if not objects:
            raise OpsError(
                f"node {step.node} has no bootstrap manifests to apply (controlplane/Manifests is empty)"
            )
        await self.kube.apply_objects(objects)
        self.progress.info(f"applied {len(objects)} bootstrap manifest objects")
        return plan_module.CHANGED
