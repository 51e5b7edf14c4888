"""The wire answer cache: a hit is the slow path's reply with the query's ID, RD bit and spelling."""

from __future__ import annotations

from typing import Any

import dns.flags
import dns.message
import pytest
from dns_objects import CONFIG, COREFILE, endpoint, endpoint_slice, query, service
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeplane.dns import corefile, wirecache
from kubeplane.dns.answer import Forward, Reply, respond
from kubeplane.dns.corefile import Config
from kubeplane.dns.records import Table
from kubeplane.dns.wirecache import WireCache, question_key

pytestmark = pytest.mark.unit

SVC = "echo.default.svc.cluster.local."
HL = "hl.default.svc.cluster.local."


def cluster() -> Table:
    return Table.from_objects(
        [service("echo"), service("hl", cluster_ip="None")],
        [endpoint_slice("hl", [endpoint("10.244.1.5"), endpoint("10.244.1.6"), endpoint("10.244.1.7")])],
    )


def wire(name: str, rdtype: str = "A", *, ident: int = 0x1234, rd: bool = True, **kwargs: object) -> bytes:
    message = query(name, rdtype, **kwargs)
    message.id = ident
    if not rd:
        message.flags &= ~dns.flags.RD
    return message.to_wire()


def slow(table: Table, data: bytes) -> bytes:
    result = respond(table, CONFIG, data)
    assert isinstance(result, Reply)
    return result.wire


def test_a_hit_is_the_slow_path_reply_with_the_query_id_and_rd() -> None:
    table, cache = cluster(), WireCache()
    first = cache.reply(table, CONFIG, wire(SVC, ident=1))
    assert first == slow(table, wire(SVC, ident=1)) and len(cache) == 1
    for ident, rd in ((2, True), (0xFFFF, False)):
        data = wire(SVC, ident=ident, rd=rd)
        assert cache.reply(table, CONFIG, data) == slow(table, data)
    assert len(cache) == 1


def test_a_hit_echoes_the_question_in_the_client_spelling() -> None:
    table, cache = cluster(), WireCache()
    cache.reply(table, CONFIG, wire(SVC))
    mixed = wire("eChO.DEFAULT.svc.CLUSTER.local.")
    hit = cache.reply(table, CONFIG, mixed)
    assert isinstance(hit, bytes) and len(cache) == 1
    assert hit == slow(table, mixed)
    reply = dns.message.from_wire(hit)  # compression pointers still land on the question
    assert str(reply.question[0].name) == "eChO.DEFAULT.svc.CLUSTER.local."
    assert [str(rd) for rd in reply.answer[0]] == ["10.96.0.50"]


def test_edns_and_other_unusual_queries_always_take_the_slow_path() -> None:
    table, cache = cluster(), WireCache()
    for data in (
        wire(SVC, use_edns=0),
        wire(SVC, want_dnssec=True),
        b"\x12\x34\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\xc0\x0c\x00\x01\x00\x01",  # compression pointer
        wire(SVC)[:-1],
    ):
        assert question_key(data) is None
        assert cache.reply(table, CONFIG, data) == (
            r.wire if isinstance(r := respond(table, CONFIG, data), Reply) else r
        )
    assert len(cache) == 0


def test_the_key_lowercases_the_name_but_not_the_type() -> None:
    # Type 65 (HTTPS) is b"\x00A" on the wire: lowercasing it would turn it into type 97.
    upper, lower = wire("ECHO.default.svc.cluster.local.", "TYPE65"), wire(SVC, "TYPE65")
    key_upper, key_lower = question_key(upper), question_key(lower)
    assert key_upper is not None and key_upper == key_lower and key_upper[0].endswith(b"\x00A\x00\x01")
    assert question_key(wire(SVC, "TYPE97")) != key_lower


