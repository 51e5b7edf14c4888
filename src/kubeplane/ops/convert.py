"""``convert-k8s``: a self-hosted control plane (DaemonSets + pod-checkpointer) → static pods.

Follows REFERENCE.md §4 with the original's messages, as a :class:`kubeplane.plan.Plan` that
``--dry-run`` prints and the one executor (:func:`kubeplane.plan.execute`) runs:

1. (before the plan) discover control plane nodes (Nodes labelled master/control-plane, first
   InternalIP) and read the first node's BootstrapStatus; when self-hosted, refuse nodes running
   with ``persist: false`` (a patched config would not survive a reboot);
2. ``patch machine config`` on each control plane node (self-hosted only): the service account
   key from Secret ``kube-system/kube-controller-manager``, an aggregator CA (**better:** one a
   node's config already has, from an earlier step or interrupted run, is reused; a new one is
   minted only when no node has one) and the DaemonSet images, applied ``--immediate``; skipped
   when the node's config already carries them;
3. ``disable pod-checkpointer`` (self-hosted only): wait until every control plane node has the
   three StaticPods and at least one Manifest; prompt ``confirm disabling pod-checkpointer ...``
   (``no`` → "aborted", nothing else changed); delete DaemonSet ``pod-checkpointer`` and wait
   until no pod checkpoint is active (``retrying error: found N active pod checkpoints: [...]``);
   all-Pending ones are force-deleted;
4. ``remove etcd key 'initialized'`` (self-hosted only): prompt ``confirm applying static pod
   definitions and manifests``, delete the kube-controller-manager and kube-scheduler
   DaemonSets and their pods (not behind the load balancer, they may go at once; gone before
   the static pods are released, their static pods start on free ports instead of
   crash-looping), then remove the key; skipped when the node no longer reports a self-hosted
   control plane, no prompt when those DaemonSets are already gone (a run told yes deleted them);
5. ``hand over`` kube-apiserver node by node, so the API never goes away: wait for the static
   (mirror) pods of kube-controller-manager and kube-scheduler and for the node's agent to have
   rendered its kube-apiserver static pod (the agent writes its file only once the old pod has
   freed the port), delete the DaemonSet leaving its pods (``Orphan``), then for each control
   plane node in turn take it out of the load balancer's rotation (when another API server
   serves; :func:`kubeplane.ops.upgrader.out_of_rotation`, as ``upgrade-k8s`` does), delete its
   old pod gracefully (the API server finishes what it serves), let its static pod start
   (restarting the kubelet only if the pod sits in crash-loop back-off), wait until it is Ready
   and put the node back; once no old pod is left, delete the DaemonSet again with
   ``Background`` (:meth:`Converter.finish_orphaning`);
6. ``replace`` kube-controller-manager and kube-scheduler: their DaemonSets and pods (if a run
   that did not delete them first is resumed) deleted, not left to the garbage collector (see
   :meth:`Converter.remove_daemonset_pods`); wait for the static pods Ready.

Re-runnable at every point (a SIGKILL included): every step re-reads the live state, and a re-run
plans again from it, so once the key is removed only the replacements are left, and they tolerate
DaemonSets already gone. Every wait reports what it waits for; a failed step names itself, its
node and the command to resume. Retryable errors (API timeouts, 5xx, connection refused/reset,
EOF, a node that cannot answer now) are retried inside the waits
(:meth:`kubeplane.retry.Wait.poll_async`), chosen by type: :data:`RETRYABLE`.

The ``Env`` protocol is everything the conversion touches (node API, Kubernetes API, etcd); the CLI
implements it, tests fake it. ``Timing`` records how long each wait took (for the benchmark).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from kubeplane import config as machine_config
from kubeplane import pki, retry
from kubeplane import plan as plan_module
from kubeplane.clients import kube as kube_client
from kubeplane.ops.errors import NodeUnavailable, OpsError, PreflightError, WaitTimeout
from kubeplane.ops.upgrade import ClusterNode, NoRotation, Rotation
from kubeplane.ops.upgrader import out_of_rotation

COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
CHECKPOINTER = "pod-checkpointer"
CHECKPOINT_OF = "checkpointer.alpha.coreos.com/checkpoint-of"
SECRETS_VERSION = "kubeplane.dev/secrets-version"
IMAGE_PATHS = {
    "kube-apiserver": ("cluster", "apiServer", "image"),
    "kube-controller-manager": ("cluster", "controllerManager", "image"),
    "kube-scheduler": ("cluster", "scheduler", "image"),
}
RESUME = "re-run `kubeplane convert-k8s` to resume: every step is safe to repeat"
KIND_PATCH = "patch"
KIND_DISABLE = "disable"
KIND_REMOVE = "remove"
KIND_REPLACE = "replace"
KIND_HANDOVER = "hand over"
#: Replaced node by node behind the load balancer; the others go at once.
APISERVER = "kube-apiserver"
#: Deleted right before the static pods are released (the ``initialized`` key removed).
RELEASED_FIRST = ("kube-controller-manager", "kube-scheduler")
INITIALIZED_KEY = "etcd key 'initialized'"


class ConvertError(OpsError):
    """The conversion stopped; the message says where and how to resume."""


class Aborted(OpsError):
    """The user answered no: the self-hosted control plane keeps running."""


@dataclasses.dataclass(frozen=True)
class Pod:
    """What the conversion needs to know of a kube-system pod."""

    name: str
    node_name: str = ""
    phase: str = ""
    ready: bool = False
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    owner_kinds: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Container:
    """A kube-system container on a node: its pod's name, its own name, running or not."""

    pod: str
    name: str
    running: bool


