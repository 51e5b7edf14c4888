"""``certs renew``: the plan and the executor's decisions against an in-process fake cluster.

:class:`RenewCluster` answers like the real nodes where the executor's decisions depend on it: a
renewal request re-issues only certificates issued before it (the same request twice renews
once), the node writes the new files a couple of polls later under the next secrets version, and
each control plane pod reports that version a couple of polls after that.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections import Counter

import pytest
from ops_fakes import NODES, FakeClock

from kubeplane import plan as plan_module
from kubeplane.ops import renew, upgrade
from kubeplane.ops.errors import PreflightError

pytestmark = pytest.mark.unit

CP = [node for node in NODES if node.control_plane]
CREATED = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
CUTOFF = datetime.datetime(2026, 11, 24, 21, 0, tzinfo=datetime.UTC)
RESUME = "kubeplane certs renew --issued-before 2026-11-24T21:00:00+00:00"
#: Polls after a request before the node's files carry the new certificates (then its pods).
LAG = 2


@dataclasses.dataclass
class NodeCerts:
    issued: datetime.datetime = CREATED
    version: int = 1
    expires: str = "2027-01-01T00:00:00+00:00"
    #: Polls left before a requested renewal lands on disk (0: none pending).
    pending: int = 0


@dataclasses.dataclass
class Pod:
    secrets_version: int = 1
    pending: int = 0


class RenewCluster:
    """Node API + Kubernetes API + load balancer of a 3 control plane + 1 worker cluster."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []
        self.certs = {node.address: NodeCerts() for node in CP}
        self.pods = {(node.name, c): Pod() for node in CP for c in upgrade.COMPONENTS}
        self.unreachable: set[str] = set()
        self.frozen_pods: set[tuple[str, str]] = set()
        self.drained: set[str] = set()
        self.nodes_listed = list(NODES)

    def name_of(self, address: str) -> str:
        return next(node.name for node in NODES if node.address == address)

    def renewals(self) -> list[str]:
        return [event[1] for event in self.events if event[0] == "reissue"]

    # -- NodeAPI --

    async def check(self, node: str) -> None:
        if node in self.unreachable:
            raise ConnectionError(f"connection refused: {node}:50000")

    async def cert_state(self, node: str) -> renew.CertState:
        state = self.certs[node]
        if state.pending:
            state.pending -= 1
            if not state.pending:
                state.issued = CUTOFF + datetime.timedelta(seconds=5)
                state.version += 1
                state.expires = "2027-11-24T21:00:05+00:00"
                self.events.append(("reissue", node))
                for component in upgrade.COMPONENTS:
                    self.pods[(self.name_of(node), component)].pending = LAG
        return renew.CertState(issued=state.issued, secrets_version=state.version, expires=state.expires)

    async def renew(self, node: str, *, not_before: datetime.datetime) -> datetime.datetime:
        self.events.append(("renew", node))
        state = self.certs[node]
        if state.issued < not_before and not state.pending:
            state.pending = LAG
        return not_before

    # -- KubeAPI --

    async def nodes(self) -> list[upgrade.ClusterNode]:
        return self.nodes_listed

    async def mirror_pod(self, *, node_name: str, component: str) -> upgrade.PodState | None:
        pod = self.pods[(node_name, component)]
        if pod.pending and (node_name, component) not in self.frozen_pods:
            pod.pending -= 1
            if not pod.pending:
                address = next(n.address for n in NODES if n.name == node_name)
                pod.secrets_version = self.certs[address].version
                self.events.append(("pod-updated", node_name, component))
        return upgrade.PodState(
            name=f"{component}-{node_name}",
            config_version="2",
            ready=not pod.pending,
            secrets_version=str(pod.secrets_version),
        )

    # -- Rotation --

    async def drain(self, node: upgrade.ClusterNode) -> None:
        self.events.append(("drain", node.name))
        self.drained.add(node.name)

    async def restore(self, node: upgrade.ClusterNode) -> None:
        self.events.append(("restore", node.name))
        self.drained.discard(node.name)

    async def serving(self) -> set[str]:
        return {n.address for n in CP if n.name not in self.drained}


def run(
    cluster: RenewCluster, *, timing: upgrade.Timing | None = None
) -> tuple[list[plan_module.StepResult], renew.Renewer, plan_module.RecordingProgress]:
    clock = FakeClock()
    progress = plan_module.RecordingProgress()

    async def scenario() -> tuple[list[plan_module.StepResult], renew.Renewer]:
        observed = await renew.prepare(options=renew.Options(cutoff=CUTOFF), node_api=cluster, kube=cluster)
        renewer = renew.Renewer(
            observed=observed,
            node_api=cluster,
            kube=cluster,
            rotation=cluster,
            progress=progress,
            timing=timing or upgrade.Timing(),
            sleep=clock.sleep,
            clock=clock,
        )
        return await renewer.run(renew.build_plan(observed), resume=RESUME), renewer

    results, renewer = asyncio.run(scenario())
    return results, renewer, progress


