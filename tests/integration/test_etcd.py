"""The project's etcd client and the agent's membership steps against real etcd from Debian,
over mutual TLS on loopback: a single member (the ``etcd_server`` fixture) or a cluster grown
from it by learners that join the way a node's agent joins."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

from kubeplane import pki
from kubeplane.agent import etcd as agent_etcd
from kubeplane.clients import errors
from kubeplane.clients import etcd as etcd_client
from kubeplane.controllers.k8s import etcd_access
from kubeplane.services import etcd as etcd_rules

if TYPE_CHECKING:
    from conftest import EtcdServer, Processes, Started

T = TypeVar("T")

run = asyncio.run

pytestmark = pytest.mark.integration


async def eventually(check: Callable[[], Awaitable[T | None]], *, timeout: float, what: str) -> T:
    """Await ``check()`` until it returns something other than None (retryable etcd errors count
    as "not yet"); fail naming ``what`` and the last error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = await check()
            if value is not None:
                return value
        except errors.EtcdError as exc:
            if not exc.retryable:
                raise
            last = exc
        await asyncio.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last error: {last!r})", pytrace=False)


def test_kv_put_get_prefix_delete(etcd_server: EtcdServer) -> None:
    async def scenario() -> None:
        async with etcd_server.client_for() as etcd:
            first = await etcd.put(b"/kp/a", b"1")
            await etcd.put(b"/kp/b", b"2")
            await etcd.put(b"/kq", b"outside")
            assert await etcd.get_value(b"/kp/a") == b"1"
            assert await etcd.get_value(b"/missing") is None
            found = await etcd.get(b"/kp/", prefix=True)
            assert [(kv.key, kv.value) for kv in found.kvs] == [(b"/kp/a", b"1"), (b"/kp/b", b"2")]
            assert found.count == 2
            assert found.kvs[0].mod_revision == first.revision
            assert (await etcd.delete(b"/kp/", prefix=True)).deleted == 2
            assert (await etcd.get(b"/kp/", prefix=True)).kvs == []
            assert await etcd.get_value(b"/kq") == b"outside"

    run(scenario())


def test_lease_expiry_keepalive_revoke(etcd_server: EtcdServer) -> None:
    async def gone(etcd: etcd_client.EtcdClient, key: bytes) -> bool | None:
        return True if await etcd.get_value(key) is None else None

    async def scenario() -> None:
        async with etcd_server.client_for() as etcd:
            short = await etcd.lease_grant(2)
            await etcd.put(b"/leased", b"x", lease=short.id)
            assert (await etcd.get(b"/leased")).kvs[0].lease == short.id
            assert await etcd.lease_keepalive(short.id) == 2
            await eventually(
                lambda: gone(etcd, b"/leased"), timeout=10, what="the unrefreshed lease to expire"
            )
            with pytest.raises(errors.EtcdNotFound):
                await etcd.lease_keepalive(short.id)

            async with etcd.lease(2) as kept:
                await etcd.put(b"/kept", b"y", lease=kept.id)
                # A twin lease granted after it, never refreshed, expiring shows that more than
                # the TTL went by: only the keepalive task saved the kept one.
                twin = await etcd.lease_grant(2)
                await etcd.put(b"/twin", b"z", lease=twin.id)
                await eventually(lambda: gone(etcd, b"/twin"), timeout=10, what="the twin lease to expire")
                assert await etcd.get_value(b"/kept") == b"y"
            assert await etcd.get_value(b"/kept") is None
            assert await etcd.lease_ttl(kept.id) == -1

    run(scenario())


