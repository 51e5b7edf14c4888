"""machine.network, pure: what the config asks for, and the plan from what the node shows to it
(only kubeplane's own addresses and routes are ever removed; nothing changes when any of it
cannot be done), plus the resolv.conf and hosts renderings."""

from __future__ import annotations

from typing import Any

import pytest

from kubeplane.config import models
from kubeplane.services import machinenet
from kubeplane.services.machinenet import ObservedAddress, ObservedLink, ObservedRoute

pytestmark = pytest.mark.unit

ETH0 = ObservedLink(name="eth0", index=2, mtu=1500, up=True, oper_state="UP")
LO = ObservedLink(name="lo", index=1, mtu=65536, up=True, oper_state="UNKNOWN")
# What the provisioner left: the primary address and a metric-0 default route.
PRIMARY = ObservedAddress(link="eth0", cidr="10.5.0.3/24", owned=False)
PROVISIONED_DEFAULT = ObservedRoute(
    network="0.0.0.0/0", metric=0, gateway="10.5.0.1", link="eth0", owned=False
)


def network(**fields: Any) -> models.MachineNetwork:
    return models.MachineNetwork.model_validate(fields)


def node(*addresses: ObservedAddress, routes: tuple[ObservedRoute, ...] = ()) -> machinenet.Observed:
    return machinenet.Observed(
        links={"lo": LO, "eth0": ETH0}, addresses=(PRIMARY, *addresses), routes=(PROVISIONED_DEFAULT, *routes)
    )


def test_the_guide_static_addressing_example_becomes_links_addresses_routes_and_files() -> None:
    wanted = machinenet.desired(
        network(
            hostname="talos",
            nameservers=["10.0.0.1"],
            interfaces=[
                {
                    "interface": "eth0",
                    "cidr": "10.0.0.201/8",
                    "mtu": 8765,
                    "routes": [{"network": "0.0.0.0/0", "gateway": "10.0.0.1"}],
                },
                {"interface": "eth1", "ignore": True},
            ],
            extraHostEntries=[{"ip": "192.168.1.100", "aliases": ["example", "example.domain.tld"]}],
        )
    )
    assert wanted.hostname == "talos" and wanted.nameservers == ("10.0.0.1",)
    assert wanted.links == (machinenet.Link(name="eth0", mtu=8765, field="machine.network.interfaces[0]"),)
    assert wanted.addresses == (
        machinenet.Address(link="eth0", cidr="10.0.0.201/8", field="machine.network.interfaces[0].cidr"),
    )
    # No metric: the original's default route metric, never the provisioner's metric 0.
    assert wanted.routes == (
        machinenet.Route(
            link="eth0",
            network="0.0.0.0/0",
            gateway="10.0.0.1",
            metric=machinenet.DEFAULT_METRIC,
            field="machine.network.interfaces[0].routes[0]",
        ),
    )
    assert wanted.hosts == (("192.168.1.100", ("example", "example.domain.tld")),)
    assert wanted.errors == () and wanted.unsupported == ()


def test_entries_with_one_interface_name_merge_and_addresses_add_to_cidr() -> None:
    wanted = machinenet.desired(
        network(
            interfaces=[
                {"interface": "lo", "cidr": "192.168.0.21/24"},
                {"interface": "lo", "cidr": "10.2.2.2/24", "addresses": ["10.3.3.3/32", "192.168.0.21/24"]},
            ]
        )
    )
    assert [link.name for link in wanted.links] == ["lo"]
    assert [(a.cidr, a.field) for a in wanted.addresses] == [
        ("192.168.0.21/24", "machine.network.interfaces[0].cidr"),
        ("10.2.2.2/24", "machine.network.interfaces[1].cidr"),
        ("10.3.3.3/32", "machine.network.interfaces[1].addresses[0]"),
    ]


def test_unimplemented_fields_are_reported_and_conflicts_are_errors() -> None:
    wanted = machinenet.desired(
        network(
            interfaces=[
                {"interface": "eth0", "mtu": 1400, "dhcp": True},
                {"interface": "eth0", "mtu": 9000},
                {"interface": "bond0", "bond": {"interfaces": ["eth1"], "peerNotifyDelay": 100}},
                {"interface": "eth0", "routes": [{"network": "10.9.0.0/16", "gateway": "10.5.0.1"}]},
                {"interface": "eth0", "routes": [{"network": "10.9.0.0/16", "gateway": "10.5.0.9"}]},
            ]
        )
    )
    assert wanted.unsupported == (
        "machine.network.interfaces[0].dhcp: " + machinenet._NOT_IMPLEMENTED["dhcp"],
        "machine.network.interfaces[2].bond.peerNotifyDelay: not applied: pyroute2, kubeplane's netlink "
        "library, has no attribute for it",
    )
    assert wanted.errors == (
        "machine.network.interfaces[1].mtu: eth0 has mtu 1400 in machine.network.interfaces[0] already",
        "machine.network.interfaces[4].routes[0]: a route to 10.9.0.0/16 with metric 1024 is configured in "
        "machine.network.interfaces[3].routes[0] already (give one of them another metric)",
    )


