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

An interface with ``bond`` is a bond that kubeplane makes (:class:`Bond`): the plan creates it with
the configured options (:func:`bond_request`, pyroute2's ``bond_*`` attributes, the option names
mapped to the kernel's numbers), sets each of ``bond.interfaces`` down and makes the bond its
master (:func:`enslave_requests`), then brings the bond up. Each of an interface's ``vlans`` is a
VLAN link ``<interface>.<vlanId>`` on it (:class:`Vlan`, :func:`vlan_request`), made once its
parent exists (a VLAN on a bond after the bond), with its own ``cidr``, ``routes`` and ``mtu``
like any interface. A link kubeplane made carries :data:`LINK_ALIAS` as its alias, and is deleted
once it leaves the config; a link of that name someone else made must be of the same kind (and a
VLAN of the same parent and id) and is used as it is. The kernel must have the link kind: the
controller asks it first (:func:`probe_request`) and, when it lacks one, reports the missing
feature (:data:`KERNEL_FEATURES`, :func:`kernel_errors`) and changes nothing; should a creation
fail all the same, :mod:`kubeplane.services.machinenet_io` deletes what that apply made and
releases the slaves, so a bond is never left half made. A bond that exists already keeps the
options it has (the kernel refuses most changes while a bond has slaves).

Not implemented (reported in :attr:`Desired.unsupported`, never silently dropped): ``dhcp`` (no
DHCP client runs; the interface gets its static settings only; likewise a VLAN's ``dhcp``),
``bond.peerNotifyDelay`` (pyroute2 has no attribute for it) and ``dummy`` (issue 17's later
items). ``ignore: true`` leaves an
interface alone: nothing is configured on it, and what kubeplane had added there is removed.
Removing ``mtu`` or an interface from the config leaves the link's MTU and up state as they are.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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
#: The alias (``IFLA_IFALIAS``) of the links kubeplane makes: what marks a bond or VLAN as its
#: own, to delete once it leaves the config.
LINK_ALIAS = "kubeplane machine.network"
#: The name of the link that :func:`probe_request` asks the kernel about (and never gets).
PROBE_NAME = "kp-probe"
#: What the kernel needs to make each kind of link, as its config option and module are named.
KERNEL_FEATURES = {
    "bond": "bonding driver (CONFIG_BONDING, module bonding)",
    "vlan": "802.1Q VLAN support (CONFIG_VLAN_8021Q, module 8021q)",
}
_NOT_IMPLEMENTED = {
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
class Bond:
    """A bond to make: its ``slaves`` (``bond.interfaces``), its ``options`` as pyroute2 request
    attributes (``bond_mode=4``...), its ``primary`` slave (an index only at apply time)."""

    name: str
    slaves: tuple[str, ...]
    options: tuple[tuple[str, Any], ...]
    primary: str | None
    field: str


@dataclasses.dataclass(frozen=True)
class Vlan:
    """A VLAN link to make: ``<parent>.<vlan_id>`` on ``parent``."""

    name: str
    parent: str
    vlan_id: int
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
    #: The bonds and VLAN links to make (each is in ``links`` as well).
    bonds: tuple[Bond, ...] = ()
    vlans: tuple[Vlan, ...] = ()


@dataclasses.dataclass(frozen=True)
class ObservedLink:
    """A link as netlink shows it: ``kind`` is the link kind (``""`` for a physical link),
    ``master`` the name of its bond, ``alias`` its ``IFLA_IFALIAS``, and for a VLAN its
    ``parent`` and ``vlan_id``."""

    name: str
    index: int
    mtu: int
    up: bool
    oper_state: str
    kind: str = ""
    master: str | None = None
    alias: str = ""
    parent: str | None = None
    vlan_id: int | None = None


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
    create_bonds: tuple[Bond, ...] = ()
    #: (slave, bond): the slave set down, then the bond made its master.
    enslave: tuple[tuple[str, str], ...] = ()
    create_vlans: tuple[Vlan, ...] = ()
    remove_routes: tuple[ObservedRoute, ...] = ()
    remove_addresses: tuple[ObservedAddress, ...] = ()
    #: Links kubeplane made that left the config, VLANs before bonds.
    delete_links: tuple[str, ...] = ()
    set_mtu: tuple[tuple[str, int], ...] = ()
    set_up: tuple[str, ...] = ()
    add_addresses: tuple[Address, ...] = ()
    replace_routes: tuple[Route, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.create_bonds
            or self.enslave
            or self.create_vlans
            or self.remove_routes
            or self.remove_addresses
            or self.delete_links
            or self.set_mtu
            or self.set_up
            or self.add_addresses
            or self.replace_routes
        )

    @property
    def new_kinds(self) -> frozenset[str]:
        """The kinds of link the plan makes: what the kernel must support before it applies."""
        made: tuple[tuple[str, tuple[Bond, ...] | tuple[Vlan, ...]], ...] = (
            ("bond", self.create_bonds),
            ("vlan", self.create_vlans),
        )
        return frozenset(kind for kind, links in made if links)


def desired(network: models.MachineNetwork | None) -> Desired:
    """What ``network`` (``machine.network``) asks for, merged per interface name."""
    if network is None:
        return Desired()
    wanted = _Collector()
    for index, interface in enumerate(network.interfaces or ()):
        path = f"machine.network.interfaces[{index}]"
        for name, message in _NOT_IMPLEMENTED.items():
            if getattr(interface, name):
                wanted.unsupported.append(f"{path}.{name}: {message}")
        if interface.ignore:
            continue
        name = interface.interface
        wanted.link(name, interface.mtu, path)
        device = wireguard.device(interface, path)
        if device is not None:
            configured = wanted.devices.setdefault(name, device)
            if configured is not device:
                wanted.errors.append(f"{device.field}: {name} is configured in {configured.field} already")
        if interface.bond is not None:
            wanted.bond(name, interface.bond, f"{path}.bond")
        cidrs = [(f"{path}.cidr", interface.cidr)] if interface.cidr else []
        cidrs += [(f"{path}.addresses[{i}]", cidr) for i, cidr in enumerate(interface.addresses or ())]
        wanted.addresses_and_routes(name, cidrs, interface.routes, path)
        for vlan_index, vlan in enumerate(interface.vlans or ()):
            wanted.vlan(name, vlan, f"{path}.vlans[{vlan_index}]")
    for bond in wanted.bonds.values():
        for slave in bond.slaves:
            if slave in wanted.links:
                wanted.errors.append(
                    f"{bond.field}.interfaces: {slave} is a slave of {bond.name} and is configured as an "
                    f"interface in {wanted.links[slave].field} as well (configure the bond instead)"
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
        links=tuple(wanted.links.values()),
        addresses=tuple(wanted.addresses.values()),
        routes=tuple(wanted.routes.values()),
        nameservers=nameservers,
        hosts=hosts,
        unsupported=tuple(wanted.unsupported),
        errors=tuple(wanted.errors),
        wireguard=tuple(wanted.devices.values()),
        vips=frozenset((address.link, address.cidr) for address in vip.desired(network)),
        bonds=tuple(wanted.bonds.values()),
        vlans=tuple(wanted.vlans.values()),
    )


class _Collector:
    """The interfaces of ``machine.network`` gathered into links, addresses, routes, bonds and
    VLANs, merged per name, with the conflicts between entries as errors."""

    def __init__(self) -> None:
        self.links: dict[str, Link] = {}
        self.addresses: dict[tuple[str, str], Address] = {}
        self.routes: dict[tuple[str, int], Route] = {}
        self.devices: dict[str, wireguard.Device] = {}
        self.bonds: dict[str, Bond] = {}
        self.vlans: dict[str, Vlan] = {}
        self.unsupported: list[str] = []
        self.errors: list[str] = []

    def link(self, name: str, mtu: int | None, path: str) -> None:
        known = self.links.get(name)
        if known is not None and known.mtu is not None and mtu not in (None, known.mtu):
            self.errors.append(f"{path}.mtu: {name} has mtu {known.mtu} in {known.field} already")
        merged = mtu if mtu is not None else (known.mtu if known else None)
        self.links[name] = Link(name=name, mtu=merged, field=known.field if known else path)

    def addresses_and_routes(
        self, name: str, cidrs: Iterable[tuple[str, str]], routes: Iterable[models.Route] | None, path: str
    ) -> None:
        for field, cidr in cidrs:
            address = Address(link=name, cidr=str(ipaddress.ip_interface(cidr)), field=field)
            self.addresses.setdefault(address.key, address)
        for route_index, route in enumerate(routes or ()):
            wanted = Route(
                link=name,
                network=str(ipaddress.ip_interface(route.network).network),
                gateway=str(ipaddress.ip_address(route.gateway)) if route.gateway else None,
                metric=DEFAULT_METRIC if route.metric is None else route.metric,
                field=f"{path}.routes[{route_index}]",
            )
            other = self.routes.setdefault(wanted.key, wanted)
            if other != wanted and (other.link, other.gateway) != (wanted.link, wanted.gateway):
                self.errors.append(
                    f"{wanted.field}: a route to {wanted.network} with metric {wanted.metric} is "
                    f"configured in {other.field} already (give one of them another metric)"
                )

    def bond(self, name: str, config: models.Bond, field: str) -> None:
        if name in self.bonds:
            self.errors.append(f"{field}: {name} is a bond in {self.bonds[name].field} already")
            return
        for other in self.bonds.values():
            for slave in set(other.slaves) & set(config.interfaces or ()):
                self.errors.append(f"{field}.interfaces: {slave} is a slave of {other.name} already")
        if config.peer_notify_delay is not None:
            self.unsupported.append(
                f"{field}.peerNotifyDelay: not applied: pyroute2, kubeplane's netlink library, has no "
                "attribute for it"
            )
        self.bonds[name] = Bond(
            name=name,
            slaves=tuple(config.interfaces or ()),
            options=bond_options(config),
            primary=config.primary,
            field=field,
        )

    def vlan(self, parent: str, config: models.VLAN, field: str) -> None:
        name = f"{parent}.{config.vlan_id}"
        if name in self.vlans:
            self.errors.append(f"{field}: VLAN {name} is configured in {self.vlans[name].field} already")
            return
        if config.dhcp:
            self.unsupported.append(f"{field}.dhcp: " + _NOT_IMPLEMENTED["dhcp"])
        self.vlans[name] = Vlan(name=name, parent=parent, vlan_id=config.vlan_id, field=field)
        self.link(name, config.mtu, field)
        cidrs = [(f"{field}.cidr", config.cidr)] if config.cidr else []
        self.addresses_and_routes(name, cidrs, config.routes, field)


#: The kernel's numbers for the bond options that take names, by model field: the pyroute2
#: attribute and the names' values (``include/uapi/linux/if_bonding.h`` and the bonding driver).
_BOND_CHOICES: dict[str, tuple[str, dict[str, int]]] = {
    "mode": (
        "bond_mode",
        {
            "balance-rr": 0,
            "active-backup": 1,
            "balance-xor": 2,
            "broadcast": 3,
            "802.3ad": 4,
            "balance-tlb": 5,
            "balance-alb": 6,
        },
    ),
    "xmit_hash_policy": (
        "bond_xmit_hash_policy",
        {"layer2": 0, "layer3+4": 1, "layer2+3": 2, "encap2+3": 3, "encap3+4": 4},
    ),
    "lacp_rate": ("bond_ad_lacp_rate", {"slow": 0, "fast": 1}),
    "arp_validate": (
        "bond_arp_validate",
        {
            "none": 0,
            "active": 1,
            "backup": 2,
            "all": 3,
            "filter": 4,
            "filter_active": 5,
            "filter_backup": 6,
        },
    ),
    "arp_all_targets": ("bond_arp_all_targets", {"any": 0, "all": 1}),
    "primary_reselect": ("bond_primary_reselect", {"always": 0, "better": 1, "failure": 2}),
    "fail_over_mac": ("bond_fail_over_mac", {"none": 0, "active": 1, "follow": 2}),
    "ad_select": ("bond_ad_select", {"stable": 0, "bandwidth": 1, "count": 2}),
}
#: The numeric bond options: model field, pyroute2 attribute.
_BOND_NUMBERS = {
    "miimon": "bond_miimon",
    "updelay": "bond_updelay",
    "downdelay": "bond_downdelay",
    "arp_interval": "bond_arp_interval",
    "resend_igmp": "bond_resend_igmp",
    "min_links": "bond_min_links",
    "lp_interval": "bond_lp_interval",
    "packets_per_slave": "bond_packets_per_slave",
    "num_peer_notif": "bond_num_peer_notif",
    "tlb_dynamic_lb": "bond_tlb_dynamic_lb",
    "all_slaves_active": "bond_all_slaves_active",
    "ad_actor_sys_prio": "bond_ad_actor_sys_prio",
    "ad_user_port_key": "bond_ad_user_port_key",
}


def bond_options(config: models.Bond) -> tuple[tuple[str, Any], ...]:
    """``config``'s options as pyroute2 attributes, in the model's field order; unset ones are left
    to the kernel's defaults. ``primary`` names a link, so it is rendered at apply time
    (:func:`bond_request`)."""
    options: list[tuple[str, Any]] = []
    for field in type(config).model_fields:
        value = getattr(config, field)
        if value is None:
            continue
        if field in _BOND_CHOICES:
            attribute, values = _BOND_CHOICES[field]
            options.append((attribute, values[value]))
        elif field in _BOND_NUMBERS:
            options.append((_BOND_NUMBERS[field], int(value)))
        elif field == "use_carrier":
            options.append(("bond_use_carrier", int(value)))
        elif field == "arp_ip_target":
            options.append(("bond_arp_ip_target", tuple(str(ipaddress.ip_address(a)) for a in value)))
        elif field == "ad_actor_system":
            options.append(("bond_ad_actor_system", bytes.fromhex(value.replace(":", ""))))
    return tuple(options)


def bond_request(bond: Bond, index: Mapping[str, int]) -> dict[str, Any]:
    """The pyroute2 ``link("add", ...)`` request that makes ``bond`` (``index``: link indexes)."""
    request: dict[str, Any] = {"ifname": bond.name, "kind": "bond", **dict(bond.options)}
    if bond.primary is not None:
        request["bond_primary"] = index[bond.primary]
    return request


def enslave_requests(slave: int, bond: int) -> list[dict[str, Any]]:
    """The pyroute2 ``link("set", ...)`` requests that make link ``slave`` a slave of ``bond``:
    down first, as the bonding driver wants it (it brings the slave up itself)."""
    return [{"index": slave, "state": "down"}, {"index": slave, "master": bond}]


def vlan_request(vlan: Vlan, index: Mapping[str, int]) -> dict[str, Any]:
    """The pyroute2 ``link("add", ...)`` request that makes ``vlan`` on its parent."""
    return {"ifname": vlan.name, "kind": "vlan", "link": index[vlan.parent], "vlan_id": vlan.vlan_id}


def alias_request(link: int) -> dict[str, Any]:
    """The pyroute2 ``link("set", ...)`` request that marks a link made as kubeplane's (the kernel
    ignores an alias in the request that makes the link)."""
    return {"index": link, "ifalias": LINK_ALIAS}


def probe_request(kind: str) -> dict[str, Any]:
    """A pyroute2 ``link("add", ...)`` request that asks the kernel whether it can make ``kind``
    without making anything: the all-zero hardware address is invalid, so a kernel with the kind
    refuses it when it validates the request (``EADDRNOTAVAIL``), and one without it answers
    ``EOPNOTSUPP`` ("Unknown device type") first."""
    return {"ifname": PROBE_NAME, "kind": kind, "address": "00:00:00:00:00:00"}


def kernel_errors(plan: Plan, missing: Iterable[str]) -> tuple[str, ...]:
    """The errors for the links ``plan`` would make whose kind the kernel lacks (``missing``)."""
    lacking = set(missing)
    made: list[tuple[str, str, str]] = [(bond.field, bond.name, "bond") for bond in plan.create_bonds]
    made += [(vlan.field, vlan.name, "vlan") for vlan in plan.create_vlans]
    return tuple(
        f"{field}: {name}: the kernel has no {KERNEL_FEATURES[kind]}; nothing of machine.network is applied"
        for field, name, kind in made
        if kind in lacking
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
    made = {bond.name for bond in wanted.bonds} | {vlan.name for vlan in wanted.vlans}
    for link in wanted.links:
        if link.name not in observed.links and link.name not in made:
            errors.append(f"{link.field}.interface: interface {link.name} does not exist on this node")
    errors += _link_errors(wanted, observed)
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
    gone = [
        link
        for link in observed.links.values()
        if link.alias == LINK_ALIAS and link.kind in KERNEL_FEATURES and link.name not in made
    ]
    return Plan(
        create_bonds=tuple(bond for bond in wanted.bonds if bond.name not in observed.links),
        enslave=tuple(
            (slave, bond.name)
            for bond in wanted.bonds
            for slave in bond.slaves
            if observed.links[slave].master != bond.name
        ),
        create_vlans=tuple(vlan for vlan in wanted.vlans if vlan.name not in observed.links),
        remove_routes=tuple(r for r in observed.routes if r.owned and r.key not in wanted_routes),
        remove_addresses=tuple(a for a in observed.addresses if a.owned and a.key not in wanted_addresses),
        delete_links=tuple(link.name for link in sorted(gone, key=lambda link: link.kind != "vlan")),
        set_mtu=tuple(
            (link.name, link.mtu)
            for link in wanted.links
            if link.mtu is not None
            and (link.name not in observed.links or observed.links[link.name].mtu != link.mtu)
        ),
        set_up=tuple(
            link.name
            for link in wanted.links
            if link.name not in observed.links or not observed.links[link.name].up
        ),
        add_addresses=tuple(a for a in wanted.addresses if a.key not in present),
        replace_routes=tuple(replace),
    )


def _link_errors(wanted: Desired, observed: Observed) -> Iterable[str]:
    """Bonds and VLANs that cannot be made or used as asked: a slave that does not exist or has
    another master, a link of the name that is of another kind (or another VLAN)."""
    links = observed.links
    for bond in wanted.bonds:
        existing = links.get(bond.name)
        if existing is not None and existing.kind != "bond":
            yield (
                f"{bond.field}: {bond.name} exists on this node and is not a bond "
                f"(kind {existing.kind or 'physical'})"
            )
        for slave_index, slave in enumerate(bond.slaves):
            field = f"{bond.field}.interfaces[{slave_index}]"
            current = links.get(slave)
            if current is None:
                yield f"{field}: interface {slave} does not exist on this node"
            elif current.master not in (None, bond.name):
                yield f"{field}: {slave} is a slave of {current.master} already"
    for vlan in wanted.vlans:
        existing = links.get(vlan.name)
        if existing is not None and (existing.kind, existing.parent, existing.vlan_id) != (
            "vlan",
            vlan.parent,
            vlan.vlan_id,
        ):
            yield (
                f"{vlan.field}: {vlan.name} exists on this node and is not VLAN {vlan.vlan_id} on "
                f"{vlan.parent} (kind {existing.kind or 'physical'})"
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
