"""The node's own network, I/O: netlink (pyroute2) in the agent's network namespace, the UTS
hostname, and the node's ``/etc/resolv.conf`` and ``/etc/hosts``.

Thin on purpose: :func:`observe` reads links, addresses and main-table routes into a
:class:`~kubeplane.services.machinenet.Observed`, :func:`apply` carries out a
:class:`~kubeplane.services.machinenet.Plan` in its order, :func:`supports` asks the kernel
whether it can make a kind of link. What to change, and that only what carries
:data:`~kubeplane.services.machinenet.PROTO` is ever removed, is decided in
:mod:`kubeplane.services.machinenet`, and so are the requests that make bonds and VLANs.
Everything here blocks: callers run it in a thread.

The bonds and VLANs a plan makes come first, and are a unit with the rest: when any later step
of the same apply fails (or the making itself), :func:`apply` releases the slaves it enslaved
(bringing up again those that were up), deletes the links it made, and raises, so an interface is
never left half-configured. A kernel without the link kind answers ``EOPNOTSUPP``; the error then
names the missing feature (:data:`~kubeplane.services.machinenet.KERNEL_FEATURES`).

``/etc/resolv.conf`` and ``/etc/hosts`` are rewritten in place (:func:`write_in_place`), not
renamed over: on a local cluster node each is a bind mount of the node's own copy (Docker does
the same for containers), and a rename over a mount point fails, while a temporary file beside it
would land in the host's ``/etc``.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubeplane.services import machinenet

if TYPE_CHECKING:
    from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]

#: The main routing table.
MAIN_TABLE = 254
_IFF_UP = 0x1
_ESRCH = 3
_ENODEV = 19
_EOPNOTSUPP = 95
_EADDRNOTAVAIL = 99


class MachineNetworkError(Exception):
    """A netlink change failed; the message says which and why."""


def observe() -> machinenet.Observed:
    """The namespace's links, addresses (IPv4 and IPv6) and main-table routes."""
    # Imported on first use: pyroute2 loads its whole library (~10 MB resident), which an agent
    # in maintenance mode never needs.
    from pyroute2 import IPRoute  # type: ignore[import-untyped]  # noqa: PLC0415

    with IPRoute() as ip:
        messages = ip.get_links()
        names = {message["index"]: message.get("IFLA_IFNAME") for message in messages}
        links = {}
        for message in messages:
            name = message.get("IFLA_IFNAME")
            kind = message.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or ""
            vlan_id = message.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA", "IFLA_VLAN_ID")
            links[name] = machinenet.ObservedLink(
                name=name,
                index=message["index"],
                mtu=int(message.get("IFLA_MTU") or 0),
                up=bool(message["flags"] & _IFF_UP),
                oper_state=str(message.get("IFLA_OPERSTATE") or "UNKNOWN"),
                kind=str(kind),
                master=names.get(message.get("IFLA_MASTER")),
                alias=str(message.get("IFLA_IFALIAS") or ""),
                parent=names.get(message.get("IFLA_LINK")) if kind == "vlan" else None,
                vlan_id=int(vlan_id) if kind == "vlan" and vlan_id is not None else None,
            )
        addresses = []
        for message in ip.get_addr():
            address = message.get("IFA_ADDRESS")
            link = names.get(message["index"])
            if address is None or link is None:
                continue
            addresses.append(
                machinenet.ObservedAddress(
                    link=link,
                    cidr=str(ipaddress.ip_interface(f"{address}/{message['prefixlen']}")),
                    owned=message.get("IFA_PROTO") == machinenet.PROTO,
                )
            )
        routes = []
        for family, default in ((socket.AF_INET, "0.0.0.0/0"), (socket.AF_INET6, "::/0")):
            for message in ip.get_routes(family=family, table=MAIN_TABLE):
                if message.get("RTA_TABLE", message["table"]) != MAIN_TABLE or message["type"] != 1:
                    continue  # other tables, local/broadcast/unreachable routes
                destination = message.get("RTA_DST")
                network = f"{destination}/{message['dst_len']}" if destination else default
                gateway = message.get("RTA_GATEWAY")
                routes.append(
                    machinenet.ObservedRoute(
                        network=str(ipaddress.ip_network(network)),
                        metric=int(message.get("RTA_PRIORITY") or 0),
                        gateway=str(gateway) if gateway else None,
                        link=names.get(message.get("RTA_OIF")),
                        owned=message["proto"] == machinenet.PROTO,
                    )
                )
    return machinenet.Observed(links=links, addresses=tuple(addresses), routes=tuple(routes))


