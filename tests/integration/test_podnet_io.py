"""The host-gw pod network's I/O for real, in a namespace of the test's own: routes over netlink
tagged with kubeplane's protocol (another route is never touched), the masquerade chain written
and rewritten through iptables-restore, IPv4 forwarding turned on, everything removed again."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from kubeplane.services import cni

if TYPE_CHECKING:
    from conftest import NetNS

pytestmark = pytest.mark.integration

# Runs inside the namespace: applies what argv[1] (JSON) asks with kubeplane.services.podnet.
_APPLY = """
import json, sys
from kubeplane.services import cni, podnet
request = json.loads(sys.argv[1])
routes = [cni.Route(**route) for route in request["routes"]]
changed, removed = podnet.sync_routes(routes)
if request.get("masquerade"):
    podnet.apply_masquerade(request["masquerade"])
if request.get("remove_masquerade"):
    podnet.remove_masquerade()
print(json.dumps({
    "changed": changed, "removed": removed, "forwarding": podnet.enable_forwarding(),
    "installed": podnet.installed_routes(), "on_link": [str(n) for n in podnet.on_link_networks()],
}))
"""


def in_netns(ns: NetNS, *argv: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns.name, *argv], check=True, capture_output=True, text=True, timeout=60
    ).stdout


def apply(ns: NetNS, **request: object) -> dict[str, object]:
    result = json.loads(in_netns(ns, sys.executable, "-c", _APPLY, json.dumps(request)))
    assert isinstance(result, dict)
    return result


def nat_rules(ns: NetNS) -> list[str]:
    return in_netns(ns, "iptables", "-w", "-t", "nat", "-S").splitlines()


def test_routes_rules_and_forwarding_in_a_node_namespace(netns: NetNS) -> None:
    gateway = netns.host_ip  # an on-link next hop, standing in for another node
    # Someone else's route to a pod-like range: kubeplane must leave it alone.
    in_netns(netns, "ip", "route", "add", "10.244.7.0/24", "via", gateway)
    route = {"cidr": "10.244.1.0/24", "via": gateway, "node": "n2"}
    rules = cni.masquerade_rules(pod_cidr="10.244.0.0/24", cluster_pod_subnets=["10.244.0.0/16"])

    first = apply(netns, routes=[route], masquerade=rules)
    assert first["changed"] == ["10.244.1.0/24"] and first["removed"] == []
    assert first["installed"] == {"10.244.1.0/24": gateway}
    assert first["forwarding"] is True  # a new namespace starts with forwarding off
    assert str(first["on_link"]) == str([f"{netns.node_ip.rsplit('.', 1)[0]}.0/30"])
    shown = in_netns(netns, "ip", "route", "show", "proto", str(cni.ROUTE_PROTO))
    assert shown.startswith(f"10.244.1.0/24 via {gateway}")
    assert "-A KUBEPLANE-POD-MASQ -j MASQUERADE --random-fully" in nat_rules(netns)

    # Re-applying changes nothing and keeps one jump and one copy of each rule.
    again = apply(netns, routes=[route], masquerade=rules)
    assert again["changed"] == [] and again["removed"] == [] and again["forwarding"] is False
    rules_now = nat_rules(netns)
    assert sum("-j KUBEPLANE-POD-MASQ" in line for line in rules_now) == 1
    assert sum("MASQUERADE --random-fully" in line for line in rules_now) == 1

    # A node gone: its route goes, the foreign route stays; then everything is removed.
    gone = apply(netns, routes=[], remove_masquerade=True)
    assert gone["removed"] == ["10.244.1.0/24"] and gone["installed"] == {}
    assert "10.244.7.0/24 via" in in_netns(netns, "ip", "route", "show")
    assert not any("KUBEPLANE-POD-MASQ" in line for line in nat_rules(netns))