def test_forwarded_and_unparsable_queries_are_not_cached() -> None:
    table, cache = cluster(), WireCache()
    assert isinstance(cache.reply(table, CONFIG, wire("www.example.com.")), Forward)
    # A plain-looking query whose name is longer than DNS allows: FORMERR without a question.
    too_long = b"\x12\x34\x01\x00\x00\x01" + bytes(6) + (b"\x3f" + b"a" * 63) * 5 + b"\x00\x00\x01\x00\x01"
    assert question_key(too_long) is not None
    formerr = cache.reply(table, CONFIG, too_long)
    assert isinstance(formerr, bytes) and formerr[3] & 0x0F == 1
    assert len(cache) == 0


def test_a_new_table_drops_every_entry() -> None:
    table, cache = cluster(), WireCache()
    cache.reply(table, CONFIG, wire(SVC))
    changed = table.with_service(("default", "echo"), service("echo", cluster_ip="10.96.0.99"))
    reply = cache.reply(changed, CONFIG, wire(SVC))
    assert isinstance(reply, bytes)
    assert [str(rd) for rd in dns.message.from_wire(reply).answer[0]] == ["10.96.0.99"]
    assert len(cache) == 1
    cache.clear()
    assert len(cache) == 0


def test_multi_address_answers_are_served_in_turn() -> None:
    table, cache = cluster(), WireCache()
    firsts = []
    for ident in range(6):
        reply = cache.reply(table, CONFIG, wire(HL, ident=ident))
        assert isinstance(reply, bytes)
        firsts.append(str(dns.message.from_wire(reply).answer[0][0]))
    assert firsts == ["10.244.1.5", "10.244.1.6", "10.244.1.7"] * 2


def test_truncated_replies_are_cached_too() -> None:
    many = [endpoint(f"10.244.1.{i}") for i in range(1, 101)]
    table = Table.from_objects([service("big", cluster_ip="None")], [endpoint_slice("big", many)])
    cache = WireCache()
    data = wire("big.default.svc.cluster.local.")
    first = cache.reply(table, CONFIG, data)
    assert isinstance(first, bytes) and first[2] & 0x02 and len(cache) == 1
    assert cache.reply(table, CONFIG, data) == first


def test_the_cache_is_bounded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bytes] = []

    def counting(table: Table, config: Config, data: bytes, **kwargs: Any) -> Reply | Forward | None:
        asked.append(data)
        return respond(table, config, data, **kwargs)

    monkeypatch.setattr(wirecache, "respond", counting)
    table, cache = cluster(), WireCache(max_entries=2)
    names = (SVC, "nope.default.svc.cluster.local.", "other.default.svc.cluster.local.")
    for name in names:
        cache.reply(table, CONFIG, wire(name))
    assert len(cache) == 2 and len(asked) == 3
    for name in names[1:]:
        cache.reply(table, CONFIG, wire(name))
    assert len(asked) == 3, "the two newest are hits"
    cache.reply(table, CONFIG, wire(SVC))
    assert len(asked) == 4 and len(cache) == 2, "the oldest was dropped and is answered again"


_STEADY = corefile.parse(COREFILE.replace("    loadbalance\n", ""))
_PLAIN = [
    wire(name, rdtype)
    for name, rdtype in ((SVC, "A"), (HL, "A"), (f"_http._tcp.{SVC}", "SRV"), ("x.cluster.local.", "TXT"))
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_PLAIN), st.lists(st.tuples(st.integers(0, 60), st.integers(0, 255)), max_size=4))
def test_the_cache_is_transparent(data: bytes, changes: list[tuple[int, int]]) -> None:
    # Without loadbalance every reply is fixed: asking twice through the cache (the second time
    # a hit when the query is plain) gives exactly what the slow path gives.
    mutated = bytearray(data)
    for position, value in changes:
        if position < len(mutated):
            mutated[position] = value
    table, cache = cluster(), WireCache()
    expected = respond(table, _STEADY, bytes(mutated))
    for _ in range(2):
        got = cache.reply(table, _STEADY, bytes(mutated))
        if isinstance(expected, Reply):
            assert got == expected.wire
        else:
            assert got is None if expected is None else isinstance(got, Forward)
