"""The records of a cluster: an immutable :class:`Table` built from Services and EndpointSlices.

Objects are the plain dicts the Kubernetes API returns (``v1`` Services; ``discovery.k8s.io``
``v1beta1`` and ``v1`` EndpointSlices, whose fields used here are the same). Per the Kubernetes DNS
specification (schema 1.1.0), relative to the cluster zone:

- a ClusterIP Service ``<svc>.<ns>.svc``: A/AAAA of its cluster IPs, SRV
  ``_<port>._<proto>.<svc>.<ns>.svc`` per named port, and a PTR per cluster IP;
- a headless Service: A/AAAA of every *ready* endpoint address at ``<svc>.<ns>.svc`` and at
  ``<hostname>.<svc>.<ns>.svc`` (the endpoint's ``hostname``, else the address with dashes:
  ``10-244-1-5``), SRV per named port and ready endpoint targeting that hostname name, PTR per
  address; all slices of the Service merged, addresses de-duplicated;
- an ExternalName Service: a CNAME to its external name.

Names are stored relative to the zone, so one table serves every zone of the Corefile; SRV targets
are relative too and :mod:`~kubeplane.dns.answer` completes them. A :class:`Table` never changes:
:meth:`Table.with_service` returns a new one that shares everything but that Service's names, so
the server swaps one reference per watch event and a query in flight keeps a consistent snapshot.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import dns.exception
import dns.name
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.CNAME
import dns.rdtypes.IN.A
import dns.rdtypes.IN.AAAA
import dns.rdtypes.IN.SRV
import dns.reversename

__all__ = [
    "SERVICE_NAME_LABEL",
    "IPAddress",
    "Records",
    "ServiceKey",
    "ServiceRecords",
    "Table",
    "address_rdata",
    "make_rdata",
    "pod_address",
    "service_records",
]

#: The label that ties an EndpointSlice to its Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"

IN = dns.rdataclass.IN
A = dns.rdatatype.A
AAAA = dns.rdatatype.AAAA
SRV = dns.rdatatype.SRV
CNAME = dns.rdatatype.CNAME

ServiceKey = tuple[str, str]
"""(namespace, name) of a Service."""
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Records = Mapping[dns.rdatatype.RdataType, tuple[dns.rdata.Rdata, ...]]
"""The rdatas at one name, by type."""

_SVC = dns.name.Name([b"svc"])
_POD = b"pod"


@dataclasses.dataclass(frozen=True)
class ServiceRecords:
    """Everything one Service puts in the table."""

    #: Relative name -> records; no two Services can own the same name (they differ in
    #: ``<svc>.<ns>.svc``, which every name of a Service ends with).
    names: Mapping[dns.name.Name, Records]
    #: Absolute reverse name (``5.1.244.10.in-addr.arpa.``) -> relative PTR targets.
    pointers: Mapping[dns.name.Name, tuple[dns.name.Name, ...]]


def _address(text: object) -> IPAddress | None:
    try:
        return ipaddress.ip_address(str(text))
    except ValueError:
        return None


def make_rdata(
    kind: Callable[..., dns.rdata.Rdata], rdtype: dns.rdatatype.RdataType, *fields: object
) -> dns.rdata.Rdata:
    """An IN-class rdata; dnspython 2.3's rdata constructors are unannotated, so one typed door."""
    return kind(IN, rdtype, *fields)


def _addresses(texts: Iterable[object]) -> list[IPAddress]:
    return [address for address in map(_address, texts) if address is not None]


def address_rdata(address: IPAddress) -> dns.rdata.Rdata:
    """The A or AAAA rdata of an address."""
    if address.version == 4:
        return make_rdata(dns.rdtypes.IN.A.A, A, str(address))
    return make_rdata(dns.rdtypes.IN.AAAA.AAAA, AAAA, str(address))


def _label(text: str) -> dns.name.Name:
    """A relative one-label name; raises ``dns.exception.DNSException`` for a bad label."""
    return dns.name.from_text(text, origin=None)


