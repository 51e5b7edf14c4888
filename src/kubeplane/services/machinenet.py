"""The node's own network from ``machine.network``, pure: what the config asks for, and the changes
that take the node's links, addresses and routes from what netlink shows to that.

The machine network controller (:mod:`kubeplane.controllers.network.machine_network`) reads the
config into a :class:`Desired`, observes the node (:mod:`kubeplane.services.machinenet_io`) into
an :class:`Observed`, and :func:`plan` computes the :class:`Plan` between them:

- every configured interface (``interfaces[].interface``, entries with the same name merge, as
  the guide's "additional addresses" example repeats ``lo0``) is brought up and given its ``mtu``;
- its ``cidr`` and ``addresses`` are added, marked with :data:`PROTO` (the address protocol,
  ``IFA_PROTO``, Linux 6.1+), so kubeplane later removes exactly the addresses it added: an
  address that was already there (the provisioner's primary address, say) is reported but never
  owned, and so never removed;
- its ``routes`` go into the main table with route protocol :data:`PROTO` and ``metric``
  (:data:`DEFAULT_METRIC` when unset, so a configured default route never collides with a metric-0
  route someone else installed); a kubeplane route no longer configured is deleted, another
  route is never changed;
- ``hostname`` becomes the UTS hostname, ``nameservers`` the node's ``/etc/resolv.conf``
  (:func:`render_resolv_conf`), ``extraHostEntries`` a marked block of ``/etc/hosts``
  (:func:`render_hosts`, every other line kept).

Everything is checked before anything changes: an interface that does not exist, a gateway not on
one of its interface's networks, two values for one setting, or a route someone else already
holds with a different next hop make :func:`plan` return errors (naming the config field) and no
change at all, so an interface is never left half-configured.

An interface with ``wireguard`` is a WireGuard device (:attr:`Desired.wireguard`,
:mod:`kubeplane.services.wireguard`): the controller checks the plan against the node as it
will be with the device (:func:`with_devices`), and only then has it created (a userspace
``wireguard-go``) and configured, and plans it like any other link.

An interface's ``vip`` is the shared VIP, which only the node elected for it holds
(:mod:`kubeplane.services.vip`, the VIP controller): it carries :data:`PROTO` like every address
kubeplane adds, and :attr:`Desired.vips` keeps :func:`plan` from removing it as unconfigured.
Once the VIP leaves the config it is an owned address like any other, and goes.

Not implemented (reported in :attr:`Desired.unsupported`, never silently dropped): ``dhcp`` (no
DHCP client runs; the interface gets its static settings only), ``bond``, ``vlans`` and
``dummy`` (issue 17's later items). ``ignore: true`` leaves an
interface alone: nothing is configured on it, and what kubeplane had added there is removed.
Removing ``mtu`` or an interface from the config leaves the link's MTU and up state as they are.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping, Sequence

from kubeplane.config import models
from kubeplane.services import vip, wireguard

#: The address protocol (``IFA_PROTO``) and route protocol that mark what kubeplane configured
#: from ``machine.network`` (the pod network's routes use 75). Unassigned in iproute2's tables.
PROTO = 76
#: The metric of a configured route that names none (the original's default route metric).
DEFAULT_METRIC = 1024
RESOLV_CONF_HEADER = "# written by kubeplaned from machine.network.nameservers\n"
HOSTS_BEGIN = "# BEGIN kubeplane machine.network.extraHostEntries"
HOSTS_END = "# END kubeplane machine.network.extraHostEntries"
_NOT_IMPLEMENTED = {
    "bond": "bonds are not implemented yet: the bond link is not created",
    "vlans": "VLANs are not implemented yet: no VLAN link is created",
    "dummy": "dummy links are not implemented yet: the link is not created",
    "dhcp": "DHCP is not implemented: no DHCP client runs, only the static settings apply",
}


@dataclasses.dataclass(frozen=True)
class Address:
    """An address to hold: ``cidr`` (``10.5.0.200/24``) on ``link``, from config field ``field``."""

    link: str
    cidr: str
    field: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.link, self.cidr)


@dataclasses.dataclass(frozen=True)
class Route:
    """A route in the main table: ``network`` via ``gateway`` (None: on-link) out of ``link``."""

    link: str
    network: str
    gateway: str | None
    metric: int
    field: str

    @property
    def key(self) -> tuple[str, int]:
        """What makes a route one route to the kernel (main table, no TOS): destination and metric."""
        return (self.network, self.metric)


@dataclasses.dataclass(frozen=True)
class Link:
    """A configured interface: its name, the MTU asked for (None: leave it), its config field."""

    name: str
    mtu: int | None
    field: str


@dataclasses.dataclass(frozen=True)
class Desired:
    """What ``machine.network`` asks of the node; ``errors`` are conflicts within the config."""

    hostname: str | None = None
    links: tuple[Link, ...] = ()
    addresses: tuple[Address, ...] = ()
    routes: tuple[Route, ...] = ()
    nameservers: tuple[str, ...] | None = None
    hosts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unsupported: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    #: The WireGuard devices to create and configure, one per interface name.
    wireguard: tuple[wireguard.Device, ...] = ()
    #: (link, cidr) of the shared VIPs: the VIP controller adds and removes them, never the plan.
    vips: frozenset[tuple[str, str]] = frozenset()


@dataclasses.dataclass(frozen=True)
class ObservedLink:
    name: str
    index: int
    mtu: int
    up: bool
    oper_state: str


@dataclasses.dataclass(frozen=True)
class ObservedAddress:
    link: str
    cidr: str
    owned: bool

    @property
    def key(self) -> tuple[str, str]:
        return (self.link, self.cidr)


@dataclasses.dataclass(frozen=True)
class ObservedRoute:
    """A route of the main table; ``link`` is None for a route without one output interface."""

    network: str
    metric: int
    gateway: str | None
    link: str | None
    owned: bool

    @property
    def key(self) -> tuple[str, int]:
        return (self.network, self.metric)


@dataclasses.dataclass(frozen=True)
class Observed:
    """The node's links by name, its addresses and its main-table routes, as netlink shows them."""

    links: Mapping[str, ObservedLink]
    addresses: tuple[ObservedAddress, ...] = ()
    routes: tuple[ObservedRoute, ...] = ()


