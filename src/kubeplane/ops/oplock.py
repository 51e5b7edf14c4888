"""One cluster-wide operation at a time: a Kubernetes Lease that upgrade-k8s and convert-k8s hold.

Two operations that patch the same machine configs and drain the same load balancer backends
would undo each other's steps, so each takes the Lease ``kube-system/kubeplane-cluster-operation``
before its first change and gives it back at the end (a dry run changes nothing and takes none).
The Lease names the operation, the host and the PID that holds it; ``kubectl -n kube-system get
lease kubeplane-cluster-operation -o yaml`` shows who.

- **Refused**: a Lease renewed within its duration by a live holder: the error names the
  operation, host, PID and since when, and says when the Lease runs out.
- **Taken over**: a Lease whose renewals stopped for longer than its duration (the holder died
  on another machine), or whose holder ran on this host under a PID that is no longer that
  process (killed with SIGKILL here: a re-run continues at once, which the operations' resume
  guarantee relies on). Taking over is a compare-and-swap on the Lease's resourceVersion, so
  two runs racing for a stale Lease cannot both win.
- **Held**: renewed every :data:`RENEW_EVERY` seconds. When a renewal finds another holder (it
  was taken over after this run stalled for longer than the duration), the operation is
  cancelled: it no longer has the right to change the cluster.
- **Released** on the way out, success or failure, if still ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from kubeplane import guard
from kubeplane.ops.errors import OpsError

log = logging.getLogger(__name__)

NAMESPACE = "kube-system"
NAME = "kubeplane-cluster-operation"
#: Seconds a Lease stays valid without a renewal.
DURATION = 30
#: Seconds between renewals.
RENEW_EVERY = 10.0


class OperationLocked(OpsError):
    """Another cluster operation holds the Lease (or took it over from this one)."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds the Lease: an operation run by a process on a host."""

    operation: str
    host: str
    pid: int
    #: The process's start time (clock ticks since boot), so a reused PID is not mistaken for it.
    pid_start: int | None = None

    @property
    def identity(self) -> str:
        start = "" if self.pid_start is None else f"/{self.pid_start}"
        return f"{self.operation} pid {self.pid}{start} on {self.host}"

    @classmethod
    def parse(cls, identity: str) -> Holder | None:
        """The holder a Lease's ``holderIdentity`` names, None when it is not one of ours."""
        operation, sep, rest = identity.partition(" pid ")
        pid_part, sep2, host = rest.partition(" on ")
        if not (sep and sep2 and operation and host):
            return None
        pid_text, _, start_text = pid_part.partition("/")
        if not pid_text.isdigit() or (start_text and not start_text.isdigit()):
            return None
        return cls(operation, host, int(pid_text), int(start_text) if start_text else None)


@dataclasses.dataclass(frozen=True)
class Lease:
    """The fields of the Lease object the lock reads and writes."""

    holder: str
    acquired: datetime.datetime
    renewed: datetime.datetime
    duration: int = DURATION
    resource_version: str | None = None

    def expired(self, now: datetime.datetime) -> bool:
        return now > self.renewed + datetime.timedelta(seconds=self.duration)


class LeaseStore(Protocol):
    """The Lease through the Kubernetes API."""

    async def read(self) -> Lease | None:
        """The Lease, None when there is none."""

    async def create(self, lease: Lease) -> bool:
        """Create it; False when one exists already."""

    async def replace(self, lease: Lease) -> bool:
        """Replace it if its resourceVersion is still ``lease.resource_version``; False otherwise."""

    async def delete(self, lease: Lease) -> None:
        """Delete it if its resourceVersion is still ``lease.resource_version``."""