def apply(plan: machinenet.Plan, observed: machinenet.Observed) -> None:
    """Carry out ``plan`` (computed against ``observed``); a netlink error stops it, undoes the
    links it made (see the module docstring) and says where."""
    # Imported on first use, as in observe().
    from pyroute2 import IPRoute  # noqa: PLC0415

    with IPRoute() as ip:
        apply_with(ip, plan, observed)


def apply_with(ip: Any, plan: machinenet.Plan, observed: machinenet.Observed) -> None:
    """:func:`apply` over the netlink socket ``ip`` (a pyroute2 ``IPRoute``, or a stand-in)."""
    undo = _Undo(ip, observed)
    try:
        _make_links(ip, plan, undo)
        _change(ip, plan, undo.index)
    except MachineNetworkError as exc:
        failures = undo.run()
        if failures:
            raise MachineNetworkError(f"{exc}; undoing it failed too: {'; '.join(failures)}") from exc
        raise


class _Undo:
    """What one apply made, to take back when a later step fails: the links it created and the
    slaves it touched (their up state before)."""

    def __init__(self, ip: Any, observed: machinenet.Observed) -> None:
        self.ip = ip
        self.observed = observed
        self.index = {name: link.index for name, link in observed.links.items()}
        self.created: list[str] = []
        self.slaves: list[str] = []

    def run(self) -> list[str]:
        """Release the slaves, delete the links made; the steps that failed."""
        # Imported on first use, as in observe().
        from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

        failures = []
        for slave in reversed(self.slaves):
            try:
                self.ip.link("set", index=self.index[slave], master=0)
                if self.observed.links[slave].up:
                    self.ip.link("set", index=self.index[slave], state="up")
            except NetlinkError as exc:
                failures.append(f"cannot restore {slave}: {exc}")
        for name in reversed(self.created):
            try:
                # By name: a link made is deleted even when its index was never learnt.
                self.ip.link("del", ifname=name)
            except NetlinkError as exc:
                if exc.code != _ENODEV:
                    failures.append(f"cannot delete {name}: {exc}")
        return failures


def _make_links(ip: Any, plan: machinenet.Plan, undo: _Undo) -> None:
    """Make the plan's bonds, enslave their slaves, make its VLANs, recording each in ``undo``."""
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

    index = undo.index
    for bond in plan.create_bonds:
        _create(ip, machinenet.bond_request(bond, index), undo, field=bond.field, kind="bond")
    for slave, bond_name in plan.enslave:
        undo.slaves.append(slave)
        try:
            for request in machinenet.enslave_requests(index[slave], index[bond_name]):
                ip.link("set", **request)
        except NetlinkError as exc:
            raise MachineNetworkError(f"cannot make {slave} a slave of {bond_name}: {exc}") from exc
    for vlan in plan.create_vlans:
        _create(ip, machinenet.vlan_request(vlan, index), undo, field=vlan.field, kind="vlan")


def _create(ip: Any, request: dict[str, Any], undo: _Undo, *, field: str, kind: str) -> None:
    """Make the link ``request`` asks for and mark it as kubeplane's; its index goes into
    ``undo.index``."""
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

    name = request["ifname"]
    try:
        ip.link("add", **request)
    except NetlinkError as exc:
        if exc.code == _EOPNOTSUPP:
            feature = machinenet.KERNEL_FEATURES[kind]
            raise MachineNetworkError(f"{field}: {name}: the kernel has no {feature}") from exc
        raise MachineNetworkError(f"{field}: cannot make {kind} {name}: {exc}") from exc
    undo.created.append(name)
    try:
        found = ip.link_lookup(ifname=name)
        if len(found) != 1:
            raise MachineNetworkError(f"{field}: {name} was made, but netlink does not show it")
        undo.index[name] = found[0]
        ip.link("set", **machinenet.alias_request(found[0]))
    except NetlinkError as exc:
        raise MachineNetworkError(f"{field}: cannot mark {name} as kubeplane's: {exc}") from exc


