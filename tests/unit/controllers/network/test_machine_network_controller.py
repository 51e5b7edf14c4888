"""MachineNetworkController against a simulated node (links, addresses, routes as netlink would
show them): it applies machine.network, publishes addresses/routes/links and the status, writes
the node's resolv.conf and hosts under its root, restores what it replaced, and changes nothing
when an interface is missing."""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from kubeplane import pki
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.network import machine_network
from kubeplane.resources import State, catalog
from kubeplane.services import machinenet, wireguard, wireguard_io
from kubeplane.services.machinenet import ObservedAddress, ObservedLink, ObservedRoute

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "k8s"))
from k8s_harness import eventually, publish_config, run

pytestmark = pytest.mark.unit

GENERATED = gen.generate(gen.GenOptions(cluster_name="test", endpoint="10.5.0.1"), gen.new_secrets())
PRIMARY = ObservedAddress(link="eth0", cidr="10.5.0.3/24", owned=False)


class SimulatedNode:
    """A node's links, addresses and routes; applying a plan changes them as the kernel would."""

    def __init__(self) -> None:
        self.observed = machinenet.Observed(
            links={"eth0": ObservedLink("eth0", 2, 1500, True, "UP")},
            addresses=(PRIMARY,),
            routes=(ObservedRoute("0.0.0.0/0", 0, "10.5.0.1", "eth0", owned=False),),
        )
        self.name = "worker-1"
        self.applied: list[machinenet.Plan] = []

    def observe(self) -> machinenet.Observed:
        return self.observed

    def apply(self, plan: machinenet.Plan, observed: machinenet.Observed) -> None:
        self.applied.append(plan)
        links = dict(observed.links)
        for name, mtu in plan.set_mtu:
            links[name] = dataclasses.replace(links[name], mtu=mtu)
        addresses = [a for a in observed.addresses if a not in plan.remove_addresses]
        addresses += [ObservedAddress(a.link, a.cidr, owned=True) for a in plan.add_addresses]
        routes = [r for r in observed.routes if r not in plan.remove_routes]
        replaced = {r.key for r in plan.replace_routes}
        routes = [r for r in routes if r.key not in replaced]
        routes += [
            ObservedRoute(r.network, r.metric, r.gateway, r.link, owned=True) for r in plan.replace_routes
        ]
        self.observed = machinenet.Observed(links=links, addresses=tuple(addresses), routes=tuple(routes))

    def hostname(self) -> str:
        return self.name

    def set_hostname(self, name: str) -> None:
        self.name = name


def config(network: dict[str, Any]) -> dict[str, Any]:
    document = copy.deepcopy(dict(GENERATED.documents["worker"]))
    document["machine"]["network"] = network
    return document


def specs(state: State, type_name: str) -> dict[str, dict[str, Any]]:
    return {r.id: r.spec.to_dict() for r in state.list(catalog.NETWORK_NAMESPACE, type_name)}


def status(state: State) -> dict[str, Any]:
    found = state.find(catalog.NETWORK_NAMESPACE, catalog.MACHINE_NETWORK_STATUSES, machine_network.STATUS_ID)
    return found.spec.to_dict() if found is not None else {}


def controller(tmp_path: Path, node: SimulatedNode) -> machine_network.MachineNetworkController:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/resolv.conf").write_text("nameserver 192.0.2.53\n")
    (tmp_path / "etc/hosts").write_text("127.0.0.1 localhost\n")
    return machine_network.MachineNetworkController(
        paths=NodePaths(tmp_path), network=node, retry_interval=0.05
    )


EXTRA = {
    "hostname": "worker-1",
    "nameservers": ["10.5.0.1"],
    "interfaces": [
        {
            "interface": "eth0",
            "cidr": "10.5.0.200/24",
            "mtu": 1400,
            "routes": [{"network": "10.77.0.0/16", "gateway": "10.5.0.1", "metric": 50}],
        }
    ],
    "extraHostEntries": [{"ip": "10.5.0.200", "aliases": ["extra"]}],
}


