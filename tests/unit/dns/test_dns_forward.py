"""Forwarding: targets in order, TCP after a truncated UDP answer, SERVFAIL when none answers,
``cache N`` with TTLs counted down, the loop guard (upstream calls replaced by fakes)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rrset
import pytest

from kubeplane.dns import corefile, forward
from kubeplane.dns.corefile import Upstream

pytestmark = pytest.mark.unit

A = Upstream("192.0.2.1", 53)
B = Upstream("192.0.2.2", 5353)


class Upstreams:
    """Fake ``dns.asyncquery.udp``/``tcp``: answers per host, calls recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: dict[tuple[str, str], Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, int]] = []
        monkeypatch.setattr(forward.dns.asyncquery, "udp", self.fake("udp"))
        monkeypatch.setattr(forward.dns.asyncquery, "tcp", self.fake("tcp"))

    def fake(self, proto: str) -> Any:
        async def send(query: dns.message.Message, where: str, timeout: float, port: int) -> Any:
            self.calls.append((proto, where, port))
            found = self.answers.get((proto, where))
            if isinstance(found, Exception):
                raise found
            if found is None:
                raise dns.exception.Timeout
            return found(query)

        return send


def addresses(ttl: int = 60, count: int = 1, *, truncated: bool = False) -> Any:
    def make(query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        name = query.question[0].name
        response.answer.append(
            dns.rrset.from_text_list(name, ttl, "IN", "A", [f"198.51.100.{i}" for i in range(1, count + 1)])
        )
        if truncated:
            response.flags |= dns.flags.TC
        return response

    return make


def resolve(
    forwarder: forward.Forwarder, name: str = "www.example.org", **kwargs: Any
) -> dns.message.Message:
    query = dns.message.make_query(name, "A")
    return dns.message.from_wire(asyncio.run(forwarder.resolve(query, **kwargs)))


def test_no_target_answers_servfail_at_once() -> None:
    assert resolve(forward.Forwarder(())).rcode() == dns.rcode.SERVFAIL


def test_targets_are_tried_in_order_and_all_failing_is_servfail(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Upstreams(monkeypatch, {("udp", B.host): addresses()})
    reply = resolve(forward.Forwarder((A, B)))
    assert [r.to_text() for rrset in reply.answer for r in rrset] == ["198.51.100.1"]
    assert fake.calls == [("udp", A.host, 53), ("udp", B.host, 5353)]
    failing = Upstreams(monkeypatch, {("udp", A.host): OSError("unreachable")})
    assert resolve(forward.Forwarder((A,))).rcode() == dns.rcode.SERVFAIL
    assert failing.calls == [("udp", A.host, 53)]


def test_a_truncated_udp_answer_is_asked_again_over_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Upstreams(
        monkeypatch, {("udp", A.host): addresses(truncated=True), ("tcp", A.host): addresses(count=3)}
    )
    reply = resolve(forward.Forwarder((A,)))
    assert len(reply.answer[0]) == 3
    assert [call[0] for call in fake.calls] == ["udp", "tcp"]


def test_an_answer_too_big_for_the_clients_udp_is_sent_truncated(monkeypatch: pytest.MonkeyPatch) -> None:
    Upstreams(monkeypatch, {("udp", A.host): addresses(count=60)})
    forwarder = forward.Forwarder((A,))
    short = resolve(forwarder)
    assert short.flags & dns.flags.TC
    assert not short.answer
    assert len(resolve(forwarder, tcp=True).answer[0]) == 60


def test_cache_keeps_answers_for_at_most_n_seconds_with_ttls_counted_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = Upstreams(monkeypatch, {("udp", A.host): addresses(ttl=60)})
    now = [100.0]
    forwarder = forward.Forwarder((A,), cache_ttl=30, clock=lambda: now[0])
    assert resolve(forwarder).answer[0].ttl == 60
    now[0] += 10
    assert resolve(forwarder, "WWW.example.org").answer[0].ttl == 50
    assert len(fake.calls) == 1
    now[0] += 21  # past `cache 30`, though the record's own TTL has time left
    resolve(forwarder)
    assert len(fake.calls) == 2


def test_without_cache_every_query_goes_upstream_and_servfail_is_never_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = Upstreams(monkeypatch, {("udp", A.host): addresses()})
    uncached = forward.Forwarder((A,))
    resolve(uncached)
    resolve(uncached)
    assert len(fake.calls) == 2
    failing = Upstreams(monkeypatch, {})
    cached = forward.Forwarder((A,), cache_ttl=30)
    resolve(cached)
    resolve(cached)
    assert len(failing.calls) == 2


def test_the_loop_guard_drops_an_upstream_that_is_this_server(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("search example.org\nnameserver 10.0.0.10\nnameserver 10.96.0.10\n")
    config = corefile.parse(
        f""".:53 {{
    kubernetes cluster.local
    forward . 127.0.0.1 127.0.0.1:5353 {resolv}
}}"""
    )
    kept = forward.upstreams(config, {"127.0.0.1", "10.96.0.10"})
    assert kept == (Upstream("127.0.0.1", 5353), Upstream("10.0.0.10", 53))
    assert "127.0.0.1" in forward.local_addresses("0.0.0.0")


def test_a_missing_resolv_conf_gives_no_upstream(tmp_path: Path) -> None:
    config = corefile.parse(f".:53 {{\n    kubernetes cluster.local\n    forward . {tmp_path}/none\n}}")
    assert forward.upstreams(config, set()) == ()