@dataclasses.dataclass(frozen=True)
class Plan:
    """The changes, in the order they apply; nothing at all when ``errors`` is not empty."""

    errors: tuple[str, ...] = ()
    remove_routes: tuple[ObservedRoute, ...] = ()
    remove_addresses: tuple[ObservedAddress, ...] = ()
    set_mtu: tuple[tuple[str, int], ...] = ()
    set_up: tuple[str, ...] = ()
    add_addresses: tuple[Address, ...] = ()
    replace_routes: tuple[Route, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.remove_routes
            or self.remove_addresses
            or self.set_mtu
            or self.set_up
            or self.add_addresses
            or self.replace_routes
        )


def desired(network: models.MachineNetwork | None) -> Desired:
    """What ``network`` (``machine.network``) asks for, merged per interface name."""
    if network is None:
        return Desired()
    links: dict[str, Link] = {}
    addresses: dict[tuple[str, str], Address] = {}
    routes: dict[tuple[str, int], Route] = {}
    devices: dict[str, wireguard.Device] = {}
    unsupported: list[str] = []
    errors: list[str] = []
    for index, interface in enumerate(network.interfaces or ()):
        path = f"machine.network.interfaces[{index}]"
        for name, message in _NOT_IMPLEMENTED.items():
            if getattr(interface, name):
                unsupported.append(f"{path}.{name}: {message}")
        if interface.ignore:
            continue
        name = interface.interface
        known = links.get(name)
        mtu = interface.mtu if interface.mtu is not None else (known.mtu if known else None)
        if known is not None and known.mtu is not None and interface.mtu not in (None, known.mtu):
            errors.append(f"{path}.mtu: {name} has mtu {known.mtu} in {known.field} already")
        links[name] = Link(name=name, mtu=mtu, field=known.field if known else path)
        device = wireguard.device(interface, path)
        if device is not None:
            configured = devices.setdefault(name, device)
            if configured is not device:
                errors.append(f"{device.field}: {name} is configured in {configured.field} already")
        cidrs = [(f"{path}.cidr", interface.cidr)] if interface.cidr else []
        cidrs += [(f"{path}.addresses[{i}]", cidr) for i, cidr in enumerate(interface.addresses or ())]
        for field, cidr in cidrs:
            address = Address(link=name, cidr=str(ipaddress.ip_interface(cidr)), field=field)
            addresses.setdefault(address.key, address)
        for route_index, route in enumerate(interface.routes or ()):
            wanted = Route(
                link=name,
                network=str(ipaddress.ip_interface(route.network).network),
                gateway=str(ipaddress.ip_address(route.gateway)) if route.gateway else None,
                metric=DEFAULT_METRIC if route.metric is None else route.metric,
                field=f"{path}.routes[{route_index}]",
            )
            other = routes.setdefault(wanted.key, wanted)
            if other != wanted and (other.link, other.gateway) != (wanted.link, wanted.gateway):
                errors.append(
                    f"{wanted.field}: a route to {wanted.network} with metric {wanted.metric} is "
                    f"configured in {other.field} already (give one of them another metric)"
                )
    hosts = tuple(
        (str(ipaddress.ip_address(entry.ip)), tuple(entry.aliases or ()))
        for entry in network.extra_host_entries or ()
    )
    nameservers = (
        tuple(str(ipaddress.ip_address(a)) for a in network.nameservers)
        if network.nameservers is not None
        else None
    )
    return Desired(
        hostname=network.hostname or None,
        links=tuple(links.values()),
        addresses=tuple(addresses.values()),
        routes=tuple(routes.values()),
        nameservers=nameservers,
        hosts=hosts,
        unsupported=tuple(unsupported),
        errors=tuple(errors),
        wireguard=tuple(devices.values()),
        vips=frozenset((address.link, address.cidr) for address in vip.desired(network)),
    )