def test_machine_network_is_applied_published_and_undone(tmp_path: Path) -> None:
    node = SimulatedNode()
    paths = NodePaths(tmp_path)
    ctl = controller(tmp_path, node)

    async def body(state: State) -> None:
        publish_config(state, config(EXTRA))
        await eventually(lambda: specs(state, catalog.MACHINE_ROUTES), what="the route published")
        assert specs(state, catalog.MACHINE_ADDRESSES) == {
            "eth0/10.5.0.200/24": {
                "link": "eth0",
                "address": "10.5.0.200/24",
                "owned": True,
                "field": "machine.network.interfaces[0].cidr",
            }
        }
        assert specs(state, catalog.MACHINE_ROUTES)["eth0/10.77.0.0/16/50"]["owned"] is True
        assert specs(state, catalog.MACHINE_LINKS)["eth0"] == {
            "mtu": 1400,
            "up": True,
            "operState": "UP",
            "kind": "",
            "master": "",
            "parent": "",
            "vlanId": None,
            "configuredMtu": 1400,
            "field": "machine.network.interfaces[0]",
        }
        assert status(state) == {
            "hostname": "worker-1",
            "nameservers": ["10.5.0.1"],
            "extraHostEntries": ["10.5.0.200 extra"],
            "errors": [],
            "unsupported": [],
        }
        assert paths.resolv_conf.read_text() == machinenet.render_resolv_conf(["10.5.0.1"])
        assert paths.replaced_resolv_conf.read_text() == "nameserver 192.0.2.53\n"
        assert "10.5.0.200 extra\n" in paths.hosts.read_text()
        assert node.name == "worker-1"  # already the node's name: left as it was

        # The extra address, route, resolvers and host entries leave the config: all undone.
        publish_config(
            state, config({"hostname": "worker-2", "interfaces": [{"interface": "eth0", "mtu": 1400}]})
        )
        await eventually(lambda: not specs(state, catalog.MACHINE_ADDRESSES), what="the address unpublished")
        assert node.observed.addresses == (PRIMARY,)
        assert [r.network for r in node.observed.routes] == ["0.0.0.0/0"]
        assert specs(state, catalog.MACHINE_ROUTES) == {}
        assert paths.resolv_conf.read_text() == "nameserver 192.0.2.53\n"
        assert not paths.replaced_resolv_conf.exists()
        assert paths.hosts.read_text() == "127.0.0.1 localhost\n"
        assert node.name == "worker-2"

    run([ctl], body)


def test_a_missing_interface_is_an_error_naming_it_and_nothing_changes(tmp_path: Path) -> None:
    node = SimulatedNode()
    paths = NodePaths(tmp_path)
    ctl = controller(tmp_path, node)
    broken = copy.deepcopy(EXTRA)
    broken["interfaces"].append({"interface": "eth9", "cidr": "192.168.9.2/24", "dhcp": False})

    async def body(state: State) -> None:
        publish_config(state, config(broken))
        await eventually(lambda: status(state).get("errors"), what="the error")
        assert status(state)["errors"] == [
            "machine.network.interfaces[1].interface: interface eth9 does not exist on this node"
        ]
        assert node.applied == [] and node.observed.addresses == (PRIMARY,)
        assert paths.resolv_conf.read_text() == "nameserver 192.0.2.53\n"
        assert paths.hosts.read_text() == "127.0.0.1 localhost\n"
        assert specs(state, catalog.MACHINE_LINKS)["eth9"]["operState"] == "MISSING"

        publish_config(state, config(EXTRA))  # fixed: applied at once
        await eventually(lambda: specs(state, catalog.MACHINE_ADDRESSES), what="the address")
        assert status(state)["errors"] == []
        assert "eth9" not in specs(state, catalog.MACHINE_LINKS)

    run([ctl], body)


WG_PRIVATE = "DfNT3K6s8U3YhpFOBGj9VUIuxogjYAsRcQn4MBt5QEU="
WG_PEER = "8vy509p7j40ExyJLiWxeokxy8yJlYVfQOv80rAunEEE="
WG0 = {
    "interface": "wg0",
    "cidr": "10.1.0.3/24",
    "wireguard": {
        "privateKey": WG_PRIVATE,
        "peers": [
            {
                "publicKey": WG_PEER,
                "endpoint": "10.5.0.2:51111",
                "allowedIPs": ["10.1.0.2/32"],
                "persistentKeepaliveInterval": "5s",
            }
        ],
    },
}


