"""Answers from the record table: a query in, an authoritative reply or "forward it" out.

:func:`answer` works on parsed messages; :func:`respond` is the server's slow path from wire bytes
to wire bytes (malformed queries get FORMERR, other opcodes NOTIMP, datagrams that are not queries
are dropped, UDP replies that do not fit get TC). Inside the Corefile's zones every reply is
authoritative (AA); a name with nothing at or below it is NXDOMAIN, an existing name or an empty
non-terminal (``svc.<zone>``, ``<ns>.svc.<zone>``) without the asked type is NOERROR with no
answer (NODATA), and both negative kinds carry the zone's SOA for negative caching (RFC 2308, RFC
8020). Names outside the zones, and reverse names the table has no PTR for when the Corefile's
``fallthrough`` covers them, come back as :class:`Forward`: the caller sends them upstream.

Multi-address answers are built in the table's order rotated by ``rotation`` (the ``loadbalance``
plugin): :attr:`Reply.rotations` lists the rotations that give distinct answers, so a cache can keep
each and serve them in turn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.PTR
import dns.rdtypes.ANY.SOA
import dns.rdtypes.ANY.TXT
import dns.rdtypes.IN.SRV
import dns.rrset

from kubeplane.dns import SCHEMA_VERSION
from kubeplane.dns.corefile import Config
from kubeplane.dns.records import Table, address_rdata, make_rdata, pod_address

__all__ = ["MAX_ROTATIONS", "Forward", "Reply", "answer", "respond"]

#: At most this many distinct rotations of one multi-address answer (evenly spread over its size).
MAX_ROTATIONS = 8
#: The EDNS payload size advertised in replies (DNS flag day 2020).
OUR_PAYLOAD = 1232
#: The UDP reply limit without EDNS, and the least an EDNS client may ask for (RFC 6891).
UDP_LIMIT = 512
TCP_LIMIT = 65535

IN = dns.rdataclass.IN
_DNS_VERSION = dns.name.Name([b"dns-version"])
_POD = b"pod"
_ADDRESS_TYPES = (dns.rdatatype.A, dns.rdatatype.AAAA)
# Bits of a header's first flags byte.
_QR, _OPCODE, _TC, _RD = 0x80, 0x78, 0x02, 0x01


@dataclasses.dataclass(frozen=True)
class Forward:
    """The query is not this server's to answer: send it upstream (:mod:`~kubeplane.dns.forward`)."""

    query: dns.message.Message


@dataclasses.dataclass(frozen=True)
class Reply:
    """A finished reply in wire form."""

    wire: bytes
    #: The ``rotation`` values that give distinct answers; ``(0,)`` when there is only one.
    rotations: tuple[int, ...] = (0,)


