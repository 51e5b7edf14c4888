"""Plans and their executor: the shape every cluster-wide operation shares.

A :class:`Plan` is pure data: an ordered tuple of :class:`Step` (what changes, on which node, from
what to what). ``--dry-run`` prints :meth:`Plan.render` and stops there; otherwise
:func:`execute` runs the steps in order through a ``run_step`` function the operation supplies,
reporting to a :class:`Progress`.

Re-running. Operations are written so that a step re-reads the live state before it changes
anything and reports :data:`SKIPPED` when the state is already what the step wants. A plan is
therefore stateless: nothing is recorded between runs, and re-running the same command after a
failure (or after the process was killed) redoes only what is not done yet. The plan's
``current`` values are what was seen when it was built, for the reader; they are never trusted
when executing. Rejected alternative: a journal file of finished steps — it goes stale the moment
someone changes the cluster by hand, and the live state has to be checked anyway.

A step that fails stops the run with :class:`StepFailed`, which names the step, the node, the
cause and the command that resumes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, Protocol

from kubeplane.ops.errors import OpsError

Outcome = Literal["changed", "skipped"]
CHANGED: Outcome = "changed"
SKIPPED: Outcome = "skipped"


@dataclasses.dataclass(frozen=True)
class Step:
    """One change: ``component`` on ``node`` (empty: cluster-wide) from ``current`` to ``target``."""

    kind: str
    component: str
    node: str
    current: str
    target: str

    @property
    def where(self) -> str:
        """``on node X`` or ``cluster-wide`` for messages."""
        return f"on node {self.node}" if self.node else "cluster-wide"

    @property
    def up_to_date(self) -> bool:
        """Whether the plan already saw this step at its target (it will be skipped unless that changed)."""
        return self.current == self.target

    def describe(self) -> str:
        """One line: what changes where."""
        change = (
            f"{self.current} (already at target)" if self.up_to_date else f"{self.current} -> {self.target}"
        )
        return f"{self.kind} {self.component} {self.where}: {change}"


@dataclasses.dataclass(frozen=True)
class Plan:
    """An operation's steps, in execution order, with a title and notes for the reader."""

    title: str
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()

    def render(self) -> str:
        """The plan as text (what ``--dry-run`` prints)."""
        lines = [f"{self.title}: {len(self.steps)} steps"]
        lines += [f"  {index:>2}. {step.describe()}" for index, step in enumerate(self.steps, start=1)]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


class Progress(Protocol):
    """Where an executing plan reports; the CLI prints, tests record."""

    def step_started(self, index: int, total: int, step: Step) -> None:
        """Step ``index`` (1-based) of ``total`` starts."""

    def info(self, message: str) -> None:
        """Something happened within the current step (a patch applied, a wait began)."""

    def retrying(self, message: str) -> None:
        """A wait is not satisfied yet; ``message`` says why (``config version mismatch: ...``)."""

    def step_finished(self, index: int, step: Step, outcome: Outcome, seconds: float) -> None:
        """Step ``index`` finished (changed something or found it done) after ``seconds``."""


class StepFailed(OpsError):
    """A step of a plan failed; nothing after it ran. ``resume`` is how to continue."""

    def __init__(self, *, index: int, total: int, step: Step, cause: BaseException, resume: str) -> None:
        self.index = index
        self.step = step
        self.cause = cause
        self.resume = resume
        super().__init__(
            f"step {index}/{total} failed: {step.kind} {step.component} {step.where}: {cause}\n"
            f"steps before it are done; fix the cause and re-run `{resume}` to continue "
            "(steps already at their target are skipped)"
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
    clock: Callable[[], float] = time.monotonic,
) -> list[StepResult]:
    """Run every step of ``plan`` in order; stop at the first failure with :class:`StepFailed`."""
    results: list[StepResult] = []
    total = len(plan.steps)
    for index, step in enumerate(plan.steps, start=1):
        progress.step_started(index, total, step)
        started = clock()
        try:
            outcome = await run_step(step)
        except Exception as exc:
            raise StepFailed(index=index, total=total, step=step, cause=exc, resume=resume) from exc
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


def changed_steps(results: Sequence[StepResult]) -> list[Step]:
    """The steps that changed something (the others found their target already in place)."""
    return [result.step for result in results if result.outcome == CHANGED]
