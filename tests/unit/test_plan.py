"""The generic plan and executor: rendering, order, progress, failure with a resume hint."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane import plan

pytestmark = pytest.mark.unit

STEPS = (
    plan.Step(
        kind="static-pod", component="kube-apiserver", node="10.5.0.2", current="r/a:v1", target="r/a:v2"
    ),
    plan.Step(
        kind="static-pod", component="kube-apiserver", node="10.5.0.3", current="r/a:v2", target="r/a:v2"
    ),
    plan.Step(kind="daemonset", component="kube-proxy", node="", current="r/p:v1", target="r/p:v2"),
)
PLAN = plan.Plan(title="upgrade", steps=STEPS, notes=("a note",))


def test_render_lists_every_step_in_order_with_node_and_change() -> None:
    lines = PLAN.render().splitlines()
    assert lines[0] == "upgrade: 3 steps"
    assert lines[1] == "   1. static-pod kube-apiserver on node 10.5.0.2: r/a:v1 -> r/a:v2"
    assert lines[2] == "   2. static-pod kube-apiserver on node 10.5.0.3: r/a:v2 (already at target)"
    assert lines[3] == "   3. daemonset kube-proxy cluster-wide: r/p:v1 -> r/p:v2"
    assert lines[4] == "  note: a note"


def test_execute_runs_steps_in_order_and_reports_progress() -> None:
    ran: list[plan.Step] = []

    async def run(step: plan.Step) -> plan.Outcome:
        ran.append(step)
        return plan.SKIPPED if step.up_to_date else plan.CHANGED

    progress = plan.RecordingProgress()
    results = asyncio.run(plan.execute(PLAN, run, progress=progress, resume="kubeplane upgrade-k8s --to v2"))
    assert ran == list(STEPS)
    assert [r.outcome for r in results] == ["changed", "skipped", "changed"]
    assert plan.changed_steps(results) == [STEPS[0], STEPS[2]]
    assert progress.events[0] == "start 1/3 kube-apiserver 10.5.0.2"
    assert progress.events[-1] == "changed 3 kube-proxy"


def test_failure_stops_the_run_and_says_how_to_resume() -> None:
    ran: list[plan.Step] = []

    async def run(step: plan.Step) -> plan.Outcome:
        ran.append(step)
        if step.node == "10.5.0.3":
            raise RuntimeError("pod never became Ready")
        return plan.CHANGED

    with pytest.raises(plan.StepFailed) as caught:
        asyncio.run(
            plan.execute(PLAN, run, progress=plan.RecordingProgress(), resume="kubeplane upgrade-k8s --to v2")
        )
    assert ran == list(STEPS[:2])
    message = str(caught.value)
    assert "step 2/3 failed: static-pod kube-apiserver on node 10.5.0.3: pod never became Ready" in message
    assert "re-run `kubeplane upgrade-k8s --to v2` to continue" in message
    assert caught.value.step == STEPS[1]
