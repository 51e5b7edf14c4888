"""Controller runtime: chains, coalescing, backoff, output enforcement, strong inputs, timers."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence

import pytest

from kubeplane.resources import (
    FinalizersPendingError,
    Namespace,
    Phase,
    Registry,
    ResourceDefinition,
    Spec,
    State,
)
from kubeplane.runtime import (
    LOGGER_NAME,
    Input,
    InputKind,
    Output,
    OutputKind,
    OutputNotDeclaredError,
    ReconcileContext,
    RegistrationError,
    Runtime,
)

pytestmark = pytest.mark.unit

NS = "test"
SOURCES = "Sources.test.kubeplane.dev"
MIDDLES = "Middles.test.kubeplane.dev"
SINKS = "Sinks.test.kubeplane.dev"


@dataclasses.dataclass(frozen=True)
class ValueSpec(Spec):
    value: int = 0


def make_state(*, history_size: int = 1024) -> State:
    registry = Registry(
        namespaces=[Namespace(NS)],
        definitions=[
            ResourceDefinition(
                type=name, display_type=name.split(".")[0][:-1], default_namespace=NS, spec_type=ValueSpec
            )
            for name in (SOURCES, MIDDLES, SINKS)
        ],
    )
    return State(registry, history_size=history_size)


@dataclasses.dataclass
class FakeController:
    """A controller whose reconcile is a test function; counts its runs."""

    name: str
    inputs: Sequence[Input]
    outputs: Sequence[Output]
    body: Callable[[ReconcileContext], object]
    runs: int = 0

    async def reconcile(self, ctx: ReconcileContext) -> None:
        self.runs += 1
        result = self.body(ctx)
        if asyncio.iscoroutine(result):
            await result


def copy_to(target: str) -> Callable[[ReconcileContext], None]:
    """Reconcile body: mirror every input resource into ``target`` with value + 1, clean up the rest."""

    def body(ctx: ReconcileContext) -> None:
        source = {SINKS: MIDDLES, MIDDLES: SOURCES}[target]
        keep = []
        for resource in ctx.list(NS, source):
            value = resource.spec.value + 1  # type: ignore[attr-defined]
            ctx.modify(NS, target, resource.id, lambda _, v=value: ValueSpec(v))  # type: ignore[misc]
            keep.append(resource.id)
        ctx.cleanup(NS, target, keep)

    return body


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


def test_controller_chain_propagates_changes_and_cleans_up() -> None:
    async def scenario() -> None:
        state = make_state()
        runtime = Runtime(state)
        runtime.register(FakeController("test.A", [Input(NS, SOURCES)], [Output(MIDDLES)], copy_to(MIDDLES)))
        runtime.register(FakeController("test.B", [Input(NS, MIDDLES)], [Output(SINKS)], copy_to(SINKS)))
        state.create(NS, SOURCES, "x", spec=ValueSpec(1))
        async with runtime:
            await wait_until(lambda: state.find(NS, SINKS, "x") is not None)
            sink = state.get(NS, SINKS, "x")
            assert (sink.spec, sink.metadata.owner) == (ValueSpec(3), "test.B")
            state.modify(NS, SOURCES, "x", lambda _: ValueSpec(10))
            await wait_until(lambda: state.get(NS, SINKS, "x").spec == ValueSpec(12))
            state.destroy(NS, SOURCES, "x")
            await wait_until(lambda: state.find(NS, SINKS, "x") is None)
            assert state.find(NS, MIDDLES, "x") is None

    asyncio.run(scenario())


def test_changes_during_a_reconcile_coalesce_into_one_more_run() -> None:
    async def scenario() -> None:
        state = make_state()
        gate = asyncio.Event()
        started = asyncio.Event()

        async def body(ctx: ReconcileContext) -> None:
            started.set()
            await gate.wait()

        controller = FakeController("test.Slow", [Input(NS, SOURCES)], [], body)
        runtime = Runtime(state)
        runtime.register(controller)
        async with runtime:
            await started.wait()
            for value in range(5):
                state.modify(NS, SOURCES, "x", lambda _, v=value: ValueSpec(v))  # type: ignore[misc]
            await asyncio.sleep(0.01)
            gate.set()
            await wait_until(lambda: controller.runs == 2)
            await asyncio.sleep(0.02)
            assert controller.runs == 2

    asyncio.run(scenario())


def test_failing_controller_is_retried_with_exponential_backoff_and_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> list[float]:
        times: list[float] = []

        def body(ctx: ReconcileContext) -> None:
            times.append(time.monotonic())
            if len(times) <= 4:
                raise RuntimeError(f"boom {len(times)}")

        controller = FakeController("k8s.FlakyController", [], [], body)
        runtime = Runtime(make_state(), backoff_initial=0.01, backoff_max=0.04)
        runtime.register(controller)
        async with runtime:
            await wait_until(lambda: len(times) == 5)
        return times

    with caplog.at_level(logging.ERROR, logger=LOGGER_NAME):
        times = asyncio.run(scenario())
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert gaps[0] >= 0.01
    assert gaps[1] >= 0.02
    assert gaps[2] >= 0.04
    assert gaps[3] >= 0.04 and gaps[3] < 0.2  # capped at backoff_max
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    assert messages[:2] == [
        "k8s.FlakyController: controller failed: boom 1",
        "k8s.FlakyController: controller failed: boom 2",
    ]
    assert caplog.records[0].controller == "k8s.FlakyController"  # type: ignore[attr-defined]


def test_writes_to_undeclared_outputs_are_refused() -> None:
    async def scenario() -> None:
        state = make_state()
        errors: list[Exception] = []

        def body(ctx: ReconcileContext) -> None:
            try:
                ctx.create(NS, SINKS, "x", spec=ValueSpec())
            except OutputNotDeclaredError as exc:
                errors.append(exc)

        runtime = Runtime(state)
        runtime.register(FakeController("test.Sneaky", [], [Output(MIDDLES)], body))
        async with runtime:
            await wait_until(lambda: bool(errors))
        assert "controller test.Sneaky wrote Sinks.test.kubeplane.dev" in str(errors[0])
        assert "(Middles.test.kubeplane.dev)" in str(errors[0])
        assert state.list(NS, SINKS) == []

    asyncio.run(scenario())


def test_registration_refuses_duplicate_names_and_clashing_exclusive_outputs() -> None:
    runtime = Runtime(make_state())
    runtime.register(FakeController("test.A", [], [Output(MIDDLES)], lambda ctx: None))
    with pytest.raises(RegistrationError, match=r"named test\.A is already registered"):
        runtime.register(FakeController("test.A", [], [], lambda ctx: None))
    with pytest.raises(RegistrationError, match=r"but test\.A already declares it"):
        runtime.register(FakeController("test.B", [], [Output(MIDDLES, OutputKind.SHARED)], lambda ctx: None))
    runtime.register(FakeController("test.C", [], [Output(SINKS, OutputKind.SHARED)], lambda ctx: None))
    runtime.register(FakeController("test.D", [], [Output(SINKS, OutputKind.SHARED)], lambda ctx: None))
    assert runtime.controller_names == ["test.A", "test.C", "test.D"]


def test_requeue_after_reruns_without_input_changes() -> None:
    async def scenario() -> None:
        def body(ctx: ReconcileContext) -> None:
            ctx.requeue_after(0.005)

        controller = FakeController("test.Poller", [], [], body)
        runtime = Runtime(make_state())
        runtime.register(controller)
        async with runtime:
            await wait_until(lambda: controller.runs >= 3)

    asyncio.run(scenario())


def test_strong_input_holds_a_finalizer_until_the_consumer_lets_go() -> None:
    async def scenario() -> None:
        state = make_state()
        seen_teardown: list[str] = []

        def produce(ctx: ReconcileContext) -> None:
            wanted = [] if ctx.find(NS, SOURCES, "stop") else ["x"]
            for resource_id in wanted:
                ctx.modify(NS, MIDDLES, resource_id, lambda _: ValueSpec(1))
            ctx.cleanup(NS, MIDDLES, wanted)

        def consume(ctx: ReconcileContext) -> None:
            for resource in ctx.list(NS, MIDDLES):
                if resource.metadata.phase is Phase.TEARING_DOWN:
                    seen_teardown.append(resource.id)

        runtime = Runtime(state)
        runtime.register(FakeController("test.Producer", [Input(NS, SOURCES)], [Output(MIDDLES)], produce))
        runtime.register(
            FakeController("test.Consumer", [Input(NS, MIDDLES, kind=InputKind.STRONG)], [], consume)
        )
        async with runtime:
            await wait_until(
                lambda: (
                    (r := state.find(NS, MIDDLES, "x")) is not None
                    and "test.Consumer" in r.metadata.finalizers
                )
            )
            with pytest.raises(FinalizersPendingError):
                state.destroy(NS, MIDDLES, "x", owner="test.Producer")
            state.create(NS, SOURCES, "stop", spec=ValueSpec())
            await wait_until(lambda: state.find(NS, MIDDLES, "x") is None)
        assert seen_teardown == ["x"]

    asyncio.run(scenario())


def test_input_watch_that_falls_behind_rewatches_and_reconciles(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> int:
        state = make_state(history_size=2)
        controller = FakeController("test.Lagging", [Input(NS, SOURCES)], [], lambda ctx: None)
        runtime = Runtime(state)
        runtime.register(controller)
        async with runtime:
            await wait_until(lambda: controller.runs == 1)
            # A burst without yielding overflows the history before the watch task runs again.
            for value in range(10):
                state.modify(NS, SOURCES, "x", lambda _, v=value: ValueSpec(v))  # type: ignore[misc]
            await wait_until(lambda: controller.runs >= 2)
            state.modify(NS, SOURCES, "x", lambda _: ValueSpec(100))
            runs = controller.runs
            await wait_until(lambda: controller.runs > runs)  # the new watch delivers changes again
        return controller.runs

    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        asyncio.run(scenario())
    assert any("test.Lagging: watch of test/Sources" in r.getMessage() for r in caplog.records)


def test_backoff_resets_after_a_successful_reconcile() -> None:
    async def scenario() -> list[float]:
        times: list[float] = []
        fail_on = {1, 2, 3, 5}

        def body(ctx: ReconcileContext) -> None:
            times.append(time.monotonic())
            if len(times) in fail_on:
                raise RuntimeError("boom")

        controller = FakeController("test.Flaky", [Input(NS, SOURCES)], [], body)
        state = make_state()
        runtime = Runtime(state, backoff_initial=0.01, backoff_max=1.0)
        runtime.register(controller)
        async with runtime:
            await wait_until(lambda: len(times) == 4)
            state.create(NS, SOURCES, "x", spec=ValueSpec())
            await wait_until(lambda: len(times) == 6)
        return times

    times = asyncio.run(scenario())
    # Failures 1-3 waited 10, 20, 40 ms; run 4 succeeded, so failure 5 waits 10 ms again, not 80.
    assert times[3] - times[2] >= 0.04
    assert 0.01 <= times[5] - times[4] < 0.07


def test_an_input_change_cuts_the_backoff_of_a_failing_controller_short() -> None:
    async def scenario() -> tuple[list[float], float]:
        times: list[float] = []

        def body(ctx: ReconcileContext) -> None:
            times.append(time.monotonic())
            if not ctx.state.list(NS, SOURCES):
                raise RuntimeError("no source yet")

        controller = FakeController("test.WaitsForInput", [Input(NS, SOURCES)], [], body)
        state = make_state()
        runtime = Runtime(state, backoff_initial=10.0, backoff_max=10.0)
        runtime.register(controller)
        async with runtime:
            await wait_until(lambda: len(times) == 1)
            changed = time.monotonic()
            state.create(NS, SOURCES, "x", spec=ValueSpec())
            await wait_until(lambda: len(times) == 2)
        return times, changed

    times, changed = asyncio.run(scenario())
    # Retried right after the change, not after the 10 s backoff.
    assert times[1] - changed < 1.0


def test_a_long_wait_is_a_background_task_whose_end_queues_the_controller() -> None:
    """The reconcile returns at once; input changes keep reaching the controller while the wait is
    pending; the wait's end queues one more reconcile, which reads the task's result."""

    async def scenario() -> None:
        released = asyncio.Event()
        seen: list[str] = []

        async def wait_for_release() -> str:
            await released.wait()
            return "released"

        def body(ctx: ReconcileContext) -> None:
            task = ctx.task("wait")
            if task is None:
                ctx.start_task("wait", wait_for_release())
                seen.append("started")
            elif task.done():
                seen.append(task.result())
            else:
                seen.append("still waiting")

        controller = FakeController("test.Waiter", [Input(NS, SOURCES)], [], body)
        state = make_state()
        runtime = Runtime(state)
        runtime.register(controller)
        async with runtime:
            await wait_until(lambda: seen == ["started"])
            state.create(NS, SOURCES, "x", spec=ValueSpec())
            await wait_until(lambda: seen == ["started", "still waiting"])
            await asyncio.sleep(0.02)
            assert controller.runs == 2, "a pending background task queues nothing by itself"
            released.set()
            await wait_until(lambda: seen == ["started", "still waiting", "released"])
            await asyncio.sleep(0.02)
            assert controller.runs == 3

    asyncio.run(scenario())


def test_a_replaced_or_stopped_background_task_is_cancelled_and_queues_nothing() -> None:
    async def scenario() -> None:
        tasks: list[asyncio.Task[object]] = []
        stopped: list[asyncio.Task[object] | None] = []

        async def body(ctx: ReconcileContext) -> None:
            if controller.runs == 1:
                tasks.append(ctx.start_task("wait", asyncio.Event().wait()))
                tasks.append(ctx.start_task("wait", asyncio.Event().wait()))
                tasks.append(ctx.start_task("other", asyncio.Event().wait()))
            elif controller.runs == 2:
                stopped.append(await ctx.stop_task("wait"))
                stopped.append(await ctx.stop_task("missing"))

        controller = FakeController("test.Replacer", [Input(NS, SOURCES)], [], body)
        state = make_state()
        runtime = Runtime(state)
        runtime.register(controller)
        async with runtime:
            await wait_until(lambda: len(tasks) == 3)
            await asyncio.sleep(0.02)
            assert tasks[0].cancelled(), "starting a task of the same name cancels the running one"
            assert controller.runs == 1, "a replaced task's end queues nothing"
            state.create(NS, SOURCES, "x", spec=ValueSpec())
            await wait_until(lambda: len(stopped) == 2)
            assert stopped == [tasks[1], None]
            assert tasks[1].cancelled(), "stop_task waits until the task has ended"
            await asyncio.sleep(0.02)
            assert controller.runs == 2, "a stopped task's end queues nothing"
            assert not tasks[2].done()
        assert tasks[2].cancelled(), "stopping the runtime cancels the background tasks"

    asyncio.run(scenario())


def test_a_failing_background_task_queues_the_controller_with_its_error() -> None:
    async def scenario() -> list[str]:
        errors: list[str] = []

        async def fail() -> None:
            await asyncio.sleep(0.01)
            raise ValueError("lost the lock")

        async def body(ctx: ReconcileContext) -> None:
            task = await ctx.stop_task("work")
            if task is None:
                ctx.start_task("work", fail())
                return
            exception = task.exception()
            errors.append(str(exception))

        controller = FakeController("test.Failer", [], [], body)
        runtime = Runtime(make_state())
        runtime.register(controller)
        async with runtime:
            await wait_until(lambda: bool(errors))
        return errors

    assert asyncio.run(scenario()) == ["lost the lock"]