def _change(ip: Any, plan: machinenet.Plan, index: dict[str, int]) -> None:
    """The plan's changes after the links are made, in its order."""
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

    for old in plan.remove_routes:
        try:
            ip.route("del", dst=old.network, priority=old.metric, proto=machinenet.PROTO, table=MAIN_TABLE)
        except NetlinkError as exc:
            _unless_gone(exc, f"cannot remove the route to {old.network} (metric {old.metric})")
    for gone in plan.remove_addresses:
        interface = ipaddress.ip_interface(gone.cidr)
        try:
            ip.addr(
                "del",
                index=index[gone.link],
                address=str(interface.ip),
                prefixlen=interface.network.prefixlen,
            )
        except NetlinkError as exc:
            _unless_gone(exc, f"cannot remove address {gone.cidr} from {gone.link}")
    for name in plan.delete_links:
        try:
            ip.link("del", index=index[name])
        except NetlinkError as exc:
            if exc.code != _ENODEV:
                raise MachineNetworkError(f"cannot delete {name}, which left the config: {exc}") from exc
    for name, mtu in plan.set_mtu:
        try:
            ip.link("set", index=index[name], mtu=mtu)
        except NetlinkError as exc:
            raise MachineNetworkError(f"cannot set mtu {mtu} on {name}: {exc}") from exc
    for name in plan.set_up:
        try:
            ip.link("set", index=index[name], state="up")
        except NetlinkError as exc:
            raise MachineNetworkError(f"cannot bring {name} up: {exc}") from exc
    for new in plan.add_addresses:
        interface = ipaddress.ip_interface(new.cidr)
        try:
            ip.addr(
                "add",
                index=index[new.link],
                address=str(interface.ip),
                prefixlen=interface.network.prefixlen,
                proto=machinenet.PROTO,
            )
        except NetlinkError as exc:
            raise MachineNetworkError(f"{new.field}: cannot add {new.cidr} to {new.link}: {exc}") from exc
    for route in plan.replace_routes:
        request: dict[str, Any] = {
            "dst": route.network,
            "oif": index[route.link],
            "priority": route.metric,
            "proto": machinenet.PROTO,
            "table": MAIN_TABLE,
        }
        if route.gateway is not None:
            request["gateway"] = route.gateway
        try:
            ip.route("replace", **request)
        except NetlinkError as exc:
            raise MachineNetworkError(
                f"{route.field}: cannot route {route.network} on {route.link}: {exc}"
            ) from exc


def supports(kind: str) -> bool:
    """Whether the kernel can make links of ``kind``, asked without making one
    (:func:`~kubeplane.services.machinenet.probe_request`). The kernel loads the kind's module on
    demand, as for any request that names it."""
    from pyroute2 import IPRoute  # noqa: PLC0415

    with IPRoute() as ip:
        return supports_with(ip, kind)


def supports_with(ip: Any, kind: str) -> bool:
    """:func:`supports` over the netlink socket ``ip``."""
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

    try:
        ip.link("add", **machinenet.probe_request(kind))
    except NetlinkError as exc:
        # EADDRNOTAVAIL: the kind's own validation refused the address. EEXIST (a link named
        # like the probe exists, checked only for a kind the kernel lacks) cannot tell: then the
        # creation itself decides, and apply() undoes what it made when it fails.
        return bool(exc.code != _EOPNOTSUPP)
    # A kernel that took the invalid address after all: it has the kind; the probe goes again.
    ip.link("del", ifname=machinenet.PROBE_NAME)
    return True


def _unless_gone(exc: NetlinkError, what: str) -> None:
    """Raise for a failed removal, unless what was to be removed is gone already."""
    if exc.code not in (_ESRCH, _EADDRNOTAVAIL):
        raise MachineNetworkError(f"{what}: {exc}") from exc


def hostname() -> str:
    """The UTS hostname of the agent's namespace."""
    return socket.gethostname()


def set_hostname(name: str) -> None:
    socket.sethostname(name)


def write_in_place(path: Path, text: str) -> bool:
    """Make ``path`` hold ``text`` by rewriting the file itself (see the module docstring); True
    when it changed. A missing file is created."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    with path.open("r+" if path.exists() else "w") as file:
        file.write(text)
        file.truncate()
        file.flush()
    return True
