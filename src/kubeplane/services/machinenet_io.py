"""The node's own network, I/O: netlink (pyroute2) in the agent's network namespace, the UTS
hostname, and the node's ``/etc/resolv.conf`` and ``/etc/hosts``.

Thin on purpose: :func:`observe` reads links, addresses and main-table routes into a
:class:`~kubeplane.services.machinenet.Observed`, :func:`apply` carries out a
:class:`~kubeplane.services.machinenet.Plan` in its order. What to change, and that only what
carries :data:`~kubeplane.services.machinenet.PROTO` is ever removed, is decided in
:mod:`kubeplane.services.machinenet`. Everything here blocks: callers run it in a thread.

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
_EADDRNOTAVAIL = 99


class MachineNetworkError(Exception):
    """A netlink change failed; the message says which and why."""


def observe() -> machinenet.Observed:
    """The namespace's links, addresses (IPv4 and IPv6) and main-table routes."""
    # Imported on first use: pyroute2 loads its whole library (~10 MB resident), which an agent
    # in maintenance mode never needs.
    from pyroute2 import IPRoute  # type: ignore[import-untyped]  # noqa: PLC0415

    with IPRoute() as ip:
        links = {}
        for message in ip.get_links():
            name = message.get("IFLA_IFNAME")
            links[name] = machinenet.ObservedLink(
                name=name,
                index=message["index"],
                mtu=int(message.get("IFLA_MTU") or 0),
                up=bool(message["flags"] & _IFF_UP),
                oper_state=str(message.get("IFLA_OPERSTATE") or "UNKNOWN"),
            )
        names = {link.index: link.name for link in links.values()}
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
    """Carry out ``plan`` (computed against ``observed``); a netlink error stops it and says where."""
    # Imported on first use, as in observe().
    from pyroute2 import IPRoute  # noqa: PLC0415
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

    index = {name: link.index for name, link in observed.links.items()}
    with IPRoute() as ip:
        for old in plan.remove_routes:
            try:
                ip.route(
                    "del", dst=old.network, priority=old.metric, proto=machinenet.PROTO, table=MAIN_TABLE
                )
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
