"""The Corefile subset kubeplane (and the original's CoreDNS manifests) renders, as a typed Config.

The add-on is started like CoreDNS (``-conf /etc/coredns/Corefile``) from the same ConfigMap, so
``cluster.coreDNS.image`` alone switches between it and a real CoreDNS. It understands one server
block for the root zone::

    .:53 {
        errors
        health { lameduck 5s }
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        prometheus :9153
        forward . /etc/resolv.conf
        cache 30
        loop
        reload
        loadbalance
    }

Any other plugin or option is reported in :attr:`Config.ignored` (the server logs it once) rather
than refused, so a CoreDNS Corefile with extras still runs. What would change the answers in a way
this server cannot honour (no ``kubernetes`` plugin, forwarding only part of the name space, a
second server block, DNS over TLS upstreams) is a :class:`~kubeplane.dns.CorefileError`.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import shlex
from collections.abc import Iterator
from typing import Any, Literal

import dns.exception
import dns.name

from kubeplane.dns import CorefileError

__all__ = ["DEFAULT_TTL", "Config", "Listen", "PodsMode", "Upstream", "parse"]

#: The kubernetes plugin's TTL when the Corefile sets none (CoreDNS's default).
DEFAULT_TTL = 5
#: CoreDNS's ``kubernetes ... { ttl N }`` bounds.
MAX_TTL = 3600

PodsMode = Literal["disabled", "insecure"]

_REVERSE_ROOTS = (dns.name.from_text("in-addr.arpa."), dns.name.from_text("ip6.arpa."))
#: Plugins that need no setting here: the server always does what they ask, or they only matter to
#: CoreDNS itself (``reload``: the pod restarts on a ConfigMap change; ``loop``: the forwarder drops
#: an upstream that is the server itself).
_NO_SETTINGS = frozenset({"errors", "log", "loop", "reload"})


@dataclasses.dataclass(frozen=True)
class Listen:
    """An HTTP listener of a plugin: ``host`` is empty for every address."""

    host: str
    port: int


@dataclasses.dataclass(frozen=True)
class Upstream:
    """One ``forward`` target given as an address (``dns://`` prefix stripped)."""

    host: str
    port: int


@dataclasses.dataclass(frozen=True)
class Config:
    """What the server needs from the Corefile; every field has CoreDNS's default."""

    #: The kubernetes plugin's zones, absolute and lowercased, forward and reverse alike.
    zones: tuple[dns.name.Name, ...]
    #: ``pods insecure`` answers ``a-b-c-d.<ns>.pod.<zone>`` from the name; ``disabled`` does not.
    pods: PodsMode = "disabled"
    ttl: int = DEFAULT_TTL
    #: Zones whose unknown names go to the next plugin (the forwarder) instead of NXDOMAIN.
    fallthrough: tuple[dns.name.Name, ...] = ()
    #: ``forward .`` targets given as addresses, in order.
    upstreams: tuple[Upstream, ...] = ()
    #: ``forward . /etc/resolv.conf``: read the nameservers from this file (dnsPolicy Default).
    resolv_conf: str | None = None
    #: ``cache N``: seconds forwarded answers are kept at most; None without the plugin.
    cache_ttl: int | None = None
    #: ``loadbalance``: rotate multi-address answers.
    loadbalance: bool = False
    dns_port: int = 53
    health: Listen | None = None
    ready: Listen | None = None
    metrics: Listen | None = None
    #: Plugins and options read but not acted on, one line each (``line 7: plugin 'hosts'``).
    ignored: tuple[str, ...] = ()

    @functools.cached_property
    def primary_zone(self) -> dns.name.Name:
        """The first zone of names as written: PTR targets are given in it."""
        return next(zone for zone in self.zones if not _is_reverse(zone))

    @functools.cached_property
    def forward_zones(self) -> tuple[dns.name.Name, ...]:
        """The zones of names (``cluster.local.``), longest first so the closest one matches."""
        names = [zone for zone in self.zones if not _is_reverse(zone)]
        return tuple(sorted(names, key=lambda zone: -len(zone)))

    @functools.cached_property
    def reverse_zones(self) -> tuple[dns.name.Name, ...]:
        """The zones of PTR names (``in-addr.arpa.``, ``ip6.arpa.``), longest first."""
        names = [zone for zone in self.zones if _is_reverse(zone)]
        return tuple(sorted(names, key=lambda zone: -len(zone)))

    def falls_through(self, name: dns.name.Name) -> bool:
        """Whether a name this server has no record for goes upstream rather than to NXDOMAIN."""
        return any(name.is_subdomain(zone) for zone in self.fallthrough)


def _is_reverse(zone: dns.name.Name) -> bool:
    return any(zone.is_subdomain(root) for root in _REVERSE_ROOTS)


@dataclasses.dataclass(frozen=True)
class _Directive:
    line: int
    name: str
    args: tuple[str, ...]
    #: The lines of its ``{ ... }`` block: (line number, tokens).
    block: tuple[tuple[int, tuple[str, ...]], ...] = ()


def _lines(text: str) -> Iterator[tuple[int, list[str]]]:
    """Non-empty lines as tokens (quotes honoured, ``#`` comments dropped), with line numbers."""
    for number, raw in enumerate(text.splitlines(), start=1):
        lexer = shlex.shlex(raw, posix=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError as e:
            raise CorefileError(f"Corefile line {number}: {e}") from None
        if tokens:
            yield number, tokens


def _server_blocks(text: str) -> list[tuple[int, list[str], list[_Directive]]]:
    blocks: list[tuple[int, list[str], list[_Directive]]] = []
    lines = iter(list(_lines(text)))
    for number, tokens in lines:
        if tokens[-1] != "{" or len(tokens) < 2:
            raise CorefileError(f"Corefile line {number}: expected a server block ('.:53 {{'), got {tokens}")
        directives: list[_Directive] = []
        for inner_number, inner in lines:
            if inner == ["}"]:
                break
            if inner[-1] == "}" and inner.count("{") == 1:  # a block on one line: health { lameduck 5s }
                start = inner.index("{")
                options = ((inner_number, tuple(inner[start + 1 : -1])),) if start + 2 < len(inner) else ()
                directives.append(_Directive(inner_number, inner[0], tuple(inner[1:start]), options))
                continue
            if inner[-1] != "{":
                directives.append(_Directive(inner_number, inner[0], tuple(inner[1:])))
                continue
            block: list[tuple[int, tuple[str, ...]]] = []
            for option_number, option in lines:
                if option == ["}"]:
                    break
                if "{" in option or "}" in option:
                    raise CorefileError(f"Corefile line {option_number}: nested blocks are not supported")
                block.append((option_number, tuple(option)))
            else:
                raise CorefileError(f"Corefile line {inner_number}: '{inner[0]}' block is not closed")
            directives.append(_Directive(inner_number, inner[0], tuple(inner[1:-1]), tuple(block)))
        else:
            raise CorefileError(f"Corefile line {number}: server block is not closed")
        blocks.append((number, tokens[:-1], directives))
    return blocks


def _absolute(text: str, line: int) -> dns.name.Name:
    try:
        return dns.name.from_text(text.lower())
    except dns.exception.DNSException as e:
        raise CorefileError(f"Corefile line {line}: {text!r} is not a zone name ({e})") from None


def _number(text: str, line: int, what: str, low: int, high: int) -> int:
    if not text.isdigit() or not low <= int(text) <= high:
        raise CorefileError(f"Corefile line {line}: {what} must be a number in {low}..{high}, got {text!r}")
    return int(text)


def _listen(args: tuple[str, ...], line: int, plugin: str, default: int) -> Listen:
    if not args:
        return Listen("", default)
    host, sep, port = args[0].rpartition(":")
    if not sep:
        raise CorefileError(f"Corefile line {line}: {plugin} address must be [HOST]:PORT, got {args[0]!r}")
    return Listen(host, _number(port, line, f"{plugin} port", 1, 65535))


def _upstream(text: str, line: int) -> Upstream:
    address = text.removeprefix("dns://")
    if "://" in address:
        raise CorefileError(f"Corefile line {line}: only plain DNS upstreams are supported, got {text!r}")
    host, port = address, "53"
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest.removeprefix(":") or "53"
    elif address.count(":") == 1:
        host, port = address.split(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise CorefileError(f"Corefile line {line}: forward target {text!r} is not an IP address") from None
    return Upstream(host, _number(port, line, "forward port", 1, 65535))


def parse(text: str) -> Config:
    """Read a Corefile; raises :class:`~kubeplane.dns.CorefileError` naming the line at fault."""
    blocks = _server_blocks(text)
    if len(blocks) != 1:
        raise CorefileError(f"Corefile: exactly one server block is supported, found {len(blocks)}")
    line, keys, directives = blocks[0]
    dns_port = 53
    for key in keys:
        zone, _, port = key.removeprefix("dns://").partition(":")
        if zone != ".":
            raise CorefileError(f"Corefile line {line}: the server block must be for '.', got {key!r}")
        dns_port = _number(port, line, "server port", 1, 65535) if port else 53
    fields: dict[str, Any] = {"dns_port": dns_port}
    ignored: list[str] = []
    for directive in directives:
        name, args, at = directive.name, directive.args, directive.line
        if name == "kubernetes":
            fields.update(_kubernetes(directive, ignored))
        elif name == "forward":
            if not args or args[0] != ".":
                raise CorefileError(f"Corefile line {at}: only 'forward . TO...' is supported")
            if len(args) < 2:
                raise CorefileError(f"Corefile line {at}: forward needs at least one target")
            targets = args[1:]
            fields["resolv_conf"] = next((t for t in targets if t.startswith("/")), None)
            fields["upstreams"] = tuple(_upstream(t, at) for t in targets if not t.startswith("/"))
            ignored.extend(f"line {n}: forward option {' '.join(o)!r}" for n, o in directive.block)
        elif name == "cache":
            fields["cache_ttl"] = _number(args[0], at, "cache TTL", 0, 86400) if args else 3600
            ignored.extend(f"line {n}: cache option {' '.join(o)!r}" for n, o in directive.block)
        elif name in ("health", "ready", "prometheus"):
            default = {"health": 8080, "ready": 8181, "prometheus": 9153}[name]
            fields["metrics" if name == "prometheus" else name] = _listen(args, at, name, default)
            ignored.extend(f"line {n}: {name} option {' '.join(o)!r}" for n, o in directive.block)
        elif name == "loadbalance":
            fields["loadbalance"] = True
        elif name not in _NO_SETTINGS:
            ignored.append(f"line {at}: plugin {name!r}")
    if "zones" not in fields:
        raise CorefileError("Corefile: no 'kubernetes' plugin: this server answers for Kubernetes only")
    return Config(**fields, ignored=tuple(ignored))


def _kubernetes(directive: _Directive, ignored: list[str]) -> dict[str, Any]:
    if not directive.args:
        raise CorefileError(f"Corefile line {directive.line}: kubernetes needs its zones (cluster.local ...)")
    zones = tuple(_absolute(zone, directive.line) for zone in directive.args)
    if all(_is_reverse(zone) for zone in zones):
        raise CorefileError(
            f"Corefile line {directive.line}: kubernetes needs a zone of names (cluster.local)"
        )
    fields: dict[str, Any] = {"zones": zones}
    for line, (option, *values) in directive.block:
        if option == "pods" and values in (["insecure"], ["disabled"]):
            fields["pods"] = values[0]
        elif option == "ttl" and len(values) == 1:
            fields["ttl"] = _number(values[0], line, "ttl", 0, MAX_TTL)
        elif option == "fallthrough":
            fields["fallthrough"] = tuple(_absolute(zone, line) for zone in values) or zones
        else:
            # ``pods verified`` needs a watch of every pod: answered as ``disabled`` (no pod records).
            ignored.append(f"line {line}: kubernetes option {' '.join([option, *values])!r}")
    return fields