def _spread(count: int) -> tuple[int, ...]:
    """Rotations of a ``count``-address set: every one, or MAX_ROTATIONS evenly spread."""
    if count <= 1:
        return (0,)
    shown = min(count, MAX_ROTATIONS)
    return tuple(i * count // shown for i in range(shown))


def _soa(zone: dns.name.Name, table: Table, ttl: int) -> dns.rrset.RRset:
    rdata = make_rdata(
        dns.rdtypes.ANY.SOA.SOA,
        dns.rdatatype.SOA,
        dns.name.Name([b"ns", b"dns", *zone.labels]),
        dns.name.Name([b"hostmaster", *zone.labels]),
        table.generation,
        7200,
        1800,
        86400,
        ttl,
    )
    return dns.rrset.from_rdata_list(zone, ttl, [rdata])


def _complete(names: Iterable[dns.name.Name], zone: dns.name.Name) -> list[dns.name.Name]:
    """The table's relative names made absolute in ``zone``.

    A name longer than DNS allows (a long hostname under a long zone) is left out rather than
    failing the whole answer.
    """
    complete: list[dns.name.Name] = []
    for name in names:
        try:
            complete.append(name.derelativize(zone))
        except dns.name.NameTooLong:
            continue
    return complete


def _in_zone(rdatas: Iterable[dns.rdata.Rdata], zone: dns.name.Name) -> list[dns.rdata.Rdata]:
    """The table keeps SRV targets relative to the zone: complete them for this answer."""
    complete: list[dns.rdata.Rdata] = []
    for rdata in rdatas:
        if isinstance(rdata, dns.rdtypes.IN.SRV.SRV):
            complete.extend(rdata.replace(target=target) for target in _complete([rdata.target], zone))
        else:
            complete.append(rdata)
    return complete


def _response(query: dns.message.Message) -> dns.message.Message:
    response = dns.message.make_response(query, our_payload=OUR_PAYLOAD)
    response.flags |= dns.flags.AA
    return response


def answer(
    table: Table, config: Config, query: dns.message.Message, rotation: int = 0
) -> dns.message.Message | Forward:
    """The reply to a query with exactly one question, or :class:`Forward`."""
    question = query.question[0]
    name, rdtype = question.name, question.rdtype
    for zone in config.forward_zones:
        if name.is_subdomain(zone):
            response = _response(query)
            _zone_answer(response, table, config, zone=zone, name=name, rdtype=rdtype, rotation=rotation)
            return response
    for zone in config.reverse_zones:
        if name.is_subdomain(zone):
            targets = table.pointers(name)
            if not targets and config.falls_through(name):
                return Forward(query)
            response = _response(query)
            if not targets:
                response.set_rcode(dns.rcode.NXDOMAIN)
            elif rdtype in (dns.rdatatype.PTR, dns.rdatatype.ANY):
                rdatas = [
                    make_rdata(dns.rdtypes.ANY.PTR.PTR, dns.rdatatype.PTR, target)
                    for target in _complete(targets, config.primary_zone)
                ]
                if rdatas:
                    response.answer.append(dns.rrset.from_rdata_list(name, config.ttl, rdatas))
            if not response.answer:
                response.authority.append(_soa(zone, table, config.ttl))
            return response
    return Forward(query)


def _zone_answer(
    response: dns.message.Message,
    table: Table,
    config: Config,
    *,
    zone: dns.name.Name,
    name: dns.name.Name,
    rdtype: dns.rdatatype.RdataType,
    rotation: int,
) -> None:
    ttl = config.ttl
    relative = name.relativize(zone)
    any_type = rdtype == dns.rdatatype.ANY

    def wanted(found: dns.rdatatype.RdataType) -> bool:
        return any_type or found == rdtype

    records = table.lookup(relative)
    pod = pod_address(relative) if config.pods == "insecure" else None
    if relative == dns.name.empty:
        if wanted(dns.rdatatype.SOA):
            response.answer.append(_soa(zone, table, ttl))
    elif relative == _DNS_VERSION:
        if wanted(dns.rdatatype.TXT):
            txt = make_rdata(dns.rdtypes.ANY.TXT.TXT, dns.rdatatype.TXT, [SCHEMA_VERSION.encode()])
            response.answer.append(dns.rrset.from_rdata_list(name, ttl, [txt]))
    elif pod is not None:
        if wanted(dns.rdatatype.A if pod[1].version == 4 else dns.rdatatype.AAAA):
            response.answer.append(dns.rrset.from_rdata_list(name, ttl, [address_rdata(pod[1])]))
    elif records is None:
        pod_tree = config.pods == "insecure" and len(relative) <= 2 and relative.labels[-1].lower() == _POD
        if not (table.exists(relative) or pod_tree):
            response.set_rcode(dns.rcode.NXDOMAIN)
    elif dns.rdatatype.CNAME in records:
        # An ExternalName: the CNAME answers every type (its target is the upstream's to resolve).
        response.answer.append(dns.rrset.from_rdata_list(name, ttl, records[dns.rdatatype.CNAME]))
    else:
        for found_type, stored in records.items():
            if not wanted(found_type):
                continue
            rdatas = stored
            if found_type in _ADDRESS_TYPES and config.loadbalance and rotation:
                shift = rotation % len(stored)
                rdatas = stored[shift:] + stored[:shift]
            complete = _in_zone(rdatas, zone)
            if complete:
                response.answer.append(dns.rrset.from_rdata_list(name, ttl, complete))
            if found_type == dns.rdatatype.SRV:
                _additional(response, table, zone, complete, ttl)
    if not response.answer:
        response.authority.append(_soa(zone, table, ttl))


def _additional(
    response: dns.message.Message, table: Table, zone: dns.name.Name, srvs: list[dns.rdata.Rdata], ttl: int
) -> None:
    """A/AAAA of SRV targets, so a client needs no second query (specification 2.3.2, 2.4.2)."""
    seen: set[dns.name.Name] = set()
    for srv in srvs:
        assert isinstance(srv, dns.rdtypes.IN.SRV.SRV)
        if srv.target in seen:
            continue
        seen.add(srv.target)
        records = table.lookup(srv.target.relativize(zone)) or {}
        for rdtype in _ADDRESS_TYPES:
            if rdtype in records:
                response.additional.append(dns.rrset.from_rdata_list(srv.target, ttl, records[rdtype]))


def _header_reply(data: bytes, rcode: dns.rcode.Rcode) -> bytes:
    """A reply with no sections, from the query's header only (it could not be parsed)."""
    flags = _QR | (data[2] & (_OPCODE | _RD))
    return data[:2] + bytes([flags, int(rcode) & 0x0F]) + bytes(8)


#: dnspython shuffles every record set it renders by default; the order is ours to choose (the
#: table's, rotated for ``loadbalance``) so that cached rotations are distinct and repeatable.
_IN_ORDER: dict[str, Any] = {"want_shuffle": False}


def _render(response: dns.message.Message, query: dns.message.Message, tcp: bool) -> Reply:
    """Wire form within the client's limit.

    A UDP reply that does not fit first loses its additional records (the client can ask for
    them; RFC 2181 9: no TC for that); if it still does not fit it goes out empty with TC, and the
    client retries over TCP.
    """
    limit = TCP_LIMIT if tcp else max(UDP_LIMIT, query.payload if query.edns >= 0 else UDP_LIMIT)
    try:
        return Reply(response.to_wire(max_size=limit, **_IN_ORDER))
    except dns.exception.TooBig:
        pass
    if response.additional:
        response.additional = []
        try:
            return Reply(response.to_wire(max_size=limit, **_IN_ORDER))
        except dns.exception.TooBig:
            pass
    short = _response(query)
    short.set_rcode(response.rcode())
    short.flags |= dns.flags.TC
    return Reply(short.to_wire())


def respond(
    table: Table, config: Config, data: bytes, *, tcp: bool = False, rotation: int = 0
) -> Reply | Forward | None:
    """The reply to a query's wire bytes, :class:`Forward`, or None to drop the datagram.

    Never raises for any input: the server calls it on whatever arrives.
    """
    if len(data) < 12 or data[2] & _QR:
        return None  # not a query: answering a reply could start a loop
    if data[2] & _OPCODE:
        return Reply(_header_reply(data, dns.rcode.NOTIMP))
    try:
        query = dns.message.from_wire(data)
    except (dns.exception.DNSException, ValueError):
        return Reply(_header_reply(data, dns.rcode.FORMERR))
    if len(query.question) != 1:
        response = _response(query)
        response.set_rcode(dns.rcode.FORMERR)
        return _render(response, query, tcp)
    if query.edns > 0 or query.question[0].rdclass != IN:
        response = dns.message.make_response(query, our_payload=OUR_PAYLOAD)
        response.set_rcode(dns.rcode.BADVERS if query.edns > 0 else dns.rcode.REFUSED)
        return _render(response, query, tcp)
    result = answer(table, config, query, rotation)
    if isinstance(result, Forward):
        return result
    reply = _render(result, query, tcp)
    if not config.loadbalance or reply.wire[2] & _TC:
        return reply
    count = max((len(rrset) for rrset in result.answer if rrset.rdtype in _ADDRESS_TYPES), default=0)
    return dataclasses.replace(reply, rotations=_spread(count))
