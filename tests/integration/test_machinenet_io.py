"""machine.network's netlink I/O for real, in a namespace of the test's own: addresses, routes and
the MTU are applied; a change that drops an address and a route removes exactly those (marked with
kubeplane's protocol), while the namespace's own address, its default route, an address and a
route someone else added stay; a missing interface changes nothing. The fixture deletes the
namespace even when an assertion fails."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from kubeplane.services import machinenet

if TYPE_CHECKING:
    from conftest import NetNS

pytestmark = pytest.mark.integration

# Runs inside the namespace: desired state from argv[1] (machine.network as JSON), planned against
# netlink and applied; prints the plan's errors and what netlink shows afterwards.
_APPLY = """
import json, sys
from kubeplane.config import models
from kubeplane.services import machinenet, machinenet_io
wanted = machinenet.desired(models.MachineNetwork.model_validate(json.loads(sys.argv[1])))
observed = machinenet_io.observe()
plan = machinenet.plan(wanted, observed)
if not plan.errors:
    machinenet_io.apply(plan, observed)
after = machinenet_io.observe()
print(json.dumps({
    "errors": list(plan.errors),
    "links": {name: link.mtu for name, link in after.links.items()},
    "addresses": sorted(
        [a.link, a.cidr, a.owned] for a in after.addresses if ":" not in a.cidr and a.link != "lo"
    ),
    "routes": sorted(
        [r.network, r.metric, r.gateway, r.owned] for r in after.routes if ":" not in r.network
    ),
}))
"""


def in_netns(ns: NetNS, *argv: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns.name, *argv], check=True, capture_output=True, text=True, timeout=60
    ).stdout


def apply(ns: NetNS, network: dict[str, Any]) -> dict[str, Any]:
    result = json.loads(in_netns(ns, sys.executable, "-c", _APPLY, json.dumps(network)))
    assert isinstance(result, dict)
    return result


def test_addresses_and_routes_are_applied_and_only_the_removed_ones_go(netns: NetNS) -> None:
    link = in_netns(netns, "ip", "-o", "link", "show").split("\n")[1].split(":")[1].strip().split("@")[0]
    # Someone else's address and route on the same link: never kubeplane's to remove.
    in_netns(netns, "ip", "addr", "add", "192.168.77.1/24", "dev", link)
    in_netns(netns, "ip", "route", "add", "10.88.0.0/16", "via", netns.host_ip)
    primary = [link, f"{netns.node_ip}/30", False]
    full = {
        "interfaces": [
            {
                "interface": link,
                "cidr": "192.168.50.2/24",
                "addresses": ["192.168.51.2/24"],
                "mtu": 1400,
                "routes": [
                    {"network": "10.77.0.0/16", "gateway": "192.168.50.1", "metric": 50},
                    {"network": "0.0.0.0/0", "gateway": netns.host_ip},
                ],
            }
        ]
    }

    first = apply(netns, full)
    assert first["errors"] == []
    assert first["links"][link] == 1400
    assert first["addresses"] == sorted(
        [
            primary,
            [link, "192.168.50.2/24", True],
            [link, "192.168.51.2/24", True],
            [link, "192.168.77.1/24", False],
        ]
    )
    ours = [r for r in first["routes"] if r[3]]
    assert ours == [
        ["0.0.0.0/0", machinenet.DEFAULT_METRIC, netns.host_ip, True],
        ["10.77.0.0/16", 50, "192.168.50.1", True],
    ]
    shown = in_netns(netns, "ip", "route", "show", "proto", str(machinenet.PROTO))
    assert "10.77.0.0/16 via 192.168.50.1" in shown and f"default via {netns.host_ip}" in shown
    assert apply(netns, full) == first  # applying again changes nothing

    # The extra address and the 10.77 route leave the config: exactly they go.
    smaller = {
        "interfaces": [
            {
                "interface": link,
                "cidr": "192.168.50.2/24",
                "mtu": 1400,
                "routes": [{"network": "0.0.0.0/0", "gateway": netns.host_ip}],
            }
        ]
    }
    second = apply(netns, smaller)
    assert second["errors"] == []
    assert [link, "192.168.51.2/24", True] not in second["addresses"]
    assert second["addresses"] == sorted(
        [primary, [link, "192.168.50.2/24", True], [link, "192.168.77.1/24", False]]
    )
    assert ["10.77.0.0/16", 50, "192.168.50.1", True] not in second["routes"]
    assert ["10.88.0.0/16", 0, netns.host_ip, False] in second["routes"]
    assert ["0.0.0.0/0", 0, netns.host_ip, False] in second["routes"]  # the fixture's default route

    # A missing interface: nothing changes, not even the removal of what left the config.
    broken = apply(netns, {"interfaces": [{"interface": "eth9", "cidr": "10.9.9.9/24"}]})
    assert broken["errors"] == [
        "machine.network.interfaces[0].interface: interface eth9 does not exist on this node"
    ]
    assert broken["addresses"] == second["addresses"] and broken["routes"] == second["routes"]

    # Nothing configured: every address and route of kubeplane's goes, nobody else's.
    empty = apply(netns, {})
    assert empty["addresses"] == sorted([primary, [link, "192.168.77.1/24", False]])
    assert not any(route[3] for route in empty["routes"])
    assert ["10.88.0.0/16", 0, netns.host_ip, False] in empty["routes"]