class Env(Protocol):
    """Node API, Kubernetes API and etcd as the conversion uses them."""

    async def master_nodes(self) -> list[tuple[str, str]]:
        """(InternalIP, node name) of every control plane Node."""

    async def self_hosted(self, node: str) -> bool:
        """The node's BootstrapStatus."""

    async def secret_value(self, namespace: str, name: str, key: str) -> bytes | None:
        """One key of a Secret (decoded), None when the Secret or key is missing."""

    async def daemonset_image(self, name: str) -> str | None:
        """``spec.template.spec.containers[0].image`` of a kube-system DaemonSet, None if absent."""

    async def machine_config(self, node: str) -> str:
        """The node's current machine config (YAML)."""

    async def apply_config(self, node: str, data: str) -> None:
        """Apply ``data`` to ``node`` in ``immediate`` mode."""

    async def resource_ids(self, node: str, type_name: str) -> list[str]:
        """Ids of the node's resources of a type (``staticpods``, ``manifests``)."""

    async def delete_daemonset(self, name: str, *, orphan: bool = False) -> bool:
        """Delete a kube-system DaemonSet, its pods with it (``Background``) or, with ``orphan``,
        leaving them running; False when it was already gone. A DaemonSet being deleted with
        ``orphan`` is deleted at once by a call without it (nothing is left to orphan)."""

    async def system_pods(self) -> list[Pod]:
        """Every kube-system pod."""

    async def force_delete_pod(self, name: str) -> None:
        """Delete a kube-system pod with grace period 0."""

    async def delete_pod(self, name: str, *, grace_period: int) -> None:
        """Delete a kube-system pod gracefully: its containers get SIGTERM, and SIGKILL only after
        ``grace_period`` seconds."""

    async def remove_initialized_key(self) -> None:
        """Delete the etcd ``initialized`` key (needs an etcd leader)."""

    async def containers(self, node: str) -> list[Container]:
        """The node's kube-system containers as its container runtime sees them (no API server needed)."""

    async def restart_kubelet(self, node: str) -> None:
        """Restart the node's kubelet service (its containers keep running)."""


@dataclasses.dataclass
class Timing:
    """Seconds spent in each wait, in order (for ``bench/bench_convert.py``)."""

    waits: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.waits[name] = self.waits.get(name, 0.0) + seconds


@dataclasses.dataclass(frozen=True)
class Options:
    force: bool = False
    #: How often and how long the waits poll (the original: 20 s / 7 min for checkpoints).
    interval: float = 2.0
    checkpoint_interval: float = 5.0
    static_pod_timeout: float = 180.0
    checkpoint_timeout: float = 420.0
    #: Above the kubelet's 5 min crash back-off cap: a static pod that crash-looped on the ports
    #: of its DaemonSet pod restarts only when its back-off ends.
    component_timeout: float = 420.0
    #: How long a force-deleted DaemonSet container may keep running (holding its host ports).
    port_release_timeout: float = 30.0
    #: The grace period an old kube-apiserver pod is deleted with. Out of the rotation, it gets no
    #: new connection, and on SIGTERM it answers what it was serving (telling kept-alive clients to
    #: reconnect elsewhere); what is left then is its watches, on which it would sit out the
    #: pod's full 30 s before the kubelet kills it. Their clients re-establish them anyway.
    apiserver_grace_period: int = 5
    #: How long a gracefully deleted kube-apiserver pod may take to stop (grace period, then kill).
    graceful_stop_timeout: float = 60.0


