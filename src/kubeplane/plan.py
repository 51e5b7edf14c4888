"""Plans and their one executor: the shape every operation shares.

A :class:`Plan` is pure data: an ordered tuple of :class:`Step` (what changes, on which node, from
what to what). ``--dry-run`` prints :meth:`Plan.render` and stops there; otherwise
:func:`execute` runs the steps in order through a ``run_step`` function the operation supplies,
reporting every event to a :class:`Progress`. ``upgrade-k8s``, ``convert-k8s``, ``cluster create``
and ``bootstrap`` are all run this way, and the CLI has one display of :class:`Progress` events
(:mod:`kubeplane.cli.progress`); the toolchain build's logged commands
(:mod:`kubeplane.provision.steps`) report through the same protocol.

This module sits in the innermost layer (beside :mod:`kubeplane.retry`) because ``ops`` and
``provision`` are sibling layers that may not import each other, yet both build plans.

Re-running. Operations are written so that a step re-reads the live state before it changes
anything and reports :data:`SKIPPED` when the state is already what the step wants. A plan is
therefore stateless: nothing is recorded between runs, and re-running the same command after a
failure (or after the process was killed) redoes only what is not done yet. The plan's
``current`` values are what was seen when it was built, for the reader; they are never trusted
when executing. Rejected alternative: a journal file of finished steps — it goes stale the moment
someone changes the cluster by hand, and the live state has to be checked anyway.

A step that fails stops the run with :class:`StepFailed`, whose message is the one resume message
of every operation: the step, the node, the cause and the exact command that continues.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, Protocol

Outcome = Literal["changed", "skipped"]
CHANGED: Outcome = "changed"
SKIPPED: Outcome = "skipped"

#: What a failed run says about re-running when the plan does not say otherwise.
RERUN_SKIPS = "steps already at their target are skipped"


@dataclasses.dataclass(frozen=True)
class Step:
    """One change: ``component`` on ``node`` (empty: ``place``, by default cluster-wide) from
    ``current`` to ``target``."""

    kind: str
    component: str
    node: str
    current: str
    target: str
    place: str = "cluster-wide"

    @property
    def where(self) -> str:
        """``on node X``, else the step's place (``cluster-wide``, ``on this host``) for messages."""
        return f"on node {self.node}" if self.node else self.place

    @property
    def up_to_date(self) -> bool:
        """Whether the plan already saw this step at its target (it will be skipped unless that changed)."""
        return self.current == self.target

    def describe(self) -> str:
        """One line: what changes where."""
        if not self.current:
            change = self.target
        elif self.up_to_date:
            change = f"{self.current} (already at target)"
        else:
            change = f"{self.current} -> {self.target}"
        return f"{self.kind} {self.component} {self.where}: {change}"


@dataclasses.dataclass(frozen=True)
class Plan:
    """An operation's steps, in execution order, with a title and notes for the reader.

    ``rerun`` says what running the resume command again does (shown when a step fails).
    """

    title: str
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()
    rerun: str = RERUN_SKIPS

    def render(self) -> str:
        """The plan as text (what ``--dry-run`` prints)."""
        lines = [f"{self.title}: {len(self.steps)} steps"]
        lines += [f"  {index:>2}. {step.describe()}" for index, step in enumerate(self.steps, start=1)]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def with_notes(self, *notes: str) -> Plan:
        """This plan with more notes for the reader."""
        return dataclasses.replace(self, notes=(*self.notes, *notes))


class Progress(Protocol):
    """Where running steps report; the CLI displays (:mod:`kubeplane.cli.progress`), tests record.

    ``total`` is 0 when the number of steps is not known in advance (the toolchain build).
    """

    def step_started(self, index: int, total: int, step: Step) -> None:
        """Step ``index`` (1-based) of ``total`` starts."""

    def info(self, message: str) -> None:
        """Something happened within the current step (a patch applied, a wait began, still running)."""

    def retrying(self, message: str) -> None:
        """A wait is not satisfied yet; ``message`` says why (``config version mismatch: ...``)."""

    def step_finished(self, index: int, step: Step, outcome: Outcome, seconds: float) -> None:
        """Step ``index`` finished (changed something or found it done) after ``seconds``."""

    def step_failed(self, index: int, step: Step, cause: BaseException, seconds: float) -> None:
        """Step ``index`` failed after ``seconds``; nothing after it runs."""


class StepFailed(Exception):
    """A step of a plan failed; nothing after it ran. ``resume`` is how to continue."""

    def __init__(
        self,
        *,
        index: int,
        total: int,
        step: Step,
        cause: BaseException,
        resume: str,
        rerun: str = RERUN_SKIPS,
    ) -> None:
        self.index = index
        self.step = step
        self.cause = cause
        self.resume = resume
        super().__init__(
            f"step {index}/{total} failed: {step.kind} {step.component} {step.where}: {cause}\n"
            f"steps before it are done; fix the cause and re-run `{resume}` to continue ({rerun})"
        )


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What executing one step did, and how long it took."""

    step: Step
    outcome: Outcome
    seconds: float


RunStep = Callable[[Step], Awaitable[Outcome]]


async def execute(
    plan: Plan,
    run_step: RunStep,
    *,
    progress: Progress,
    resume: str,
    passthrough: tuple[type[BaseException], ...] = (),
    clock: Callable[[], float] = time.monotonic,
) -> list[StepResult]:
    """Run every step of ``plan`` in order; stop at the first failure with :class:`StepFailed`.

    An error of a ``passthrough`` type is raised as it is (it is reported as the step's failure
    first): it means the operation stopped on purpose or before changing anything (the user
    answered no, a pre-pull showed the target cannot work), which a resume message would misstate.
    """
    results: list[StepResult] = []
    total = len(plan.steps)
    for index, step in enumerate(plan.steps, start=1):
        progress.step_started(index, total, step)
        started = clock()
        try:
            outcome = await run_step(step)
        except Exception as exc:
            progress.step_failed(index, step, exc, clock() - started)
            if isinstance(exc, passthrough):
                raise
            raise StepFailed(
                index=index, total=total, step=step, cause=exc, resume=resume, rerun=plan.rerun
            ) from exc
        seconds = clock() - started
        progress.step_finished(index, step, outcome, seconds)
        results.append(StepResult(step=step, outcome=outcome, seconds=seconds))
    return results


class RecordingProgress:
    """A :class:`Progress` that keeps every event as text (tests, benchmarks, quiet runs)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def step_started(self, index: int, total: int, step: Step) -> None:
        self.events.append(f"start {index}/{total} {step.component} {step.node}".rstrip())

    def info(self, message: str) -> None:
        self.events.append(f"info {message}")

    def retrying(self, message: str) -> None:
        self.events.append(f"retrying error: {message}")

    def step_finished(self, index: int, step: Step, outcome: Outcome, seconds: float) -> None:
        self.events.append(f"{outcome} {index} {step.component} {step.node}".rstrip())

    def step_failed(self, index: int, step: Step, cause: BaseException, seconds: float) -> None:
        self.events.append(f"failed {index} {step.component} {step.node}: {cause}".rstrip())


def changed_steps(results: Sequence[StepResult]) -> list[Step]:
    """The steps that changed something (the others found their target already in place)."""
    return [result.step for result in results if result.outcome == CHANGED]