def with_devices(wanted: Desired, observed: Observed) -> Observed:
    """``observed`` plus a down link for each WireGuard device it lacks: the node as it will be once
    the devices are made, to check the plan against before making any of them."""
    links = dict(observed.links)
    for device in wanted.wireguard:
        links.setdefault(device.name, ObservedLink(device.name, index=0, mtu=0, up=False, oper_state="DOWN"))
    return dataclasses.replace(observed, links=links)


def plan(wanted: Desired, observed: Observed) -> Plan:
    """The changes from ``observed`` to ``wanted``; errors and no change when it cannot be done."""
    errors = list(wanted.errors)
    for link in wanted.links:
        if link.name not in observed.links:
            errors.append(f"{link.field}.interface: interface {link.name} does not exist on this node")
    errors += _route_errors(wanted, observed)
    if errors:
        return Plan(errors=tuple(errors))

    wanted_addresses = {address.key for address in wanted.addresses} | wanted.vips
    present = {address.key for address in observed.addresses}
    wanted_routes = {route.key: route for route in wanted.routes}
    installed = {route.key: route for route in observed.routes}
    replace = []
    for route in wanted.routes:
        current = installed.get(route.key)
        if current is None or (current.owned and _next_hop(current) != _next_hop(route)):
            replace.append(route)
    return Plan(
        remove_routes=tuple(r for r in observed.routes if r.owned and r.key not in wanted_routes),
        remove_addresses=tuple(a for a in observed.addresses if a.owned and a.key not in wanted_addresses),
        set_mtu=tuple(
            (link.name, link.mtu)
            for link in wanted.links
            if link.mtu is not None and observed.links[link.name].mtu != link.mtu
        ),
        set_up=tuple(link.name for link in wanted.links if not observed.links[link.name].up),
        add_addresses=tuple(a for a in wanted.addresses if a.key not in present),
        replace_routes=tuple(replace),
    )


def _route_errors(wanted: Desired, observed: Observed) -> Iterable[str]:
    """Routes that cannot be installed as asked: a gateway off its interface's networks, or a
    route someone else holds at the same destination and metric with another next hop."""
    networks: dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = {}
    for link, cidr in [*(a.key for a in observed.addresses), *(a.key for a in wanted.addresses)]:
        networks.setdefault(link, []).append(ipaddress.ip_interface(cidr).network)
    installed = {route.key: route for route in observed.routes}
    for route in wanted.routes:
        if route.gateway is not None:
            gateway = ipaddress.ip_address(route.gateway)
            if not any(gateway in network for network in networks.get(route.link, ())):
                yield (
                    f"{route.field}.gateway: {route.gateway} is not on a network of {route.link} "
                    "(give the interface an address in the gateway's network)"
                )
        current = installed.get(route.key)
        if current is not None and not current.owned and _next_hop(current) != _next_hop(route):
            via = f"via {current.gateway}" if current.gateway else f"dev {current.link}"
            yield (
                f"{route.field}: the node already has a route to {route.network} with metric "
                f"{route.metric} ({via}) that kubeplane did not install (give this one another metric)"
            )


def _next_hop(route: Route | ObservedRoute) -> tuple[str | None, str | None]:
    return (route.gateway, route.link)


def render_resolv_conf(nameservers: Sequence[str]) -> str:
    """``/etc/resolv.conf`` for ``nameservers``, marked as kubeplane's."""
    return RESOLV_CONF_HEADER + "".join(f"nameserver {address}\n" for address in nameservers)


def is_ours(resolv_conf: str) -> bool:
    """Whether kubeplane wrote this ``/etc/resolv.conf``."""
    return resolv_conf.startswith(RESOLV_CONF_HEADER)


def render_hosts(current: str, entries: Sequence[tuple[str, Sequence[str]]]) -> str:
    """``current`` (``/etc/hosts``) with kubeplane's block replaced by ``entries`` (removed when
    there are none); every line outside the block stays as it was."""
    kept: list[str] = []
    inside = False
    for line in current.splitlines(keepends=True):
        marker = line.rstrip("\n")
        if marker == HOSTS_BEGIN:
            inside = True
        elif marker == HOSTS_END and inside:
            inside = False
        elif not inside:
            kept.append(line)
    text = "".join(kept)
    if not entries:
        return text
    if text and not text.endswith("\n"):
        text += "\n"
    block = "".join(f"{ip} {' '.join(aliases)}\n".replace(" \n", "\n") for ip, aliases in entries)
    return f"{text}{HOSTS_BEGIN}\n{block}{HOSTS_END}\n"
