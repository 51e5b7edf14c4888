"""Cluster network naming, address reservation and host conflict detection (no kernel calls);
the host routes lock."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from kubeplane.provision import netns

pytestmark = pytest.mark.unit


def test_names_fit_ifnamsiz_and_are_deterministic() -> None:
    longest = "a" * netns.MAX_CLUSTER_NAME
    assert netns.bridge_name(longest) == f"kp-{longest}"
    assert len(netns.bridge_name(longest)) == netns.IFNAMSIZ
    veth = netns.veth_name(longest, 999)
    assert len(veth) <= netns.IFNAMSIZ
    assert veth == netns.veth_name(longest, 999)
    assert netns.veth_name("one", 1) != netns.veth_name("two", 1)
    assert netns.veth_name("one", 1) != netns.veth_name("one", 2)
    assert netns.netns_name("c1", "controlplane-1") == "kp-c1-controlplane-1"


def test_too_long_cluster_name_names_the_constraint() -> None:
    with pytest.raises(netns.InvalidName, match=r"IFNAMSIZ") as info:
        netns.plan("a" * (netns.MAX_CLUSTER_NAME + 1), ["n1"])
    assert "at most 12" in str(info.value)


@pytest.mark.parametrize("name", ["", "Upper", "-lead", "trail-", "under_score", "dot.ted"])
def test_invalid_cluster_names_are_refused(name: str) -> None:
    with pytest.raises(netns.InvalidName, match="lowercase"):
        netns.validate_cluster_name(name)


def test_invalid_node_name_is_refused() -> None:
    with pytest.raises(netns.InvalidName, match="node name 'Bad_Node'"):
        netns.plan("c", ["Bad_Node"])


def test_plan_reserves_host_first_then_nodes_in_order() -> None:
    plan = netns.plan("demo", ["cp1", "cp2", "w1"])
    assert plan.host_ip == "10.5.0.1"
    assert plan.bridge == "kp-demo"
    assert [(n.name, n.index, n.ip) for n in plan.nodes] == [
        ("cp1", 1, "10.5.0.2"),
        ("cp2", 2, "10.5.0.3"),
        ("w1", 3, "10.5.0.4"),
    ]
    assert plan.nodes[0].netns == "kp-demo-cp1"
    assert plan.prefixlen == 24


def test_plan_uses_a_configured_cidr() -> None:
    plan = netns.plan("demo", ["a", "b"], cidr="192.168.77.16/28")
    assert plan.host_ip == "192.168.77.17"
    assert [n.ip for n in plan.nodes] == ["192.168.77.18", "192.168.77.19"]


@pytest.mark.parametrize(
    ("cidr", "message"),
    [
        ("10.5.0.1/24", "host bits set"),
        ("not-a-cidr", "invalid"),
        ("fd00::/64", "IPv6"),
        ("10.5.0.0/30", "2 usable addresses, but the host and 2 nodes need 3"),
    ],
)
def test_bad_cidrs_are_refused(cidr: str, message: str) -> None:
    with pytest.raises(netns.InvalidCIDR, match=message):
        netns.plan("demo", ["a", "b"], cidr=cidr)


def test_duplicate_node_names_are_refused() -> None:
    with pytest.raises(netns.InvalidName, match="unique"):
        netns.plan("demo", ["a", "a"])


def _fake_ip(addrs: list[dict[str, Any]], routes: list[dict[str, Any]]) -> Any:
    def fake(*args: str) -> list[dict[str, Any]]:
        return addrs if "addr" in args else routes

    return fake


def test_host_conflicts_flag_overlapping_addresses_and_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = netns.plan("demo", ["a"], cidr="10.5.0.0/24")
    addrs = [
        {"ifname": "eth0", "addr_info": [{"local": "192.0.2.2", "prefixlen": 24}]},
        {"ifname": "vpn0", "addr_info": [{"local": "10.5.0.77", "prefixlen": 32}]},
        # Our own bridge, when re-running create, is not a conflict.
        {"ifname": "kp-demo", "addr_info": [{"local": "10.5.0.1", "prefixlen": 24}]},
    ]
    routes = [
        {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
        {"dst": "10.0.0.0/8", "gateway": "192.0.2.9", "dev": "eth0"},
        {"dst": "10.5.0.0/24", "dev": "kp-demo"},
        {"type": "local", "dst": "10.5.0.77", "dev": "vpn0"},
        {"dst": "172.16.0.0/12", "dev": "eth0"},
    ]
    monkeypatch.setattr(netns, "_ip_json", _fake_ip(addrs, routes))
    assert netns.host_conflicts(plan.cidr, ignore_dev=plan.bridge) == [
        "address 10.5.0.77/32 on vpn0",
        "route 10.0.0.0/8 via 192.0.2.9",
    ]


def test_host_without_overlap_has_no_conflicts(monkeypatch: pytest.MonkeyPatch) -> None:
    addrs = [{"ifname": "eth0", "addr_info": [{"local": "192.0.2.2", "prefixlen": 24}]}]
    routes = [{"dst": "default", "gateway": "192.0.2.1"}, {"dst": "192.0.2.0/24", "dev": "eth0"}]
    monkeypatch.setattr(netns, "_ip_json", _fake_ip(addrs, routes))
    assert netns.host_conflicts(netns.plan("demo", ["a"]).cidr, ignore_dev="kp-demo") == []


def test_host_routes_lock_makes_a_second_create_wait_and_says_so(tmp_path: Path) -> None:
    lock = tmp_path / "run" / "host-routes.lock"
    told = threading.Event()
    acquired = threading.Event()

    def second() -> None:
        with netns.host_routes_lock(path=lock, waiting=told.set):
            acquired.set()

    with netns.host_routes_lock(path=lock, waiting=lambda: pytest.fail("the first holder never waits")):
        thread = threading.Thread(target=second)
        thread.start()
        assert told.wait(5), "the second holder said it waits"
        assert not acquired.wait(0.2), "it does not get the lock while the first holds it"
    thread.join(5)
    assert acquired.is_set(), "it gets the lock once the first lets go"