class SimulatedWireguard(SimulatedNode):
    """A node whose WireGuard devices appear as links when their process starts (as wireguard-go's
    TUN does) and keep what they were configured with."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: dict[str, wireguard.Device] = {}
        self.missing_binary = False

    async def converge(self, names: Iterable[str]) -> list[str]:
        if self.missing_binary:
            raise wireguard_io.WireguardError("wireguard-go is not installed")
        wanted = set(names)
        links = {name: link for name, link in self.observed.links.items() if name in wanted or name == "eth0"}
        started = sorted(wanted - set(links))
        for index, name in enumerate(started, start=10):
            links[name] = ObservedLink(name, index, 1420, False, "DOWN")
        self.observed = dataclasses.replace(
            self.observed,
            links=links,
            addresses=tuple(a for a in self.observed.addresses if a.link in links),
        )
        return started

    def configure_wireguard(self, device: wireguard.Device) -> bool:
        changed = self.devices.get(device.name) != device
        self.devices[device.name] = device
        return changed

    def wireguard_state(self, name: str) -> wireguard.DeviceState:
        device = self.devices[name]
        return wireguard.DeviceState(
            private_key=device.private_key,
            listen_port=40000,
            firewall_mark=0,
            peers=tuple(
                wireguard.PeerState(
                    p.public_key, p.endpoint or "", p.keepalive, p.allowed_ips, 1700000000, 1, 2
                )
                for p in device.peers
            ),
        )


def test_a_wireguard_device_is_started_configured_addressed_and_shown(tmp_path: Path) -> None:
    node = SimulatedWireguard()
    (tmp_path / "etc").mkdir()
    ctl = machine_network.MachineNetworkController(
        paths=NodePaths(tmp_path), network=node, wireguard=node, retry_interval=0.05
    )

    async def body(state: State) -> None:
        publish_config(state, config({"interfaces": [WG0]}))
        await eventually(lambda: specs(state, catalog.WIREGUARD_DEVICES), what="the device published")
        assert node.devices["wg0"].peers[0].endpoint == "10.5.0.2:51111"
        assert node.applied[0].set_up == ("wg0",)  # brought up once configured
        assert ObservedAddress("wg0", "10.1.0.3/24", owned=True) in node.observed.addresses
        assert specs(state, catalog.WIREGUARD_DEVICES) == {
            "wg0": {
                "publicKey": pki.wireguard_public_key(WG_PRIVATE),
                "listenPort": 40000,
                "peers": [
                    {
                        "publicKey": WG_PEER,
                        "endpoint": "10.5.0.2:51111",
                        "allowedIPs": ["10.1.0.2/32"],
                        "persistentKeepaliveInterval": 5,
                        "latestHandshake": 1700000000,
                        "rxBytes": 1,
                        "txBytes": 2,
                    }
                ],
            }
        }
        assert status(state)["errors"] == [] and status(state)["unsupported"] == []

        # Removed from the config: its process (and so its link) goes, and so does the resource.
        publish_config(state, config({"interfaces": []}))
        await eventually(lambda: not specs(state, catalog.WIREGUARD_DEVICES), what="the device unpublished")
        assert "wg0" not in node.observed.links

    run([ctl], body)


def test_without_wireguard_go_the_status_says_so_and_nothing_changes(tmp_path: Path) -> None:
    node = SimulatedWireguard()
    node.missing_binary = True
    (tmp_path / "etc").mkdir()
    ctl = machine_network.MachineNetworkController(
        paths=NodePaths(tmp_path), network=node, wireguard=node, retry_interval=0.05
    )

    async def body(state: State) -> None:
        publish_config(state, config({"interfaces": [WG0, {"interface": "eth0", "cidr": "10.5.0.200/24"}]}))
        await eventually(lambda: status(state).get("errors"), what="the error")
        assert status(state)["errors"] == ["wireguard-go is not installed"]
        assert node.applied == [] and node.devices == {} and "wg0" not in node.observed.links

    run([ctl], body)


def test_a_missing_interface_keeps_the_wireguard_device_from_being_made(tmp_path: Path) -> None:
    node = SimulatedWireguard()
    (tmp_path / "etc").mkdir()
    ctl = machine_network.MachineNetworkController(
        paths=NodePaths(tmp_path), network=node, wireguard=node, retry_interval=0.05
    )

    async def body(state: State) -> None:
        publish_config(state, config({"interfaces": [WG0, {"interface": "eth9", "cidr": "10.9.9.9/24"}]}))
        await eventually(lambda: status(state).get("errors"), what="the error")
        assert status(state)["errors"] == [
            "machine.network.interfaces[1].interface: interface eth9 does not exist on this node"
        ]
        # All or nothing: no wireguard-go started, nothing configured or applied.
        assert "wg0" not in node.observed.links and node.devices == {} and node.applied == []

        publish_config(state, config({"interfaces": [WG0]}))
        await eventually(lambda: specs(state, catalog.WIREGUARD_DEVICES), what="the device published")
        assert status(state)["errors"] == []

    run([ctl], body)


BOND0 = {
    "interface": "bond0",
    "cidr": "192.168.10.2/24",
    "bond": {"mode": "802.3ad", "lacpRate": "fast", "miimon": 100, "interfaces": ["eth1", "eth2"]},
}


class SimulatedBonding(SimulatedWireguard):
    """A node with two more NICs whose kernel has the link kinds in ``kinds``; applying a plan
    makes its bonds (up, with their slaves) as the kernel would."""

    def __init__(self, kinds: set[str]) -> None:
        super().__init__()
        self.kinds = kinds
        self.asked: list[str] = []
        self.observed = dataclasses.replace(
            self.observed,
            links={
                **self.observed.links,
                "eth1": ObservedLink("eth1", 3, 1500, True, "UP"),
                "eth2": ObservedLink("eth2", 4, 1500, True, "UP"),
            },
        )

    def supports(self, kind: str) -> bool:
        self.asked.append(kind)
        return kind in self.kinds

    async def converge(self, names: Iterable[str]) -> list[str]:
        keep = dict(self.observed.links)
        started = await super().converge(names)
        self.observed = dataclasses.replace(self.observed, links={**keep, **self.observed.links})
        return started

    def apply(self, plan: machinenet.Plan, observed: machinenet.Observed) -> None:
        links = dict(observed.links)
        for index, bond in enumerate(plan.create_bonds, start=20):
            links[bond.name] = ObservedLink(bond.name, index, 1500, True, "UP", kind="bond")
        for slave, bond_name in plan.enslave:
            links[slave] = dataclasses.replace(links[slave], master=bond_name)
        super().apply(plan, dataclasses.replace(observed, links=links))


def test_a_kernel_without_bonding_is_named_in_the_status_and_nothing_is_made(tmp_path: Path) -> None:
    node = SimulatedBonding(kinds=set())
    (tmp_path / "etc").mkdir()
    ctl = machine_network.MachineNetworkController(
        paths=NodePaths(tmp_path), network=node, wireguard=node, retry_interval=0.05
    )

    async def body(state: State) -> None:
        publish_config(state, config({"interfaces": [WG0, BOND0]}))
        await eventually(lambda: status(state).get("errors"), what="the error")
        assert status(state)["errors"] == [
            "machine.network.interfaces[1].bond: bond0: the kernel has no bonding driver (CONFIG_BONDING, "
            "module bonding); nothing of machine.network is applied"
        ]
        assert node.asked[0] == "bond"
        # Asked before anything was made: no WireGuard device, no plan applied, no slave touched.
        assert node.applied == [] and "wg0" not in node.observed.links
        assert node.observed.links["eth1"].master is None
        assert specs(state, catalog.MACHINE_LINKS)["bond0"]["operState"] == "MISSING"

    run([ctl], body)


def test_a_bond_is_made_when_the_kernel_has_bonding(tmp_path: Path) -> None:
    node = SimulatedBonding(kinds={"bond"})
    (tmp_path / "etc").mkdir()
    ctl = machine_network.MachineNetworkController(
        paths=NodePaths(tmp_path), network=node, wireguard=node, retry_interval=0.05
    )

    async def body(state: State) -> None:
        publish_config(state, config({"interfaces": [BOND0]}))
        await eventually(lambda: specs(state, catalog.MACHINE_ADDRESSES), what="the bond's address")
        assert status(state)["errors"] == []
        (plan,) = node.applied
        assert [bond.name for bond in plan.create_bonds] == ["bond0"]
        assert plan.enslave == (("eth1", "bond0"), ("eth2", "bond0"))
        links = specs(state, catalog.MACHINE_LINKS)
        assert links["bond0"]["operState"] == "UP" and links["bond0"]["kind"] == "bond", links
        assert list(specs(state, catalog.MACHINE_ADDRESSES)) == ["bond0/192.168.10.2/24"]

    run([ctl], body)
