"""``certs renew``: a rolling renewal of the control plane's Kubernetes certificates, same CAs.

Each control plane node issues its own Kubernetes certificates
(:mod:`kubeplane.controllers.secrets.kubernetes`): the kube-apiserver serving certificate, its
kubelet and front-proxy client certificates and the admin, kube-controller-manager and
kube-scheduler kubeconfigs. The node renews them by itself in their renewal window, but nodes
created together reach it together, and a renewal restarts the node's control plane pods. This
operation renews them now, one node at a time, so the API never loses more than one server:

1. :func:`prepare` — checks before any change: control plane nodes are discovered from
   Kubernetes Nodes as ``upgrade-k8s`` does (``-n`` only names the node to talk through), each
   answers on the node API, and each node's certificate state is read (the issue time and the
   secrets version of the files its pods run with, the serving certificate's expiry).
   :func:`build_plan` turns it into the :class:`~kubeplane.plan.Plan` (``--dry-run`` prints it).
2. :class:`Renewer` — for each node in turn: take it out of the load balancer's rotation (only
   when another API server serves), ask it (``KubernetesCertificatesRenew``) for certificates
   issued at or after the run's *cutoff*, wait until its secrets status carries certificates
   issued that late (that version of the files holds them), wait until its kube-apiserver,
   kube-controller-manager and kube-scheduler mirror pods run that secrets version and are
   Ready, then put it back.

Re-running. The cutoff is the time the run started unless ``--issued-before`` gives it, and the
command a failed run prints to continue carries it: a node whose certificates were already
issued at or after the cutoff is skipped (its pods are still waited for and it is put back into
the rotation, so a run killed between drain and restore leaves no node out). Running the plain
command again later is a new renewal of every node. The request is idempotent on the node: the
same cutoff twice renews once.

Not renewed here: the CAs (a CA change is another operation), etcd's certificates (the node
renews them in their window) and the kubelets' (they rotate their own). The cluster is reached
through :class:`NodeAPI`, :class:`KubeAPI` and :class:`~kubeplane.ops.upgrade.Rotation`, which
the CLI implements (and unit tests fake).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Iterable, Mapping
from typing import Protocol

from kubeplane import plan as plan_module
from kubeplane.ops import upgrade
from kubeplane.ops.upgrade import ClusterNode, PodState
from kubeplane.ops.upgrader import RollingExecutor, out_of_rotation

KIND_RENEW = "renew"
COMPONENT = "kubernetes-certs"
NOTES = (
    "renewed with the same CAs: the kube-apiserver serving certificate, its kubelet and "
    "front-proxy client certificates, the admin, kube-controller-manager and kube-scheduler "
    "kubeconfigs",
    "not renewed: the CAs, etcd's certificates (renewed by each node in their renewal window) and "
    "the kubelets' (they rotate their own)",
)


@dataclasses.dataclass(frozen=True)
class CertState:
    """A control plane node's Kubernetes certificates as its control plane pods use them."""

    #: When the certificates whose files are on disk were issued (None: not known yet).
    issued: datetime.datetime | None
    #: The secrets version of those files (the pods' ``kubeplane.dev/secrets-version``).
    secrets_version: int
    #: The kube-apiserver serving certificate's expiry (ISO 8601; empty when not found).
    expires: str

    def renewed_since(self, cutoff: datetime.datetime) -> bool:
        """Whether these certificates were issued at or after ``cutoff``."""
        return self.issued is not None and self.issued >= cutoff


class NodeAPI(Protocol):
    """The node API calls the renewal makes, addressed by node address."""

    async def check(self, node: str) -> None:
        """Raise when ``node`` does not answer (used before any change)."""

    async def cert_state(self, node: str) -> CertState:
        """The node's certificate state (its ``SecretStatuses static-pods`` and certificate files)."""

    async def renew(self, node: str, *, not_before: datetime.datetime) -> datetime.datetime:
        """Ask ``node`` to re-issue its Kubernetes certificates issued before ``not_before``; the
        time the node will answer the request at (``not_before``, capped at the node's clock)."""


class KubeAPI(Protocol):
    """The Kubernetes API calls the renewal makes (through the control plane endpoint)."""

    async def nodes(self) -> list[ClusterNode]:
        """Every Node with its first InternalIP; control plane by :data:`upgrade.CONTROL_PLANE_LABELS`."""

    async def mirror_pod(self, *, node_name: str, component: str) -> PodState | None:
        """The kube-system pod labelled ``k8s-app=<component>`` on ``node_name``, if any."""


@dataclasses.dataclass(frozen=True)
class Options:
    """What the user asked for (the CLI flags)."""

    #: Certificates issued before this are renewed (the run's start unless ``--issued-before``).
    cutoff: datetime.datetime
    #: The nodes the CLI talks through (``-n``); the plan covers every control plane node.
    via: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Observed:
    """What :func:`prepare` read: the input of :func:`build_plan` (pure)."""

    cutoff: datetime.datetime
    control_plane: tuple[ClusterNode, ...]
    #: Node address -> its certificate state before any change.
    states: Mapping[str, CertState]