Confirm = Callable[[str], bool]
Echo = Callable[[str], None]


#: What the waits retry, by type: the Kubernetes API or etcd could not answer now (the client
#: boundary raises these, :class:`kubeplane.clients.kube.KubeClient`), a node API call could not reach its
#: node (:class:`~kubeplane.ops.errors.NodeUnavailable`), or the network under them failed.
RETRYABLE: tuple[type[BaseException], ...] = (
    *kube_client.RETRYABLE,
    NodeUnavailable,
    ConnectionError,
    TimeoutError,
    EOFError,
)


def retryable(exc: BaseException) -> bool:
    """API timeouts, 5xx, connection refused/reset, EOF: worth another try (:data:`RETRYABLE`)."""
    return isinstance(exc, RETRYABLE)


async def wait_until(
    what: str,
    attempt: Callable[[], Awaitable[Any]],
    *,
    timeout: float,
    interval: float,
    progress: plan_module.Progress,
    timing: Timing,
    key: str,
) -> Any:
    """Report ``waiting for <what>``, then poll ``attempt`` until truthy; retryable errors and
    falsy results are retried (an ``str`` result is reported as the reason it is not done yet)."""

    async def checked() -> Any:
        value = await attempt()
        if isinstance(value, str):
            raise retry.NotYet(value)
        return value

    def report(failed: retry.Attempt) -> None:
        if failed.not_yet:
            progress.retrying(failed.reason)

    progress.info(f"waiting for {what}")
    started = time.monotonic()
    try:
        return await retry.Wait(
            what=what,
            timeout=timeout,
            backoff=retry.fixed(interval),
            retry_on=RETRYABLE,
            progress=report,
            error=WaitTimeout,
        ).poll_async(checked)
    finally:
        timing.add(key, time.monotonic() - started)