def _connections_to(port: int) -> set[int]:
    """The local ports of this process's established TCP connections to 127.0.0.1:``port``."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
        if state == "01" and remote == f"0100007F:{port:04X}" and inode in inodes:
            ports.add(int(local.split(":")[1], 16))
    return ports


def test_lease_keepalives_share_one_connection(etcd_server: EtcdServer) -> None:
    # A keep-alive is a stream that ends after its one answer: left unread, its connection was
    # closed, and every keep-alive (the VIP holder sends one every 0.5 s) paid a new TCP and TLS
    # handshake, which on a loaded machine came too late.
    port = int(etcd_server.endpoint.rsplit(":", 1)[1])

    async def scenario() -> list[set[int]]:
        async with etcd_server.client_for() as etcd:
            lease = await etcd.lease_grant(10)
            seen = []
            for _ in range(5):
                assert await etcd.lease_keepalive(lease.id, timeout=2) == 10
                seen.append(_connections_to(port))
            return seen

    seen = run(scenario())
    assert len(seen[0]) == 1 and all(ports == seen[0] for ports in seen), seen


def test_lock_mutual_exclusion(etcd_server: EtcdServer) -> None:
    events: list[tuple[str, str]] = []

    async def hold(name: str) -> None:
        async with etcd_server.client_for() as etcd, etcd.lock(b"the-lock", ttl=5):
            events.append((name, "in"))
            await asyncio.sleep(0.5)
            events.append((name, "out"))

    async def scenario() -> None:
        await asyncio.gather(hold("a"), hold("b"), hold("c"))

    run(scenario())
    # Three holders, never two inside at once: every "in" is followed by its own "out".
    assert len(events) == 6
    for index in range(0, 6, 2):
        assert events[index][1] == "in"
        assert events[index + 1] == (events[index][0], "out")


def test_members_status_snapshot(etcd_server: EtcdServer, free_port: Callable[[], int]) -> None:
    async def scenario() -> None:
        async with etcd_server.client_for() as etcd:
            members = await etcd.member_list()
            assert [(m.name, m.peer_urls, m.client_urls) for m in members] == [
                ("test", [etcd_server.peer_url], [etcd_server.endpoint])
            ]
            status = await etcd.status()
            assert status.is_leader and status.member_id == members[0].id
            assert status.raft_index > 0 and status.db_size > 0 and status.version.startswith("3.4")

            # A learner does not count towards quorum, so the single member keeps working.
            unstarted = f"https://127.0.0.1:{free_port()}"
            learner = await etcd.member_add([unstarted], learner=True)
            assert learner.is_learner and learner.peer_urls == [unstarted] and learner.name == ""
            assert {m.id for m in await etcd.member_list()} == {members[0].id, learner.id}
            with pytest.raises(errors.EtcdConflict):
                await etcd.member_add([unstarted], learner=True)
            await etcd.member_remove(learner.id)
            assert [m.id for m in await etcd.member_list()] == [members[0].id]
            with pytest.raises(errors.EtcdNotFound):
                await etcd.member_remove(learner.id)

            snapshot = io.BytesIO()
            size = await etcd.snapshot(snapshot)
            assert size == len(snapshot.getvalue()) >= status.db_size_in_use

    run(scenario())


def test_failover_and_unavailable(etcd_server: EtcdServer, free_port: Callable[[], int]) -> None:
    dead = f"https://127.0.0.1:{free_port()}"

    async def scenario() -> None:
        async with etcd_server.client_for(dead, etcd_server.endpoint) as etcd:
            await etcd.put(b"/failover", b"ok")
            assert await etcd.get_value(b"/failover") == b"ok"
        async with etcd_server.client_for(dead) as etcd:
            started = time.monotonic()
            with pytest.raises(errors.EtcdUnavailable) as caught:
                await etcd.get(b"/failover")
            assert caught.value.retryable
            assert dead in str(caught.value)
            assert time.monotonic() - started < 6

    run(scenario())


def test_wrong_client_certificate_is_refused(etcd_server: EtcdServer) -> None:
    from kubeplane import pki

    stranger_ca = pki.new_ca("stranger")
    stranger = pki.issue(ca=stranger_ca, common_name="intruder", usages=("client",))
    tls = etcd_client.tls_context(ca=etcd_server.ca.cert, cert=stranger.cert, key=stranger.key)

    async def scenario() -> None:
        async with etcd_client.EtcdClient([etcd_server.endpoint], tls=tls) as etcd:
            # TLS 1.3 rejects a client certificate after the handshake. Depending on timing the
            # client reads the bad-certificate alert or only the connection closing (which cannot
            # be told apart from a crash, hence "unavailable"); both must name the certificate.
            with pytest.raises(errors.EtcdUnavailable, match="client certificate"):
                await etcd.get(b"/x")

    run(scenario())


# -- membership, lease loss and compaction on real etcd ---------------------------------------


@dataclasses.dataclass
class Peer:
    """One more etcd member on loopback, certified by the ``etcd_server`` fixture's CA."""

    name: str
    client_url: str
    peer_url: str
    data_dir: Path
    started: Started | None = None