def test_a_new_address_route_and_mtu_are_planned_and_the_primary_address_is_left_alone() -> None:
    wanted = machinenet.desired(
        network(
            interfaces=[
                {
                    "interface": "eth0",
                    "cidr": "10.5.0.200/24",
                    "mtu": 1400,
                    "routes": [{"network": "10.77.0.0/16", "gateway": "10.5.0.1", "metric": 50}],
                }
            ]
        )
    )
    plan = machinenet.plan(wanted, node())
    assert plan.errors == () and plan.remove_addresses == () and plan.remove_routes == ()
    assert plan.set_mtu == (("eth0", 1400),) and plan.set_up == ()
    assert [a.cidr for a in plan.add_addresses] == ["10.5.0.200/24"]
    assert [(r.network, r.gateway, r.metric) for r in plan.replace_routes] == [
        ("10.77.0.0/16", "10.5.0.1", 50)
    ]

    # Once applied, the same config plans nothing.
    applied = node(
        ObservedAddress(link="eth0", cidr="10.5.0.200/24", owned=True),
        routes=(
            ObservedRoute(network="10.77.0.0/16", metric=50, gateway="10.5.0.1", link="eth0", owned=True),
        ),
    )
    applied = machinenet.Observed(
        links={"lo": LO, "eth0": ObservedLink("eth0", 2, 1400, True, "UP")},
        addresses=applied.addresses,
        routes=applied.routes,
    )
    assert machinenet.plan(wanted, applied).empty


def test_only_kubeplanes_own_addresses_and_routes_are_removed() -> None:
    someone_elses = ObservedAddress(link="eth0", cidr="10.5.0.50/24", owned=False)
    ours = ObservedAddress(link="eth0", cidr="10.5.0.200/24", owned=True)
    our_route = ObservedRoute(network="10.77.0.0/16", metric=50, gateway="10.5.0.1", link="eth0", owned=True)
    pod_route = ObservedRoute(network="10.244.1.0/24", metric=0, gateway="10.5.0.2", link="eth0", owned=False)
    plan = machinenet.plan(machinenet.desired(None), node(someone_elses, ours, routes=(our_route, pod_route)))
    assert plan.remove_addresses == (ours,)
    assert plan.remove_routes == (our_route,)
    assert plan.add_addresses == () and plan.replace_routes == () and plan.set_mtu == ()


def test_an_address_already_there_is_adopted_not_owned_so_never_removed() -> None:
    wanted = machinenet.desired(network(interfaces=[{"interface": "eth0", "cidr": "10.5.0.3/24"}]))
    assert machinenet.plan(wanted, node()).empty  # the primary address is already there
    # Removing it from the config later removes nothing: it is not kubeplane's.
    assert machinenet.plan(machinenet.desired(network()), node()).empty


def test_an_ignored_interface_loses_what_kubeplane_added_there() -> None:
    ours = ObservedAddress(link="eth0", cidr="10.5.0.200/24", owned=True)
    wanted = machinenet.desired(
        network(interfaces=[{"interface": "eth0", "cidr": "10.5.0.200/24", "ignore": True}])
    )
    assert machinenet.plan(wanted, node(ours)).remove_addresses == (ours,)


def test_a_moved_route_of_ours_is_replaced_and_a_link_down_is_brought_up() -> None:
    ours = ObservedRoute(network="10.77.0.0/16", metric=50, gateway="10.5.0.1", link="eth0", owned=True)
    wanted = machinenet.desired(
        network(
            interfaces=[
                {
                    "interface": "eth0",
                    "routes": [{"network": "10.77.0.0/16", "gateway": "10.5.0.9", "metric": 50}],
                }
            ]
        )
    )
    observed = node(routes=(ours,))
    observed = machinenet.Observed(
        links={"eth0": ObservedLink("eth0", 2, 1500, False, "DOWN")},
        addresses=observed.addresses,
        routes=observed.routes,
    )
    plan = machinenet.plan(wanted, observed)
    assert [r.gateway for r in plan.replace_routes] == ["10.5.0.9"]
    assert plan.remove_routes == () and plan.set_up == ("eth0",)


