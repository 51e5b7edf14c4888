"""machine.network's bonds and VLANs, pure: the netlink requests that make them (pyroute2's
keyword arguments, exactly), the plan's order (bond, its slaves, then VLANs on it), the errors that
keep a bond or VLAN from being made (nothing changes then), the links kubeplane made that left the
config, and the errors naming a kernel feature the node lacks."""

from __future__ import annotations

from typing import Any

import pytest

from kubeplane.config import models
from kubeplane.services import machinenet
from kubeplane.services.machinenet import ObservedLink

pytestmark = pytest.mark.unit

LO = ObservedLink(name="lo", index=1, mtu=65536, up=True, oper_state="UNKNOWN")
ETH0 = ObservedLink(name="eth0", index=2, mtu=1500, up=True, oper_state="UP")
ETH1 = ObservedLink(name="eth1", index=3, mtu=1500, up=True, oper_state="UP")
ETH2 = ObservedLink(name="eth2", index=4, mtu=1500, up=False, oper_state="DOWN")
# The guide's bonding example, addressed statically (DHCP is not implemented).
GUIDE_BOND = {
    "interface": "bond0",
    "cidr": "192.168.10.2/24",
    "bond": {
        "mode": "802.3ad",
        "lacpRate": "fast",
        "xmitHashPolicy": "layer3+4",
        "miimon": 100,
        "updelay": 200,
        "downdelay": 200,
        "interfaces": ["eth1", "eth2"],
    },
}


def network(*interfaces: dict[str, Any]) -> models.MachineNetwork:
    return models.MachineNetwork.model_validate({"interfaces": list(interfaces)})


def node(*links: ObservedLink) -> machinenet.Observed:
    return machinenet.Observed(links={link.name: link for link in (LO, ETH0, ETH1, ETH2, *links)})


def test_the_guide_bond_is_made_with_its_options_then_its_slaves_are_enslaved_and_it_comes_up() -> None:
    wanted = machinenet.desired(network(GUIDE_BOND))
    assert wanted.errors == () and wanted.unsupported == ()
    (bond,) = wanted.bonds
    assert bond == machinenet.Bond(
        name="bond0",
        slaves=("eth1", "eth2"),
        options=(
            ("bond_mode", 4),
            ("bond_xmit_hash_policy", 1),
            ("bond_ad_lacp_rate", 1),
            ("bond_miimon", 100),
            ("bond_updelay", 200),
            ("bond_downdelay", 200),
        ),
        primary=None,
        field="machine.network.interfaces[0].bond",
    )
    plan = machinenet.plan(wanted, node())
    assert plan.errors == ()
    assert plan.create_bonds == (bond,) and plan.create_vlans == ()
    assert plan.enslave == (("eth1", "bond0"), ("eth2", "bond0"))
    assert plan.set_up == ("bond0",)
    assert [(a.link, a.cidr) for a in plan.add_addresses] == [("bond0", "192.168.10.2/24")]
    assert plan.new_kinds == {"bond"}

    # The requests, with the indexes apply() knows by then (bond0 made as index 9).
    index = {"eth1": 3, "eth2": 4, "bond0": 9}
    assert machinenet.bond_request(bond, index) == {
        "ifname": "bond0",
        "kind": "bond",
        "bond_mode": 4,
        "bond_xmit_hash_policy": 1,
        "bond_ad_lacp_rate": 1,
        "bond_miimon": 100,
        "bond_updelay": 200,
        "bond_downdelay": 200,
    }
    assert machinenet.enslave_requests(3, 9) == [{"index": 3, "state": "down"}, {"index": 3, "master": 9}]
    assert machinenet.alias_request(9) == {"index": 9, "ifalias": machinenet.LINK_ALIAS}


