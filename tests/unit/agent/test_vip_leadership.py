"""A halting control plane node hands etcd leadership to a voter that holds no shared VIP.

A VIP holder that also leads etcd makes its own loss slow (an etcd election, then every lease
extended, before another node may take the VIP), so the nodes holding a VIP are asked last.
:func:`kubeplane.agent.etcd.vip_holders` finds them; a node that has just given its VIPs up waits
a moment for another node to take each, so that the new holder is known too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubeplane.agent import etcd as agent_etcd
from kubeplane.clients import etcd as etcd_client
from kubeplane.services import vip

pytestmark = pytest.mark.unit

KEY_A = vip.key("10.5.0.100")
KEY_B = vip.key("10.5.0.101")


class FakeEtcd:
    """Answers prefix reads of the VIP keys from a list of successive states."""

    def __init__(self, *states: dict[bytes, str]) -> None:
        self.states = list(states)
        self.reads = 0

    async def get(self, key: bytes, *, prefix: bool = False) -> etcd_client.RangeResult:
        assert (key, prefix) == (vip.KEY_PREFIX, True)
        state = self.states[min(self.reads, len(self.states) - 1)]
        self.reads += 1
        kvs = [
            etcd_client.KeyValue(key=k, value=v.encode(), create_revision=1, mod_revision=1, version=1)
            for k, v in sorted(state.items())
        ]
        return etcd_client.RangeResult(kvs=kvs, count=len(kvs), more=False, revision=1)


def holders(fake: FakeEtcd, **kwargs: Any) -> set[str]:
    return asyncio.run(agent_etcd.vip_holders(fake, me="cp-1", **kwargs))  # type: ignore[arg-type]


def test_the_holders_are_the_other_nodes_named_by_the_vip_keys() -> None:
    fake = FakeEtcd({KEY_A: "cp-2", KEY_B: "cp-1"})
    assert holders(fake) == {"cp-2"}
    assert fake.reads == 1


def test_a_released_vip_is_waited_for_until_another_node_holds_it() -> None:
    fake = FakeEtcd({}, {KEY_A: "cp-1"}, {KEY_A: "cp-3"})
    assert holders(fake, released=[KEY_A], wait=5.0) == {"cp-3"}
    assert fake.reads == 3


def test_the_wait_for_a_released_vip_is_bounded() -> None:
    fake = FakeEtcd({})
    assert holders(fake, released=[KEY_A], wait=0.2) == set()
    assert 2 <= fake.reads <= 10


def test_without_a_wait_one_read_answers() -> None:
    fake = FakeEtcd({}, {KEY_A: "cp-3"})
    assert holders(fake, released=[KEY_A]) == set()
    assert fake.reads == 1