class LoopbackCluster:
    """``etcd_server`` (member ``test``) plus members that join it the way the agent joins."""

    def __init__(
        self, server: EtcdServer, processes: Processes, tmp_path: Path, free_port: Callable[[], int]
    ) -> None:
        self.server = server
        self.processes = processes
        self.tmp_path = tmp_path
        self.free_port = free_port
        self.binary = str(server.started.process.args[0])
        self.peers: dict[str, Peer] = {}

    def peer(self, name: str) -> Peer:
        if name not in self.peers:
            self.peers[name] = Peer(
                name=name,
                client_url=f"https://127.0.0.1:{self.free_port()}",
                peer_url=f"https://127.0.0.1:{self.free_port()}",
                data_dir=self.tmp_path / f"etcd-{name}",
            )
        return self.peers[name]

    def logs(self) -> str:
        return (
            "\n".join(p.started.tail() for p in self.peers.values() if p.started) + self.server.started.tail()
        )

    def start(self, peer: Peer, initial_cluster: dict[str, str]) -> None:
        """Start ``peer`` as a member that was added already (``initial-cluster-state=existing``)."""
        certs = self.tmp_path / f"pki-{peer.name}"
        certs.mkdir(exist_ok=True)
        pair = pki.issue(ca=self.server.ca, common_name=peer.name, ip_addresses=["127.0.0.1"])
        files = {"ca.crt": self.server.ca.cert, "member.crt": pair.cert, "member.key": pair.key}
        for file, data in files.items():
            (certs / file).touch(mode=0o600)
            (certs / file).write_bytes(data)
        cert, key, ca = certs / "member.crt", certs / "member.key", certs / "ca.crt"
        peer.started = self.processes.start(
            [
                self.binary,
                f"--name={peer.name}",
                f"--data-dir={peer.data_dir}",
                f"--listen-client-urls={peer.client_url}",
                f"--advertise-client-urls={peer.client_url}",
                f"--listen-peer-urls={peer.peer_url}",
                f"--initial-advertise-peer-urls={peer.peer_url}",
                "--initial-cluster=" + ",".join(f"{n}={url}" for n, url in initial_cluster.items()),
                "--initial-cluster-state=existing",
                "--client-cert-auth=true",
                "--peer-client-cert-auth=true",
                *(f"--cert-file={cert}", f"--key-file={key}", f"--trusted-ca-file={ca}"),
                *(f"--peer-cert-file={cert}", f"--peer-key-file={key}", f"--peer-trusted-ca-file={ca}"),
            ],
            name=f"etcd-{peer.name}",
        )

    async def join(self, name: str) -> etcd_client.Member:
        """Join member ``name`` as the agent does (:func:`agent_etcd.join`), start it, and promote it
        the way the agent's health check does: ask, and ask again while etcd says "not in sync"."""
        peer = self.peer(name)
        async with self.server.client_for() as etcd:
            # The agent's pre-start retries a join that etcd refuses for now ("unhealthy cluster"
            # right after a membership change), like every retryable error.
            plan = await eventually(
                lambda: agent_etcd.join(etcd, name=name, peer=peer.peer_url),
                timeout=30,
                what=f"{name} to join",
            )
            [learner] = [m for m in await etcd.member_list() if peer.peer_url in m.peer_urls]
            assert learner.is_learner, f"{name} was added as a voting member"
            self.start(peer, plan.initial_cluster)

            async def promoted() -> bool | None:
                assert peer.started is not None
                if peer.started.process.poll() is not None:
                    pytest.fail(f"etcd {name} exited while catching up\n{self.logs()}", pytrace=False)
                try:
                    await agent_etcd.promote(etcd, learner.id)
                except errors.EtcdLearnerNotReady:
                    return None
                return True

            await eventually(promoted, timeout=60, what=f"etcd to promote learner {name}")
            members = {m.id: m for m in await etcd.member_list()}
        assert not members[learner.id].is_learner
        return members[learner.id]