def test_plan_has_one_step_per_control_plane_node_and_says_what_is_not_renewed() -> None:
    states = {node.address: renew.CertState(issued=CREATED, secrets_version=1, expires="") for node in CP}
    states[CP[1].address] = renew.CertState(issued=CUTOFF, secrets_version=2, expires="")
    observed = renew.Observed(cutoff=CUTOFF, control_plane=tuple(CP), states=states)
    plan = renew.build_plan(observed)
    lines = plan.render().splitlines()
    assert lines[0] == "renew the Kubernetes certificates of 3 control plane node(s), one at a time: 3 steps"
    target = "issued at or after 2026-11-24T21:00:00+00:00"
    assert (
        lines[1]
        == f"   1. renew kubernetes-certs on node 10.5.0.2: issued 2026-01-01T00:00:00+00:00 -> {target}"
    )
    assert lines[2] == f"   2. renew kubernetes-certs on node 10.5.0.3: {target} (already at target)"
    assert any("not renewed: the CAs, etcd's certificates" in line for line in lines)
    assert (
        plan.rerun == "nodes whose certificates were issued at or after 2026-11-24T21:00:00+00:00 are skipped"
    )


def test_each_node_in_turn_leaves_the_rotation_until_its_pods_run_the_new_secrets() -> None:
    cluster = RenewCluster()
    results, renewer, progress = run(cluster)
    assert [result.outcome for result in results] == ["changed"] * 3
    assert cluster.renewals() == [node.address for node in CP]
    for node in CP:
        drain = cluster.events.index(("drain", node.name))
        asked = cluster.events.index(("renew", node.address))
        pods = max(i for i, e in enumerate(cluster.events) if e[:2] == ("pod-updated", node.name))
        restore = cluster.events.index(("restore", node.name))
        assert drain < asked < pods < restore
        for component in upgrade.COMPONENTS:
            assert cluster.pods[(node.name, component)].secrets_version == 2
    # One node at a time: the next one leaves the rotation after the previous one is back.
    steered = [e for e in cluster.events if e[0] in ("drain", "restore")]
    assert steered == [(kind, node.name) for node in CP for kind in ("drain", "restore")]
    assert cluster.drained == set()
    assert 'retrying error: secrets version mismatch: got "1", expected "2"' in progress.events
    assert [(e.node.name, e.before, e.after) for e in renewer.expiries] == [
        (node.name, "2027-01-01T00:00:00+00:00", "2027-11-24T21:00:05+00:00") for node in CP
    ]


def test_rerun_with_the_same_cutoff_renews_nothing_again() -> None:
    cluster = RenewCluster()
    run(cluster)
    results, _, _ = run(cluster)
    assert [result.outcome for result in results] == ["skipped"] * 3
    assert Counter(cluster.renewals()) == {node.address: 1 for node in CP}
    assert cluster.drained == set()


def test_failed_step_restores_its_node_and_the_resumed_run_renews_each_node_once() -> None:
    cluster = RenewCluster()
    cluster.frozen_pods.add(("cp-2", "kube-scheduler"))
    with pytest.raises(plan_module.StepFailed) as caught:
        run(cluster, timing=upgrade.Timing(pod_timeout=10))
    message = str(caught.value)
    assert "step 2/3 failed: renew kubernetes-certs on node 10.5.0.3: timed out after 10s" in message
    assert f"re-run `{RESUME}` to continue (nodes whose certificates were issued at or after" in message
    assert cluster.drained == set() and cluster.events[-1] == ("restore", "cp-2")
    # As if the run had been killed while cp-2 was drained: the resumed run puts it back.
    cluster.drained.add("cp-2")
    cluster.frozen_pods.clear()
    results, _, _ = run(cluster)
    assert [result.outcome for result in results] == ["skipped", "skipped", "changed"]
    assert Counter(cluster.renewals()) == {node.address: 1 for node in CP}
    assert cluster.drained == set()


def test_a_single_control_plane_node_stays_in_the_rotation() -> None:
    cluster = RenewCluster()
    cluster.nodes_listed = [CP[0], *[node for node in NODES if not node.control_plane]]
    results, _, _ = run(cluster)
    assert [result.outcome for result in results] == ["changed"]
    assert not [event for event in cluster.events if event[0] in ("drain", "restore")]


def test_an_unreachable_node_stops_the_renewal_before_any_change() -> None:
    cluster = RenewCluster()
    cluster.unreachable.add(CP[2].address)
    with pytest.raises(PreflightError, match=r"nothing was changed: node\(s\) not reachable"):
        run(cluster)
    assert cluster.events == []


def test_only_nodes_given_with_n_that_are_kubernetes_nodes_are_accepted() -> None:
    cluster = RenewCluster()

    async def scenario() -> None:
        await renew.prepare(
            options=renew.Options(cutoff=CUTOFF, via=("10.9.9.9",)), node_api=cluster, kube=cluster
        )

    with pytest.raises(PreflightError, match=r"node\(s\) 10\.9\.9\.9 given with -n are not Kubernetes Nodes"):
        asyncio.run(scenario())
