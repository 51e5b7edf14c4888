"""The cluster operation Lease: one upgrade-k8s / convert-k8s at a time, stale holders taken over."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from ops_fakes import MemoryStore

from kubeplane.ops import oplock

pytestmark = pytest.mark.unit

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
ME = oplock.Holder("upgrade-k8s", "laptop", 100, 5)
OTHER_HOST = oplock.Holder("convert-k8s", "jumphost", 200, 7)
SAME_HOST = oplock.Holder("convert-k8s", "laptop", 300, 9)


def held_by(store: MemoryStore, holder: oplock.Holder, *, renewed: datetime.datetime = T0) -> None:
    store._stamp(oplock.Lease(holder=holder.identity, acquired=renewed, renewed=renewed))


def acquire(store: MemoryStore, *, now: datetime.datetime = T0, alive: bool = True) -> oplock.Lease:
    return asyncio.run(oplock.acquire(store, me=ME, now=lambda: now, alive=lambda pid, start: alive))


def test_a_free_cluster_is_locked_and_released() -> None:
    store = MemoryStore()

    async def scenario() -> None:
        async with oplock.held(store, operation="upgrade-k8s", me=ME, now=lambda: T0) as lease:
            assert lease.holder == "upgrade-k8s pid 100/5 on laptop"
            assert store.lease is not None

    asyncio.run(scenario())
    assert store.lease is None


def test_a_live_holder_refuses_with_who_and_since_when() -> None:
    store = MemoryStore()
    held_by(store, OTHER_HOST)
    with pytest.raises(oplock.OperationLocked) as caught:
        acquire(store, now=T0 + datetime.timedelta(seconds=5))
    message = str(caught.value)
    assert "nothing was changed" in message
    assert "convert-k8s pid 200/7 on jumphost" in message
    assert "2026-01-01T00:00:00+00:00" in message
    assert store.lease is not None and store.lease.holder == OTHER_HOST.identity


def test_a_lease_not_renewed_for_its_duration_is_taken_over() -> None:
    store = MemoryStore()
    held_by(store, OTHER_HOST)
    later = T0 + datetime.timedelta(seconds=oplock.DURATION + 1)
    assert acquire(store, now=later).holder == ME.identity


def test_a_holder_killed_on_this_host_is_taken_over_at_once() -> None:
    store = MemoryStore()
    held_by(store, SAME_HOST)
    assert acquire(store, alive=False).holder == ME.identity


def test_a_live_holder_on_this_host_refuses() -> None:
    store = MemoryStore()
    held_by(store, SAME_HOST)
    with pytest.raises(oplock.OperationLocked, match="convert-k8s pid 300/9 on laptop"):
        acquire(store, alive=True)


def test_the_lease_is_released_when_the_operation_fails() -> None:
    store = MemoryStore()

    async def scenario() -> None:
        async with oplock.held(store, operation="upgrade-k8s", me=ME, now=lambda: T0):
            raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        asyncio.run(scenario())
    assert store.lease is None and store.deleted == 1


def test_losing_the_lease_cancels_the_operation() -> None:
    store = MemoryStore()
    reached: list[str] = []

    async def scenario() -> None:
        async with oplock.held(store, operation="upgrade-k8s", me=ME, now=lambda: T0, renew_every=0.01):
            held_by(store, OTHER_HOST)  # taken over while this run stalled
            await asyncio.sleep(5)
            reached.append("the body went on without the lock")

    with pytest.raises(
        oplock.OperationLocked, match=r"lost the Lease .* to convert-k8s pid 200/7 on jumphost"
    ):
        asyncio.run(asyncio.wait_for(scenario(), 2))
    assert reached == []
    assert store.lease is not None and store.lease.holder == OTHER_HOST.identity


def test_a_lost_lease_leaves_no_cancellation_pending_on_the_task() -> None:
    store = MemoryStore()

    async def scenario() -> int:
        try:
            async with oplock.held(store, operation="upgrade-k8s", me=ME, now=lambda: T0, renew_every=0.01):
                held_by(store, OTHER_HOST)
                await asyncio.sleep(5)
        except oplock.OperationLocked:
            pass
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    # asyncio.timeout and TaskGroup in the same task would take a left-over count for theirs.
    assert asyncio.run(asyncio.wait_for(scenario(), 2)) == 0


def test_renewals_move_the_renew_time() -> None:
    store = MemoryStore()
    clock = [T0]

    async def scenario() -> None:
        async with oplock.held(store, operation="upgrade-k8s", me=ME, now=lambda: clock[0], renew_every=0.01):
            clock[0] = T0 + datetime.timedelta(seconds=20)
            for _ in range(200):
                if store.lease is not None and store.lease.renewed == clock[0]:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the lease was not renewed")

    asyncio.run(scenario())


def test_racing_for_a_stale_lease_only_one_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    held_by(store, SAME_HOST)
    original = store.replace

    async def someone_else_first(lease: oplock.Lease) -> Any:
        held_by(store, OTHER_HOST)  # the other run's compare-and-swap lands first
        return await original(lease)

    monkeypatch.setattr(store, "replace", someone_else_first)
    with pytest.raises(oplock.OperationLocked, match="jumphost"):
        acquire(store, alive=False)


def test_holder_identity_round_trips() -> None:
    assert oplock.Holder.parse(ME.identity) == ME
    assert oplock.Holder.parse("kube-controller-manager_1234") is None
    assert oplock.process_alive(1, None)