@pytest.fixture
def loopback_cluster(
    etcd_server: EtcdServer, processes: Processes, tmp_path: Path, free_port: Callable[[], int]
) -> LoopbackCluster:
    return LoopbackCluster(etcd_server, processes, tmp_path, free_port)


def test_learners_join_and_are_promoted_into_a_three_member_cluster(
    loopback_cluster: LoopbackCluster,
) -> None:
    cluster = loopback_cluster

    async def scenario() -> None:
        async with cluster.server.client_for() as etcd:
            for index in range(50):
                await etcd.put(f"/data/{index}".encode(), b"x" * 1000)
            # A learner that has not even started is far behind: etcd refuses, typed and retryable.
            spare = cluster.peer("spare")
            learner = await etcd.member_add([spare.peer_url], learner=True)
            with pytest.raises(errors.EtcdLearnerNotReady) as caught:
                await etcd.member_promote(learner.id)
            assert caught.value.retryable
            await etcd.member_remove(learner.id)

        second = await cluster.join("second")
        third = await cluster.join("third")
        endpoints = [cluster.server.endpoint, *(p.client_url for p in cluster.peers.values() if p.started)]
        async with cluster.server.client_for(*endpoints) as etcd:
            members = await etcd.member_list()
            assert sorted((m.name, m.is_learner) for m in members) == [
                ("second", False),
                ("test", False),
                ("third", False),
            ]
            assert {second.id, third.id} < {m.id for m in members}
        # Every member serves quorum reads now (a learner refuses them), each with the data
        # written before it joined.
        for endpoint in endpoints:
            async with cluster.server.client_for(endpoint) as etcd:
                found = await eventually(
                    lambda: etcd.get(b"/data/", prefix=True, keys_only=True),
                    timeout=10,
                    what=f"a quorum read from {endpoint}",
                )
                assert found.count == 50
                assert not (await etcd.status()).is_learner
        # The leader hands its leadership over on request (a VIP holder does, so that losing it
        # does not also cost an etcd election); a follower asked to has nothing to do.
        async with cluster.server.client_for(*endpoints) as etcd:
            statuses = [await etcd.status(endpoint) for endpoint in endpoints]
            [leader] = [status for status in statuses if status.is_leader]
            follower = next(status for status in statuses if not status.is_leader)
            assert await etcd.hand_over_leadership(follower.endpoint) is None
            # The member etcd lists first would take it; named in ``last`` (a VIP holder), it
            # is asked only after the others.
            voters = [m for m in await etcd.member_list() if m.id != leader.member_id]
            successor = await etcd.hand_over_leadership(leader.endpoint, last={voters[0].name})
            assert successor is not None and successor.id == voters[1].id

            async def led_by_successor() -> bool | None:
                return (await etcd.status(leader.endpoint)).leader == successor.id or None

            await eventually(led_by_successor, timeout=10, what=f"{successor.name} to lead")

    run(scenario())


def test_a_member_whose_data_was_wiped_rejoins_under_a_new_id(loopback_cluster: LoopbackCluster) -> None:
    cluster = loopback_cluster

    async def scenario() -> None:
        await cluster.join("second")
        before = await cluster.join("third")
        third = cluster.peers["third"]
        async with cluster.server.client_for() as etcd:
            await etcd.put(b"/before-wipe", b"kept")
        assert third.started is not None
        cluster.processes.forget(third.started)
        shutil.rmtree(third.data_dir)

        # The agent's join with an empty data dir: our name is listed, so that member goes.
        async with cluster.server.client_for() as etcd:
            plan = etcd_rules.plan_join(await etcd.member_list(), name="third", peer=third.peer_url)
            assert (plan.remove, plan.add) == (before.id, True)
        after = await cluster.join("third")
        assert after.id != before.id and after.name == "third"

        async with cluster.server.client_for(third.client_url) as etcd:
            kept = await eventually(
                lambda: etcd.get_value(b"/before-wipe"),
                timeout=10,
                what="a quorum read from the rejoined member",
            )
            assert kept == b"kept"
            await etcd.put(b"/after-rejoin", b"ok")
            assert sorted(m.name for m in await etcd.member_list()) == ["second", "test", "third"]
        async with cluster.server.client_for() as etcd:
            assert await etcd.get_value(b"/after-rejoin") == b"ok"
        assert third.started is not None and third.started.process.poll() is None
        assert "panic" not in third.started.log.read_text(errors="replace")

    run(scenario())