def timestamp(value: datetime.datetime) -> str:
    """A time as the plan and the messages show it (UTC, seconds)."""
    return value.astimezone(datetime.UTC).isoformat(timespec="seconds")


def build_plan(observed: Observed) -> plan_module.Plan:
    """One renewal step per control plane node, in the order of :func:`prepare`'s discovery."""
    target = f"issued at or after {timestamp(observed.cutoff)}"
    steps = []
    for node in observed.control_plane:
        state = observed.states[node.address]
        issued = timestamp(state.issued) if state.issued is not None else "unknown"
        current = target if state.renewed_since(observed.cutoff) else f"issued {issued}"
        steps.append(
            plan_module.Step(
                kind=KIND_RENEW, component=COMPONENT, node=node.address, current=current, target=target
            )
        )
    return plan_module.Plan(
        title=f"renew the Kubernetes certificates of {len(steps)} control plane node(s), one at a time",
        steps=tuple(steps),
        notes=NOTES,
        rerun=f"nodes whose certificates were issued at or after {timestamp(observed.cutoff)} are skipped",
    )


async def prepare(*, options: Options, node_api: NodeAPI, kube: KubeAPI) -> Observed:
    """Every check before any change, and the state the plan is built from."""
    nodes = await upgrade.kube_read(kube.nodes(), what="list Kubernetes Nodes")
    control_plane = upgrade.select_control_plane(nodes, options.via)
    await upgrade.check_reachable(node_api, control_plane)
    states = {node.address: await node_api.cert_state(node.address) for node in control_plane}
    return Observed(cutoff=options.cutoff, control_plane=control_plane, states=states)


@dataclasses.dataclass(frozen=True)
class Expiry:
    """A node's kube-apiserver serving certificate expiry before and after its step."""

    node: ClusterNode
    before: str
    after: str


class Renewer(RollingExecutor[Observed, NodeAPI, KubeAPI]):
    """Runs a renewal plan's steps, each deciding from live state (see the module docstring)."""

    def _known_nodes(self) -> Iterable[ClusterNode]:
        return self.observed.control_plane

    @functools.cached_property
    def expiries(self) -> list[Expiry]:
        """Each finished step's expiry, in order (what the CLI prints at the end)."""
        return []

    async def run(self, plan: plan_module.Plan, *, resume: str) -> list[plan_module.StepResult]:
        """Execute ``plan``; raises :class:`~kubeplane.plan.StepFailed` naming the step and ``resume``."""
        return await plan_module.execute(
            plan, self.run_step, progress=self.progress, resume=resume, clock=self._clock
        )

    def _steer(self) -> bool:
        """Whether a step takes its node out of the rotation: when other API servers exist."""
        return len(self.observed.control_plane) > 1

    async def run_step(self, step: plan_module.Step) -> plan_module.Outcome:
        """Renew one node's certificates (or find them renewed) and wait for its pods."""
        node = self._nodes[step.node]
        cutoff = self.observed.cutoff
        state = await self.node_api.cert_state(node.address)
        if state.renewed_since(cutoff):
            outcome, expected = plan_module.SKIPPED, state.secrets_version
            self.progress.info(
                f"node {node.name} already runs certificates issued at {timestamp(state.issued or cutoff)}"
            )
        else:
            outcome = plan_module.CHANGED
        async with out_of_rotation(
            self.rotation, node, self.progress, steer=self._steer(), drain=outcome is plan_module.CHANGED
        ):
            if outcome is plan_module.CHANGED:
                answered_at = await self.node_api.renew(node.address, not_before=cutoff)
                self.progress.info(
                    f"asked node {node.name} to renew its certificates issued before {timestamp(answered_at)}"
                )
                expected = await self._wait_issued(node, answered_at)
            await self._wait_pods_on_secrets(node, expected)
        after = await self.node_api.cert_state(node.address)
        before = self.observed.states[node.address].expires
        self.expiries.append(Expiry(node=node, before=before, after=after.expires))
        self.progress.info(
            f"kube-apiserver certificate of node {node.name}: "
            f"expires {before or '?'} -> {after.expires or '?'}"
        )
        return outcome

    async def _wait_issued(self, node: ClusterNode, not_before: datetime.datetime) -> int:
        """Wait until the node's secrets carry certificates issued at or after ``not_before``;
        the secrets version that carries them."""
        found: list[int] = []

        async def check() -> str | None:
            state = await self.node_api.cert_state(node.address)
            if not state.renewed_since(not_before):
                issued = timestamp(state.issued) if state.issued is not None else "unknown"
                return f"the certificates on node {node.name} were issued at {issued}"
            found.append(state.secrets_version)
            return None

        await self._wait(
            check,
            timeout=self.timing.config_timeout,
            describe=f"node {node.name} to write certificates issued at or after {timestamp(not_before)}",
        )
        return found[-1]