class _Builder:
    """Collects one Service's records as plain values, then makes each rdata once, in order.

    Values, not rdatas, are collected: hashing or sorting a dnspython rdata renders it to wire
    form, which made a 10-endpoint headless Service cost milliseconds.
    """

    def __init__(self) -> None:
        self.addresses: dict[dns.name.Name, set[IPAddress]] = {}
        self.services: dict[dns.name.Name, set[tuple[int, dns.name.Name]]] = {}
        self.aliases: dict[dns.name.Name, dns.name.Name] = {}
        self.pointers: dict[dns.name.Name, set[dns.name.Name]] = {}

    def address(self, name: dns.name.Name, address: IPAddress, *, pointer: bool = True) -> None:
        """An A/AAAA record at ``name``, and the PTR that points back to it unless told not to."""
        self.addresses.setdefault(name, set()).add(address)
        if pointer:
            self.pointers.setdefault(dns.reversename.from_address(str(address)), set()).add(name)

    def service(self, name: dns.name.Name, port: int, target: dns.name.Name) -> None:
        """An SRV record ``0 100 <port> <target>`` at ``name``."""
        self.services.setdefault(name, set()).add((port, target))

    def build(self) -> ServiceRecords:
        names: dict[dns.name.Name, dict[dns.rdatatype.RdataType, tuple[dns.rdata.Rdata, ...]]] = {}
        for name, addresses in self.addresses.items():
            ordered = sorted(addresses, key=lambda address: (address.version, int(address)))
            for rdtype, version in ((A, 4), (AAAA, 6)):
                rdatas = tuple(address_rdata(address) for address in ordered if address.version == version)
                if rdatas:
                    names.setdefault(name, {})[rdtype] = rdatas
        for name, entries in self.services.items():
            names.setdefault(name, {})[SRV] = tuple(
                make_rdata(dns.rdtypes.IN.SRV.SRV, SRV, 0, 100, port, target)
                for port, target in sorted(entries)
            )
        for name, target in self.aliases.items():
            names[name] = {CNAME: (make_rdata(dns.rdtypes.ANY.CNAME.CNAME, CNAME, target),)}
        return ServiceRecords(
            names=names,
            pointers={name: tuple(sorted(targets)) for name, targets in self.pointers.items()},
        )


def _named_ports(ports: object) -> list[tuple[str, str, int]]:
    """(name, protocol, port) of the named ports; the specification has SRV only for those."""
    named = []
    for port in ports if isinstance(ports, list) else []:
        name, number = port.get("name"), port.get("port")
        if name and isinstance(number, int):
            named.append((str(name), str(port.get("protocol") or "TCP").lower(), number))
    return named


def _srv_name(port_name: str, protocol: str, base: dns.name.Name) -> dns.name.Name:
    return dns.name.Name([f"_{port_name}".encode(), f"_{protocol}".encode(), *base.labels])


def service_records(service: Mapping[str, Any], slices: Iterable[Mapping[str, Any]] = ()) -> ServiceRecords:
    """The records of one Service and its EndpointSlices (those of a ClusterIP Service are unused).

    Malformed parts (an address that is not an IP, a label DNS cannot carry) are skipped, not
    fatal: one bad object must not take the cluster's DNS down.
    """
    meta = service.get("metadata") or {}
    spec = service.get("spec") or {}
    builder = _Builder()
    try:
        base = dns.name.Name([str(meta["name"]).encode(), str(meta["namespace"]).encode(), *_SVC.labels])
    except (KeyError, dns.name.LabelTooLong, dns.name.EmptyLabel):
        return builder.build()
    if spec.get("type") == "ExternalName":
        try:
            target = dns.name.from_text(str(spec.get("externalName") or ""))
        except dns.exception.DNSException:
            return builder.build()
        if len(target) > 1:
            builder.aliases[base] = target
        return builder.build()
    cluster_ips = spec.get("clusterIPs") or [spec.get("clusterIP")]
    if cluster_ips != ["None"]:
        for address in _addresses(cluster_ips):
            builder.address(base, address)
        if builder.addresses:
            for port_name, protocol, number in _named_ports(spec.get("ports")):
                builder.service(_srv_name(port_name, protocol, base), number, base)
        return builder.build()
    _headless(builder, base, slices, bool(spec.get("publishNotReadyAddresses")))
    return builder.build()


def _headless(
    builder: _Builder, base: dns.name.Name, slices: Iterable[Mapping[str, Any]], not_ready_too: bool
) -> None:
    for endpoint_slice in slices:
        if endpoint_slice.get("addressType") not in ("IPv4", "IPv6"):
            continue  # FQDN slices carry no addresses to answer with
        ports = _named_ports(endpoint_slice.get("ports"))
        for endpoint in endpoint_slice.get("endpoints") or []:
            ready = (endpoint.get("conditions") or {}).get("ready")
            if ready is False and not not_ready_too:
                continue
            for address in _addresses(endpoint.get("addresses") or []):
                dashed = str(address).replace(".", "-").replace(":", "-")
                try:
                    host = _label(str(endpoint.get("hostname") or dashed)).concatenate(base)
                except dns.exception.DNSException:
                    continue
                # PTRs point at the hostname name only (specification 2.4.3).
                builder.address(base, address, pointer=False)
                builder.address(host, address)
                for port_name, protocol, number in ports:
                    builder.service(_srv_name(port_name, protocol, base), number, host)


