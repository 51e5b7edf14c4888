"""The network of a local cluster: a bridge on the host and one network namespace per node.

Layout (docs/architecture.md "Local clusters"), for cluster ``c`` on CIDR ``10.5.0.0/24``::

    host:  bridge kp-c  10.5.0.1/24
             ├── veth kv<hash>n1 ── netns kp-c-<node1>: eth0 10.5.0.2/24, lo up, default via 10.5.0.1
             └── veth kv<hash>n2 ── netns kp-c-<node2>: eth0 10.5.0.3/24, ...

Interface names must fit IFNAMSIZ (15 characters), so the bridge name limits cluster names to 12
characters, and host veth ends use a short hash of the cluster name plus the node's index
(deterministic, so a re-run finds them). Namespace names are files in ``/run/netns`` and have no
such limit. Node N (counting from 1, control plane nodes first) gets the (N+1)th address.

Node to node traffic is bridged and node to host traffic is local, so no host sysctl needs to
change (``ip_forward`` stays as it is). The plan's ``routes`` (the cluster's Service subnet via
its first control plane node, so the host reaches Services) are added on the bridge, recorded in
the state first and deleted by :func:`destroy`. Note that with ``br_netfilter`` loaded, bridged packets
traverse the host's iptables FORWARD chain: a DROP policy there cuts nodes off from each other.

Everything is recorded in the :class:`~kubeplane.provision.state.NetworkState` *before* it is
created, and the state is saved after every step; :func:`destroy` deletes exactly what the state
records (absent things are skipped) and is safe to run twice. The bridge and veth ends also carry
the link alias ``kubeplane:<cluster>``, so a bridge that exists but is someone else's is refused.

Errors (all :class:`NetworkError`): :class:`InvalidName`, :class:`InvalidCIDR`,
:class:`AddressConflict` (the CIDR overlaps a host address or route), :class:`NotOurs` (a
bridge, link or namespace of the same name exists and this cluster did not create it),
:class:`CommandFailed` (an ``ip`` command failed; the message quotes it and its stderr).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import ipaddress
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kubeplane.provision import hostproc
from kubeplane.provision import state as state_mod

IFNAMSIZ = 15
BRIDGE_PREFIX = "kp-"
MAX_CLUSTER_NAME = IFNAMSIZ - len(BRIDGE_PREFIX)
DEFAULT_CIDR = "10.5.0.0/24"
NETNS_DIR = Path("/run/netns")
#: Inside every node namespace the cluster interface is called this.
NODE_INTERFACE = "eth0"

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


class NetworkError(Exception):
    """Base of this module's errors."""


class InvalidName(NetworkError):
    """A cluster or node name cannot be used for interface or namespace names."""


class InvalidCIDR(NetworkError):
    """The cluster CIDR is malformed or too small."""


class AddressConflict(NetworkError):
    """The cluster CIDR overlaps an address or route the host already has."""


class NotOurs(NetworkError):
    """A link or namespace with one of our names exists but this cluster did not create it."""


class CommandFailed(NetworkError):
    """An ``ip`` command failed."""