class Converter:
    """Plans and runs the steps of the module docstring against ``env``.

    ``echo`` prints what the run says outside its steps (the nodes found, the plan, the end);
    ``progress`` gets the steps' events.
    """

    def __init__(
        self,
        env: Env,
        *,
        options: Options,
        echo: Echo,
        confirm: Confirm,
        progress: plan_module.Progress | None = None,
        timing: Timing | None = None,
        rotation: Rotation | None = None,
    ) -> None:
        self.env = env
        #: The load balancer in front of the API servers, steered during the kube-apiserver hand-over.
        self.rotation: Rotation = rotation if rotation is not None else NoRotation()
        self.options = options
        self.echo = echo
        self.confirm = confirm
        self.progress = progress if progress is not None else plan_module.RecordingProgress()
        self.timing = timing or Timing()
        self._nodes: list[tuple[str, str]] = []

    async def masters(self) -> list[tuple[str, str]]:
        """(address, name) of every control plane node; PreflightError when there is none."""
        nodes = await self.env.master_nodes()
        if not nodes:
            raise PreflightError(
                "no control plane nodes found (Nodes labelled node-role.kubernetes.io/master or "
                "node-role.kubernetes.io/control-plane); check `kubectl get nodes --show-labels`"
            )
        return nodes

    async def plan(self) -> plan_module.Plan:
        """What :meth:`run` does, seen through read calls only (``--dry-run`` prints it)."""
        nodes = await self.masters()
        self._nodes = nodes
        addresses = [address for address, _ in nodes]
        self_hosted = await self.env.self_hosted(addresses[0])
        present = {}
        for name in (CHECKPOINTER, *COMPONENTS):
            present[name] = "DaemonSet" if await self.env.daemonset_image(name) else "no DaemonSet"
        Step = plan_module.Step
        steps: list[plan_module.Step] = []
        if self_hosted:
            rendered = "service account key, aggregator CA, images; static pods rendered"
            steps += [Step(KIND_PATCH, "machine config", ip, "self-hosted", rendered) for ip in addresses]
            steps.append(Step(KIND_DISABLE, CHECKPOINTER, "", present[CHECKPOINTER], "no checkpoints"))
            steps.append(Step(KIND_REMOVE, INITIALIZED_KEY, "", "present", "absent"))
        steps += [
            Step(KIND_HANDOVER, APISERVER, address, f"{present[APISERVER]} pod", "static pod")
            for address in addresses
        ]
        target = f"static pods on {len(nodes)} nodes"
        steps += [
            Step(KIND_REPLACE, component, "", present[component], target)
            for component in COMPONENTS
            if component != APISERVER
        ]
        notes = ["control plane nodes: " + ", ".join(f"{name} ({address})" for address, name in nodes)]
        if self_hosted and not self.options.force:
            notes.append("asks before disabling pod-checkpointer and before applying the static pods")
        title = f"convert-k8s (self-hosted: {str(self_hosted).lower()})"
        return plan_module.Plan(title=title, steps=tuple(steps), notes=tuple(notes))

    async def run(self, *, resume: str = "kubeplane convert-k8s") -> list[plan_module.StepResult]:
        """Plan from the live state, then execute; a failed step raises
        :class:`~kubeplane.plan.StepFailed` naming ``resume``. A "no" at a prompt raises
        :class:`Aborted` and a failed check before any change :class:`PreflightError`, as they are."""
        plan = await self.plan()
        addresses = [address for address, _ in self._nodes]
        self.echo("discovered master nodes [" + " ".join(f'"{a}"' for a in addresses) + "]")
        self_hosted = any(step.kind == KIND_PATCH for step in plan.steps)
        self.echo(f"current self-hosted status: {str(self_hosted).lower()}")
        if self_hosted:
            await self.check_persist(addresses)
        self.echo(plan.render())
        results = await plan_module.execute(
            plan, self.run_step, progress=self.progress, resume=resume, passthrough=(Aborted, PreflightError)
        )
        self.echo("conversion process completed successfully")
        return results

    async def run_step(self, step: plan_module.Step) -> plan_module.Outcome:
        """One step of :meth:`plan`, by kind; each re-reads the live state first."""
        if step.kind == KIND_PATCH:
            return await self.patch_config(step.node)
        if step.kind == KIND_DISABLE:
            return await self.disable_checkpointer()
        if step.kind == KIND_REMOVE:
            return await self.remove_initialized_key()
        if step.kind == KIND_HANDOVER:
            return await self.hand_over(step.node)
        return await self.replace(step.component)

    def ask(self, prompt: str) -> None:
        if not self.options.force and not self.confirm(f"{prompt} [yes/no]: "):
            raise Aborted("aborted")

    # -- step 2 --

    async def check_persist(self, nodes: Sequence[str]) -> None:
        """Refuse before any change when a node runs with ``persist: false``."""
        for node in nodes:
            if machine_config.load(await self.env.machine_config(node)).model.persist is False:
                raise PreflightError(
                    f"node {node} runs with persist: false: a patched config would be lost on "
                    "reboot; enable persist (or convert by hand, see docs/convert.md)"
                )

    async def patch_config(self, node: str) -> plan_module.Outcome:
        """Patch ``node``'s config with what the static pods need; skipped when it already has it."""
        self.progress.info("gathering control plane configuration")
        documents = {
            address: machine_config.load(await self.env.machine_config(address)) for address, _ in self._nodes
        }
        key = await self.env.secret_value("kube-system", "kube-controller-manager", "service-account.key")
        if not key:
            raise ConvertError(
                "Secret kube-system/kube-controller-manager has no service-account.key: the service account "
                "key cannot be recovered; patch /cluster/serviceAccount by hand (docs/convert.md)"
            )
        aggregator = next(
            (
                doc.model.cluster.aggregator_ca
                for doc in documents.values()
                if doc.model.cluster.aggregator_ca is not None and doc.model.cluster.aggregator_ca.key
            ),
            None,
        )
        if aggregator is not None:
            self.progress.info(
                "reusing the aggregator CA already patched into a control plane machine config"
            )
            aggregator_value = {"crt": aggregator.crt, "key": aggregator.key}
        else:
            self.progress.info(
                "aggregator CA key can't be recovered from bootkube-boostrapped control plane, "
                "generating new CA"
            )
            ca = pki.aggregator_ca()
            aggregator_value = {
                "crt": base64.b64encode(ca.cert).decode(),
                "key": base64.b64encode(ca.key).decode(),
            }
        document = documents[node]
        patch = [
            {
                "op": "add",
                "path": "/cluster/serviceAccount",
                "value": {"key": base64.b64encode(key).decode()},
            },
            {"op": "add", "path": "/cluster/aggregatorCA", "value": aggregator_value},
        ]
        tree = document.to_dict()
        for component, path in IMAGE_PATHS.items():
            image = await self.env.daemonset_image(component)
            if image:
                patch.extend(_set_path(tree, path, image))
        patched = machine_config.apply_json_patch(document, patch)
        if patched.to_dict() == tree:
            self.progress.info(f'master node "{node}" configuration is already patched')
            return plan_module.SKIPPED
        self.progress.info(f'patching master node "{node}" configuration')
        await self.env.apply_config(node, patched.to_yaml())
        return plan_module.CHANGED

    # -- step 3: the wait before the first prompt --

    async def wait_rendered(self, nodes: Sequence[str]) -> None:
        async def static_pods() -> bool | str:
            missing = []
            for node in nodes:
                ids = set(await self.env.resource_ids(node, "staticpods"))
                missing += [f"{node}/{c}" for c in COMPONENTS if c not in ids]
            return True if not missing else f"static pods missing: {missing}"

        async def manifests() -> bool | str:
            empty = [node for node in nodes if not await self.env.resource_ids(node, "manifests")]
            return True if not empty else f"no manifests yet on {empty}"

        for what, attempt in (
            ("static pod definitions to be generated", static_pods),
            ("manifests to be generated", manifests),
        ):
            await self._wait(
                what,
                attempt,
                timeout=self.options.static_pod_timeout,
                key="static pods rendered",
            )

    # -- step 3 (the rest) --

    async def disable_checkpointer(self) -> plan_module.Outcome:
        """Once every node rendered its static pods (and the user agreed), remove the checkpointer."""
        await self.wait_rendered([address for address, _ in self._nodes])
        self.progress.info(
            "kubeplane generated control plane static pod definitions and bootstrap manifests, please "
            "verify them with commands:\n"
            "    kubeplane -n <master node IP> get staticpods\n"
            "    kubeplane -n <master node IP> get manifests\n\n"
            "in order to remove self-hosted control plane, pod-checkpointer component needs to be "
            "disabled\nonce pod-checkpointer is disabled, the cluster shouldn't be rebooted until the "
            "entire conversion process is complete"
        )
        self.ask("confirm disabling pod-checkpointer to proceed with control plane update")
        self.progress.info("disabling pod-checkpointer")
        deleted = await self._delete_daemonset(CHECKPOINTER)

        async def checkpointer_gone() -> bool | str:
            left = [p.name for p in await self.env.system_pods() if _owned_by_daemonset(p, CHECKPOINTER)]
            return True if not left else f"pod-checkpointer pods still running: {left}"

        await self._wait(
            "pod-checkpointer pods to terminate",
            checkpointer_gone,
            timeout=self.options.component_timeout,
            key="checkpointer pods gone",
        )
        self.progress.info("checking for active pod checkpoints")

        async def no_checkpoints() -> bool | str:
            active = [p for p in await self.env.system_pods() if CHECKPOINT_OF in p.annotations]
            if not active:
                return True
            if all(p.phase == "Pending" for p in active):
                for pod in active:
                    await self.env.force_delete_pod(pod.name)
            names = sorted(p.name for p in active)
            return f"found {len(names)} active pod checkpoints: {names}"

        await self._wait(
            "pod checkpoints to be removed",
            no_checkpoints,
            timeout=self.options.checkpoint_timeout,
            interval=self.options.checkpoint_interval,
            key="checkpointer grace",
        )
        return plan_module.CHANGED if deleted else plan_module.SKIPPED

    # -- step 4 --

    async def remove_initialized_key(self) -> plan_module.Outcome:
        """Hand the control plane to the static pods (after the second prompt)."""
        if not await self.env.self_hosted(self._nodes[0][0]):
            self.progress.info("the control plane is no longer self-hosted: the key is already removed")
            return plan_module.SKIPPED
        present = [c for c in RELEASED_FIRST if await self.env.daemonset_image(c)]
        if present:
            self.ask("confirm applying static pod definitions and manifests")
        else:  # deleted by a run that was told yes and then stopped before the key went
            self.progress.info(
                "the kube-controller-manager and kube-scheduler DaemonSets are already gone: "
                "applying the static pods was confirmed"
            )
        # These two are not behind the load balancer: they go before the static pods are released,
        # so their static pods start on free ports instead of crash-looping on the DaemonSet pods'
        # (a kubelet restart out of that back-off costs each node seconds).
        for component in RELEASED_FIRST:
            if component in present:
                self.progress.info(f'deleting daemonset "{component}"')
                await self._retry(
                    functools.partial(self.env.delete_daemonset, component),
                    what=f'deleting daemonset "{component}"',
                )
            await self.remove_daemonset_pods(component)
        await asyncio.gather(
            *(
                self.wait_ports_free(component, address, name, timeout=self.options.port_release_timeout)
                for component in RELEASED_FIRST
                for address, name in self._nodes
            )
        )
        self.progress.info("removing self-hosted initialized key")
        await self._retry(self.env.remove_initialized_key, what="removing the etcd initialized key")
        return plan_module.CHANGED

    # -- step 5 --

    async def hand_over(self, address: str) -> plan_module.Outcome:
        """Replace the kube-apiserver DaemonSet pod of the node at ``address`` by its static pod,
        with the node out of the load balancer's rotation while it has no API server.

        The DaemonSet goes first, its pods left running (``Orphan``), so each pod stops only when
        its node's turn comes; the pod is deleted with its grace period, so the API server
        finishes the requests it serves. A re-run finds a node already handed over (no old pod,
        its static pod Ready) and only makes sure it is back in the rotation.
        """
        name = dict(self._nodes)[address]
        node_names = [node for _, node in self._nodes]
        for later in COMPONENTS[1:]:
            await self.wait_static(later, node_names, ready=False)

        async def rendered() -> bool | str:
            # The node's agent has its static pod; it writes the kubelet's file once the old pod
            # has freed the port (an older agent writes it at once: then it crash-loops until then).
            ids = await self.env.resource_ids(address, "staticpods")
            return True if APISERVER in ids else f"{address}: no {APISERVER} static pod rendered yet"

        await self._wait(
            f'the {APISERVER} static pod to be rendered on node "{address}"',
            rendered,
            timeout=self.options.static_pod_timeout,
            key="static pods appearing",
        )
        if await self.env.daemonset_image(APISERVER):
            self.progress.info(
                f'deleting daemonset "{APISERVER}", leaving its pods to be replaced node by node'
            )
            await self._retry(
                functools.partial(self.env.delete_daemonset, APISERVER, orphan=True),
                what=f'deleting daemonset "{APISERVER}"',
            )
        pods = await self._retry(self.env.system_pods, what="listing the kube-system pods")
        old = sorted(p.name for p in pods if p.node_name == name and _is_daemonset_pod(p, APISERVER))
        done = not old and any(p.node_name == name and p.ready and _is_static(p, APISERVER) for p in pods)
        node = ClusterNode(name=name, address=address, control_plane=True)
        async with out_of_rotation(
            self.rotation, node, self.progress, steer=len(self._nodes) > 1, drain=not done
        ):
            if done:
                self.progress.info(f'node "{address}" already serves the API from its static pod')
            for pod in old:
                self.progress.info(f'deleting pod "{pod}" on node "{address}"')
                delete = functools.partial(
                    self.env.delete_pod, pod, grace_period=self.options.apiserver_grace_period
                )
                await self._retry(delete, what=f'deleting pod "{pod}"')
            if not done:
                await self.skip_crash_backoff(
                    APISERVER, address, name, timeout=self.options.graceful_stop_timeout
                )
                await self.wait_static(APISERVER, [name], ready=True)
        await self.finish_orphaning(APISERVER)
        return plan_module.SKIPPED if done else plan_module.CHANGED

    async def finish_orphaning(self, component: str) -> None:
        """Once no pod of ``component``'s DaemonSet is left anywhere, make sure the DaemonSet is
        gone. Deleted with ``Orphan``, it waits for the garbage collector to release its pods,
        and that collector runs in kube-controller-manager, restarted as a static pod just before
        and slow to start: deleting it again with ``Background`` propagation drops that wait (there
        is nothing left to orphan)."""
        pods = await self._retry(self.env.system_pods, what="listing the kube-system pods")
        if any(_is_daemonset_pod(p, component) for p in pods):
            return

        async def gone() -> bool | str:
            deleted = await self.env.delete_daemonset(component)
            return True if not deleted else f'daemonset "{component}" is still being deleted'

        await self._wait(
            f'daemonset "{component}" to be gone',
            gone,
            timeout=self.options.component_timeout,
            key="daemonset hand-over",
        )

    async def replace(self, component: str) -> plan_module.Outcome:
        """Hand ``component`` over from its DaemonSet to its static pods."""
        # Presence only: every DaemonSet pod holds its component's host ports (6443, 10257,
        # 10259), so a static pod can only be Ready between two crashes until its DaemonSet pod
        # goes, and each crash lengthens the kubelet's back-off, i.e. the API outage at hand-over.
        node_names = [name for _, name in self._nodes]
        for later in COMPONENTS[COMPONENTS.index(component) :]:
            await self.wait_static(later, node_names, ready=False)
        deleted = await self._delete_daemonset(component)
        await self.remove_daemonset_pods(component)
        # Every node at once: these components are not behind the load balancer, and each node's
        # wait and kubelet restart concern that node alone.
        await asyncio.gather(
            *(self.skip_crash_backoff(component, address, name) for address, name in self._nodes)
        )
        await self.wait_static(component, node_names, ready=True)
        return plan_module.CHANGED if deleted else plan_module.SKIPPED

    async def remove_daemonset_pods(self, component: str) -> None:
        """Delete the pods of a deleted DaemonSet and wait until they are gone.

        Left to the garbage collector they may outlive the conversion: the collector runs in
        kube-controller-manager, itself one of the pods being replaced, and every DaemonSet pod
        that stays holds its host ports, so the static pod that replaces it crash-loops.
        """

        async def gone() -> bool | str:
            left = [p for p in await self.env.system_pods() if _is_daemonset_pod(p, component)]
            for pod in left:
                await self.env.force_delete_pod(pod.name)
            return (
                True
                if not left
                else f"daemonset {component} pods still there: {sorted(p.name for p in left)}"
            )

        await self._wait(
            f'pods of daemonset "{component}" to terminate',
            gone,
            timeout=self.options.component_timeout,
            key="daemonset hand-over",
        )

    async def skip_crash_backoff(
        self, component: str, address: str, node_name: str, *, timeout: float | None = None
    ) -> None:
        """Restart the node's kubelet when its static ``component`` pod has a container, none
        running.

        That pod crashed on the host ports its DaemonSet pod held, and the kubelet's back-off
        (doubling from 10 s up to 5 min) would keep it down long after the ports are free; a
        restarted kubelet has forgotten the back-off and starts it at once. Read from the node's
        container runtime: during the kube-apiserver hand-over there is no API to ask.
        """
        static = f"{component}-{node_name}"
        listed = await self.wait_ports_free(
            component,
            address,
            node_name,
            timeout=self.options.port_release_timeout if timeout is None else timeout,
        )
        mine = [c for c in listed if c.pod == static and c.name == component]
        if not mine or any(c.running for c in mine):
            # Running, or not made yet: an agent holds a new kube-apiserver static pod back while
            # another server has its port, so the kubelet starts it at once when it is written.
            return
        self.progress.info(
            f'restarting kubelet on node "{address}" to start its {component} static pod without '
            "waiting out the crash-loop back-off"
        )
        await self._retry(
            functools.partial(self.env.restart_kubelet, address), what=f"restarting the kubelet on {address}"
        )

    async def wait_ports_free(
        self, component: str, address: str, node_name: str, *, timeout: float
    ) -> list[Container]:
        """Wait until no container of ``component`` but its static pod's runs on the node (the old
        ones hold its host ports); returns the node's containers as last listed."""
        static = f"{component}-{node_name}"
        listed: list[Container] = []

        async def ports_free() -> bool | str:
            listed[:] = await self.env.containers(address)
            held = [c.pod for c in listed if c.name == component and c.pod != static and c.running]
            return True if not held else f"{address}: {component} still runs in {held}"

        await self._wait(
            f'the old {component} containers on node "{address}" to stop',
            ports_free,
            timeout=timeout,
            interval=self.options.interval / 4,
            key="daemonset hand-over",
        )
        return listed

    async def wait_static(self, component: str, node_names: Sequence[str], *, ready: bool) -> None:
        async def present() -> bool | str:
            pods = await self.env.system_pods()
            problems = []
            for node in node_names:
                mine = [p for p in pods if p.node_name == node and _is_static(p, component)]
                if not mine:
                    problems.append(f"{node}: no static pod")
                elif ready and not any(p.ready for p in mine):
                    problems.append(f"{node}: not ready ({mine[0].phase})")
            return True if not problems else f"{component} static pods: {problems}"

        await self._wait(
            f'static pods for "{component}" to be present in the API server state',
            present,
            timeout=self.options.component_timeout,
            key="daemonset hand-over" if ready else "static pods appearing",
        )

    async def _wait(
        self,
        what: str,
        attempt: Callable[[], Awaitable[Any]],
        *,
        timeout: float,
        key: str,
        interval: float | None = None,
    ) -> Any:
        """:func:`wait_until` with this run's progress, timing and (by default) poll interval."""
        return await wait_until(
            what,
            attempt,
            timeout=timeout,
            interval=self.options.interval if interval is None else interval,
            progress=self.progress,
            timing=self.timing,
            key=key,
        )

    async def _delete_daemonset(self, name: str) -> bool:
        """Delete kube-system DaemonSet ``name`` with its pods; says so, or that a run before this
        one deleted it already. False then."""
        self.progress.info(f'deleting daemonset "{name}"')
        deleted = bool(
            await self._retry(
                functools.partial(self.env.delete_daemonset, name), what=f'deleting daemonset "{name}"'
            )
        )
        if not deleted:
            self.progress.info(f'daemonset "{name}" was already deleted')
        return deleted

    async def _retry(self, action: Callable[[], Awaitable[Any]], *, what: str) -> Any:
        """``action`` until it does not raise a retryable error (each one is printed)."""

        async def attempt() -> tuple[Any]:
            return (await action(),)

        done = await retry.Wait(
            what=what,
            timeout=self.options.component_timeout,
            backoff=retry.fixed(self.options.interval),
            retry_on=RETRYABLE,
            progress=lambda failed: self.progress.retrying(str(failed.error)),
            error=WaitTimeout,
        ).poll_async(attempt)
        return done[0]