def _start_time(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - one short read
    except OSError:
        return None
    # Field 22 (starttime); the command name (field 2) may hold spaces, so count from its ")".
    return int(stat.rpartition(")")[2].split()[19])


def process_alive(pid: int, start: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (on this host)."""
    current = _start_time(pid)
    return current is not None and (start is None or current == start)


def this_process(operation: str) -> Holder:
    pid = os.getpid()
    return Holder(operation=operation, host=socket.gethostname(), pid=pid, pid_start=_start_time(pid))


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


#: Whether a PID is still the process that started at a given time.
Alive = Callable[[int, int | None], bool]


def _stale(lease: Lease, *, me: Holder, now: datetime.datetime, alive: Alive) -> bool:
    if lease.expired(now):
        return True
    holder = Holder.parse(lease.holder)
    return holder is not None and holder.host == me.host and not alive(holder.pid, holder.pid_start)


def _refusal(lease: Lease, *, me: Holder, now: datetime.datetime) -> OperationLocked:
    remaining = max(0, int((lease.renewed - now).total_seconds()) + lease.duration)
    return OperationLocked(
        f"nothing was changed: another cluster operation is running ({lease.holder}, since "
        f"{lease.acquired.isoformat(timespec='seconds')}); {me.operation} runs one at a time. Wait for "
        f"it to finish; if it died on another machine, its Lease {NAMESPACE}/{NAME} runs out "
        f"{remaining}s after its last renewal"
    )


async def acquire(
    store: LeaseStore,
    *,
    me: Holder,
    now: Callable[[], datetime.datetime] = _utcnow,
    alive: Alive = process_alive,
) -> Lease:
    """Take the Lease for ``me``, or raise :class:`OperationLocked` naming who holds it."""
    for _ in range(3):
        stamp = now()
        fresh = Lease(holder=me.identity, acquired=stamp, renewed=stamp)
        current = await store.read()
        if current is None:
            if await store.create(fresh):
                return await _read_own(store, me)
            continue
        if current.holder != me.identity and not _stale(current, me=me, now=stamp, alive=alive):
            raise _refusal(current, me=me, now=stamp)
        if await store.replace(dataclasses.replace(fresh, resource_version=current.resource_version)):
            return await _read_own(store, me)
    raise OperationLocked(
        f"nothing was changed: the Lease {NAMESPACE}/{NAME} kept changing while {me.operation} "
        "tried to take it: another operation is starting; try again"
    )


async def _read_own(store: LeaseStore, me: Holder) -> Lease:
    lease = await store.read()
    if lease is None or lease.holder != me.identity:
        raise OperationLocked(
            f"the Lease {NAMESPACE}/{NAME} was taken by another operation as it was created"
        )
    return lease


@contextlib.asynccontextmanager
async def held(
    store: LeaseStore,
    *,
    operation: str,
    me: Holder | None = None,
    now: Callable[[], datetime.datetime] = _utcnow,
    alive: Alive = process_alive,
    renew_every: float = RENEW_EVERY,
) -> AsyncIterator[Lease]:
    """Hold the Lease for the block (see the module docstring)."""
    holder = me or this_process(operation)
    lease = await acquire(store, me=holder, now=now, alive=alive)
    loss = guard.LossGuard()

    async def renew() -> None:
        while True:
            await asyncio.sleep(renew_every)
            try:
                current = await store.read()
            except Exception as exc:  # the API may blink during the operation: the next tick retries
                log.debug("reading the cluster operation lease failed: %s", exc)
                continue
            if current is None or current.holder != holder.identity:
                taker = current.holder if current is not None else "nobody (it was deleted)"
                loss.lose(
                    OperationLocked(
                        f"{operation} stopped: it lost the Lease {NAMESPACE}/{NAME} to {taker}; re-run "
                        "it once that operation has finished"
                    )
                )
                return
            renewed = dataclasses.replace(current, renewed=now())
            with contextlib.suppress(Exception):  # a failed renewal is retried on the next tick
                await store.replace(renewed)

    renewer = asyncio.create_task(renew(), name="renew the cluster operation lease")
    try:
        yield lease
    except asyncio.CancelledError:
        # Our own cancellation becomes the error that says why; one from elsewhere stays.
        error = loss.release()
        if error is not None:
            raise error from None
        raise
    finally:
        loss.release()  # also when the block swallowed our cancellation: it must not stay pending
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
        if loss.lost is None:
            with contextlib.suppress(Exception):
                current = await store.read()
                if current is not None and current.holder == holder.identity:
                    await store.delete(current)
