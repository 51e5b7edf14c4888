"""The ``host-gw`` pod network's I/O in the node's network namespace: routes over netlink
(pyroute2), the masquerade chain through ``iptables-restore`` and IPv4 forwarding.

Everything here is blocking (netlink sockets, subprocesses): callers run it in a thread. Routes
carry :data:`~kubeplane.services.cni.ROUTE_PROTO`, and only routes with that protocol are ever
changed or deleted; the nat chain :data:`~kubeplane.services.cni.MASQUERADE_CHAIN` and its one
POSTROUTING jump are the only iptables state touched. What to install is computed by
:mod:`kubeplane.services.cni`.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from kubeplane.services import cni

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
#: The main routing table.
MAIN_TABLE = 254
IPTABLES_TIMEOUT = 30.0


class PodNetworkError(Exception):
    """A route or rule could not be applied; the message says which and why."""


def on_link_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of this namespace's addresses (loopback excluded)."""
    # Imported on first use: pyroute2 loads its whole library (~10 MB resident), which an agent
    # in maintenance mode never needs.
    from pyroute2 import IPRoute  # type: ignore[import-untyped]  # noqa: PLC0415

    with IPRoute() as ip:
        found = []
        for message in ip.get_addr(family=socket.AF_INET):
            address = message.get("IFA_ADDRESS")
            if address is None:
                continue
            network = ipaddress.IPv4Interface(f"{address}/{message['prefixlen']}").network
            if not network.is_loopback:
                found.append(network)
    return sorted(set(found))


def installed_routes() -> dict[str, str]:
    """kubeplane's routes in the main table: destination CIDR → gateway."""
    from pyroute2 import IPRoute  # noqa: PLC0415  # on first use, as in on_link_networks()

    with IPRoute() as ip:
        return {
            f"{message.get('RTA_DST')}/{message['dst_len']}": str(message.get("RTA_GATEWAY"))
            for message in ip.get_routes(family=socket.AF_INET, proto=cni.ROUTE_PROTO, table=MAIN_TABLE)
        }


def sync_routes(routes: Sequence[cni.Route]) -> tuple[list[str], list[str]]:
    """Make kubeplane's routes exactly ``routes``; returns (added or changed, removed) CIDRs."""
    current = installed_routes()
    wanted = {route.cidr: route.via for route in routes}
    changed = [cidr for cidr, via in wanted.items() if current.get(cidr) != via]
    removed = [cidr for cidr in current if cidr not in wanted]
    # On first use, as in on_link_networks().
    from pyroute2 import IPRoute  # noqa: PLC0415
    from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]  # noqa: PLC0415

    with IPRoute() as ip:
        for cidr in changed:
            try:
                ip.route("replace", dst=cidr, gateway=wanted[cidr], proto=cni.ROUTE_PROTO, table=MAIN_TABLE)
            except NetlinkError as exc:
                raise PodNetworkError(f"cannot route {cidr} via {wanted[cidr]}: {exc}") from exc
        for cidr in removed:
            try:
                ip.route("del", dst=cidr, proto=cni.ROUTE_PROTO, table=MAIN_TABLE)
            except NetlinkError as exc:
                if exc.code != 3:  # ESRCH: gone already
                    raise PodNetworkError(f"cannot remove the route to {cidr}: {exc}") from exc
    return changed, removed


def enable_forwarding(path: Path = IP_FORWARD) -> bool:
    """Turn on IPv4 forwarding (a new network namespace starts with it off); True when it was off."""
    if path.read_text().strip() == "1":
        return False
    path.write_text("1\n")
    return True


def _iptables(binary: str, *args: str, stdin: str | None = None, check: bool = True) -> bool:
    found = shutil.which(binary)
    if found is None:
        raise PodNetworkError(f"{binary} is not installed (Debian package iptables)")
    result = subprocess.run(
        [found, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=IPTABLES_TIMEOUT,
        check=False,
    )
    if check and result.returncode != 0:
        raise PodNetworkError(f"{binary} {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result.returncode == 0


def apply_masquerade(rules: str) -> None:
    """Rewrite the masquerade chain from ``rules`` and make sure POSTROUTING jumps to it once."""
    _iptables("iptables-restore", "--noflush", "-w", stdin=rules)
    jump = cni.masquerade_jump()
    if not _iptables("iptables", "-w", "-t", "nat", "-C", *jump, check=False):
        _iptables("iptables", "-w", "-t", "nat", "-A", *jump)


def remove_masquerade() -> None:
    """Remove the jump and the chain (what is already gone is fine)."""
    jump = cni.masquerade_jump()
    while _iptables("iptables", "-w", "-t", "nat", "-D", *jump, check=False):
        pass
    if _iptables("iptables", "-w", "-t", "nat", "-F", cni.MASQUERADE_CHAIN, check=False):
        _iptables("iptables", "-w", "-t", "nat", "-X", cni.MASQUERADE_CHAIN)
