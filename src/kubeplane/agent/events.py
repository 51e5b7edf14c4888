"""The node's event stream: what happened on this node, in order, for ``kubeplane events``.

Five kinds of event, each with a subject and a one-line message:

- ``sequence``: the node's own life (maintenance mode, boot, booted, reboot, halt, bootstrap);
- ``config``: an applied or staged machine config (the mode and the outcome, never the content);
- ``service``: a supervised service changing state (``etcd: [Running] Health check successful``);
- ``controller``: a controller's reconcile failing (the error it logged);
- ``pki``: a client certificate signed for a caller (its name, roles and expiry).

:class:`EventLog` keeps the last :data:`CAPACITY` events in memory (a restarted agent starts a new
history, as the original's did) with increasing ids, and lets any number of followers read the
history then the live events. Emitting never blocks and is safe from any thread; a follower that
fell so far behind that events it had not read were dropped is told how many.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

Kind = Literal["sequence", "config", "service", "controller", "pki"]

#: How many events the node keeps.
CAPACITY = 1000


@dataclasses.dataclass(frozen=True)
class Event:
    """One event; ``id`` increases by one per event within an agent's lifetime."""

    id: int
    timestamp: float
    kind: Kind
    subject: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class EventLog:
    """A bounded, followable history of events (see the module docstring)."""

    def __init__(self, *, capacity: int = CAPACITY, clock: Callable[[], float] = time.time) -> None:
        self._events: collections.deque[Event] = collections.deque(maxlen=capacity)
        self._next_id = 1
        self._clock = clock
        self._lock = threading.Lock()
        self._followers: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def emit(self, kind: Kind, subject: str, message: str) -> Event:
        """Record an event and wake the followers; callable from any thread."""
        with self._lock:
            event = Event(self._next_id, self._clock(), kind, subject, message)
            self._next_id += 1
            self._events.append(event)
            followers = list(self._followers)
        for loop, wake in followers:
            if not loop.is_closed():
                loop.call_soon_threadsafe(wake.set)
        return event

    def history(self, *, since: float | None = None, tail: int | None = None) -> list[Event]:
        """The kept events, oldest first: those at or after ``since`` (a time), the last ``tail``."""
        with self._lock:
            kept = list(self._events)
        return _select(kept, since=since, tail=tail)

    async def follow(self, *, since: float | None = None, tail: int | None = None) -> AsyncIterator[Event]:
        """The history (as :meth:`history`), then every new event as it is emitted, until cancelled.

        When events the follower had not read yet were dropped for room, it first gets a
        ``sequence`` event (id 0) saying how many.
        """
        wake = asyncio.Event()
        follower = (asyncio.get_running_loop(), wake)
        with self._lock:
            # Registered and read in one step: an event emitted meanwhile is either in the
            # backlog or wakes this follower, never neither.
            self._followers.add(follower)
            kept = list(self._events)
            last = self._next_id - 1
        try:
            for event in _select(kept, since=since, tail=tail):
                yield event
            while True:
                await wake.wait()
                wake.clear()
                with self._lock:
                    fresh = [e for e in self._events if e.id > last]
                    oldest = self._events[0].id if self._events else last + 1
                if oldest > last + 1:
                    yield Event(
                        0,
                        self._clock(),
                        "sequence",
                        "events",
                        f"{oldest - last - 1} events were dropped before this follower read them",
                    )
                for event in fresh:
                    yield event
                if fresh:
                    last = fresh[-1].id
        finally:
            with self._lock:
                self._followers.discard(follower)


def _select(events: list[Event], *, since: float | None, tail: int | None) -> list[Event]:
    chosen = [e for e in events if since is None or e.timestamp >= since]
    if tail is not None:
        chosen = chosen[-tail:] if tail else []
    return chosen
