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
   kube-apiserver, kube-controller-manager and kube-scheduler exist and are Ready;
5. ``the Kubernetes API to answer through the endpoint``: ``/readyz`` through the kubeconfig's server
   (the load balancer in a local cluster).

Once a check fails the run goes on with the next ones (each then gets a single attempt), so a
report lists every failing node, not just the first symptom. Rejected alternative: stopping at
the first failure as the original does — with one node down, later checks are exactly what tells
the operator whether the rest of the cluster still works.

The checks reach the cluster only through the two interfaces the caller hands in: a node API
client factory and a Kubernetes ``ApiClient`` factory. Nothing here knows about local clusters.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client as k8s

from kubeplane import api, retry

#: The static pods every control plane node runs (their ``k8s-app`` label).
CONTROL_PLANE_COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
SYSTEM_NAMESPACE = "kube-system"
_REQUEST_TIMEOUT = 5

#: Makes a node API client whose calls go to ``nodes`` (through the caller's endpoints).
NodeClientFactory = Callable[[Sequence[str]], api.NodeClient]
#: Makes a ``kubernetes.client.ApiClient`` for the cluster.
KubeFactory = Callable[[], Any]


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

    def nodes_ready() -> list[str]:
        by_ip = _nodes_by_ip(kube)
        problems = []
        for ip in topology.nodes:
            node = by_ip.get(ip)
            if node is None:
                problems.append(f"node {ip}: not registered in Kubernetes")
                continue
            ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
            if ready is None or ready.status != "True":
                why = f"{ready.reason}: {ready.message}" if ready is not None else "no Ready condition yet"
                problems.append(f"node {ip} ({node.metadata.name}): not Ready ({why})")
        return problems

    def static_pods_ready() -> list[str]:
        pods = _core(
            kube, lambda core: core.list_namespaced_pod(SYSTEM_NAMESPACE, _request_timeout=_REQUEST_TIMEOUT)
        )
        problems = []
        for ip in topology.controlplanes:
            for component in CONTROL_PLANE_COMPONENTS:
                found = [
                    pod
                    for pod in pods.items
                    if (pod.metadata.labels or {}).get("k8s-app") == component and pod.status.host_ip == ip
                ]
                if not found:
                    problems.append(f"node {ip}: no {component} pod")
                elif not any(_pod_ready(pod) for pod in found):
                    problems.append(f"node {ip}: {component} is {found[0].status.phase}, not Ready")
        return problems

    def api_endpoint() -> list[str]:
        client = kube()
        host = client.configuration.host
        try:
            response = client.call_api("GET", f"{host}/readyz", _request_timeout=_REQUEST_TIMEOUT)
            response.read()
            status, body = response.status, (response.data or b"")[:200]
        finally:
            client.close()
        return [] if status == 200 else [f"{host}/readyz answered HTTP {status}: {body!r}"]

    return [
        Check("etcd to be healthy", etcd_healthy),
        Check("etcd members to be consistent across nodes", etcd_consistent),
        Check("all k8s nodes to report ready", nodes_ready),
        Check("all control plane static pods to be ready", static_pods_ready),
        Check("the Kubernetes API to answer through the endpoint", api_endpoint),
    ]


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


def _core(kube: KubeFactory, call: Callable[[Any], Any]) -> Any:
    client = kube()
    try:
        return call(k8s.CoreV1Api(client))
    finally:
        client.close()


def _nodes_by_ip(kube: KubeFactory) -> dict[str, Any]:
    nodes = _core(kube, lambda core: core.list_node(_request_timeout=_REQUEST_TIMEOUT))
    found = {}
    for node in nodes.items:
        for address in node.status.addresses or []:
            if address.type == "InternalIP":
                found[address.address] = node
    return found


def _pod_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def failing_nodes(results: Sequence[Result]) -> set[str]:
    """Nodes named by failing checks (``node X: ...`` / ``node X (name): ...``)."""
    found = set()
    for result in results:
        for problem in result.problems:
            if problem.startswith("node "):
                found.add(problem.split()[1].rstrip(":"))
    return found
