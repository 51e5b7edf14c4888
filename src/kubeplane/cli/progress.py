"""The one progress display of every operation: the :class:`kubeplane.plan.Progress` the CLI uses.

``upgrade-k8s``, ``convert-k8s``, ``cluster create``, ``bootstrap`` and ``toolchain build`` all
report here, on stderr (stdout keeps what a command produces: plans, documents, results).

On a terminal it is a live view (rich): each finished step stays as one line (done, skipped or
failed, with its time), what happens inside a step is printed dimmed above, and the running step
is a spinner line with its elapsed time and the latest "not yet" reason of its wait.

Elsewhere (a pipe, CI, tests) it prints one plain line per event, which tests and scripts read::

    [3/14] static-pod kube-apiserver on node 10.5.0.2: k8s.gcr.io/kube-apiserver:v1.20.3
     > patched /cluster/apiServer/image = k8s.gcr.io/kube-apiserver:v1.20.3 on node 10.5.0.2 (mode immediate)
    2026/01/02 03:04:05 retrying error: config version mismatch: got "2", expected "3"
     < done (41.2s)

A ``retrying`` line repeating the previous one within :data:`REPEAT_AFTER` seconds is dropped.
Prompts (``convert-k8s`` asks twice) run inside :meth:`Display.paused`, so the live view never
draws over the question.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Iterator

import click
from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from kubeplane import plan as plan_module

#: A repeated identical "retrying error" line is printed again only after this many seconds.
REPEAT_AFTER = 10.0


def headline(index: int, total: int, step: plan_module.Step) -> str:
    """``[3/14] static-pod kube-apiserver on node 10.5.0.2: <target>`` (``[3]`` when the total is unknown)."""
    count = f"{index}/{total}" if total else str(index)
    return f"[{count}] {step.kind} {step.component} {step.where}: {step.target}"


def finished(outcome: plan_module.Outcome, seconds: float) -> str:
    """``done (1.2s)`` or ``already at target, skipped (0.1s)``."""
    what = "done" if outcome == plan_module.CHANGED else "already at target, skipped"
    return f"{what} ({seconds:.1f}s)"


class Display:
    """Live on a terminal, one line per event elsewhere (see the module docstring)."""

    def __init__(
        self,
        *,
        console: Console | None = None,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._console = console or Console(stderr=True, highlight=False)
        self._live_view = self._console.is_terminal if live is None else live
        self._clock = clock
        self._live: Live | None = None
        #: Headline and start time of each running step, innermost last (a registry step builds
        #: the checkpointer image in steps of its own).
        self._running: list[tuple[str, float]] = []
        self._waiting = ""
        self._last: tuple[str, float] | None = None

    # -- plan.Progress --

    def step_started(self, index: int, total: int, step: plan_module.Step) -> None:
        self._last = None
        line = headline(index, total, step)
        if not self._live_view:
            click.echo(line, err=True)
            return
        self._running.append((line, self._clock()))
        self._waiting = ""
        if self._live is None:
            self._live = Live(
                self._status(),
                console=self._console,
                refresh_per_second=4,
                transient=True,
                get_renderable=self._status,
            )
            self._live.start()

    def info(self, message: str) -> None:
        if not self._live_view:
            click.echo(f" > {message}", err=True)
            return
        self._console.print(Text(f"    {message}", style="dim"))

    def retrying(self, message: str) -> None:
        if self._live_view:
            self._waiting = message
            return
        now = self._clock()
        if self._last is not None and self._last[0] == message and now - self._last[1] < REPEAT_AFTER:
            return
        self._last = (message, now)
        stamp = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S")
        click.echo(f"{stamp} retrying error: {message}", err=True)

    def step_finished(
        self, index: int, step: plan_module.Step, outcome: plan_module.Outcome, seconds: float
    ) -> None:
        if not self._live_view:
            click.echo(f" < {finished(outcome, seconds)}", err=True)
            return
        mark = Text("✓ ", style="green") if outcome == plan_module.CHANGED else Text("- ", style="cyan")
        self._done(mark + Text(f"{self._line(step, index)}  {finished(outcome, seconds)}"))

    def step_failed(self, index: int, step: plan_module.Step, cause: BaseException, seconds: float) -> None:
        if not self._live_view:
            click.echo(f" < FAILED ({seconds:.1f}s): {cause}", err=True)
            return
        self._done(Text("✗ ", style="bold red") + Text(f"{self._line(step, index)}  FAILED ({seconds:.1f}s)"))

    # -- around prompts and at the end --

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Stop drawing the live view while the body runs (a prompt), then go on."""
        live = self._live
        if live is not None:
            live.stop()
        try:
            yield
        finally:
            if live is not None:
                live.start()

    def close(self) -> None:
        """End the live view (idempotent)."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- the live view --

    def _line(self, step: plan_module.Step, index: int) -> str:
        return self._running[-1][0] if self._running else headline(index, 0, step)

    def _done(self, line: Text) -> None:
        if self._running:
            self._running.pop()
        self._waiting = ""
        self._console.print(line)
        if not self._running:
            # Live only while a step runs: what the command prints between steps stays clean.
            self.close()

    def _status(self) -> Group:
        if not self._running:
            return Group()
        line, started = self._running[-1]
        spinner = Spinner("dots", text=Text(f"{line}  {self._clock() - started:.0f}s"))
        return (
            Group(spinner, Text(f"    {self._waiting}", style="yellow")) if self._waiting else Group(spinner)
        )


@contextlib.contextmanager
def display() -> Iterator[Display]:
    """A :class:`Display` for one command; its live view ends with the block."""
    shown = Display()
    try:
        yield shown
    finally:
        shown.close()
