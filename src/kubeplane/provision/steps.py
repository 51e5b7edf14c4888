"""Logged commands for long provisioning work (toolchain and checkpointer image builds).

``Steps.step(name)`` is a context manager for one step with a log file and a stopwatch;
``Steps.run(argv)`` runs one command inside the current step with its output appended to the
step's log file. A failing command or an exception raised inside a step turns into
:class:`StepFailed`, which names the step, says what went wrong, quotes the last lines of the
log and points at the whole log, so a user never has to guess which of twenty minutes of
output matters.

Progress goes to a :class:`kubeplane.plan.Progress`, the same events every plan's executor
reports (so the CLI has one display for all of them): a step starts, finishes (``changed``;
``skipped`` for a cached one) or fails, and a running command's heartbeat is an ``info`` line.
Commands' output goes to the log file only (never to the terminal): the progress display is the
single voice towards the user, and heartbeats keep a long step visibly alive.
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from kubeplane import plan as plan_module

#: How often a running command reports that it is still alive.
HEARTBEAT_SECONDS = 30.0

#: How many lines of the log a failure message quotes.
TAIL_LINES = 15


class StepError(Exception):
    """Base of this module's errors."""


class StepFailed(StepError):
    """A step failed; the message names the step, the cause and the log file."""

    def __init__(self, *, step: str, reason: str, log: Path | None) -> None:
        self.step = step
        self.reason = reason
        self.log = log
        text = f"step {step!r} failed: {reason}"
        if log is not None:
            tail = _tail(log)
            if tail:
                text += "\n  last lines of the log:\n" + "\n".join(f"    {line}" for line in tail)
            text += f"\n  full log: {log}"
        super().__init__(text)


def _tail(log: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with log.open("r", errors="replace") as handle:
            return [line.rstrip("\n") for line in collections.deque(handle, maxlen=lines)]
    except OSError:
        return []


class Steps:
    """Runs named steps with one log file each under ``log_dir`` and reports them to ``progress``.

    Each step is reported as a :class:`kubeplane.plan.Step` of ``kind`` (``toolchain``,
    ``image``) on this host, numbered in order (the total is not known in advance).
    """

    def __init__(self, log_dir: Path, progress: plan_module.Progress | None = None, *, kind: str) -> None:
        self.log_dir = log_dir
        self.progress = progress if progress is not None else plan_module.RecordingProgress()
        self.kind = kind
        self._count = 0
        self._current: tuple[str, Path, float] | None = None

    def log_path(self, name: str) -> Path:
        """Where the log of step ``name`` goes."""
        return self.log_dir / f"{name}.log"

    def _started(self, name: str, detail: str) -> tuple[int, plan_module.Step]:
        self._count += 1
        step = plan_module.Step(self.kind, name, "", "", detail, place="on this host")
        self.progress.step_started(self._count, 0, step)
        return self._count, step

    def cached(self, name: str, detail: str = "") -> None:
        """Report that step ``name`` had nothing to do."""
        index, step = self._started(name, detail)
        self.progress.step_finished(index, step, plan_module.SKIPPED, 0.0)

    @contextlib.contextmanager
    def step(self, name: str, detail: str = "") -> Iterator[Path]:
        """Run the body as step ``name``; yields the step's (fresh) log file path."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(name)
        log.write_text("")
        started = time.monotonic()
        self._current = (name, log, started)
        index, step = self._started(name, detail)
        try:
            yield log
        except StepFailed as exc:
            self.progress.step_failed(index, step, exc, time.monotonic() - started)
            raise
        except Exception as exc:
            # Any error inside a step is reported as that step's failure; the traceback goes
            # to the log so a programming error is still diagnosable.
            with log.open("a") as handle:
                handle.write("".join(traceback.format_exception(exc)))
            failed = StepFailed(step=name, reason=str(exc), log=log)
            self.progress.step_failed(index, step, failed, time.monotonic() - started)
            raise failed from exc
        finally:
            self._current = None
        self.progress.step_finished(index, step, plan_module.CHANGED, time.monotonic() - started)

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        capture: bool = False,
    ) -> str:
        """Run ``argv`` inside the current step, logging its output; returns stdout if ``capture``.

        A non-zero exit raises :class:`StepFailed` for the current step.
        """
        if self._current is None:
            raise StepError("Steps.run() called outside a step; wrap it in `with steps.step(name):`")
        name, log, started = self._current
        with log.open("a") as handle:
            handle.write(f"$ {' '.join(argv)}\n")
            handle.flush()
            try:
                proc = subprocess.Popen(
                    list(argv),
                    cwd=cwd,
                    env=dict(env) if env is not None else None,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE if capture else handle,
                    stderr=handle,
                    text=True,
                )
            except OSError as exc:
                raise StepFailed(step=name, reason=f"cannot run {argv[0]!r}: {exc}", log=log) from exc
            out = self._wait(proc, name=name, log=log, started=started, capture=capture)
            if capture:
                handle.write(out)
        if proc.returncode != 0:
            raise StepFailed(
                step=name, reason=f"{' '.join(argv[:3])} ... exited with status {proc.returncode}", log=log
            )
        return out

    def _wait(
        self, proc: subprocess.Popen[str], *, name: str, log: Path, started: float, capture: bool
    ) -> str:
        if capture:
            # Captured commands are short queries; a heartbeat would only add noise.
            out, _ = proc.communicate()
            return out
        while True:
            try:
                proc.wait(timeout=HEARTBEAT_SECONDS)
                return ""
            except subprocess.TimeoutExpired:
                last = next((line.strip() for line in reversed(_tail(log, 5)) if line.strip()), "")
                detail = last if len(last) <= 80 else last[:77] + "..."
                elapsed = time.monotonic() - started
                self.progress.info(
                    f"{name}: still running after {elapsed:.0f}s" + (f": {detail}" if detail else "")
                )


def env_with(overrides: Mapping[str, str]) -> dict[str, str]:
    """The current environment with ``overrides`` applied."""
    env = dict(os.environ)
    env.update(overrides)
    return env
