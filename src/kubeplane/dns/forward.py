"""Upstream forwarding: the names this server does not own go to the Corefile's ``forward`` targets.

- Targets are the ``forward .`` addresses, or the ``nameserver`` lines of the file it names
  (``/etc/resolv.conf`` under ``dnsPolicy: Default``: the kubelet's ``--resolv-conf``), read once
  at start. A target that is this server itself (our DNS port on one of our own addresses) is
  dropped with a log line: asking ourselves would loop (CoreDNS's ``loop`` plugin stops instead).
- Each query goes to the targets in order over UDP, then again over TCP when the UDP answer is
  truncated; each try waits :data:`TIMEOUT` at most. With no target, or when every one fails, the
  client gets SERVFAIL at once (a pod's resolver then tries its next name instead of timing out).
- ``cache N`` keeps forwarded NOERROR and NXDOMAIN answers for at most N seconds (less when their
  own TTLs are lower), handing them out with the TTLs counted down. The records of the cluster
  never enter this cache (they change with every watch event; the wire cache handles them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode

from kubeplane.dns.corefile import Config, Upstream

__all__ = ["ALL_ADDRESSES", "TIMEOUT", "Forwarder", "local_addresses", "upstreams"]

log = logging.getLogger(__name__)

#: The address that listens on every interface (the server's default).
ALL_ADDRESSES = "0.0.0.0"  # noqa: S104 - a DNS server for the pod network listens on all of it
#: Seconds one upstream try may take (a pod's resolver gives up after 5 s per server).
TIMEOUT = 2.0
#: The largest UDP reply we send a client that announced no EDNS payload.
_UDP_LIMIT = 512


def resolv_conf_nameservers(path: str) -> list[Upstream]:
    """The ``nameserver`` lines of a resolv.conf file (none when it is missing)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        log.warning("cannot read %s: %s; no upstream from it", path, exc)
        return []
    found = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            found.append(Upstream(words[1].partition("%")[0], 53))
    return found


def local_addresses(listen: str) -> set[str]:
    """The addresses this server answers on: ``listen``, the host's own, loopback when on all."""
    found = {listen}
    if listen in ("", ALL_ADDRESSES, "::"):
        found |= {"127.0.0.1", "::1"}
    with contextlib.suppress(OSError):
        found |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
    return found


def upstreams(config: Config, own: Iterable[str]) -> tuple[Upstream, ...]:
    """The targets to forward to, without ourselves (the loop guard)."""
    targets = list(config.upstreams)
    if config.resolv_conf:
        targets += resolv_conf_nameservers(config.resolv_conf)
    own = set(own)
    kept = []
    for target in targets:
        if target.port == config.dns_port and target.host in own:
            log.warning(
                "forward target %s:%d is this server; dropped (it would loop)", *dataclasses.astuple(target)
            )
        else:
            kept.append(target)
    return tuple(kept)


@dataclasses.dataclass
class _Cached:
    response: dns.message.Message
    stored: float
    expires: float


class Forwarder:
    """Sends queries upstream and keeps their answers for ``cache_ttl`` seconds (None: no cache)."""

    def __init__(
        self,
        targets: tuple[Upstream, ...],
        *,
        cache_ttl: int | None = None,
        timeout: float = TIMEOUT,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.targets = targets
        self.cache_ttl = cache_ttl
        self.timeout = timeout
        self.max_entries = max_entries
        self._clock = clock
        self._cache: dict[tuple[dns.name.Name, int, int], _Cached] = {}

    async def resolve(self, query: dns.message.Message, *, tcp: bool = False) -> bytes:
        """The reply to ``query`` in wire form for a client over UDP (size-limited) or TCP."""
        response = self._cached(query) or await self._ask(query)
        response.id = query.id
        limit = 65535 if tcp else max(_UDP_LIMIT, query.payload if query.edns >= 0 else 0)
        try:
            return response.to_wire(max_size=limit)
        except dns.exception.TooBig:
            short = dns.message.make_response(query)
            short.set_rcode(response.rcode())
            short.flags |= dns.flags.TC
            return short.to_wire()

    async def _ask(self, query: dns.message.Message) -> dns.message.Message:
        for target in self.targets:
            try:
                response = await dns.asyncquery.udp(query, target.host, self.timeout, target.port)
                if response.flags & dns.flags.TC:
                    response = await dns.asyncquery.tcp(query, target.host, self.timeout, target.port)
            except (OSError, dns.exception.DNSException) as exc:
                log.info("upstream %s:%d failed: %s", target.host, target.port, exc or type(exc).__name__)
                continue
            self._remember(query, response)
            return response
        failed = dns.message.make_response(query)
        failed.set_rcode(dns.rcode.SERVFAIL)
        return failed

    def _key(self, query: dns.message.Message) -> tuple[dns.name.Name, int, int] | None:
        if len(query.question) != 1:
            return None
        question = query.question[0]
        return question.name.canonicalize(), int(question.rdtype), int(question.rdclass)

    def _remember(self, query: dns.message.Message, response: dns.message.Message) -> None:
        key = self._key(query)
        if (
            not self.cache_ttl
            or key is None
            or response.rcode() not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN)
        ):
            return
        ttls = [rrset.ttl for section in (response.answer, response.authority) for rrset in section]
        ttl = min([self.cache_ttl, *ttls])
        if ttl <= 0:
            return
        while len(self._cache) >= self.max_entries:
            del self._cache[next(iter(self._cache))]
        now = self._clock()
        self._cache[key] = _Cached(response, now, now + ttl)

    def _cached(self, query: dns.message.Message) -> dns.message.Message | None:
        key = self._key(query)
        entry = self._cache.get(key) if key is not None else None
        if key is None or entry is None:
            return None
        now = self._clock()
        if now >= entry.expires:
            del self._cache[key]
            return None
        # A copy with the TTLs counted down by the time the answer has been kept.
        response = dns.message.from_wire(entry.response.to_wire())
        spent = int(now - entry.stored)
        for section in (response.answer, response.authority, response.additional):
            for rrset in section:
                rrset.ttl = max(0, rrset.ttl - spent)
        return response