def test_a_revoked_lease_stops_the_lock_holder(etcd_server: EtcdServer) -> None:
    progress: list[str] = []

    async def holder(etcd: etcd_client.EtcdClient, taken: asyncio.Future[bytes]) -> None:
        async with etcd.lock(b"/locks/revoked", ttl=3) as key:
            taken.set_result(key)
            progress.append("in")
            await asyncio.Event().wait()  # the critical section: only the lease loss ends it
            progress.append("carried on")

    async def scenario() -> None:
        async with etcd_server.client_for() as a, etcd_server.client_for() as b:
            taken: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(holder(a, taken))
            key = await asyncio.wait_for(taken, 10)
            lease_id = int(key.rsplit(b"/", 1)[1], 16)
            await b.lease_revoke(lease_id)
            with pytest.raises(errors.EtcdLeaseLost, match="expired or was revoked"):
                await asyncio.wait_for(task, 10)
            # The lock is free for the next holder straight away.
            async with b.lock(b"/locks/revoked", ttl=3, timeout=5):
                pass

    run(scenario())
    assert progress == ["in"]


def test_an_unreachable_etcd_stops_the_lock_holder_within_the_ttl(etcd_server: EtcdServer) -> None:
    pid = etcd_server.started.process.pid
    progress: list[str] = []

    async def scenario() -> float:
        tls = etcd_server.tls()
        async with etcd_client.EtcdClient([etcd_server.endpoint], tls=tls, timeout=1.0) as etcd:
            with pytest.raises(errors.EtcdLeaseLost, match="no keep-alive got through within its 2s TTL"):
                async with asyncio.timeout(20), etcd.lock(b"/locks/frozen", ttl=2):
                    progress.append("in")
                    os.kill(pid, signal.SIGSTOP)  # etcd stops answering, its sockets stay open
                    stopped = time.monotonic()
                    await asyncio.Event().wait()
                    progress.append("carried on")
            return time.monotonic() - stopped

    try:
        elapsed = run(scenario())
    finally:
        os.kill(pid, signal.SIGCONT)
    assert progress == ["in"]
    # Lost at the lease's deadline (give or take a refresh), plus the failed revoke's timeout.
    assert elapsed < 2 + 1 + 2, f"the holder carried on for {elapsed:.1f}s without its lease"

    async def reacquired() -> None:
        async with etcd_server.client_for() as etcd, etcd.lock(b"/locks/frozen", ttl=2, timeout=15):
            pass

    run(reacquired())


def test_a_watch_behind_a_compaction_gets_the_current_state_and_carries_on(etcd_server: EtcdServer) -> None:
    async def scenario() -> None:
        async with etcd_server.client_for() as etcd:
            start = (await etcd.put(b"/w/key", b"v1")).revision
            await etcd.put(b"/w/key", b"v2")
            await etcd.put(b"/w/gone", b"x")
            await etcd.delete(b"/w/gone")
            latest = (await etcd.put(b"/w/key", b"v3")).revision
            await etcd.compact(latest, physical=True)

            async with contextlib.aclosing(etcd.watch(b"/w/", prefix=True, start_revision=start)) as watch:
                relist = await asyncio.wait_for(anext(watch), 10)
                assert isinstance(relist, etcd_client.Relist)
                assert [(kv.key, kv.value) for kv in relist] == [(b"/w/key", b"v3")]
                assert relist.compact_revision == latest and relist.revision >= latest
                await etcd.put(b"/w/key", b"v4")
                changed = await asyncio.wait_for(anext(watch), 10)
                assert [(kv.key, kv.value) for kv in changed] == [(b"/w/key", b"v4")]
                assert not isinstance(changed, etcd_client.Relist)

            # The controllers' one-key wait reports the missed change instead of timing out.
            assert await etcd_access.wait_for_change(etcd, b"/w/key", start_revision=start, timeout=10)

    run(scenario())
