"""Cluster health checks (``kubeplane health``; also the waits of create, upgrade and convert).

Modelled on the original's ``talosctl health``: an ordered list of named checks, each polled
until it passes or the shared deadline passes, each reported as it finishes
(``waiting for etcd to be healthy: OK``). A failing check names the failing node(s) and why.

Checks, in order:

1. ``etcd to be healthy``: every control plane node answers the node API's etcd members call;
2. ``etcd members to be consistent across nodes``: the answering nodes agree on one member set,
   with one member per control plane node;
3. ``all k8s nodes to report ready``: every node (matched by its InternalIP) registered and Ready;
4. ``all control plane static pods to be ready``: on each control plane node the mirror pods of
   kube-apiserver, kube-controller-manager and kube-scheduler exist and are Ready (one waiting
   for an image it cannot pull is reported with the image named: :func:`image_problems`);
5. ``the Kubernetes API to answer through the endpoint``: ``/readyz`` through the kubeconfig's server
   (the load balancer in a local cluster);
6. ``the cluster DNS to be ready``: when the cluster has the ``kube-dns`` Service, at least one of
   its endpoints is ready (so pods resolve names once ``cluster create`` returns); a DNS pod that
   cannot pull its image is named the same way.

Once a check fails the run goes on with the next ones (each then gets a single attempt), so a
report lists every failing node, not just the first symptom. Rejected alternative: stopping at
the first failure as the original does — with one node down, later checks are exactly what tells
the operator whether the rest of the cluster still works.

The checks reach the cluster only through the two interfaces the caller hands in: a node API
client factory and a :class:`~kubeplane.clients.kube.KubeClient` factory (a client per attempt,
each in its own event loop: the checks are blocking calls). Nothing here knows about local
clusters.

``kubeplane health --explain`` runs the same checks once, then explains the failures:
:mod:`kubeplane.ops.evidence` reads what the troubleshooting guide would look at and
:mod:`kubeplane.ops.diagnose` walks its decision tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any, TypeVar

from kubeplane import api, retry
from kubeplane.clients import kube as kube_client

#: The static pods every control plane node runs (their ``k8s-app`` label).
CONTROL_PLANE_COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
SYSTEM_NAMESPACE = "kube-system"
#: Seconds one Kubernetes API request of a check may take (the clients a KubeFactory makes).
REQUEST_TIMEOUT = 5.0

#: The names of the checks of :func:`default_checks` (what ``--explain`` ties its diagnoses to).
ETCD_HEALTHY = "etcd to be healthy"
ETCD_CONSISTENT = "etcd members to be consistent across nodes"
NODES_READY = "all k8s nodes to report ready"
STATIC_PODS_READY = "all control plane static pods to be ready"
API_ENDPOINT = "the Kubernetes API to answer through the endpoint"
CLUSTER_DNS = "the cluster DNS to be ready"
SYSTEM_PODS_READY = "every kube-system pod to be ready"
CHECK_NAMES = (ETCD_HEALTHY, ETCD_CONSISTENT, NODES_READY, STATIC_PODS_READY, API_ENDPOINT, CLUSTER_DNS)
#: The cluster DNS Service of the bootstrap manifests (CoreDNS or kubeplane's drop-in).
DNS_SERVICE = "kube-dns"

T = TypeVar("T")
#: Makes a node API client whose calls go to ``nodes`` (through the caller's endpoints).
NodeClientFactory = Callable[[Sequence[str]], api.NodeClient]
#: Makes a Kubernetes API client for the cluster.
KubeFactory = Callable[[], kube_client.KubeClient]


@dataclasses.dataclass(frozen=True)
class Topology:
    """The nodes a healthy cluster has, by the addresses the node API knows them by."""

    controlplanes: tuple[str, ...]
    workers: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.controlplanes + self.workers


@dataclasses.dataclass(frozen=True)
class Check:
    """One named check; ``run`` returns the problems found (empty: the check passes)."""

    name: str
    run: Callable[[], list[str]]


@dataclasses.dataclass(frozen=True)
class Result:
    name: str
    problems: tuple[str, ...]
    elapsed: float

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        """``waiting for NAME: OK`` or ``...: FAILED`` with one indented line per problem."""
        if self.ok:
            return f"waiting for {self.name}: OK"
        return "\n".join([f"waiting for {self.name}: FAILED", *(f"  {p}" for p in self.problems)])


def run(
    checks: Sequence[Check],
    *,
    timeout: float,
    interval: float = 1.0,
    report: Callable[[Result], None] = lambda _: None,
) -> list[Result]:
    """Run ``checks`` in order within ``timeout`` seconds overall (see the module docstring)."""
    deadline = time.monotonic() + timeout
    results = []
    for check in checks:
        started = time.monotonic()
        problems = _until_passes(check, timeout=max(deadline - started, 0.0), interval=interval)
        result = Result(check.name, tuple(problems), time.monotonic() - started)
        report(result)
        results.append(result)
    return results


def _until_passes(check: Check, *, timeout: float, interval: float) -> list[str]:
    """The problems ``check`` still finds when it passes (none) or ``timeout`` runs out."""
    problems: list[str] = []

    def attempt() -> bool:
        problems[:] = _attempt(check)
        return not problems

    with contextlib.suppress(retry.WaitTimeout):
        retry.Wait(what=check.name, timeout=timeout, backoff=retry.fixed(interval)).poll(attempt)
    return problems


def _attempt(check: Check) -> list[str]:
    try:
        return check.run()
    except Exception as exc:  # a check that cannot even ask is a failing check, not a crash
        return [f"{type(exc).__name__}: {_one_line(exc)}"]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


#: A container's waiting reasons that mean its image cannot be had.
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


def image_problems(pod: dict[str, Any]) -> list[str]:
    """``image X cannot be pulled (REASON: message)`` for each container of ``pod`` waiting for an
    image it cannot get: a registry (or air-gapped mirror) lacking the image is then named in the
    report at once, instead of showing only as a pod that never gets Ready."""
    status = pod.get("status") or {}
    problems = []
    for container in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            message = " ".join(str(waiting.get("message") or "").split())[:400]
            problems.append(
                f"image {container.get('image')} cannot be pulled ({waiting['reason']}: {message})"
            )
    return problems


def default_checks(topology: Topology, *, node_client: NodeClientFactory, kube: KubeFactory) -> list[Check]:
    """The checks of the module docstring for ``topology``."""
    members: dict[str, set[str]] = {}

    def etcd_healthy() -> list[str]:
        members.clear()
        problems = []
        for reply in asyncio.run(_etcd_members(node_client, topology.controlplanes)):
            if reply.error is not None:
                problems.append(f"node {reply.node}: {_one_line(reply.error)}")
            else:
                members[reply.node] = {str(m.get("id")) for m in reply.result or []}
        return problems

    def etcd_consistent() -> list[str]:
        # Read the member sets again on every attempt: a member added while the check above read
        # them shows on some nodes a moment before the others, and that first read must not stand
        # for the whole wait. Nodes that do not answer were reported above; the rest must agree.
        etcd_healthy()
        if not members:
            return ["no control plane node answered with its etcd members"]
        problems = []
        reference = max(members.values(), key=lambda ids: sum(ids == other for other in members.values()))
        for node, ids in sorted(members.items()):
            if ids != reference:
                problems.append(f"node {node}: sees members {sorted(ids)}, others see {sorted(reference)}")
        if len(reference) != len(topology.controlplanes):
            problems.append(
                f"etcd has {len(reference)} member(s), expected {len(topology.controlplanes)} "
                "(one per control plane node)"
            )
        return problems

    def static_pods_ready() -> list[str]:
        pods = kube_call(kube, lambda api: api.list(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"))
        problems = []
        for ip in topology.controlplanes:
            for component in CONTROL_PLANE_COMPONENTS:
                found = [
                    pod
                    for pod in pods
                    if (pod["metadata"].get("labels") or {}).get("k8s-app") == component
                    and (pod.get("status") or {}).get("hostIP") == ip
                ]
                if not found:
                    problems.append(f"node {ip}: no {component} pod")
                elif not any(kube_client.is_ready(pod) for pod in found):
                    phase = (found[0].get("status") or {}).get("phase")
                    problems.append(f"node {ip}: {component} is {phase}, not Ready")
                    problems += [f"node {ip}: {problem}" for problem in image_problems(found[0])]
        return problems

    kube_only = kube_checks(topology, kube=kube)
    return [
        Check(ETCD_HEALTHY, etcd_healthy),
        Check(ETCD_CONSISTENT, etcd_consistent),
        kube_only[NODES_READY],
        Check(STATIC_PODS_READY, static_pods_ready),
        kube_only[API_ENDPOINT],
        kube_only[CLUSTER_DNS],
    ]


def kube_checks(topology: Topology, *, kube: KubeFactory) -> dict[str, Check]:
    """The checks that need only the Kubernetes API (by name): every node registered and Ready,
    the endpoint's ``/readyz``, the cluster DNS answering, every kube-system pod Ready. A cluster
    without kubeplane's agents (kubeadm's) is waited for with these."""

    def nodes_ready() -> list[str]:
        by_ip = kube_call(kube, _nodes_by_ip)
        problems = []
        for ip in topology.nodes:
            node = by_ip.get(ip)
            if node is None:
                problems.append(f"node {ip}: not registered in Kubernetes")
                continue
            conditions = (node.get("status") or {}).get("conditions") or []
            ready = next((c for c in conditions if c.get("type") == "Ready"), None)
            if ready is None or ready.get("status") != "True":
                why = (
                    f"{ready.get('reason')}: {ready.get('message')}"
                    if ready is not None
                    else "no Ready condition yet"
                )
                problems.append(f"node {ip} ({node['metadata']['name']}): not Ready ({why})")
        return problems

    def api_endpoint() -> list[str]:
        async def readyz(api: kube_client.KubeClient) -> tuple[str, int, str]:
            return (api.server, *await api.raw_get("/readyz"))

        host, status, text = kube_call(kube, readyz)
        body = text[:200].encode()
        return [] if status == HTTPStatus.OK else [f"{host}/readyz answered HTTP {status}: {body!r}"]

    def cluster_dns() -> list[str]:
        def read(kind: str) -> dict[str, Any] | None:
            path = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/{kind}/{DNS_SERVICE}"
            return kube_call(kube, lambda api: api.get_or_none(path))

        if read("services") is None:
            return []  # no cluster DNS (coreDNS disabled): nothing to wait for
        subsets = (read("endpoints") or {}).get("subsets") or ()
        if any(subset.get("addresses") for subset in subsets):
            return []
        pods = kube_call(
            kube,
            lambda api: api.list(
                f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", label_selector=f"k8s-app={DNS_SERVICE}"
            ),
        )
        return [
            f"service {SYSTEM_NAMESPACE}/{DNS_SERVICE} has no ready endpoint: no DNS pod is Ready",
            *(problem for pod in pods for problem in image_problems(pod)),
        ]

    def system_pods_ready() -> list[str]:
        pods = kube_call(kube, lambda api: api.list(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"))
        problems = []
        for pod in pods:
            if not kube_client.is_ready(pod):
                phase = (pod.get("status") or {}).get("phase")
                problems.append(f"pod {SYSTEM_NAMESPACE}/{pod['metadata']['name']} is {phase}, not Ready")
                problems += image_problems(pod)
        return problems if pods else [f"no pod in {SYSTEM_NAMESPACE} yet"]

    return {
        NODES_READY: Check(NODES_READY, nodes_ready),
        API_ENDPOINT: Check(API_ENDPOINT, api_endpoint),
        CLUSTER_DNS: Check(CLUSTER_DNS, cluster_dns),
        SYSTEM_PODS_READY: Check(SYSTEM_PODS_READY, system_pods_ready),
    }


async def _etcd_members(factory: NodeClientFactory, nodes: Sequence[str]) -> list[api.Reply[Any]]:
    replies: list[api.Reply[Any]] = []
    for node in nodes:
        # One node per client: an unreachable endpoint must fail that node only.
        try:
            async with factory([node]) as client:
                replies.extend(await client.etcd_members())
        except api.APIError as exc:
            error = (
                exc if isinstance(exc, api.CallError) else api.CallError("UNAVAILABLE", str(exc), node=node)
            )
            replies.append(api.Reply(node=node, error=error))
    return replies


def kube_call(kube: KubeFactory, call: Callable[[kube_client.KubeClient], Awaitable[T]]) -> T:
    """Run ``call`` with a new client from ``kube`` in an event loop of its own; close the client."""

    async def run() -> T:
        async with kube() as client:
            return await call(client)

    return asyncio.run(run())


async def _nodes_by_ip(api: kube_client.KubeClient) -> dict[str, Any]:
    found = {}
    for node in await api.list(kube_client.NODES_PATH):
        for address in (node.get("status") or {}).get("addresses") or []:
            if address.get("type") == "InternalIP":
                found[address["address"]] = node
    return found


def failing_nodes(results: Sequence[Result]) -> set[str]:
    """Nodes named by failing checks (``node X: ...`` / ``node X (name): ...``)."""
    found = set()
    for result in results:
        for problem in result.problems:
            if problem.startswith("node "):
                found.add(problem.split()[1].rstrip(":"))
    return found