def _is_static(pod: Pod, component: str) -> bool:
    return (
        pod.labels.get("k8s-app") == component
        and bool(pod.annotations.get(SECRETS_VERSION))
        and "Node" in pod.owner_kinds
        and CHECKPOINT_OF not in pod.annotations
    )


def _owned_by_daemonset(pod: Pod, name: str) -> bool:
    return "DaemonSet" in pod.owner_kinds and pod.labels.get("k8s-app") == name


def _is_daemonset_pod(pod: Pod, component: str) -> bool:
    """A pod of ``component``'s DaemonSet, also once orphaned (its owner gone): neither a static
    (mirror) pod nor a checkpoint."""
    return (
        pod.labels.get("k8s-app") == component
        and not _is_static(pod, component)
        and CHECKPOINT_OF not in pod.annotations
        and "Node" not in pod.owner_kinds
    )


def _set_path(tree: Mapping[str, Any], path: Sequence[str], value: str) -> list[dict[str, Any]]:
    """JSON patch ops setting ``path`` to ``value``, creating missing parent mappings."""
    ops: list[dict[str, Any]] = []
    node: Any = tree
    for depth, part in enumerate(path[:-1]):
        if not isinstance(node, Mapping) or part not in node or node[part] is None:
            ops.append({"op": "add", "path": "/" + "/".join(path[: depth + 1]), "value": {}})
            node = {}
        else:
            node = node[part]
    ops.append({"op": "add", "path": "/" + "/".join(path), "value": value})
    return ops


async def self_hosted_problems(api: kube_client.KubeClient) -> list[str]:
    """What keeps a self-hosted control plane from being complete: a control plane or checkpointer
    DaemonSet not Ready everywhere, or a temporary (non-checkpoint) static control plane pod left."""
    listed = await api.list("/apis/apps/v1/namespaces/kube-system/daemonsets")
    daemonsets = {ds["metadata"]["name"]: ds for ds in listed}
    pods = await api.list("/api/v1/namespaces/kube-system/pods")
    problems = []
    for name in (*COMPONENTS, CHECKPOINTER):
        ds = daemonsets.get(name)
        if ds is None:
            problems.append(f"DaemonSet kube-system/{name} does not exist yet")
        else:
            status = ds.get("status") or {}
            desired, ready = status.get("desiredNumberScheduled") or 0, status.get("numberReady") or 0
            if not desired or ready < desired:
                problems.append(f"DaemonSet kube-system/{name}: {ready}/{desired} ready")
    for pod in pods:
        annotations = pod["metadata"].get("annotations") or {}
        if annotations.get(SECRETS_VERSION) and CHECKPOINT_OF not in annotations:
            problems.append(f"temporary static pod {pod['metadata']['name']} still runs")
    return problems
