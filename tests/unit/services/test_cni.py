"""The host-gw pod network's pure parts: Node fields, routes, conflist, masquerade rules."""

from __future__ import annotations

import ipaddress
import json

import pytest

from kubeplane.services import cni

pytestmark = pytest.mark.unit

ON_LINK = [ipaddress.IPv4Network("10.5.0.0/24")]


def node(name: str, cidr: str | None, ip: str | None) -> cni.NodeNet:
    return cni.NodeNet(name=name, pod_cidrs=(cidr,) if cidr else (), internal_ip=ip)


def test_node_net_reads_pod_cidrs_and_the_ipv4_internal_ip() -> None:
    obj = {
        "metadata": {"name": "n1"},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00::/64"]},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": "n1"},
                {"type": "InternalIP", "address": "fd00::5"},
                {"type": "InternalIP", "address": "10.5.0.3"},
            ]
        },
    }
    parsed = cni.node_net(obj)
    assert parsed == cni.NodeNet("n1", ("10.244.1.0/24", "fd00::/64"), "10.5.0.3")
    assert cni.ipv4_pod_cidr(parsed) == "10.244.1.0/24"
    assert cni.node_net({"metadata": {"name": "new"}}) == cni.NodeNet("new")
    assert cni.node_net({"spec": {"podCIDR": "10.244.2.0/24"}}).pod_cidrs == ("10.244.2.0/24",)


def test_routes_go_to_every_other_node_via_its_internal_ip() -> None:
    nodes = [
        node("c", "10.244.2.0/24", "10.5.0.4"),
        node("a", "10.244.0.0/24", "10.5.0.2"),
        node("b", "10.244.1.0/24", "10.5.0.3"),
    ]
    routes, skipped = cni.desired_routes("a", nodes, on_link=ON_LINK)
    assert routes == [
        cni.Route("10.244.1.0/24", "10.5.0.3", "b"),
        cni.Route("10.244.2.0/24", "10.5.0.4", "c"),
    ]
    assert skipped == []


def test_nodes_that_cannot_be_routed_are_reported_with_the_reason() -> None:
    nodes = [
        node("a", "10.244.0.0/24", "10.5.0.2"),
        node("pending", None, "10.5.0.3"),
        node("noip", "10.244.3.0/24", None),
        node("far", "10.244.4.0/24", "192.168.9.9"),
        node("dup", "10.244.0.0/24", "10.5.0.6"),
        node("other", "10.244.0.0/24", "10.5.0.7"),
    ]
    routes, skipped = cni.desired_routes("me", nodes, on_link=ON_LINK)
    assert routes == [cni.Route("10.244.0.0/24", "10.5.0.2", "a")]
    reasons = dict(skipped)
    assert set(reasons) == {"pending", "noip", "far", "dup", "other"}
    assert "no IPv4 pod CIDR" in reasons["pending"]
    assert "no IPv4 InternalIP" in reasons["noip"]
    assert "192.168.9.9" in reasons["far"] and "L2" in reasons["far"]
    assert "already routed" in reasons["dup"]


def test_conflist_bridges_pods_over_the_node_cidr_without_masquerading() -> None:
    document = json.loads(cni.render_conflist(pod_cidr="10.244.2.0/24"))
    bridge, portmap = document["plugins"]
    assert bridge["type"] == "bridge" and bridge["isGateway"] is True
    # The bridge plugin's masquerade would rewrite pod-to-pod traffic to other nodes.
    assert bridge["ipMasq"] is False
    assert bridge["ipam"] == {
        "type": "host-local",
        "ranges": [[{"subnet": "10.244.2.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    }
    assert portmap["type"] == "portmap"


def test_masquerade_keeps_pod_to_pod_sources_and_hides_the_rest() -> None:
    rules = cni.masquerade_rules(pod_cidr="10.244.2.0/24", cluster_pod_subnets=["10.244.0.0/16", "fd00::/48"])
    lines = rules.splitlines()
    chain = cni.MASQUERADE_CHAIN
    assert lines[0] == "*nat" and lines[-1] == "COMMIT"
    assert f":{chain} - [0:0]" in lines  # declaring the chain empties it: a rewrite, not an append
    assert lines[2:5] == [
        f"-A {chain} ! -s 10.244.2.0/24 -j RETURN",
        f"-A {chain} -d 10.244.0.0/16 -j RETURN",
        f"-A {chain} -j MASQUERADE --random-fully",
    ]
    assert "fd00" not in rules
    assert cni.masquerade_jump()[0] == "POSTROUTING" and cni.masquerade_jump()[-1] == chain