def test_a_missing_interface_names_its_field_and_nothing_at_all_changes() -> None:
    ours = ObservedAddress(link="eth0", cidr="10.5.0.200/24", owned=True)
    wanted = machinenet.desired(
        network(
            interfaces=[
                {"interface": "eth0", "cidr": "10.5.0.201/24", "mtu": 1400},
                {"interface": "eth9", "cidr": "192.168.9.2/24"},
            ]
        )
    )
    plan = machinenet.plan(wanted, node(ours))
    assert plan.errors == (
        "machine.network.interfaces[1].interface: interface eth9 does not exist on this node",
    )
    assert plan.empty  # not even eth0's changes, nor the removal of the address no longer configured


def test_a_gateway_off_the_interface_networks_or_a_route_held_by_someone_else_is_refused() -> None:
    wanted = machinenet.desired(
        network(
            interfaces=[
                {
                    "interface": "eth0",
                    "routes": [
                        {"network": "10.9.0.0/16", "gateway": "192.168.50.1"},
                        {"network": "0.0.0.0/0", "gateway": "10.5.0.254", "metric": 0},
                        {"network": "0.0.0.0/0", "gateway": "10.5.0.1", "metric": 100},
                    ],
                }
            ]
        )
    )
    plan = machinenet.plan(wanted, node())
    assert plan.empty
    assert plan.errors == (
        "machine.network.interfaces[0].routes[0].gateway: 192.168.50.1 is not on a network of eth0 "
        "(give the interface an address in the gateway's network)",
        "machine.network.interfaces[0].routes[1]: the node already has a route to 0.0.0.0/0 with metric 0 "
        "(via 10.5.0.1) that kubeplane did not install (give this one another metric)",
    )
    # The same route as the provisioner's is fine: there already, and it stays someone else's.
    same = machinenet.desired(
        network(
            interfaces=[
                {
                    "interface": "eth0",
                    "routes": [{"network": "0.0.0.0/0", "gateway": "10.5.0.1", "metric": 0}],
                }
            ]
        )
    )
    assert machinenet.plan(same, node()).empty


def test_a_gateway_on_an_address_configured_in_the_same_change_is_fine() -> None:
    wanted = machinenet.desired(
        network(
            interfaces=[
                {
                    "interface": "eth0",
                    "cidr": "192.168.50.2/24",
                    "routes": [{"network": "10.9.0.0/16", "gateway": "192.168.50.1"}],
                }
            ]
        )
    )
    plan = machinenet.plan(wanted, node())
    assert plan.errors == () and len(plan.add_addresses) == 1 and len(plan.replace_routes) == 1


def test_resolv_conf_is_marked_as_kubeplanes() -> None:
    text = machinenet.render_resolv_conf(["10.5.0.1", "192.0.2.53"])
    assert text.splitlines()[1:] == ["nameserver 10.5.0.1", "nameserver 192.0.2.53"]
    assert machinenet.is_ours(text) and not machinenet.is_ours("nameserver 10.255.255.53\n")


def test_hosts_block_is_added_replaced_and_removed_keeping_every_other_line() -> None:
    original = "127.0.0.1 localhost\n::1 localhost ip6-localhost"  # no final newline
    once = machinenet.render_hosts(original, [("10.5.0.200", ["extra", "extra.example"]), ("10.5.0.201", [])])
    assert once == (
        "127.0.0.1 localhost\n::1 localhost ip6-localhost\n"
        f"{machinenet.HOSTS_BEGIN}\n10.5.0.200 extra extra.example\n10.5.0.201\n{machinenet.HOSTS_END}\n"
    )
    twice = machinenet.render_hosts(once + "192.0.2.1 added-later\n", [("10.5.0.9", ["nine"])])
    assert twice == (
        "127.0.0.1 localhost\n::1 localhost ip6-localhost\n192.0.2.1 added-later\n"
        f"{machinenet.HOSTS_BEGIN}\n10.5.0.9 nine\n{machinenet.HOSTS_END}\n"
    )
    assert machinenet.render_hosts(twice, []) == (
        "127.0.0.1 localhost\n::1 localhost ip6-localhost\n192.0.2.1 added-later\n"
    )
    assert machinenet.render_hosts(original, []) == original  # nothing of ours: unchanged
