"""LossGuard: a lost right stops the block with the loss error; anyone else's cancellation stays."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from kubeplane import guard

pytestmark = pytest.mark.unit


class Lost(Exception):
    pass


async def guarded(*, lose_after: float | None, cancel_from_outside: bool = False) -> str:
    """A block under a guard; what ended it."""
    task = asyncio.current_task()
    assert task is not None
    loss = guard.LossGuard()
    loop = asyncio.get_running_loop()
    if lose_after is not None:
        loop.call_later(lose_after, loss.lose, Lost("the lease is gone"))
    if cancel_from_outside:
        loop.call_later(0.01, task.cancel)
    try:
        await asyncio.sleep(5)
        return "finished"
    except asyncio.CancelledError:
        error = loss.release()
        if error is not None:
            return f"raised {error}"
        raise
    finally:
        loss.release()


def test_a_loss_stops_the_block_with_the_loss_error() -> None:
    assert asyncio.run(guarded(lose_after=0.01)) == "raised the lease is gone"


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def outer() -> None:
        await guarded(lose_after=0.02, cancel_from_outside=True)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(outer())


def test_a_loss_after_the_block_cancels_nothing_and_a_swallowed_one_is_taken_back() -> None:
    async def scenario() -> int:
        loss = guard.LossGuard()
        loss.lose(Lost("during"))  # cancellation requested while guarding
        with contextlib.suppress(asyncio.CancelledError):  # the block swallows it
            await asyncio.sleep(1)
        assert loss.release() is not None and loss.release() is None
        loss.lose(Lost("after"))  # no longer guarding: nothing is cancelled
        await asyncio.sleep(0.01)
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert asyncio.run(scenario()) == 0


def test_a_guard_needs_a_task() -> None:
    with pytest.raises(RuntimeError):  # no running loop, so no task to stop
        guard.LossGuard()
