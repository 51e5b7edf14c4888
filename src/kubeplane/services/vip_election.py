"""The shared VIP's election in etcd, run by each control plane node (:class:`Election`); the
rules it follows are in :mod:`kubeplane.services.vip`.

One :meth:`Election.run` loop per VIP:

1. wait until the local kube-apiserver answers (no point drawing clients to a node that cannot
   serve them);
2. campaign: create the VIP's key with this node's *standing lease*, only if absent
   (:meth:`~kubeplane.clients.etcd.EtcdClient.create`). The lease is granted once and kept
   alive while the node waits, so a campaign is one keep-alive (answered by the etcd leader
   from memory) and one transaction: a grant is a raft proposal, an fsync on every member, on
   the failover's critical path. Lost: watch the key until it changes (or for four ticks, to
   look at the health again), renewing the lease every tick, and campaign again. A key holding
   this node's own name is a leftover of this agent's previous run (it stopped without
   revoking): it is deleted and the campaign repeated;
3. won: every tick renew the address and its lifetime while
   :meth:`~kubeplane.services.vip.Tenure.may_renew` allows (after a late keep-alive the address
   lapses, and comes back, announced anew, with the next one that gets through), send the first
   gratuitous ARPs, and at the same time renew the lease and check the kube-apiserver; give up
   as soon as :meth:`~kubeplane.services.vip.Tenure.verdict` says so;
4. give up: remove the address first, then revoke the lease (which deletes the key, so the
   others' watches fire at once), and start over.

Right after it wins, the node also hands its own etcd member's leadership over if it leads
(``step_down``, in the background; an attempt etcd refuses is repeated every
:attr:`~kubeplane.services.vip.Timing.leadership_check` seconds until one goes through): a holder
that dies while it leads etcd costs an etcd election first, and the new leader then extends
every lease by its TTL, so the others could take the VIP over only after about twice as long. It
is done once per tenure, inside the failover that made this node the holder, and never again
while it holds the VIP: every leader change fails the writes etcd has in flight ("etcdserver:
leader changed", a 500 from the API server), so a periodic hand-over would cost clients failed
requests while nothing else changes. A holder that becomes etcd's leader later keeps leading;
it seldom does, since a control plane node that halts while it leads etcd hands the leadership
to a voter holding no VIP (:meth:`kubeplane.agent.etcd.EtcdMember.forfeit_leadership`), where
etcd left to itself picks its most up-to-date follower.

Cancelling :meth:`Election.run` (the agent stops, the config changes) gives the VIP up the same
way before it returns. :attr:`Election.status` says who owns the VIP as far as this node knows,
and ``on_change`` is called whenever that changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from kubeplane.clients import errors
from kubeplane.clients import etcd as etcd_client
from kubeplane.services import vip

log = logging.getLogger(__name__)


class VipNetwork(Protocol):
    """The address and its announcement (blocking; :class:`kubeplane.services.vip_io.NetlinkVip`)."""

    def hold(self, address: vip.Vip, lifetime: int) -> None: ...

    def release(self, address: vip.Vip) -> bool: ...

    def announce(self, address: vip.Vip) -> None: ...


@dataclasses.dataclass(frozen=True)
class Status:
    """What this node knows of a VIP: its ``owner`` (empty: none known), whether this node
    ``held`` it, and why the last change happened."""

    owner: str = ""
    held: bool = False
    reason: str = ""


async def _to_the_end(call: Callable[[], object]) -> None:
    """Run a blocking network call in a thread and wait for its end even when cancelled meanwhile
    (then re-raise): a thread cannot be stopped, and an address it renewed, or an announcement it
    sent, after the give-up's release would make this node a second owner of the VIP."""
    done = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait([done])
        raise


