"""The node's CNI configuration: a ``bridge`` + ``host-local`` conflist, rendered as JSON text.

Pure. No CNI image can run here (no Debian package ships flannel), so every node gets the
plugins Debian does ship: a Linux bridge with host-local IPAM over a per-node slice of the
cluster's pod subnet, plus ``portmap`` for hostPorts. The slice is derived from the node IP
(:func:`node_pod_cidr`) so that nodes agree without coordination; pods of different nodes do
not route to each other through this config alone (that needs routes the provisioner may add).
"""

from __future__ import annotations

import ipaddress
import json

CONFLIST_NAME = "10-kubeplane.conflist"
#: Per-node slice of the pod subnet.
NODE_PREFIX = 24


def node_pod_cidr(pod_subnet: str, node_ip: str, *, prefix: int = NODE_PREFIX) -> str:
    """The ``/prefix`` slice of ``pod_subnet`` for the node at ``node_ip``.

    The slice index is the node IP's low bits, so nodes of one /24 (local clusters) get distinct
    slices. Raises ValueError when the subnet is not larger than one slice.
    """
    network = ipaddress.ip_network(pod_subnet, strict=False)
    if network.prefixlen >= prefix:
        raise ValueError(f"pod subnet {pod_subnet} is too small to give each node a /{prefix}")
    slices = 1 << (prefix - network.prefixlen)
    index = int(ipaddress.ip_address(node_ip)) % slices
    base = int(network.network_address) + (index << (network.max_prefixlen - prefix))
    return str(ipaddress.ip_network((base, prefix)))


def render_conflist(*, pod_cidr: str, bridge: str = "cni0", name: str = "kubeplane") -> str:
    """The conflist JSON for a node whose pods get addresses from ``pod_cidr``."""
    document = {
        "cniVersion": "0.4.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": True,
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
