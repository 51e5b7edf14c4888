"""The node's event log: bounded history, selection by time and count, followers, drops, threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from kubeplane.agent.events import Event, EventLog

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def take(stream: AsyncIterator[Event], count: int) -> list[Event]:
    taken = []
    async with asyncio.timeout(5):
        async for event in stream:
            taken.append(event)
            if len(taken) == count:
                break
    return taken


def test_history_selects_by_time_and_count_and_keeps_the_newest() -> None:
    clock = Clock()
    log = EventLog(capacity=3, clock=clock)
    for index in range(5):
        clock.now = 1000.0 + index
        log.emit("service", "etcd", f"event {index}")
    assert [e.message for e in log.history()] == ["event 2", "event 3", "event 4"]
    assert [e.id for e in log.history()] == [3, 4, 5]
    assert [e.message for e in log.history(since=1003.0)] == ["event 3", "event 4"]
    assert [e.message for e in log.history(tail=1)] == ["event 4"]
    assert log.history(tail=0) == []
    assert log.history()[0].as_dict() == {
        "id": 3,
        "timestamp": 1002.0,
        "kind": "service",
        "subject": "etcd",
        "message": "event 2",
    }


def test_a_follower_gets_the_backlog_then_live_events_including_ones_from_other_threads() -> None:
    async def scenario() -> list[str]:
        log = EventLog()
        log.emit("sequence", "boot", "before")
        stream = log.follow()
        first = await take(stream, 1)
        log.emit("config", "immediate", "on the loop")
        thread = threading.Thread(target=log.emit, args=("controller", "c", "from a thread"))
        thread.start()
        thread.join()
        rest = await take(stream, 2)
        await stream.aclose()  # type: ignore[attr-defined]
        return [e.message for e in first + rest]

    assert asyncio.run(scenario()) == ["before", "on the loop", "from a thread"]


def test_a_follower_that_fell_behind_is_told_how_many_events_it_missed() -> None:
    async def scenario() -> list[Event]:
        log = EventLog(capacity=2)
        stream = log.follow()
        pending = asyncio.ensure_future(take(stream, 3))
        await asyncio.sleep(0)  # the follower is registered and waits
        for index in range(5):  # no await in between: it cannot read any before they drop
            log.emit("service", "kubelet", f"event {index}")
        return await pending

    notice, *kept = asyncio.run(scenario())
    assert (notice.id, notice.subject) == (0, "events")
    assert notice.message.startswith("3 events were dropped")
    assert [e.message for e in kept] == ["event 3", "event 4"]


def test_a_closed_follower_is_forgotten() -> None:
    async def scenario() -> int:
        log = EventLog()
        stream = log.follow()
        log.emit("sequence", "boot", "x")
        await take(stream, 1)
        await stream.aclose()  # type: ignore[attr-defined]
        return len(log._followers)

    assert asyncio.run(scenario()) == 0