class _HealthChecks:
    """The local kube-apiserver's health checks: one at a time, and never cancelled by a wait
    that stops waiting for one. Cancelling an HTTP request closes its connection, and on a loaded
    machine the next check's new TCP and TLS handshake made that one late too: one slow answer
    became the failed checks in a row that moved the VIP. A late answer counts when it comes."""

    def __init__(self, healthy: Callable[[], Awaitable[bool]], clock: Callable[[], float]) -> None:
        self._healthy = healthy
        self._clock = clock
        self._task: asyncio.Future[bool] | None = None
        self._since = 0.0

    async def outcome(self, wait: float) -> tuple[bool | None, float]:
        """Whether the local kube-apiserver passed the check in flight (one is started if none
        is), waiting up to ``wait`` seconds for it (None: no answer yet), and how long ago that
        check was started."""
        if self._task is None:
            self._since = self._clock()
            self._task = asyncio.ensure_future(self._healthy())
        done, _pending = await asyncio.wait({self._task}, timeout=wait)
        age = self._clock() - self._since
        if not done:
            return None, age
        task, self._task = self._task, None
        return task.result(), age

    async def cancel(self) -> None:
        """Drop the check in flight, if any (the election ends)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})


class Election:
    """One node's side of one VIP's election (see the module docstring)."""

    def __init__(
        self,
        *,
        etcd: etcd_client.EtcdClient,
        address: vip.Vip,
        node: str,
        network: VipNetwork,
        healthy: Callable[[], Awaitable[bool]],
        timing: vip.Timing | None = None,
        on_change: Callable[[Status], None] | None = None,
        step_down: Callable[[], Awaitable[object]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.etcd = etcd
        self.address = address
        self.node = node
        self.network = network
        self._checks = _HealthChecks(healthy, clock)
        self.timing = timing or vip.Timing()
        self.on_change = on_change
        self.step_down = step_down
        self.clock = clock
        self.key = vip.key(address.ip)
        self.status = Status(reason="starting")
        #: The standing lease a waiting node campaigns with (None: grant one at the next campaign).
        self._lease: int | None = None

    def _set(self, status: Status) -> None:
        if status != self.status:
            self.status = status
            if self.on_change is not None:
                self.on_change(status)

    async def run(self) -> None:
        """Campaign, hold and give up, until cancelled (see the module docstring)."""
        # An address left by this agent's previous run goes before anything else.
        if await asyncio.to_thread(self.network.release, self.address):
            log.info("removed %s left from an earlier run", self.address.cidr)
        try:
            while True:
                try:
                    await self._round()
                except (errors.EtcdError, TimeoutError) as exc:
                    self._set(Status(reason=f"etcd: {exc or 'timed out'}"))
                    await asyncio.sleep(self.timing.tick)
                except vip.VipError as exc:
                    log.warning("%s", exc)
                    self._set(Status(reason=str(exc)))
                    await asyncio.sleep(self.timing.tick)
        finally:
            await self._checks.cancel()
            if self._lease is not None:
                lease, self._lease = self._lease, None
                await self._revoke(lease)

    async def _round(self) -> None:
        tick = self.timing.tick
        passed, _age = await self._checks.outcome(self.timing.check_timeout)
        if not passed:
            self._set(
                dataclasses.replace(self.status, reason="waiting for the local kube-apiserver to answer")
            )
            await asyncio.sleep(tick)
            return
        lease, renewed_at, ttl = await self._standing_lease()
        try:
            async with asyncio.timeout(2 * tick):
                result = await self.etcd.create(self.key, self.node.encode(), lease=lease)
        except BaseException:
            # Whether the key was written is unknown: the lease goes, and the key with it.
            self._lease = None
            await self._revoke(lease)
            raise
        if not result.created:
            owner = result.current.value.decode() if result.current else ""
            if owner == self.node:
                log.info("deleting the VIP key %s left by this node's previous run", self.key.decode())
                await self.etcd.delete(self.key)
                return
            self._set(Status(owner=owner, reason=f"{owner or 'another node'} holds it"))
            await self._wait_for_change(result.revision + 1)
            return
        # The lease is the tenure's now; the give-up revokes it.
        self._lease = None
        tenure = vip.Tenure(self.timing, granted_at=renewed_at, ttl=ttl)
        reason = "stopped"
        try:
            reason = await self._hold(tenure, lease)
        finally:
            await self._give_up(lease, reason)

    async def _standing_lease(self) -> tuple[int, float, int]:
        """The standing lease, renewed (or granted) now: its ID, when the request went out (the
        lease lives at least its TTL from then) and the TTL etcd gave it."""
        if self._lease is not None:
            sent = self.clock()
            renewed = await self._keepalive(self._lease)
            if renewed:
                return self._lease, sent, renewed
            # Gone (0), or no answer: a new lease, and the old one revoked if it is still there.
            lease, self._lease = self._lease, None
            if renewed is None:
                await self._revoke(lease)
        asked = self.clock()
        async with asyncio.timeout(2 * self.timing.tick):
            granted = await self.etcd.lease_grant(self.timing.ttl)
        self._lease = granted.id
        return granted.id, asked, granted.ttl

    async def _wait_for_change(self, revision: int) -> None:
        """Watch the key from ``revision`` until it changes or four ticks pass, renewing the
        standing lease every tick meanwhile."""
        changes = self.etcd.watch(self.key, start_revision=revision)
        async with contextlib.aclosing(changes):
            change = asyncio.ensure_future(anext(changes))
            try:
                for _ in range(4):
                    done, _pending = await asyncio.wait({change}, timeout=self.timing.tick)
                    if done:
                        with contextlib.suppress(StopAsyncIteration):
                            change.result()
                        return
                    if self._lease is not None and await self._keepalive(self._lease) == 0:
                        self._lease = None
            finally:
                if not change.done():
                    change.cancel()
                    await asyncio.wait({change})

    async def _hold(self, tenure: vip.Tenure, lease_id: int) -> str:
        """Keep the VIP while the tenure allows; returns why it ended."""
        shedding = asyncio.create_task(self._shed_leadership()) if self.step_down is not None else None
        try:
            return await self._renew(tenure, lease_id)
        finally:
            if shedding is not None:
                shedding.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await shedding

    async def _shed_leadership(self) -> None:
        """Ask ``step_down`` once, again every ``leadership_check`` seconds only while it fails
        (see the module docstring)."""
        assert self.step_down is not None
        while True:
            try:
                async with asyncio.timeout(self.timing.leadership_check):
                    successor = await self.step_down()
            except (errors.EtcdError, TimeoutError) as exc:
                log.info("could not hand this node's etcd leadership over: %s", exc or "timed out")
                await asyncio.sleep(self.timing.leadership_check)
                continue
            if successor is not None:
                log.info("handed the etcd leadership over (the VIP's new holder does not lead etcd)")
            return

    async def _renew(self, tenure: vip.Tenure, lease_id: int) -> str:
        timing = self.timing
        announcements = 0
        #: When the address renewed last runs out (the kernel removes it then).
        address_until = 0.0
        asked_at_once = False
        while True:
            reason = tenure.verdict()
            if reason is not None:
                return reason
            now = self.clock()
            if tenure.may_renew(now):
                if now >= address_until:  # new, or it lapsed: neighbours may have lost our MAC
                    announcements = timing.announcements
                await _to_the_end(functools.partial(self.network.hold, self.address, timing.lifetime))
                address_until = now + timing.lifetime
                if announcements > 0:
                    announcements -= 1
                    await _to_the_end(functools.partial(self.network.announce, self.address))
                if not self.status.held:
                    log.info("took %s on %s", self.address.cidr, self.address.link)
                    self._set(Status(owner=self.node, held=True, reason="elected"))
            elif self.status.held:
                late = "no lease keep-alive got through in time (etcd electing a leader, or unreachable)"
                log.warning("%s: %s lapses until one does", late, self.address.cidr)
                self._set(Status(owner=self.node, reason=f"{late}: the address lapses until one does"))
            wake = self.clock() + timing.tick
            if tenure.may_renew(self.clock()):  # keep it alive before the renewals must stop
                wake = min(wake, tenure.safe_until - timing.lifetime)
            elif address_until == 0.0 and not asked_at_once:
                # Won, but the campaign's writes (an fsync each) outlasted the lease's certain life
                # for a first address: a keep-alive now, not a tick later, lets it be added.
                asked_at_once = True
                wake = self.clock()
            await asyncio.sleep(max(0.0, wake - self.clock()))
            sent = self.clock()
            renewed, (passed, age) = await asyncio.gather(
                self._keepalive(lease_id), self._checks.outcome(timing.check_timeout)
            )
            if renewed == 0:
                tenure.lost()
            elif renewed is not None:
                tenure.keepalive(sent=sent, ttl=renewed)
            if passed is None:
                if not tenure.unanswered_for:
                    log.info("the local kube-apiserver is slow to answer its health check")
                tenure.unanswered(age)
            else:
                if tenure.unanswered_for:
                    log.info("the local kube-apiserver answered its health check after %.1fs", age)
                tenure.health(passed)
                if not passed:
                    log.info(
                        "the local kube-apiserver failed a health check (%d in a row)", tenure.failed_checks
                    )

    async def _keepalive(self, lease_id: int) -> int | None:
        """The TTL etcd renewed the lease for; 0 when etcd says it is gone; None: no answer."""
        try:
            return await self.etcd.lease_keepalive(lease_id, timeout=self.timing.keepalive_timeout)
        except errors.EtcdNotFound:
            return 0
        except errors.EtcdError as exc:
            log.info("VIP lease keep-alive failed: %s", exc)
            return None

    async def _give_up(self, lease_id: int, reason: str) -> None:
        """Remove the address, then revoke the lease: the order that keeps the VIP single-owned."""
        try:
            removed = await asyncio.to_thread(self.network.release, self.address)
        finally:
            await self._revoke(lease_id)
        # Said even when the address had lapsed already: the holder lost its right to the VIP.
        lapsed = "" if removed else " (its address had lapsed already)"
        log.info("gave up %s%s: %s", self.address.cidr, lapsed, reason)
        self._set(Status(reason=f"gave it up: {reason}"))

    async def _revoke(self, lease_id: int) -> None:
        """Revoke the lease if etcd answers soon; otherwise it expires by itself."""
        try:
            async with asyncio.timeout(2 * self.timing.tick):
                await self.etcd.lease_revoke(lease_id)
        except (errors.EtcdError, TimeoutError) as exc:
            log.info("VIP lease %x not revoked (it expires by itself): %s", lease_id, exc)
