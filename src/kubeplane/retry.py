"""Poll until done or a deadline passes: the one wait/retry loop of kubeplane.

:meth:`Wait.poll` (blocking) and :meth:`Wait.poll_async` call ``attempt`` until it returns a
truthy value and return that value::

    pod = retry.Wait(what="pod x to be Ready", timeout=180, retry_on=(Unavailable,)).poll(read_pod)
 An attempt that is not done yet says so in one of three ways:

- it returns a falsy value (``None``, ``False``, an empty list ...);
- it raises :class:`NotYet` with the reason (``"pod x is not Ready yet"``);
- it raises an exception of one of the ``retry_on`` classes (a server that could not answer now).

Any other exception propagates at once: retryable errors are chosen by type, never by the words
of a message. Between attempts the loop sleeps as :class:`Backoff` says (never past the deadline)
and calls ``progress`` with an :class:`Attempt`, so a caller can print
``retrying error: ...`` or ``waiting for X (12s)``. When the deadline passes, it raises
``error(message)`` (default :class:`WaitTimeout`); the message names what was awaited and the
last reason or error seen: ``timed out after 30s waiting for X (last error: ...)``.

This module imports nothing from kubeplane, so every layer may use it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import NoReturn, TypeVar, cast

T = TypeVar("T")


class WaitTimeout(Exception):
    """A wait ran out of time; the message says what was awaited and the last error seen."""


class NotYet(Exception):
    """Raised by an attempt that is not done yet; the message says why (always retried)."""


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Seconds between attempts: ``initial``, times ``factor`` after each one, at most ``maximum``."""

    initial: float = 1.0
    factor: float = 1.0
    maximum: float = 30.0

    def delays(self) -> Iterator[float]:
        delay = self.initial
        while True:
            yield min(delay, self.maximum)
            delay *= self.factor


def fixed(interval: float) -> Backoff:
    """The same ``interval`` between every two attempts."""
    return Backoff(initial=interval, factor=1.0, maximum=interval)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt that was not done (what :func:`poll` hands to ``progress``)."""

    what: str
    number: int
    elapsed: float
    #: Why not done: the :class:`NotYet` text, the error on one line, or ``last result: ...``.
    reason: str
    #: The retryable exception the attempt raised (None for :class:`NotYet` or a falsy result).
    error: BaseException | None = None
    #: Whether the attempt raised :class:`NotYet`.
    not_yet: bool = False


Progress = Callable[[Attempt], None]
Clock = Callable[[], float]


def one_line(exc: BaseException) -> str:
    """``exc`` as one line of at most 300 characters (its type name when it has no text)."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__


@dataclasses.dataclass(frozen=True)
class Wait:
    """What to wait for and how: ``Wait(what=..., timeout=...).poll(attempt)``.

    ``what`` completes ``waiting for ...``; ``hint`` (where to look, how to resume) ends the
    timeout message; ``error`` makes the timeout exception from the message.
    """

    what: str
    timeout: float
    backoff: Backoff = Backoff()
    retry_on: tuple[type[BaseException], ...] = ()
    progress: Progress | None = None
    error: Callable[[str], BaseException] = WaitTimeout
    hint: str = ""
    clock: Clock = time.monotonic

    def poll(self, attempt: Callable[[], T], *, sleep: Callable[[float], object] = time.sleep) -> T:
        """Call ``attempt`` until it returns a truthy value and return it (see the module docstring)."""
        run = _Run(self)
        while not run.settled(_outcome(attempt)):
            sleep(run.delay)
        return cast(T, run.value)

    async def poll_async(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> T:
        """:meth:`poll` for a coroutine ``attempt``, sleeping with ``sleep`` (``asyncio.sleep``)."""
        run = _Run(self)
        while not run.settled(await _outcome_async(attempt)):
            await sleep(run.delay)
        return cast(T, run.value)


@dataclasses.dataclass(frozen=True)
class _Outcome:
    value: object = None
    error: Exception | None = None


def _outcome(attempt: Callable[[], object]) -> _Outcome:
    try:
        return _Outcome(value=attempt())
    except Exception as exc:
        return _Outcome(error=exc)


async def _outcome_async(attempt: Callable[[], Awaitable[object]]) -> _Outcome:
    try:
        return _Outcome(value=await attempt())
    except Exception as exc:
        return _Outcome(error=exc)


class _Run:
    """One wait under way: its deadline, the delays left, the last attempt that was not done."""

    def __init__(self, wait: Wait) -> None:
        self.wait = wait
        self.started = wait.clock()
        self.deadline = self.started + wait.timeout
        self.delays = wait.backoff.delays()
        self.number = 0
        self.last: Attempt | None = None
        self.value: object = None
        self.delay = 0.0

    def settled(self, outcome: _Outcome) -> bool:
        """True when ``outcome`` is the result; else record it and set :attr:`delay`.

        A non-retryable error is raised here; so is the timeout error once the deadline passed.
        """
        exc = outcome.error
        if exc is None and outcome.value:
            self.value = outcome.value
            return True
        if exc is None:
            self._failed(reason=f"last result: {outcome.value!r}")
        elif isinstance(exc, NotYet):
            self._failed(reason=one_line(exc), not_yet=True)
        elif isinstance(exc, self.wait.retry_on):
            self._failed(reason=one_line(exc), error=exc)
        else:
            raise exc
        return False

    def _failed(self, *, reason: str, error: BaseException | None = None, not_yet: bool = False) -> None:
        self.number += 1
        now = self.wait.clock()
        self.last = Attempt(self.wait.what, self.number, now - self.started, reason, error, not_yet)
        if self.wait.progress is not None:
            self.wait.progress(self.last)
        if now >= self.deadline:
            self._expire(self.last)
        self.delay = min(next(self.delays), self.deadline - now)

    def _expire(self, last: Attempt) -> NoReturn:
        detail = f"last error: {last.reason}" if last.error is not None else last.reason
        message = f"timed out after {self.wait.timeout:g}s waiting for {self.wait.what} ({detail})"
        if self.wait.hint:
            message += f"; {self.wait.hint}"
        raise self.wait.error(message) from last.error
