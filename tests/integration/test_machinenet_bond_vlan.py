"""machine.network's bonds and VLANs against the real kernel, in a namespace of the test's own with
two veth pairs to bond. What the kernel can make is asked independently first (``ip link add type
bond``/``vlan`` in the namespace); the test then checks the branch that kernel takes:

- without the link kind, the plan is refused before anything changes, with an error naming the
  missing kernel feature; applying it regardless (skipping the check, as if the kernel lost the
  kind in between) fails with the same feature named, and leaves every link, address and route
  as it was: no bond, no VLAN, the slaves neither enslaved nor brought down;
- with it, the bond is made with its slaves and a VLAN on it, addressed, and both go again once
  they leave the config, the slaves released.

The fixture deletes the namespace, and with it every link made here, even when an assertion
fails."""

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

# Runs inside the namespace: machine.network from argv[1] is planned, the kernel asked for the
# link kinds, and the plan applied when that checks out, or with argv[2] == "force" regardless.
# Prints the errors, the forced apply's error, and the links and addresses afterwards.
_APPLY = """
import json, sys
from kubeplane.config import models
from kubeplane.services import machinenet, machinenet_io
wanted = machinenet.desired(models.MachineNetwork.model_validate(json.loads(sys.argv[1])))
observed = machinenet_io.observe()
plan = machinenet.plan(wanted, observed)
missing = sorted(kind for kind in plan.new_kinds if not machinenet_io.supports(kind))
errors = plan.errors or machinenet.kernel_errors(plan, missing)
forced = None
if not errors:
    machinenet_io.apply(plan, observed)
elif sys.argv[2] == "force" and not plan.errors:
    try:
        machinenet_io.apply(plan, observed)
    except machinenet_io.MachineNetworkError as exc:
        forced = str(exc)
after = machinenet_io.observe()
print(json.dumps({
    "errors": list(errors),
    "forced": forced,
    "links": {
        l.name: [l.kind, l.master, l.up, l.mtu, l.alias, l.parent, l.vlan_id] for l in after.links.values()
    },
    "addresses": sorted([a.link, a.cidr, a.owned] for a in after.addresses if ":" not in a.cidr),
    "routes": sorted([r.network, r.metric, r.gateway, r.owned] for r in after.routes),
}))
"""

BOND = {
    "interface": "bond0",
    "cidr": "192.168.60.2/24",
    "bond": {
        "mode": "active-backup",
        "miimon": 100,
        "updelay": 200,
        "downdelay": 200,
        "interfaces": ["kpa0", "kpb0"],
    },
    "vlans": [{"vlanId": 42, "cidr": "192.168.61.2/24"}],
}
BOND_ERROR = (
    "machine.network.interfaces[0].bond: bond0: the kernel has no bonding driver (CONFIG_BONDING, "
    "module bonding)"
)
VLAN_ERROR = (
    "machine.network.interfaces[0].vlans[0]: kpa0.7: the kernel has no 802.1Q VLAN support "
    "(CONFIG_VLAN_8021Q, module 8021q)"
)


def in_netns(ns: NetNS, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns.name, *argv], check=check, capture_output=True, text=True, timeout=60
    )


def apply(ns: NetNS, network: dict[str, Any], *, force: bool = False) -> dict[str, Any]:
    argv = [sys.executable, "-c", _APPLY, json.dumps(network), "force" if force else "check"]
    result = json.loads(in_netns(ns, *argv).stdout)
    assert isinstance(result, dict)
    return result


def node(result: dict[str, Any]) -> dict[str, Any]:
    """The links, addresses and routes of an :func:`apply` result."""
    return {key: result[key] for key in ("links", "addresses", "routes")}


def kernel_has(ns: NetNS, kind: str, *args: str) -> bool:
    """Whether ``ip link add`` makes a link of ``kind`` (deleted again at once)."""
    made = in_netns(ns, "ip", "link", "add", "kpkind", *args, "type", kind, *_KIND_ARGS[kind], check=False)
    if made.returncode == 0:
        in_netns(ns, "ip", "link", "del", "kpkind")
    return made.returncode == 0


_KIND_ARGS = {"bond": (), "vlan": ("id", "7")}


@pytest.fixture
def slaves(netns: NetNS) -> NetNS:
    """The namespace with veth pairs kpa0/kpa1 (kpa0 up, MTU 1400) and kpb0/kpb1 (kpb0 down)."""
    for name in ("kpa", "kpb"):
        in_netns(netns, "ip", "link", "add", f"{name}0", "type", "veth", "peer", "name", f"{name}1")
    in_netns(netns, "ip", "link", "set", "kpa0", "mtu", "1400", "up")
    return netns


def test_bonds_and_vlans_are_made_or_refused_naming_the_missing_kernel_feature(slaves: NetNS) -> None:
    before = apply(slaves, {})
    assert before["links"]["kpa0"] == ["veth", None, True, 1400, "", None, None]
    assert before["links"]["kpb0"] == ["veth", None, False, 1500, "", None, None]

    if not kernel_has(slaves, "bond"):
        refused = apply(slaves, {"interfaces": [BOND]})
        assert refused["errors"][0] == BOND_ERROR + "; nothing of machine.network is applied"
        assert refused["forced"] is None and node(refused) == node(before)
        assert machinenet.PROBE_NAME not in refused["links"]

        # Applied regardless: the kernel refuses the bond, and nothing is left half made.
        forced = apply(slaves, {"interfaces": [BOND]}, force=True)
        assert forced["forced"] == BOND_ERROR and node(forced) == node(before)
    else:
        made = apply(slaves, {"interfaces": [BOND]})
        assert made["errors"] == []
        ours = machinenet.LINK_ALIAS
        assert made["links"]["bond0"][:3] == ["bond", None, True]
        assert made["links"]["bond0"][4] == ours
        assert made["links"]["kpa0"][1] == "bond0" and made["links"]["kpb0"][1] == "bond0"
        has_vlan = kernel_has(slaves, "vlan", "link", "kpa1")
        if has_vlan:
            assert made["links"]["bond0.42"] == ["vlan", None, True, 1500, ours, "bond0", 42]
            assert ["bond0.42", "192.168.61.2/24", True] in made["addresses"]
        else:
            # The VLAN could not be made: neither was the bond, the slaves are as they were.
            assert made["errors"] == [
                "machine.network.interfaces[0].vlans[0]: bond0.42: the kernel has no 802.1Q VLAN "
                "support (CONFIG_VLAN_8021Q, module 8021q); nothing of machine.network is applied"
            ]
        gone = apply(slaves, {})
        assert "bond0" not in gone["links"] and "bond0.42" not in gone["links"]
        assert gone["links"]["kpa0"][1] is None and gone["links"]["kpb0"][1] is None

    vlan = {"interfaces": [{"interface": "kpa0", "vlans": [{"vlanId": 7, "cidr": "192.168.62.2/24"}]}]}
    if not kernel_has(slaves, "vlan", "link", "kpa1"):
        refused = apply(slaves, vlan)
        assert refused["errors"] == [VLAN_ERROR + "; nothing of machine.network is applied"]
        assert refused["forced"] is None and node(refused) == node(before)
        forced = apply(slaves, vlan, force=True)
        assert forced["forced"] == VLAN_ERROR and node(forced) == node(before)
    else:
        made = apply(slaves, vlan)
        assert made["errors"] == []
        assert made["links"]["kpa0.7"] == ["vlan", None, True, 1400, machinenet.LINK_ALIAS, "kpa0", 7]
        assert ["kpa0.7", "192.168.62.2/24", True] in made["addresses"]
        assert "kpa0.7" not in apply(slaves, {})["links"]
