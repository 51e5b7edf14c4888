"""The ``host-gw`` pod network, pure: the node's CNI conflist, its routes to other nodes' pods and
its masquerade rules, computed from the Node objects' ``spec.podCIDR`` and InternalIP.

No CNI daemon ships in Debian (no flannel, calico or cilium package), but the plugins do
(``containernetworking-plugins``: ``bridge``, ``host-local``, ``portmap``), and that is enough on
nodes that share one L2 network, as flannel's host-gw backend shows:

- every node has a pod CIDR (the control plane agents assign them:
  :mod:`kubeplane.controllers.k8s.node_cidr`);
- each node's pods get addresses from its own CIDR on a Linux bridge (:func:`render_conflist`);
- each node routes every other node's pod CIDR via that node's InternalIP
  (:func:`desired_routes`), so pods reach each other directly, with their own source addresses;
- traffic from pods to anything outside the cluster's pod subnets leaves with the node's address
  (:func:`masquerade_rules`); the bridge plugin's own ``ipMasq`` is off, because it would also
  rewrite pod-to-pod traffic to other nodes.

There is no encapsulation: a node whose InternalIP is not on one of this node's directly
connected networks cannot be reached this way, and is reported instead of routed. NetworkPolicy
is not implemented. The I/O (netlink, iptables) is in :mod:`kubeplane.services.podnet`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CONFLIST_NAME = "10-kubeplane.conflist"
#: The route protocol (``ip route ... proto 75``) that marks the routes kubeplane installs, so it
#: changes and removes its own routes and never anyone else's. Unassigned in iproute2's rt_protos.
ROUTE_PROTO = 75
#: The nat chain holding the pod masquerade rules; POSTROUTING jumps to it.
MASQUERADE_CHAIN = "KUBEPLANE-POD-MASQ"
MASQUERADE_COMMENT = "kubeplane pod network masquerade"


@dataclasses.dataclass(frozen=True)
class NodeNet:
    """What the pod network needs of one Node object."""

    name: str
    pod_cidrs: tuple[str, ...] = ()
    internal_ip: str | None = None


@dataclasses.dataclass(frozen=True)
class Route:
    """A route to one node's pods: ``cidr via via``, for node ``node``."""

    cidr: str
    via: str
    node: str


def pod_cidrs(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The pod CIDRs of a Node object: ``spec.podCIDRs``, or the older ``spec.podCIDR``."""
    spec = obj.get("spec") or {}
    cidrs = list(spec.get("podCIDRs") or ())
    if not cidrs and spec.get("podCIDR"):
        cidrs = [spec["podCIDR"]]
    return tuple(str(cidr) for cidr in cidrs)


def node_net(obj: Mapping[str, Any]) -> NodeNet:
    """The pod network fields of a Node object (missing fields: empty)."""
    metadata, status = (obj.get(key) or {} for key in ("metadata", "status"))
    internal = [
        str(address.get("address"))
        for address in status.get("addresses") or ()
        if isinstance(address, Mapping) and address.get("type") == "InternalIP" and address.get("address")
    ]
    ipv4 = [address for address in internal if _is_ipv4(address)]
    return NodeNet(
        name=str(metadata.get("name") or ""),
        pod_cidrs=pod_cidrs(obj),
        internal_ip=ipv4[0] if ipv4 else None,
    )


def _is_ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False


def ipv4_pod_cidr(node: NodeNet) -> str | None:
    """The node's IPv4 pod CIDR, None when the controller manager has not given it one (yet)."""
    for cidr in node.pod_cidrs:
        try:
            network = ipaddress.ip_network(cidr)
        except ValueError:
            continue
        if network.version == 4:
            return str(network)
    return None


def desired_routes(
    own: str, nodes: Iterable[NodeNet], *, on_link: Sequence[ipaddress.IPv4Network]
) -> tuple[list[Route], list[tuple[str, str]]]:
    """Routes to every other node's pods, and the nodes skipped with the reason.

    ``on_link`` are the networks of this node's own addresses: a next hop must be on one of them.
    Nodes are taken in name order; a pod CIDR claimed twice is routed to the first node only.
    """
    routes: list[Route] = []
    skipped: list[tuple[str, str]] = []
    claimed: set[str] = set()
    for node in sorted(nodes, key=lambda item: item.name):
        if node.name == own:
            continue
        cidr = ipv4_pod_cidr(node)
        if cidr is None:
            skipped.append((node.name, "no IPv4 pod CIDR allocated yet"))
        elif node.internal_ip is None:
            skipped.append((node.name, "no IPv4 InternalIP"))
        elif not any(ipaddress.ip_address(node.internal_ip) in network for network in on_link):
            skipped.append(
                (
                    node.name,
                    f"InternalIP {node.internal_ip} is not on a network of this node (host-gw needs one L2)",
                )
            )
        elif cidr in claimed:
            skipped.append((node.name, f"pod CIDR {cidr} is already routed to another node"))
        else:
            claimed.add(cidr)
            routes.append(Route(cidr=cidr, via=node.internal_ip, node=node.name))
    return routes, skipped


def render_conflist(*, pod_cidr: str, bridge: str = "cni0", name: str = "kubeplane") -> str:
    """The conflist JSON for a node whose pods get addresses from ``pod_cidr``.

    ``isGateway`` gives the bridge the CIDR's first address, the pods' default route; ``ipMasq``
    stays off (see the module docstring).
    """
    document = {
        "cniVersion": "0.4.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def masquerade_rules(*, pod_cidr: str, cluster_pod_subnets: Sequence[str]) -> str:
    """``iptables-restore --noflush`` input that (re)writes :data:`MASQUERADE_CHAIN` in ``nat``.

    Packets from this node's pods to the cluster's pod subnets keep their source; everything else
    from this node's pods is masqueraded. The jump from POSTROUTING is added separately, once.
    """
    lines = ["*nat", f":{MASQUERADE_CHAIN} - [0:0]", f"-A {MASQUERADE_CHAIN} ! -s {pod_cidr} -j RETURN"]
    for subnet in cluster_pod_subnets:
        if ipaddress.ip_network(subnet, strict=False).version == 4:
            lines.append(f"-A {MASQUERADE_CHAIN} -d {subnet} -j RETURN")
    lines += [f"-A {MASQUERADE_CHAIN} -j MASQUERADE --random-fully", "COMMIT", ""]
    return "\n".join(lines)


def masquerade_jump() -> list[str]:
    """The POSTROUTING rule (``iptables -t nat`` arguments after ``-A``/``-C``/``-D``)."""
    return ["POSTROUTING", "-m", "comment", "--comment", MASQUERADE_COMMENT, "-j", MASQUERADE_CHAIN]
