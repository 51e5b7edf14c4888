"""The hot path: finished UDP replies by question, so a repeated query costs a dict lookup.

Parsing a query, answering it and rendering the reply with dnspython takes a few hundred
microseconds; clients ask the same few names over and over (every search-path expansion of every
lookup). :class:`WireCache` keeps the reply bytes of *plain* queries (one question, no other
sections, no flags but RD, AD and CD: what glibc and busybox send) under the question's bytes with
the name lowercased, and answers a hit by splicing the query's ID, RD bit and question bytes into
the stored reply. The question keeps the client's exact spelling (0x20 case randomisation), and
the stored reply's compression pointers stay valid because the question has the same length.

Queries with EDNS (an OPT record), TCP queries and anything unusual take the slow path
(:func:`~kubeplane.dns.answer.respond`) every time. Forwarded names never enter the cache. Every
entry belongs to one :class:`~kubeplane.dns.records.Table`: the first lookup with another table
drops them all, so an answer never outlives the Service change that made it stale. For a
multi-address answer the entry keeps each rotation and serves them in turn (``loadbalance``).
"""

from __future__ import annotations

from kubeplane.dns.answer import Forward, Reply, respond
from kubeplane.dns.corefile import Config
from kubeplane.dns.records import Table

__all__ = ["DEFAULT_ENTRIES", "WireCache", "question_key"]

#: Entries kept at most; the oldest goes first (random names must not grow the cache unbounded).
DEFAULT_ENTRIES = 10_000

_HEADER = 12
_RD = 0x01
#: Second flags byte of a query that may hit: AD and CD (dig sets AD) do not change the reply.
_AD_CD = 0x30
_ONE_QUESTION = b"\x00\x01" + bytes(6)
_MAX_LABEL = 63


def question_key(data: bytes) -> tuple[bytes, int] | None:
    """The cache key of a plain query and the end of its name, or None for any other datagram."""
    if len(data) < _HEADER + 5 or data[2] & ~_RD or data[3] & ~_AD_CD or data[4:12] != _ONE_QUESTION:
        return None
    end = _HEADER
    while data[end]:
        if data[end] > _MAX_LABEL:
            return None  # a compression pointer or an extended label type
        end += data[end] + 1
        if end >= len(data):
            return None
    end += 1
    if len(data) != end + 4:
        return None
    # Lowercase the name only: the type and class bytes after it are numbers, not letters.
    return data[_HEADER:end].lower() + data[end:], end


class _Entry:
    """The reply templates of one question (RD cleared) and the rotation to serve next."""

    __slots__ = ("next", "templates")

    def __init__(self, templates: list[bytes]) -> None:
        self.templates = templates
        # The slow path that made the entry has just sent the first rotation.
        self.next = 1 % len(templates)

    def serve(self, data: bytes, end: int) -> bytes:
        template = self.templates[self.next]
        self.next = (self.next + 1) % len(self.templates)
        flags = template[2] | (data[2] & _RD)
        return data[:2] + bytes([flags]) + template[3:_HEADER] + data[_HEADER:end] + template[end:]


class WireCache:
    """UDP replies by lowercased question, for one table at a time."""

    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        self.max_entries = max_entries
        self._table: Table | None = None
        self._entries: dict[bytes, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def reply(self, table: Table, config: Config, data: bytes) -> bytes | Forward | None:
        """The reply to a UDP datagram (cached or answered and remembered), Forward, or None to drop."""
        if table is not self._table:
            self._entries.clear()
            self._table = table
        found = question_key(data)
        if found is not None:
            entry = self._entries.get(found[0])
            if entry is not None:
                return entry.serve(data, found[1])
        result = respond(table, config, data)
        if not isinstance(result, Reply):
            return result
        if found is not None:
            self._remember(table, config, data, found, result)
        return result.wire

    def _remember(
        self, table: Table, config: Config, data: bytes, found: tuple[bytes, int], first: Reply
    ) -> None:
        key, end = found
        wires = [first.wire]
        for rotation in first.rotations[1:]:
            rotated = respond(table, config, data, rotation=rotation)
            assert isinstance(rotated, Reply)  # the same query answered the first time
            wires.append(rotated.wire)
        # Only replies that echo the question can take another spelling of it (not FORMERR ones).
        if any(wire[4:6] != b"\x00\x01" or wire[_HEADER:end] != data[_HEADER:end] for wire in wires):
            return
        while len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = _Entry([wire[:2] + bytes([wire[2] & ~_RD]) + wire[3:] for wire in wires])