def test_every_bond_option_is_rendered_with_the_kernel_numbers() -> None:
    wanted = machinenet.desired(
        network(
            {
                "interface": "bond1",
                "bond": {
                    "interfaces": ["eth1", "eth2"],
                    "mode": "active-backup",
                    "primary": "eth2",
                    "primaryReselect": "failure",
                    "failOverMac": "active",
                    "arpIPTarget": ["10.0.0.1", "10.0.0.2"],
                    "arpInterval": 1000,
                    "arpValidate": "filter_backup",
                    "arpAllTargets": "all",
                    "adSelect": "count",
                    "adActorSystem": "02:00:00:00:00:01",
                    "adActorSysPrio": 100,
                    "adUserPortKey": 7,
                    "useCarrier": False,
                    "resendIgmp": 2,
                    "minLinks": 1,
                    "lpInterval": 3,
                    "packetsPerSlave": 4,
                    "numPeerNotif": 5,
                    "tlbDynamicLb": 1,
                    "allSlavesActive": 1,
                },
            }
        )
    )
    assert wanted.errors == () and wanted.unsupported == ()
    (bond,) = wanted.bonds
    assert machinenet.bond_request(bond, {"eth1": 3, "eth2": 4}) == {
        "ifname": "bond1",
        "kind": "bond",
        "bond_mode": 1,
        "bond_primary": 4,  # the slave's index, as IFLA_BOND_PRIMARY takes it
        "bond_primary_reselect": 2,
        "bond_fail_over_mac": 1,
        "bond_arp_ip_target": ("10.0.0.1", "10.0.0.2"),
        "bond_arp_interval": 1000,
        "bond_arp_validate": 6,
        "bond_arp_all_targets": 1,
        "bond_ad_select": 2,
        "bond_ad_actor_system": bytes.fromhex("020000000001"),
        "bond_ad_actor_sys_prio": 100,
        "bond_ad_user_port_key": 7,
        "bond_use_carrier": 0,
        "bond_resend_igmp": 2,
        "bond_min_links": 1,
        "bond_lp_interval": 3,
        "bond_packets_per_slave": 4,
        "bond_num_peer_notif": 5,
        "bond_tlb_dynamic_lb": 1,
        "bond_all_slaves_active": 1,
    }


def test_the_guide_vlan_is_a_link_named_parent_dot_id_with_its_own_address_and_route() -> None:
    wanted = machinenet.desired(
        network(
            {
                "interface": "eth0",
                "dhcp": False,
                "vlans": [
                    {
                        "vlanId": 100,
                        "cidr": "192.168.2.10/28",
                        "mtu": 1400,
                        "routes": [{"network": "0.0.0.0/0", "gateway": "192.168.2.1"}],
                    }
                ],
            }
        )
    )
    assert wanted.errors == () and wanted.unsupported == ()
    (vlan,) = wanted.vlans
    assert vlan == machinenet.Vlan(
        name="eth0.100", parent="eth0", vlan_id=100, field="machine.network.interfaces[0].vlans[0]"
    )
    assert [(link.name, link.mtu) for link in wanted.links] == [("eth0", None), ("eth0.100", 1400)]
    plan = machinenet.plan(wanted, node())
    assert plan.errors == ()
    assert plan.create_bonds == () and plan.enslave == () and plan.create_vlans == (vlan,)
    assert plan.set_mtu == (("eth0.100", 1400),) and plan.set_up == ("eth0.100",)
    assert [(a.link, a.cidr, a.field) for a in plan.add_addresses] == [
        ("eth0.100", "192.168.2.10/28", "machine.network.interfaces[0].vlans[0].cidr")
    ]
    assert [(r.link, r.network, r.gateway, r.field) for r in plan.replace_routes] == [
        ("eth0.100", "0.0.0.0/0", "192.168.2.1", "machine.network.interfaces[0].vlans[0].routes[0]")
    ]
    assert machinenet.vlan_request(vlan, {"eth0": 2}) == {
        "ifname": "eth0.100",
        "kind": "vlan",
        "link": 2,
        "vlan_id": 100,
    }
    assert plan.new_kinds == {"vlan"}


def test_a_vlan_on_a_bond_is_made_after_the_bond_and_its_slaves() -> None:
    wanted = machinenet.desired(network({**GUIDE_BOND, "vlans": [{"vlanId": 42, "cidr": "10.42.0.2/24"}]}))
    plan = machinenet.plan(wanted, node())
    assert plan.errors == ()
    assert [b.name for b in plan.create_bonds] == ["bond0"]
    assert plan.enslave == (("eth1", "bond0"), ("eth2", "bond0"))
    (vlan,) = plan.create_vlans
    # The bond's index is known once apply() made it: the VLAN's link is the bond.
    assert machinenet.vlan_request(vlan, {"bond0": 9}) == {
        "ifname": "bond0.42",
        "kind": "vlan",
        "link": 9,
        "vlan_id": 42,
    }
    assert plan.set_up == ("bond0", "bond0.42")
    assert plan.new_kinds == {"bond", "vlan"}


def test_links_that_exist_already_are_used_and_only_the_missing_slave_is_enslaved() -> None:
    bond0 = ObservedLink("bond0", 9, 1500, True, "UP", kind="bond", alias=machinenet.LINK_ALIAS)
    vlan = ObservedLink("bond0.42", 10, 1500, True, "UP", kind="vlan", parent="bond0", vlan_id=42)
    enslaved = ObservedLink("eth1", 3, 1500, True, "UP", master="bond0")
    wanted = machinenet.desired(network({**GUIDE_BOND, "vlans": [{"vlanId": 42}]}))
    plan = machinenet.plan(wanted, node(bond0, vlan, enslaved))
    assert plan.errors == ()
    assert plan.create_bonds == () and plan.create_vlans == () and plan.delete_links == ()
    assert plan.enslave == (("eth2", "bond0"),)
    assert plan.new_kinds == frozenset()