def validate_cluster_name(name: str) -> str:
    """Return ``name`` if it can name a cluster, else raise :class:`InvalidName` saying why."""
    if not _LABEL.match(name):
        raise InvalidName(
            f"cluster name {name!r} is invalid: use lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    if len(name) > MAX_CLUSTER_NAME:
        raise InvalidName(
            f"cluster name {name!r} is {len(name)} characters long; at most {MAX_CLUSTER_NAME} fit, "
            f"because the bridge {BRIDGE_PREFIX}{name!s} must fit the kernel's {IFNAMSIZ}-character "
            "interface name limit (IFNAMSIZ); choose a shorter name"
        )
    return name


def validate_node_name(name: str) -> str:
    """Return ``name`` if it can name a node (a DNS label), else raise :class:`InvalidName`."""
    if not _LABEL.match(name) or len(name) > 63:
        raise InvalidName(
            f"node name {name!r} is invalid: use at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return name


def bridge_name(cluster: str) -> str:
    return BRIDGE_PREFIX + validate_cluster_name(cluster)


def netns_name(cluster: str, node: str) -> str:
    return f"{BRIDGE_PREFIX}{validate_cluster_name(cluster)}-{validate_node_name(node)}"


def veth_name(cluster: str, index: int) -> str:
    """The host end of node ``index``'s veth pair: ``kv`` + 8 hex of the cluster name + ``n<index>``."""
    if not 1 <= index <= 999:
        raise InvalidName(f"node index {index} is outside 1..999")
    digest = hashlib.sha256(validate_cluster_name(cluster).encode()).hexdigest()[:8]
    return f"kv{digest}n{index}"


def link_alias(cluster: str) -> str:
    """The alias marking links this cluster created."""
    return f"kubeplane:{cluster}"


@dataclasses.dataclass(frozen=True)
class NodeAddress:
    name: str
    index: int
    ip: str
    netns: str
    host_veth: str


@dataclasses.dataclass(frozen=True)
class NetworkPlan:
    """Names and addresses for a cluster network (pure data; :func:`plan` computes it)."""

    cluster: str
    cidr: ipaddress.IPv4Network
    host_ip: str
    bridge: str
    nodes: tuple[NodeAddress, ...]
    #: Host routes over the bridge: destination CIDR → gateway (the Service subnet via a node).
    routes: tuple[tuple[str, str], ...] = ()
    #: The control plane's shared VIP (``cluster create --vip``), reserved: no node gets it.
    vip: str | None = None

    @property
    def prefixlen(self) -> int:
        return self.cidr.prefixlen


def plan(
    cluster: str, nodes: Sequence[str], *, cidr: str = DEFAULT_CIDR, routes: Sequence[tuple[str, str]] = ()
) -> NetworkPlan:
    """Validate names and the CIDR and reserve addresses: host = 1st, node N = (N+1)th."""
    validate_cluster_name(cluster)
    try:
        network = ipaddress.ip_network(cidr, strict=True)
    except ValueError as exc:
        raise InvalidCIDR(f"cluster CIDR {cidr!r} is invalid: {exc} (example: {DEFAULT_CIDR})") from None
    if not isinstance(network, ipaddress.IPv4Network):
        raise InvalidCIDR(
            f"cluster CIDR {cidr!r} is IPv6; local clusters use an IPv4 CIDR like {DEFAULT_CIDR}"
        )
    if len(set(nodes)) != len(nodes):
        raise InvalidName(f"node names must be unique, got {list(nodes)}")
    # Usable addresses exclude the network and broadcast addresses; one is the host's.
    usable = network.num_addresses - 2
    if len(nodes) + 1 > usable:
        raise InvalidCIDR(
            f"cluster CIDR {cidr} has {max(usable, 0)} usable addresses, but the host and "
            f"{len(nodes)} nodes need {len(nodes) + 1}; use a larger CIDR"
        )
    addresses = tuple(
        NodeAddress(
            name=validate_node_name(name),
            index=index,
            ip=str(network[index + 1]),
            netns=netns_name(cluster, name),
            host_veth=veth_name(cluster, index),
        )
        for index, name in enumerate(nodes, start=1)
    )
    return NetworkPlan(
        cluster=cluster,
        cidr=network,
        host_ip=str(network[1]),
        bridge=bridge_name(cluster),
        nodes=addresses,
        routes=tuple(routes),
    )


# -- talking to the kernel -------------------------------------------------------------------


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; raise :class:`CommandFailed` quoting the command and stderr if it fails."""
    try:
        result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise CommandFailed("the `ip` command is missing; install iproute2") from None
    if check and result.returncode != 0:
        raise CommandFailed(f"`ip {' '.join(args)}` failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = ip("-j", *args).stdout.strip()
    data = json.loads(out) if out else []
    return [item for item in data if isinstance(item, dict)]


def link_info(name: str) -> dict[str, Any] | None:
    """``ip -d link show NAME`` as a dict, or None if there is no such link."""
    result = ip("-j", "-d", "link", "show", "dev", name, check=False)
    if result.returncode != 0:
        return None
    data = json.loads(result.stdout)
    return data[0] if data else None


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def host_networks(*, ignore_dev: str) -> list[tuple[ipaddress.IPv4Network, str]]:
    """The host's IPv4 address networks and routes (except those on ``ignore_dev``), each with a
    description (``address 10.0.0.1/24 on eth0``, ``route 10.96.0.0/16 via 10.5.0.2``)."""
    found = []
    for link in _ip_json("-4", "addr", "show"):
        if link.get("ifname") == ignore_dev:
            continue
        for addr in link.get("addr_info", []):
            iface = ipaddress.ip_interface(f"{addr['local']}/{addr['prefixlen']}")
            if isinstance(iface, ipaddress.IPv4Interface):
                found.append((iface.network, f"address {iface} on {link.get('ifname')}"))
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst", "default")
        if dst == "default" or route.get("dev") == ignore_dev or route.get("type") in ("local", "broadcast"):
            continue
        routed = ipaddress.ip_network(dst, strict=False)
        if isinstance(routed, ipaddress.IPv4Network):
            found.append(
                (routed, f"route {dst} via {route.get('gateway') or route.get('dev') or route.get('type')}")
            )
    return found


#: The host-wide lock of :func:`host_routes_lock`.
HOST_ROUTES_LOCK = Path("/run/kubeplane/host-routes.lock")


@contextlib.contextmanager
def host_routes_lock(
    *, path: Path = HOST_ROUTES_LOCK, waiting: Callable[[], None] = lambda: None
) -> Iterator[None]:
    """Hold the host-wide lock under which a new cluster picks what it routes on the host (its
    Service subnet: the first free one) and adds those routes. Without it two ``cluster create``
    runs at once both find the same subnet free and the second one's route collides. ``waiting``
    is called once when another holder makes this one wait (to say so)."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def host_conflicts(network: ipaddress.IPv4Network, *, ignore_dev: str) -> list[str]:
    """Host addresses and routes overlapping ``network`` (except those on ``ignore_dev``)."""
    return [what for other, what in host_networks(ignore_dev=ignore_dev) if other.overlaps(network)]


def check_host(network_plan: NetworkPlan, recorded: state_mod.NetworkState | None) -> None:
    """Refuse a CIDR that overlaps the host's addresses/routes and names that are not ours."""
    owns_bridge = recorded is not None and recorded.owns_bridge
    bridge = link_info(network_plan.bridge)
    if bridge is not None and not (owns_bridge and bridge.get("ifalias") == link_alias(network_plan.cluster)):
        raise NotOurs(
            f"a link named {network_plan.bridge} already exists and cluster {network_plan.cluster!r} did not "
            f"create it; choose another cluster name, or delete it with `ip link del {network_plan.bridge}` "
            "if it is a leftover"
        )
    if recorded is not None and recorded.cidr != str(network_plan.cidr):
        raise InvalidCIDR(
            f"cluster {network_plan.cluster!r} already uses CIDR {recorded.cidr}, not {network_plan.cidr}; "
            "destroy the cluster to change it"
        )
    conflicts = host_conflicts(network_plan.cidr, ignore_dev=network_plan.bridge)
    if conflicts:
        raise AddressConflict(
            f"cluster CIDR {network_plan.cidr} overlaps the host's {', '.join(conflicts)}; "
            "choose a free private range with --cidr"
        )
    for destination, _ in network_plan.routes:
        taken = host_conflicts(ipaddress.IPv4Network(destination), ignore_dev=network_plan.bridge)
        if taken:
            raise AddressConflict(
                f"the Service subnet {destination} (routed from the host to the cluster) overlaps the "
                f"host's {', '.join(taken)}; another local cluster may have taken it: run create again "
                "to pick a free one, or set cluster.network.serviceSubnets with --config-patch"
            )
    for node in network_plan.nodes:
        if netns_exists(node.netns) and (recorded is None or node.netns not in recorded.netns):
            raise NotOurs(
                f"network namespace {node.netns} already exists and cluster {network_plan.cluster!r} did not "
                f"create it; delete it with `ip netns del {node.netns}` if it is a leftover"
            )
        veth = link_info(node.host_veth)
        if veth is not None and veth.get("ifalias") != link_alias(network_plan.cluster):
            raise NotOurs(
                f"a link named {node.host_veth} (node {node.name}) already exists and is not marked "
                f"{link_alias(network_plan.cluster)!r}; delete it with `ip link del {node.host_veth}`"
            )


# -- create and destroy ------------------------------------------------------------------------


def create(
    network_plan: NetworkPlan,
    cluster: state_mod.ClusterState,
    *,
    roles: dict[str, state_mod.Role] | None = None,
) -> None:
    """Create (or complete) the bridge and every node namespace of ``network_plan``; idempotent.

    Records each piece in ``cluster`` and saves it before creating it. ``roles`` gives each
    node's role for the node records (default: controlplane).
    """
    check_host(network_plan, cluster.network)
    if cluster.network is None:
        cluster.network = state_mod.NetworkState(
            cidr=str(network_plan.cidr),
            host_ip=network_plan.host_ip,
            bridge=network_plan.bridge,
            vip=network_plan.vip or "",
        )
    net = cluster.network
    alias = link_alias(network_plan.cluster)
    if link_info(network_plan.bridge) is None:
        net.owns_bridge = True
        cluster.save()
        ip("link", "add", "name", network_plan.bridge, "type", "bridge")
    ip("link", "set", "dev", network_plan.bridge, "alias", alias)
    ip("addr", "replace", f"{network_plan.host_ip}/{network_plan.prefixlen}", "dev", network_plan.bridge)
    ip("link", "set", "dev", network_plan.bridge, "up")
    for node in network_plan.nodes:
        _record_node(cluster, node, (roles or {}).get(node.name, "controlplane"))
        _create_node(network_plan, node, net, cluster)
    for destination, gateway in network_plan.routes:
        net.routes[destination] = gateway
        cluster.save()
        ip("route", "replace", destination, "via", gateway, "dev", network_plan.bridge)


def _record_node(cluster: state_mod.ClusterState, node: NodeAddress, role: state_mod.Role) -> None:
    try:
        cluster.node(node.name)
    except KeyError:
        cluster.nodes.append(
            state_mod.NodeState(
                name=node.name,
                role=role,
                index=node.index,
                ip=node.ip,
                netns=node.netns,
                host_veth=node.host_veth,
            )
        )
        cluster.save()


def _create_node(
    network_plan: NetworkPlan, node: NodeAddress, net: state_mod.NetworkState, cluster: state_mod.ClusterState
) -> None:
    if node.netns not in net.netns:
        net.netns.append(node.netns)
        cluster.save()
    if not netns_exists(node.netns):
        ip("netns", "add", node.netns)
    if node.host_veth not in net.links:
        net.links.append(node.host_veth)
        cluster.save()
    if link_info(node.host_veth) is None:
        # A half-made node may still have an eth0 from an earlier attempt: start over in it.
        ip("-n", node.netns, "link", "del", NODE_INTERFACE, check=False)
        ip("link", "add", node.host_veth, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", node.netns)
    ip("link", "set", "dev", node.host_veth, "alias", link_alias(network_plan.cluster))
    ip("link", "set", "dev", node.host_veth, "master", network_plan.bridge)
    ip("link", "set", "dev", node.host_veth, "up")
    ip("-n", node.netns, "link", "set", "dev", "lo", "up")
    ip("-n", node.netns, "addr", "replace", f"{node.ip}/{network_plan.prefixlen}", "dev", NODE_INTERFACE)
    ip("-n", node.netns, "link", "set", "dev", NODE_INTERFACE, "up")
    ip("-n", node.netns, "route", "replace", "default", "via", network_plan.host_ip)


def remove_node(cluster: state_mod.ClusterState, node: state_mod.NodeState) -> None:
    """Delete one node's veth and namespace (``cluster remove``), as :func:`destroy` does for all.

    The node's processes must be stopped first. Safe to repeat: what is gone is skipped.
    """
    net = cluster.network
    if net is None:
        return
    if node.host_veth in net.links:
        info = link_info(node.host_veth)
        if info is not None and info.get("ifalias") in (link_alias(cluster.name), None):
            ip("link", "del", "dev", node.host_veth, check=False)
        net.links.remove(node.host_veth)
        cluster.save()
    if node.netns in net.netns:
        if netns_exists(node.netns):
            ip("netns", "del", node.netns)
        net.netns.remove(node.netns)
        cluster.save()


def destroy(cluster: state_mod.ClusterState) -> None:
    """Delete exactly the links, namespaces and bridge the state records; safe to run twice.

    Processes inside the namespaces must be stopped first (a namespace lives on while a
    process holds it, though its name is gone).
    """
    net = cluster.network
    if net is None:
        return
    alias = link_alias(cluster.name)
    for destination, gateway in list(net.routes.items()):
        # Only the route this cluster added (its gateway, its bridge): never another's.
        ip("route", "del", destination, "via", gateway, "dev", net.bridge, check=False)
        del net.routes[destination]
        cluster.save()
    for link in list(net.links):
        info = link_info(link)
        if info is not None and info.get("ifalias") in (alias, None):
            # No alias yet means we crashed between `link add` and `alias`: still ours by name.
            ip("link", "del", "dev", link, check=False)
        net.links.remove(link)
        cluster.save()
    for name in list(net.netns):
        if netns_exists(name):
            ip("netns", "del", name)
        net.netns.remove(name)
        cluster.save()
    if net.owns_bridge:
        info = link_info(net.bridge)
        if info is not None and info.get("ifalias") in (alias, None):
            ip("link", "del", "dev", net.bridge)
        net.owns_bridge = False
        cluster.save()
    for key, value in net.sysctls.items():
        Path("/proc/sys", key.replace(".", "/")).write_text(value)
    cluster.network = None
    cluster.save()


#: An ICMP echo in Python: the image has no ``ping`` binary. Exits 0 once ``argv[1]`` answers.
_ICMP_ECHO = """
import os, socket, struct, sys, time
def checksum(data):
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF
ident = os.getpid() & 0xFFFF
body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"kubeplane"
packet = body[:2] + struct.pack("!H", checksum(body + b"\\0")) + body[4:]
with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
    sock.settimeout(float(sys.argv[2]))
    sock.sendto(packet, (sys.argv[1], 0))
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:
        data, (source, _) = sock.recvfrom(1024)
        header = data[(data[0] & 0x0F) * 4:]
        if source == sys.argv[1] and header[0] == 0 and struct.unpack("!H", header[4:6])[0] == ident:
            sys.exit(0)
sys.exit(1)
"""


def ping(address: str, *, netns: str | None = None, timeout: float = 1.0) -> bool:
    """True if ``address`` answers one ICMP echo (sent from ``netns``, or the host) in ``timeout`` s."""
    prefix = hostproc.nsenter_argv(netns) if netns is not None else []
    argv = [*prefix, sys.executable, "-c", _ICMP_ECHO, address, str(timeout)]
    return subprocess.run(argv, capture_output=True, check=False, timeout=timeout + 10).returncode == 0


def wait_reachable(address: str, *, netns: str | None = None, timeout: float = 5.0) -> None:
    """Ping ``address`` until it answers (a fresh bridge port takes a moment to forward)."""
    deadline = time.monotonic() + timeout
    while not ping(address, netns=netns):
        if time.monotonic() >= deadline:
            where = f"namespace {netns}" if netns else "the host"
            raise NetworkError(f"{address} does not answer ping from {where} within {timeout}s")
