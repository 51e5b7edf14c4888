"""The project's etcd client against a real etcd from Debian, over mutual TLS on loopback."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from kubeplane.clients import errors
from kubeplane.clients import etcd as etcd_client

if TYPE_CHECKING:
    from conftest import EtcdServer

run = asyncio.run

pytestmark = pytest.mark.integration


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


def test_txn_compare_and_swap(etcd_server: EtcdServer) -> None:
    async def scenario() -> None:
        async with etcd_server.client_for() as etcd:
            await etcd.compare_and_swap(b"/cas", expected=None, value=b"v1")
            with pytest.raises(errors.EtcdConflict, match="found b'v1'"):
                await etcd.compare_and_swap(b"/cas", expected=None, value=b"other")
            await etcd.compare_and_swap(b"/cas", expected=b"v1", value=b"v2")
            assert await etcd.get_value(b"/cas") == b"v2"

            current = (await etcd.get(b"/cas")).kvs[0]
            stale = etcd_client.Compare.mod_revision(b"/cas", "==", current.mod_revision - 1)
            result = await etcd.txn(
                [stale], [etcd_client.Op.put(b"/cas", b"x")], [etcd_client.Op.get(b"/cas")]
            )
            assert not result.succeeded
            assert isinstance(result.responses[0], etcd_client.RangeResult)
            assert result.responses[0].kvs[0].value == b"v2"

    run(scenario())


def test_lease_expiry_keepalive_revoke(etcd_server: EtcdServer) -> None:
    async def scenario() -> None:
        async with etcd_server.client_for() as etcd:
            short = await etcd.lease_grant(2)
            await etcd.put(b"/leased", b"x", lease=short.id)
            assert (await etcd.get(b"/leased")).kvs[0].lease == short.id
            assert await etcd.lease_keepalive(short.id) == 2
            await asyncio.sleep(3.5)
            assert await etcd.get_value(b"/leased") is None
            with pytest.raises(errors.EtcdNotFound):
                await etcd.lease_keepalive(short.id)

            async with etcd.lease(2) as kept:
                await etcd.put(b"/kept", b"y", lease=kept.id)
                await asyncio.sleep(3.5)  # longer than the TTL: only the keepalive task saves it
                assert await etcd.get_value(b"/kept") == b"y"
            assert await etcd.get_value(b"/kept") is None
            assert await etcd.lease_ttl(kept.id) == -1

    run(scenario())


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


def test_election_campaign_leader_resign_observe(etcd_server: EtcdServer) -> None:
    async def scenario() -> None:
        async with etcd_server.client_for() as a, etcd_server.client_for() as b:
            assert await a.leader(b"elect") is None
            async with a.lease(10) as lease_a, b.lease(10) as lease_b:
                leader_a = await a.campaign(b"elect", b"node-a", lease=lease_a.id)
                current = await a.leader(b"elect")
                assert current is not None and current.value == b"node-a"

                observed = b.observe(b"elect")
                first = await anext(observed)
                assert first.value == b"node-a"

                waiting = asyncio.create_task(b.campaign(b"elect", b"node-b", lease=lease_b.id))
                await asyncio.sleep(0.5)
                assert not waiting.done(), "a second campaigner must wait while a leads"
                await a.resign(leader_a)
                leader_b = await asyncio.wait_for(waiting, 10)
                assert leader_b.name == b"elect"
                changed = await asyncio.wait_for(anext(observed), 10)
                assert changed.value == b"node-b"
                await observed.aclose()
                current = await a.leader(b"elect")
                assert current is not None and current.value == b"node-b"

    run(scenario())


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