def test_what_keeps_a_bond_or_vlan_from_being_made_is_an_error_and_nothing_changes() -> None:
    wanted = machinenet.desired(
        network(
            {"interface": "bond0", "bond": {"interfaces": ["eth1", "eth7"]}},
            {"interface": "bond1", "bond": {"interfaces": ["eth2"]}},
            {"interface": "eth0", "vlans": [{"vlanId": 5}, {"vlanId": 6}]},
        )
    )
    taken = ObservedLink("eth2", 4, 1500, True, "UP", master="team0")
    not_a_bond = ObservedLink("bond1", 11, 1500, True, "UP", kind="veth")
    other_vlan = ObservedLink("eth0.5", 12, 1500, True, "UP", kind="vlan", parent="eth0", vlan_id=7)
    plan = machinenet.plan(wanted, node(taken, not_a_bond, other_vlan))
    assert plan.errors == (
        "machine.network.interfaces[0].bond.interfaces[1]: interface eth7 does not exist on this node",
        "machine.network.interfaces[1].bond: bond1 exists on this node and is not a bond (kind veth)",
        "machine.network.interfaces[1].bond.interfaces[0]: eth2 is a slave of team0 already",
        "machine.network.interfaces[2].vlans[0]: eth0.5 exists on this node and is not VLAN 5 on eth0 "
        "(kind vlan)",
    )
    assert plan.empty


def test_conflicts_within_the_config_are_errors() -> None:
    wanted = machinenet.desired(
        network(
            {"interface": "bond0", "bond": {"interfaces": ["eth1", "eth2"]}},
            {"interface": "bond1", "bond": {"interfaces": ["eth2"]}},
            {"interface": "eth1", "cidr": "10.1.0.2/24"},
            {"interface": "bond0", "bond": {"interfaces": ["eth0"]}},
            {"interface": "eth0", "vlans": [{"vlanId": 3, "dhcp": True}]},
            {"interface": "eth0", "vlans": [{"vlanId": 3}]},
        )
    )
    assert wanted.errors == (
        "machine.network.interfaces[1].bond.interfaces: eth2 is a slave of bond0 already",
        "machine.network.interfaces[3].bond: bond0 is a bond in machine.network.interfaces[0].bond already",
        "machine.network.interfaces[5].vlans[0]: VLAN eth0.3 is configured in "
        "machine.network.interfaces[4].vlans[0] already",
        "machine.network.interfaces[0].bond.interfaces: eth1 is a slave of bond0 and is configured as an "
        "interface in machine.network.interfaces[2] as well (configure the bond instead)",
    )
    assert wanted.unsupported == (
        "machine.network.interfaces[4].vlans[0].dhcp: " + machinenet._NOT_IMPLEMENTED["dhcp"],
    )


def test_links_kubeplane_made_go_when_they_leave_the_config_vlans_first_and_no_one_elses() -> None:
    ours = machinenet.LINK_ALIAS
    observed = node(
        ObservedLink("bond0", 9, 1500, True, "UP", kind="bond", alias=ours),
        ObservedLink("bond0.42", 10, 1500, True, "UP", kind="vlan", alias=ours, parent="bond0", vlan_id=42),
        ObservedLink("eth0.7", 11, 1500, True, "UP", kind="vlan", alias=ours, parent="eth0", vlan_id=7),
        ObservedLink("bond9", 12, 1500, True, "UP", kind="bond"),  # someone else's
    )
    plan = machinenet.plan(
        machinenet.desired(network({"interface": "eth0", "vlans": [{"vlanId": 7}]})), observed
    )
    assert plan.errors == ()
    assert plan.delete_links == ("bond0.42", "bond0")
    assert not plan.empty


def test_a_missing_kernel_feature_is_an_error_per_link_naming_it() -> None:
    wanted = machinenet.desired(network({**GUIDE_BOND, "vlans": [{"vlanId": 42}]}))
    plan = machinenet.plan(wanted, node())
    assert machinenet.kernel_errors(plan, ["bond", "vlan"]) == (
        "machine.network.interfaces[0].bond: bond0: the kernel has no bonding driver (CONFIG_BONDING, "
        "module bonding); nothing of machine.network is applied",
        "machine.network.interfaces[0].vlans[0]: bond0.42: the kernel has no 802.1Q VLAN support "
        "(CONFIG_VLAN_8021Q, module 8021q); nothing of machine.network is applied",
    )
    assert machinenet.kernel_errors(plan, []) == ()
    # The probe asks for an invalid hardware address: a kernel with the kind refuses the address,
    # one without it refuses the kind, and neither makes a link.
    assert machinenet.probe_request("bond") == {
        "ifname": machinenet.PROBE_NAME,
        "kind": "bond",
        "address": "00:00:00:00:00:00",
    }
