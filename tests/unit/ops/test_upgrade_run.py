"""upgrade-k8s executor decisions against in-process fakes: order, waits, skips, resume, rotation."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
from ops_fakes import NODES, Broken, FakeClock, FakeCluster

from kubeplane import plan as plan_module
from kubeplane.ops import upgrade
from kubeplane.ops.upgrader import Upgrader

pytestmark = pytest.mark.unit

TARGET = "v1.20.2-kp.1"
RESUME = f"kubeplane upgrade-k8s --to {TARGET}"
CP = [node for node in NODES if node.control_plane]


def run(
    cluster: FakeCluster, *, timing: upgrade.Timing | None = None, **options: Any
) -> tuple[list[plan_module.StepResult], plan_module.RecordingProgress]:
    clock = FakeClock()
    progress = plan_module.RecordingProgress()

    async def scenario() -> list[plan_module.StepResult]:
        observed = await upgrade.prepare(
            options=upgrade.Options(to=TARGET, **options), node_api=cluster, kube=cluster
        )
        upgrader = Upgrader(
            observed=observed,
            node_api=cluster,
            kube=cluster,
            rotation=cluster,
            progress=progress,
            timing=timing or upgrade.Timing(),
            sleep=clock.sleep,
            clock=clock,
        )
        return await upgrader.run(upgrade.build_plan(observed), resume=RESUME)

    try:
        return asyncio.run(scenario()), progress
    except plan_module.StepFailed as exc:
        exc.progress = progress  # type: ignore[attr-defined]
        raise


def test_full_upgrade_changes_every_component_once_in_order(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    results, progress = run(cluster)
    assert all(result.outcome == "changed" for result in results)
    patches = [(node, component, image) for _, node, component, image, _ in cluster.patches()]
    expected = [
        (node.address, component, f"k8s.gcr.io/{component}:{TARGET}")
        for component in upgrade.COMPONENTS
        for node in CP
    ]
    assert patches[:9] == expected
    # kube-proxy: the DaemonSet and every control plane config, so they never drift.
    assert patches[9:] == [(node.address, "kube-proxy", f"k8s.gcr.io/kube-proxy:{TARGET}") for node in CP]
    assert all(mode == "immediate" for *_, mode in cluster.patches())
    assert (
        "daemonset",
        "kube-system",
        "kube-proxy",
        "kube-proxy",
        f"k8s.gcr.io/kube-proxy:{TARGET}",
    ) in cluster.events
    assert cluster.ds is not None and cluster.ds.complete(f"k8s.gcr.io/kube-proxy:{TARGET}")
    # Each component's pod carries the kcpc version that has the new image.
    for node in CP:
        for component in upgrade.COMPONENTS:
            assert cluster.pods[(node.name, component)].config_version == "3"
    assert 'retrying error: config version mismatch: got "2", expected "3"' in progress.events
    # Images are pulled everywhere before the first change.
    first_patch = cluster.events.index(cluster.patches()[0])
    assert {event[1] for event in cluster.events[:first_patch] if event[0] == "pull"} == {
        n.address for n in NODES
    }


def test_each_step_waits_for_its_pod_before_the_next_one(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    run(cluster, pre_pull=False)
    changes = [event for event in cluster.events if event[0] in ("patch", "pod-updated")]
    for patch, updated in zip(changes[:18:2], changes[1:18:2], strict=True):
        assert patch[0] == "patch" and updated[0] == "pod-updated"
        assert (cluster.name_of(patch[1]), patch[2]) == updated[1:3]


def test_apiserver_leaves_the_rotation_around_its_restart(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    run(cluster, pre_pull=False)
    for node in CP:
        drain = cluster.events.index(("drain", node.name))
        patch = next(
            i for i, e in enumerate(cluster.events) if e[:3] == ("patch", node.address, "kube-apiserver")
        )
        ready = cluster.events.index(("pod-updated", node.name, "kube-apiserver", "3"))
        restore = cluster.events.index(("restore", node.name))
        assert drain < patch < ready < restore
    assert cluster.drained == set()
    # Only the API servers leave the rotation, one node at a time.
    drained = [e for e in cluster.events if e[0] in ("drain", "restore")]
    assert drained == [(kind, node.name) for node in CP for kind in ("drain", "restore")]


def test_rerun_after_completion_changes_nothing(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    run(cluster)
    before = len(cluster.patches())
    results, _ = run(cluster)
    assert all(result.outcome == "skipped" for result in results)
    assert len(cluster.patches()) == before
    assert sum(1 for e in cluster.events if e[0] == "daemonset") == 1


@pytest.mark.parametrize(
    "broken",
    [
        ("10.5.0.3", "kube-apiserver"),
        ("10.5.0.2", "kube-scheduler"),
        ("10.5.0.4", "kube-proxy"),
    ],
)
def test_failure_stops_and_rerun_continues_without_repeating(
    generated: Mapping[str, Any], broken: tuple[str, str]
) -> None:
    cluster = FakeCluster(generated)
    cluster.fail_apply.add(broken)
    with pytest.raises(plan_module.StepFailed) as caught:
        run(cluster, pre_pull=False)
    assert f"re-run `{RESUME}` to continue" in str(caught.value)
    assert broken[1] in str(caught.value)
    cluster.fail_apply.clear()
    run(cluster, pre_pull=False)
    counts = Counter((node, component) for _, node, component, _, _ in cluster.patches())
    assert set(counts.values()) == {1}
    assert len(counts) == 12
    assert cluster.drained == set()


def test_killed_after_patch_before_pod_ready_resumes_by_waiting(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    cluster.frozen_pods.add(("cp-2", "kube-apiserver"))
    timing = upgrade.Timing(pod_timeout=10)
    with pytest.raises(plan_module.StepFailed) as caught:
        run(cluster, pre_pull=False, timing=timing)
    assert "timed out after 10s waiting for pod kube-apiserver on node cp-2" in str(caught.value)
    assert 'config version mismatch: got "2", expected "3"' in str(caught.value)
    # A failed step puts its node back into the rotation.
    assert cluster.drained == set()
    assert cluster.events[-1] == ("restore", "cp-2")
    # A run killed (SIGKILL) while cp-2 was drained: the re-run puts it back though it skips the patch.
    cluster.drained.add("cp-2")
    cluster.frozen_pods.clear()
    results, _ = run(cluster, pre_pull=False)
    assert results[1].outcome == "skipped" and results[1].step.node == "10.5.0.3"
    assert cluster.drained == set()
    counts = Counter((node, component) for _, node, component, _, _ in cluster.patches())
    assert set(counts.values()) == {1}


def test_retryable_api_errors_are_retried_while_waiting(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    observed_calls: list[str] = []
    original = cluster.mirror_pod

    async def flaky(*, node_name: str, component: str) -> upgrade.PodState | None:
        if not observed_calls:
            observed_calls.append("failed")
            raise ConnectionResetError("connection reset by peer")
        return await original(node_name=node_name, component=component)

    cluster.mirror_pod = flaky  # type: ignore[method-assign]
    _, progress = run(cluster, pre_pull=False)
    assert "retrying error: connection reset by peer" in progress.events


def test_non_retryable_errors_fail_the_step(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)

    async def broken(*, node_name: str, component: str) -> upgrade.PodState | None:
        raise Broken("forbidden")

    cluster.mirror_pod = broken  # type: ignore[method-assign]
    with pytest.raises(
        plan_module.StepFailed,
        match=r"step 1/10 failed: static-pod kube-apiserver on node 10\.5\.0\.2: forbidden",
    ):
        run(cluster, pre_pull=False)


def test_missing_proxy_daemonset_still_updates_the_configs(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated, with_proxy=False)
    results, progress = run(cluster, pre_pull=False)
    assert results[-1].outcome == "changed"
    assert "info DaemonSet kube-system/kube-proxy does not exist: nothing to roll out" in progress.events
    assert [e[1] for e in cluster.patches() if e[2] == "kube-proxy"] == [n.address for n in CP]


def test_custom_registry_is_kept_in_every_patch(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated, repository="10.5.0.1:6000/mirror")
    run(cluster)
    assert all(image.startswith("10.5.0.1:6000/mirror/") for _, _, _, image, _ in cluster.patches())
    assert cluster.ds is not None and cluster.ds.image == f"10.5.0.1:6000/mirror/kube-proxy:{TARGET}"


def test_bad_image_fails_at_pre_pull_before_any_change(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    clock = FakeClock()

    async def scenario() -> None:
        observed = await upgrade.prepare(
            options=upgrade.Options(to="v9.9.9", source="v9.9.0"), node_api=cluster, kube=cluster
        )
        upgrader = Upgrader(
            observed=observed,
            node_api=cluster,
            kube=cluster,
            rotation=cluster,
            progress=plan_module.RecordingProgress(),
            sleep=clock.sleep,
            clock=clock,
        )
        await upgrader.run(upgrade.build_plan(observed), resume=RESUME)

    with pytest.raises(upgrade.PreflightError) as raised:
        asyncio.run(scenario())
    message = str(raised.value)
    assert message.startswith("nothing was changed: image k8s.gcr.io/kube-apiserver:v9.9.9 cannot be pulled")
    assert "on node 10.5.0.2: pull k8s.gcr.io/kube-apiserver:v9.9.9: not found" in message
    assert "v9.9.9 is a version whose images" in message
    assert cluster.patches() == []
    assert cluster.drained == set()


def test_kubelets_and_manifests_when_asked(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    results, _ = run(cluster, pre_pull=False, upgrade_kubelet=True, sync_manifests=True)
    kubelet_patches = [e for e in cluster.patches() if e[2] == "kubelet"]
    assert [e[1] for e in kubelet_patches] == [n.address for n in NODES]
    assert all(e[4] == "reboot" for e in kubelet_patches)
    # Each control plane node's etcd is healthy again before the next node's kubelet restarts.
    for before, after in itertools.pairwise(kubelet_patches):
        node = before[1]
        if any(n.address == node and n.control_plane for n in NODES):
            between = cluster.events[cluster.events.index(before) : cluster.events.index(after)]
            assert ("service-health", node, "etcd") in between
    assert ("apply", "1") in cluster.events
    assert results[-1].step.kind == "manifests"


def test_a_single_control_plane_node_is_not_taken_out_of_the_rotation(generated: Mapping[str, Any]) -> None:
    # Draining the only API server would only lengthen the outage its restart causes.
    cluster = FakeCluster(generated)
    single = [NODES[0], *(dataclasses.replace(n, control_plane=False) for n in NODES[1:])]

    async def nodes() -> list[upgrade.ClusterNode]:
        return single

    cluster.nodes = nodes  # type: ignore[method-assign]
    run(cluster, pre_pull=False, via=("10.5.0.2",))
    assert not [event for event in cluster.events if event[0] in ("drain", "restore")]
    assert [e[1] for e in cluster.patches() if e[2] == "kube-apiserver"] == ["10.5.0.2"]


def test_the_last_serving_api_server_is_never_drained(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    cluster.down |= {"cp-2", "cp-3"}  # only cp-1 passes the load balancer's health checks
    _, progress = run(cluster, pre_pull=False)
    assert ("drain", "cp-1") not in cluster.events
    assert any("keeping node cp-1 in the load balancer rotation" in line for line in progress.events)
    assert ("drain", "cp-2") in cluster.events  # cp-1 serves while the others restart
