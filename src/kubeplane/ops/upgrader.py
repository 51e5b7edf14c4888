"""The executor of ``upgrade-k8s``: runs the plan :func:`kubeplane.ops.upgrade.prepare` built.

Each step re-reads live state and decides whether it is already done (see
:mod:`kubeplane.ops.upgrade` for the procedure); every wait polls through
:meth:`kubeplane.retry.Wait.poll_async`, retrying the typed errors of :data:`RETRYABLE`
(:func:`wait_until`). :class:`RollingExecutor` and :func:`out_of_rotation` are what this
executor shares with ``certs renew``'s (:class:`kubeplane.ops.renew.Renewer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from kubeplane import config as machine_config
from kubeplane import plan as plan_module
from kubeplane import retry
from kubeplane.clients import kube as kube_client
from kubeplane.ops.errors import OpsError, PreflightError, WaitTimeout
from kubeplane.ops.upgrade import (
    APISERVER,
    COMPONENTS,
    ETCD,
    IMAGE_PATHS,
    KIND_DAEMONSET,
    KIND_KUBELET,
    KIND_MANIFESTS,
    KIND_PULL,
    KIND_STATIC_POD,
    KUBELET,
    PROXY,
    PROXY_NAMESPACE,
    ClusterNode,
    KubeAPI,
    NodeAPI,
    Observed,
    PodState,
    Rotation,
    Timing,
)
from kubeplane.ops.versions import image_patch, retag

#: What the waits retry: the Kubernetes API or etcd could not answer now, or the network failed.
RETRYABLE: tuple[type[BaseException], ...] = (*kube_client.RETRYABLE, ConnectionError, TimeoutError, EOFError)

Sleep = Callable[[float], Awaitable[None]]
DEFAULT_TIMING = Timing()


async def wait_until(
    check: Callable[[], Awaitable[str | None]],
    *,
    timeout: float,
    interval: float,
    describe: str,
    progress: plan_module.Progress,
    sleep: Sleep = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Poll ``check`` (None: done; text: why not yet) until done; errors of :data:`RETRYABLE` are
    retried, and :class:`~kubeplane.ops.errors.WaitTimeout` names ``describe`` and the last reason."""

    async def attempt() -> bool:
        reason = await check()
        if reason is not None:
            raise retry.NotYet(reason)
        return True

    progress.info(f"waiting for {describe}")
    await retry.Wait(
        what=describe,
        timeout=timeout,
        backoff=retry.fixed(interval),
        retry_on=RETRYABLE,
        progress=lambda failed: progress.retrying(failed.reason),
        error=WaitTimeout,
        clock=clock,
    ).poll_async(attempt, sleep=sleep)


async def leave_rotation(rotation: Rotation, node: ClusterNode, progress: plan_module.Progress) -> None:
    """Take ``node`` out of the load balancer rotation, unless no other node would serve the API."""
    others = await rotation.serving() - {node.address}
    if not others:
        progress.info(
            f"keeping node {node.name} in the load balancer rotation: no other API server is serving"
        )
        return
    progress.info(f"taking node {node.name} out of the load balancer rotation")
    await rotation.drain(node)


@contextlib.asynccontextmanager
async def out_of_rotation(
    rotation: Rotation, node: ClusterNode, progress: plan_module.Progress, *, steer: bool, drain: bool
) -> AsyncIterator[None]:
    """Around a step that restarts ``node``'s API server: with ``steer`` (other API servers exist),
    take the node out of the rotation first when ``drain`` (the step changes something) and put it
    back afterwards: also when the step did not drain it (a run killed between drain and restore
    left it out) and when the step fails (its own error is the one raised)."""
    if steer and drain:
        await leave_rotation(rotation, node, progress)
    try:
        yield
    except BaseException:
        if steer:
            with contextlib.suppress(Exception):
                await rotation.restore(node)
        raise
    if steer:
        await rotation.restore(node)


