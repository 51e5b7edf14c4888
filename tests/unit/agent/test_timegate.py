"""The boot's wait for the time sync: none without servers, over once the status says synced (or
the sync was disabled live), and never longer than bootTimeout; each wait says so in events; the
kubelet and etcd share the one wait of a boot."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import yaml

from kubeplane import config, resources
from kubeplane.agent import services as agent_services
from kubeplane.agent import timegate
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths
from kubeplane.resources import catalog
from kubeplane.services import timesync
from kubeplane.services.timesync import Server

pytestmark = pytest.mark.unit

DOCUMENTS = gen.generate(
    gen.GenOptions(cluster_name="unit", endpoint="https://10.5.0.1:6443"), gen.new_secrets()
).documents
WANTED = timesync.Desired(servers=(Server("10.5.0.1", 11123),), boot_timeout=5.0)


def set_status(state: resources.State, **fields: object) -> None:
    spec = catalog.TimeStatusSpec(**fields)  # type: ignore[arg-type]
    state.modify(catalog.RUNTIME_NAMESPACE, catalog.TIME_STATUSES, catalog.TIME_STATUS_ID, lambda _: spec)


def test_no_servers_means_no_wait_and_no_event() -> None:
    events: list[str] = []
    state = resources.State(resources.default_registry())
    assert asyncio.run(timegate.wait_for_sync(state, timesync.Desired(), emit=events.append))
    assert events == []


def test_the_wait_ends_when_the_time_is_in_sync() -> None:
    events: list[str] = []
    state = resources.State(resources.default_registry())

    async def main() -> bool:
        waiting = asyncio.ensure_future(
            timegate.wait_for_sync(state, WANTED, emit=events.append, poll_interval=0.01)
        )
        set_status(state, sync_disabled=False, servers=["10.5.0.1:11123"])
        await asyncio.sleep(0.1)
        assert not waiting.done()
        set_status(state, sync_disabled=False, synced=True, source="10.5.0.1", stratum=9)
        return await asyncio.wait_for(waiting, 2.0)

    assert asyncio.run(main())
    assert events == [
        "kubelet and etcd wait for the time sync with 10.5.0.1:11123 (at most 5s)",
        "time in sync with 10.5.0.1: kubelet and etcd start",
    ]


def test_sync_disabled_live_ends_the_wait() -> None:
    state = resources.State(resources.default_registry())

    async def main() -> bool:
        waiting = asyncio.ensure_future(timegate.wait_for_sync(state, WANTED, emit=print, poll_interval=0.01))
        await asyncio.sleep(0.05)
        set_status(state, sync_disabled=True)
        return await asyncio.wait_for(waiting, 2.0)

    assert asyncio.run(main())


def test_the_wait_never_outlasts_the_boot_timeout() -> None:
    events: list[str] = []
    state = resources.State(resources.default_registry())
    set_status(state, sync_disabled=False)
    wanted = timesync.Desired(servers=(Server("10.5.0.1"),), boot_timeout=0.3)

    async def main() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        synced = await timegate.wait_for_sync(state, wanted, emit=events.append, poll_interval=0.05)
        return synced, loop.time() - started

    synced, waited = asyncio.run(main())
    assert synced is False
    assert 0.3 <= waited < 5.0  # the timeout, not a sync that never comes (slack: a loaded CI machine)
    assert events[-1] == (
        "time not in sync after 0.3s (machine.time.bootTimeout): kubelet and etcd start anyway; "
        "the time sync goes on"
    )


def test_etcd_and_kubelet_share_one_wait_per_boot(tmp_path: Path) -> None:
    document = copy.deepcopy(DOCUMENTS["controlplane"])
    document["machine"]["time"] = {"servers": ["10.5.0.1:11123"], "bootTimeout": "10s"}
    events: list[str] = []
    state = resources.State(resources.default_registry())
    services = agent_services.NodeServices(
        paths=NodePaths(tmp_path),
        document=config.load(yaml.safe_dump(document)),
        name="cp1",
        node_ip="10.5.0.2",
        state=state,
        emit=events.append,
    )
    prepared: list[str] = []

    async def etcd_prepare() -> None:
        prepared.append("etcd")

    assert services.etcd is not None
    services.etcd._prepare = etcd_prepare  # type: ignore[method-assign]
    (etcd,) = [spec for spec in services.specs() if spec.id == "etcd"]
    assert etcd.pre_start is not None

    async def main() -> None:
        etcd_start = asyncio.ensure_future(etcd.pre_start())
        kubelet_wait = asyncio.ensure_future(services.time_synced())
        await asyncio.sleep(0.2)
        assert prepared == []  # etcd's own pre state waits for the time
        assert not kubelet_wait.done()
        set_status(state, sync_disabled=False, synced=True, source="10.5.0.1", stratum=9)
        await asyncio.wait_for(asyncio.gather(etcd_start, kubelet_wait), 2.0)
        await services.time_synced()  # a later restart does not wait again

    asyncio.run(main())
    assert prepared == ["etcd"]
    assert events == [
        "kubelet and etcd wait for the time sync with 10.5.0.1:11123 (at most 10s)",
        "time in sync with 10.5.0.1: kubelet and etcd start",
    ]