def pod_address(name: dns.name.Name) -> tuple[str, IPAddress] | None:
    """(namespace, address) of a relative pod name ``a-b-c-d.<ns>.pod`` (``fd00--1`` for IPv6)."""
    labels = name.labels
    if len(labels) != 3 or labels[2].lower() != _POD:
        return None
    try:
        dashed, namespace = labels[0].decode("ascii"), labels[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    address = _address(dashed.replace("-", ".")) or _address(dashed.replace("-", ":"))
    return (namespace.lower(), address) if address is not None else None


def _ancestors(name: dns.name.Name) -> Iterable[dns.name.Name]:
    """``a.b.c`` -> ``a.b.c``, ``b.c``, ``c`` (relative names, the zone apex excluded)."""
    labels = name.labels
    return (dns.name.Name(labels[i:]) for i in range(len(labels)))


class Table:
    """A snapshot of every record; lookups take relative names, case-insensitively."""

    def __init__(self) -> None:
        self._services: dict[ServiceKey, ServiceRecords] = {}
        self._names: dict[dns.name.Name, Records] = {}
        # Relative name -> how many record names are at or below it: an empty non-terminal
        # (``svc``, ``<ns>.svc``) exists (NOERROR/NODATA), a name with nothing below does not.
        self._below: dict[dns.name.Name, int] = {}
        self._pointers: dict[dns.name.Name, tuple[tuple[ServiceKey, dns.name.Name], ...]] = {}
        #: Bumped by every change; the zone's SOA serial.
        self.generation = 0

    @classmethod
    def from_objects(
        cls, services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]
    ) -> Table:
        """A table of every Service with its slices (grouped by ``kubernetes.io/service-name``)."""
        grouped: dict[ServiceKey, list[Mapping[str, Any]]] = {}
        for endpoint_slice in slices:
            meta = endpoint_slice.get("metadata") or {}
            owner = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
            if owner:
                grouped.setdefault((str(meta.get("namespace")), str(owner)), []).append(endpoint_slice)
        # Built in place (the table is not shared yet): one copy per Service would be quadratic.
        table = cls()
        for service in services:
            meta = service.get("metadata") or {}
            key = (str(meta.get("namespace")), str(meta.get("name")))
            table._remove(key)
            table._add(key, service_records(service, grouped.get(key, ())))
        return table

    @property
    def services(self) -> frozenset[ServiceKey]:
        return frozenset(self._services)

    def lookup(self, name: dns.name.Name) -> Records | None:
        """The records at a relative name, or None when it has none."""
        return self._names.get(name)

    def exists(self, name: dns.name.Name) -> bool:
        """Whether a relative name has records or names below it (an empty non-terminal)."""
        return name in self._below

    def pointers(self, reverse_name: dns.name.Name) -> tuple[dns.name.Name, ...]:
        """The relative PTR targets of an absolute reverse name (``...in-addr.arpa.``)."""
        return tuple(target for _, target in self._pointers.get(reverse_name, ()))

    def with_service(
        self, key: ServiceKey, service: Mapping[str, Any], slices: Iterable[Mapping[str, Any]] = ()
    ) -> Table:
        """A new table with this Service's records replaced by those of ``service`` and ``slices``."""
        return self._replace(key, service_records(service, slices))

    def without_service(self, key: ServiceKey) -> Table:
        """A new table without this Service's records (itself when it has none)."""
        return self._replace(key, None) if key in self._services else self

    def _replace(self, key: ServiceKey, new: ServiceRecords | None) -> Table:
        table = Table()
        table.generation = self.generation + 1
        table._services = dict(self._services)
        table._names = dict(self._names)
        table._below = dict(self._below)
        table._pointers = dict(self._pointers)
        table._remove(key)
        if new is not None:
            table._add(key, new)
        return table

    def _remove(self, key: ServiceKey) -> None:
        """Drop a Service's records from this (new, not yet shared) table."""
        old = self._services.pop(key, None)
        if old is None:
            return
        for name in old.names:
            del self._names[name]
            for ancestor in _ancestors(name):
                self._below[ancestor] -= 1
                if not self._below[ancestor]:
                    del self._below[ancestor]
        for reverse_name in old.pointers:
            kept = tuple(entry for entry in self._pointers[reverse_name] if entry[0] != key)
            if kept:
                self._pointers[reverse_name] = kept
            else:
                del self._pointers[reverse_name]

    def _add(self, key: ServiceKey, new: ServiceRecords) -> None:
        """Add a Service's records to this (new, not yet shared) table; it has none yet."""
        self._services[key] = new
        for name, records in new.names.items():
            self._names[name] = records
            for ancestor in _ancestors(name):
                self._below[ancestor] = self._below.get(ancestor, 0) + 1
        for reverse_name, targets in new.pointers.items():
            added = tuple((key, target) for target in targets)
            self._pointers[reverse_name] = self._pointers.get(reverse_name, ()) + added
