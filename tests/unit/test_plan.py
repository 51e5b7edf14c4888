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


def test_every_step_reports_its_events_in_order_with_outcome_and_time() -> None:
    ticks = iter(range(100))

    async def run(step: plan.Step) -> plan.Outcome:
        return plan.SKIPPED if step.up_to_date else plan.CHANGED

    progress = plan.RecordingProgress()
    results = asyncio.run(
        plan.execute(PLAN, run, progress=progress, resume="r", clock=lambda: float(next(ticks)))
    )
    assert progress.events == [
        "start 1/3 kube-apiserver 10.5.0.2",
        "changed 1 kube-apiserver 10.5.0.2",
        "start 2/3 kube-apiserver 10.5.0.3",
        "skipped 2 kube-apiserver 10.5.0.3",
        "start 3/3 kube-proxy",
        "changed 3 kube-proxy",
    ]
    assert [r.seconds for r in results] == [1.0, 1.0, 1.0]


def test_a_failed_step_is_reported_before_the_resume_message_is_raised() -> None:
    async def run(step: plan.Step) -> plan.Outcome:
        raise TimeoutError("no answer from 10.5.0.2")

    progress = plan.RecordingProgress()
    with pytest.raises(plan.StepFailed) as caught:
        asyncio.run(plan.execute(PLAN, run, progress=progress, resume="kubeplane upgrade-k8s --to v2"))
    assert progress.events == [
        "start 1/3 kube-apiserver 10.5.0.2",
        "failed 1 kube-apiserver 10.5.0.2: no answer from 10.5.0.2",
    ]
    assert isinstance(caught.value.cause, TimeoutError) and caught.value.index == 1
    assert caught.value.resume == "kubeplane upgrade-k8s --to v2"
    assert str(caught.value).splitlines() == [
        "step 1/3 failed: static-pod kube-apiserver on node 10.5.0.2: no answer from 10.5.0.2",
        "steps before it are done; fix the cause and re-run `kubeplane upgrade-k8s --to v2` to continue "
        "(steps already at their target are skipped)",
    ]


def test_a_plan_says_what_its_rerun_does() -> None:
    once = plan.Plan(title="create", steps=STEPS[:1], rerun="the creation starts over")

    async def run(step: plan.Step) -> plan.Outcome:
        raise RuntimeError("haproxy exited")

    with pytest.raises(
        plan.StepFailed, match=r"re-run `destroy && create` to continue \(the creation starts over\)"
    ):
        asyncio.run(plan.execute(once, run, progress=plan.RecordingProgress(), resume="destroy && create"))


def test_a_passthrough_error_stops_the_run_as_it_is() -> None:
    class Aborted(Exception):
        pass

    ran: list[plan.Step] = []

    async def run(step: plan.Step) -> plan.Outcome:
        ran.append(step)
        raise Aborted("aborted")

    progress = plan.RecordingProgress()
    with pytest.raises(Aborted):
        asyncio.run(plan.execute(PLAN, run, progress=progress, resume="r", passthrough=(Aborted,)))
    assert ran == [STEPS[0]]
    assert progress.events[-1] == "failed 1 kube-apiserver 10.5.0.2: aborted"


def test_rendering_runs_nothing_and_shows_places_and_targets_without_a_current_state() -> None:
    steps = (
        plan.Step("create", "network", "", "", "bridge kp-demo"),
        plan.Step("toolchain", "fetch", "", "", "apt-get source kubernetes", place="on this host"),
    )
    text = plan.Plan(title="create cluster", steps=steps).with_notes("runs as root").render()
    assert text.splitlines() == [
        "create cluster: 2 steps",
        "   1. create network cluster-wide: bridge kp-demo",
        "   2. toolchain fetch on this host: apt-get source kubernetes",
        "  note: runs as root",
    ]