class MirrorPods(Protocol):
    """What every rolling operation's Kubernetes API offers: a node's control plane pods."""

    async def mirror_pod(self, *, node_name: str, component: str) -> PodState | None: ...


ObservedT = TypeVar("ObservedT")
NodeAPIT = TypeVar("NodeAPIT")
KubeAPIT = TypeVar("KubeAPIT", bound=MirrorPods)


class RollingExecutor(Generic[ObservedT, NodeAPIT, KubeAPIT]):
    """What the executors of the rolling operations share: the cluster as observed before the
    plan, its interfaces (node API, Kubernetes API, load balancer rotation), the progress view,
    the timing and the polling of :func:`wait_until` (a fake ``sleep`` and ``clock`` in tests)."""

    def __init__(
        self,
        *,
        observed: ObservedT,
        node_api: NodeAPIT,
        kube: KubeAPIT,
        rotation: Rotation,
        progress: plan_module.Progress,
        timing: Timing = DEFAULT_TIMING,
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
        #: The nodes the steps name, by address.
        self._nodes = {node.address: node for node in self._known_nodes()}

    def _known_nodes(self) -> Iterable[ClusterNode]:
        """The nodes the plan's steps may name (from ``observed``)."""
        raise NotImplementedError

    async def _wait_pods_on_secrets(self, node: ClusterNode, expected: int) -> None:
        """Wait for every control plane pod of ``node`` to run secrets version ``expected`` or
        later (the pods' ``kubeplane.dev/secrets-version``) and be Ready."""
        for component in COMPONENTS:

            async def check(component: str = component) -> str | None:
                pod = await self.kube.mirror_pod(node_name=node.name, component=component)
                if pod is None:
                    return f"no pod labelled k8s-app={component} on node {node.name} yet"
                if not _at_least(pod.secrets_version, expected):
                    return f'secrets version mismatch: got "{pod.secrets_version}", expected "{expected}"'
                if not pod.ready:
                    return f"pod {pod.name} on node {node.name} is not Ready yet"
                return None

            await self._wait(
                check,
                timeout=self.timing.pod_timeout,
                describe=(
                    f"pod {component} on node {node.name} to run secrets version {expected} and be Ready"
                ),
            )

    async def _wait(
        self, check: Callable[[], Awaitable[str | None]], *, timeout: float, describe: str
    ) -> None:
        await wait_until(
            check,
            timeout=timeout,
            interval=self.timing.interval,
            describe=describe,
            progress=self.progress,
            sleep=self._sleep,
            clock=self._clock,
        )


class Upgrader(RollingExecutor[Observed, NodeAPI, KubeAPI]):
    """Runs an upgrade plan's steps, each deciding from live state (see the module docstring)."""

    def _known_nodes(self) -> Iterable[ClusterNode]:
        observed = self.observed
        return (*observed.control_plane, *observed.pull_nodes, *(node for node, _ in observed.kubelets))

    async def run(self, plan: plan_module.Plan, *, resume: str) -> list[plan_module.StepResult]:
        """Execute ``plan``; raises :class:`~kubeplane.plan.StepFailed` naming the step and ``resume``.

        A failed pre-pull raises its :class:`PreflightError` instead: nothing was changed yet.
        """
        return await plan_module.execute(
            plan,
            self.run_step,
            progress=self.progress,
            resume=resume,
            passthrough=(PreflightError,),
            clock=self._clock,
        )

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
        async with out_of_rotation(
            self.rotation,
            node,
            self.progress,
            steer=self._steer(component),
            drain=outcome is plan_module.CHANGED,
        ):
            if outcome is plan_module.CHANGED:
                await self._set_image(node.address, component, image)
                expected = await self._wait_config(node, component, image, older_than=current.version)
            await self._wait_pod(node, component, expected)
        return outcome

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


def _at_least(version: str | None, expected: int) -> bool:
    """Whether a pod's secrets version (a label value, maybe absent or not a number) is at least
    ``expected``."""
    try:
        return version is not None and int(version) >= expected
    except ValueError:
        return False
