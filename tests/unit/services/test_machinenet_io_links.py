"""machine.network's netlink apply of bonds and VLANs against a stand-in for pyroute2's IPRoute:
the requests in their order, and the undo when a step fails (the slaves released and brought up
again if they were up, the links made deleted, nothing else changed), with the missing kernel
feature named; and the probe that asks the kernel for a link kind without making a link."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]

from kubeplane.config import models
from kubeplane.services import machinenet, machinenet_io
from kubeplane.services.machinenet import ObservedLink

pytestmark = pytest.mark.unit

EOPNOTSUPP, EBUSY, EEXIST, EADDRNOTAVAIL, EINVAL = 95, 16, 17, 99, 22
OBSERVED = machinenet.Observed(
    links={
        "lo": ObservedLink("lo", 1, 65536, True, "UNKNOWN"),
        "eth0": ObservedLink("eth0", 2, 1500, True, "UP"),
        "eth1": ObservedLink("eth1", 3, 1500, True, "UP"),
        "eth2": ObservedLink("eth2", 4, 1500, False, "DOWN"),
    }
)
# bond0 of eth1 and eth2 with a VLAN on it, addressed.
CONFIG = {
    "interface": "bond0",
    "cidr": "192.168.10.2/24",
    "bond": {"mode": "active-backup", "miimon": 100, "interfaces": ["eth1", "eth2"]},
    "vlans": [{"vlanId": 42, "cidr": "10.42.0.2/24"}],
}


Failure = Callable[[str, str, dict[str, Any]], int | None]


def failing(method: str, command: str, code: int, **match: Any) -> Failure:
    """Fail with ``code`` the calls of ``method`` and ``command`` whose arguments include ``match``."""
    return lambda m, c, kwargs: (
        code if (m, c) == (method, command) and match.items() <= kwargs.items() else None
    )


class FakeNetlink:
    """IPRoute's ``link``, ``addr``, ``route`` and ``link_lookup``: records each call, gives each
    link made the next index, and fails the calls ``fail`` gives an error code for."""

    def __init__(self, *fail: Failure) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail = fail
        self.indexes = {name: link.index for name, link in OBSERVED.links.items()}

    def _call(self, method: str, command: str, kwargs: dict[str, Any]) -> None:
        self.calls.append((method, command, kwargs))
        for failure in self.fail:
            code = failure(method, command, kwargs)
            if code is not None:
                raise NetlinkError(code)

    def link(self, command: str, **kwargs: Any) -> None:
        self._call("link", command, kwargs)
        if command == "add":
            self.indexes[kwargs["ifname"]] = 10 + len(self.indexes)

    def addr(self, command: str, **kwargs: Any) -> None:
        self._call("addr", command, kwargs)

    def route(self, command: str, **kwargs: Any) -> None:
        self._call("route", command, kwargs)

    def link_lookup(self, *, ifname: str) -> list[int]:
        return [self.indexes[ifname]]


def planned() -> machinenet.Plan:
    wanted = machinenet.desired(models.MachineNetwork.model_validate({"interfaces": [CONFIG]}))
    plan = machinenet.plan(wanted, OBSERVED)
    assert plan.errors == ()
    return plan


MADE = [
    ("link", "add", {"ifname": "bond0", "kind": "bond", "bond_mode": 1, "bond_miimon": 100}),
    ("link", "set", {"index": 14, "ifalias": machinenet.LINK_ALIAS}),
    ("link", "set", {"index": 3, "state": "down"}),
    ("link", "set", {"index": 3, "master": 14}),
    ("link", "set", {"index": 4, "state": "down"}),
    ("link", "set", {"index": 4, "master": 14}),
    ("link", "add", {"ifname": "bond0.42", "kind": "vlan", "link": 14, "vlan_id": 42}),
    ("link", "set", {"index": 15, "ifalias": machinenet.LINK_ALIAS}),
]


def test_the_bond_is_made_its_slaves_enslaved_the_vlan_made_then_both_come_up_and_get_addresses() -> None:
    ip = FakeNetlink()
    machinenet_io.apply_with(ip, planned(), OBSERVED)
    assert ip.calls[: len(MADE)] == MADE
    rest = [(m, c, k.get("index"), k.get("state"), k.get("address")) for m, c, k in ip.calls[len(MADE) :]]
    assert rest == [
        ("link", "set", 14, "up", None),
        ("link", "set", 15, "up", None),
        ("addr", "add", 14, None, "192.168.10.2"),
        ("addr", "add", 15, None, "10.42.0.2"),
    ]


def test_a_kernel_without_vlans_undoes_the_bond_and_restores_the_slaves_naming_the_feature() -> None:
    ip = FakeNetlink(failing("link", "add", EOPNOTSUPP, kind="vlan"))
    with pytest.raises(machinenet_io.MachineNetworkError) as raised:
        machinenet_io.apply_with(ip, planned(), OBSERVED)
    assert str(raised.value) == (
        "machine.network.interfaces[0].vlans[0]: bond0.42: the kernel has no 802.1Q VLAN support "
        "(CONFIG_VLAN_8021Q, module 8021q)"
    )
    assert ip.calls == [
        *MADE[:7],
        # Undo: the slaves released in reverse, eth1 (up before) up again, eth2 (down) left down,
        # then the bond deleted. No address, route or MTU was touched.
        ("link", "set", {"index": 4, "master": 0}),
        ("link", "set", {"index": 3, "master": 0}),
        ("link", "set", {"index": 3, "state": "up"}),
        ("link", "del", {"ifname": "bond0"}),
    ]


def test_a_kernel_without_bonding_changes_nothing_and_names_the_feature() -> None:
    ip = FakeNetlink(failing("link", "add", EOPNOTSUPP, kind="bond"))
    with pytest.raises(machinenet_io.MachineNetworkError) as raised:
        machinenet_io.apply_with(ip, planned(), OBSERVED)
    assert str(raised.value) == (
        "machine.network.interfaces[0].bond: bond0: the kernel has no bonding driver (CONFIG_BONDING, "
        "module bonding)"
    )
    assert ip.calls == MADE[:1]


def test_a_slave_that_cannot_be_enslaved_is_restored_with_the_one_before_and_the_bond_goes() -> None:
    ip = FakeNetlink(failing("link", "set", EBUSY, index=4, master=14))
    with pytest.raises(machinenet_io.MachineNetworkError) as raised:
        machinenet_io.apply_with(ip, planned(), OBSERVED)
    assert str(raised.value).startswith("cannot make eth2 a slave of bond0:")
    assert ip.calls == [
        *MADE[:6],
        ("link", "set", {"index": 4, "master": 0}),
        ("link", "set", {"index": 3, "master": 0}),
        ("link", "set", {"index": 3, "state": "up"}),
        ("link", "del", {"ifname": "bond0"}),
    ]


def test_a_later_failure_takes_back_the_links_made_too() -> None:
    ip = FakeNetlink(failing("addr", "add", EADDRNOTAVAIL, address="10.42.0.2"))
    with pytest.raises(machinenet_io.MachineNetworkError) as raised:
        machinenet_io.apply_with(ip, planned(), OBSERVED)
    assert str(raised.value).startswith(
        "machine.network.interfaces[0].vlans[0].cidr: cannot add 10.42.0.2/24 to bond0.42:"
    )
    assert ip.calls[-5:] == [
        ("link", "set", {"index": 4, "master": 0}),
        ("link", "set", {"index": 3, "master": 0}),
        ("link", "set", {"index": 3, "state": "up"}),
        ("link", "del", {"ifname": "bond0.42"}),  # the VLAN first, then the bond under it
        ("link", "del", {"ifname": "bond0"}),
    ]


def test_a_link_made_that_netlink_does_not_show_is_deleted_by_name() -> None:
    ip = FakeNetlink()
    ip.link_lookup = lambda *, ifname: []  # type: ignore[method-assign]
    with pytest.raises(machinenet_io.MachineNetworkError) as raised:
        machinenet_io.apply_with(ip, planned(), OBSERVED)
    assert (
        str(raised.value)
        == "machine.network.interfaces[0].bond: bond0 was made, but netlink does not show it"
    )
    assert ip.calls == [MADE[0], ("link", "del", {"ifname": "bond0"})]


def test_a_failed_undo_is_named_in_the_error_as_well() -> None:
    ip = FakeNetlink(
        failing("link", "add", EOPNOTSUPP, kind="vlan"), failing("link", "del", EBUSY, ifname="bond0")
    )
    with pytest.raises(machinenet_io.MachineNetworkError) as raised:
        machinenet_io.apply_with(ip, planned(), OBSERVED)
    assert str(raised.value).endswith(
        "; undoing it failed too: cannot delete bond0: (16, 'Device or resource busy')"
    )


def test_links_that_left_the_config_are_deleted_after_their_addresses() -> None:
    ours = machinenet.LINK_ALIAS
    observed = machinenet.Observed(
        links={
            **OBSERVED.links,
            "bond0": ObservedLink("bond0", 9, 1500, True, "UP", kind="bond", alias=ours),
            "bond0.42": ObservedLink(
                "bond0.42", 10, 1500, True, "UP", kind="vlan", alias=ours, parent="bond0"
            ),
        },
        addresses=(machinenet.ObservedAddress("bond0", "192.168.10.2/24", owned=True),),
    )
    plan = machinenet.plan(machinenet.desired(models.MachineNetwork()), observed)
    ip = FakeNetlink()
    machinenet_io.apply_with(ip, plan, observed)
    assert [(m, c, k.get("index")) for m, c, k in ip.calls] == [
        ("addr", "del", 9),
        ("link", "del", 10),
        ("link", "del", 9),
    ]


@pytest.mark.parametrize(
    ("code", "supported"),
    [(EOPNOTSUPP, False), (EADDRNOTAVAIL, True), (EINVAL, True), (EEXIST, True)],
)
def test_the_probe_tells_a_missing_link_kind_by_eopnotsupp(code: int, supported: bool) -> None:
    ip = FakeNetlink(failing("link", "add", code, kind="bond"))
    assert machinenet_io.supports_with(ip, "bond") is supported
    assert ip.calls == [("link", "add", machinenet.probe_request("bond"))]


def test_a_probe_the_kernel_took_after_all_is_deleted_again() -> None:
    ip = FakeNetlink()
    assert machinenet_io.supports_with(ip, "vlan") is True
    assert ip.calls == [
        ("link", "add", machinenet.probe_request("vlan")),
        ("link", "del", {"ifname": machinenet.PROBE_NAME}),
    ]
