"""TimeSyncController against a fake daemon: servers start it, a live change of the servers
replaces it, ``disabled`` or no servers stop it, a daemon that exits is started again (not in a
tight loop), and ``runtime/TimeStatuses/node`` follows what the daemon reports."""

from __future__ import annotations

import asyncio
import copy
import sys
from pathlib import Path
from typing import Any

import pytest

from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.timesync import time_sync
from kubeplane.resources import State, catalog
from kubeplane.services import timesync, timesync_io
from kubeplane.services.timesync import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "k8s"))
from k8s_harness import eventually, publish_config, run, settle

pytestmark = pytest.mark.unit

GENERATED = gen.generate(gen.GenOptions(cluster_name="test", endpoint="10.5.0.1"), gen.new_secrets())
SYNCED = timesync.Tracking(source="10.5.0.1", stratum=9, offset=0.25, leap_status="Normal")
UNSYNCED = timesync.Tracking(source="", stratum=0, offset=0.0, leap_status=timesync.UNSYNCHRONISED)


class FakeDaemon:
    """Records the daemons run (their servers), which one runs now, and reports ``tracking``."""

    def __init__(self) -> None:
        self.started: list[tuple[Server, ...]] = []
        self.running: tuple[Server, ...] | None = None
        self.tracking_result: timesync.Tracking | Exception = UNSYNCED
        self.exit_now = asyncio.Event()
        #: How many times ``tracking`` was asked.
        self.asked = 0

    async def run(self, servers: tuple[Server, ...]) -> None:
        self.started.append(servers)
        self.running = servers
        try:
            await self.exit_now.wait()
            self.exit_now.clear()
            raise timesync_io.TimeSyncError("chronyd exited with code 1: Fatal error")
        finally:
            self.running = None

    def tracking(self) -> timesync.Tracking:
        self.asked += 1
        if isinstance(self.tracking_result, Exception):
            raise self.tracking_result
        return self.tracking_result


def config(time: dict[str, Any] | None) -> dict[str, Any]:
    document = copy.deepcopy(dict(GENERATED.documents["worker"]))
    if time is not None:
        document["machine"]["time"] = time
    return document


def status(state: State) -> dict[str, Any]:
    found = state.find(catalog.RUNTIME_NAMESPACE, catalog.TIME_STATUSES, catalog.TIME_STATUS_ID)
    return found.spec.to_dict() if found is not None else {}


def controller(tmp_path: Path, daemon: FakeDaemon, *, retry: float = 0.05) -> time_sync.TimeSyncController:
    return time_sync.TimeSyncController(
        paths=NodePaths(tmp_path),
        daemon=daemon,
        poll_interval=0.02,
        synced_poll_interval=0.02,
        retry_interval=retry,
    )


def test_servers_start_the_daemon_and_the_status_follows_it(tmp_path: Path) -> None:
    daemon = FakeDaemon()

    async def body(state: State) -> None:
        publish_config(state, config({"servers": ["10.5.0.1:11123"]}))
        await eventually(lambda: daemon.running, what="the daemon started")
        assert daemon.running == (Server("10.5.0.1", 11123),)
        await eventually(lambda: status(state).get("leapStatus"), what="the first tracking")
        assert status(state) == {
            "synced": False,
            "syncDisabled": False,
            "servers": ["10.5.0.1:11123"],
            "source": "",
            "stratum": 0,
            "offset": 0.0,
            "leapStatus": "Not synchronised",
            "error": "",
        }
        daemon.tracking_result = SYNCED
        await eventually(lambda: status(state)["synced"], what="synced")
        assert status(state)["source"] == "10.5.0.1"
        assert status(state)["stratum"] == 9
        assert status(state)["offset"] == 0.25
        assert daemon.started == [(Server("10.5.0.1", 11123),)]  # polling never restarts it

    run([controller(tmp_path, daemon)], body)


def test_changed_servers_replace_the_daemon_and_disabled_stops_it(tmp_path: Path) -> None:
    daemon = FakeDaemon()
    daemon.tracking_result = SYNCED

    async def body(state: State) -> None:
        publish_config(state, config({"servers": ["a.example"]}))
        await eventually(lambda: status(state).get("synced"), what="synced with a.example")
        publish_config(state, config({"servers": ["b.example:1123"]}))
        await eventually(lambda: daemon.running == (Server("b.example", 1123),), what="the new daemon")
        await eventually(lambda: status(state)["servers"] == ["b.example:1123"], what="the new servers")
        assert daemon.started == [(Server("a.example"),), (Server("b.example", 1123),)]
        publish_config(state, config({"servers": ["b.example:1123"], "disabled": True}))
        await eventually(lambda: daemon.running is None, what="the daemon stopped")
        await eventually(lambda: status(state)["syncDisabled"], what="sync disabled")
        assert status(state)["synced"] is False
        publish_config(state, config(None))
        await settle()
        assert daemon.running is None
        assert status(state)["servers"] == []
        assert len(daemon.started) == 2

    run([controller(tmp_path, daemon)], body)


def test_no_time_section_runs_nothing(tmp_path: Path) -> None:
    daemon = FakeDaemon()

    async def body(state: State) -> None:
        publish_config(state, config(None))
        await eventually(lambda: status(state), what="the status")
        await settle()
        assert daemon.started == []
        assert status(state)["syncDisabled"] is True

    run([controller(tmp_path, daemon)], body)


def test_a_daemon_that_exits_is_started_again_and_its_exit_shown(tmp_path: Path) -> None:
    daemon = FakeDaemon()

    async def body(state: State) -> None:
        publish_config(state, config({"servers": ["a.example"]}))
        await eventually(lambda: daemon.running, what="the daemon started")
        daemon.exit_now.set()
        await eventually(lambda: len(daemon.started) == 2 and daemon.running, what="started again")
        # The new daemon answers (not in sync yet): the status still says why the last one exited.
        asked = daemon.asked
        await eventually(lambda: daemon.asked >= asked + 2, what="the new daemon asked twice")
        assert status(state)["error"] == "chronyd exited with code 1: Fatal error"
        assert status(state)["synced"] is False
        daemon.tracking_result = SYNCED
        await eventually(lambda: status(state)["synced"], what="synced after the restart")
        assert status(state)["error"] == ""

    run([controller(tmp_path, daemon)], body)


def test_restarts_wait_for_the_retry_interval(tmp_path: Path) -> None:
    daemon = FakeDaemon()

    async def body(state: State) -> None:
        publish_config(state, config({"servers": ["a.example"]}))
        await eventually(lambda: daemon.running, what="the daemon started")
        daemon.exit_now.set()
        await eventually(lambda: daemon.running is None, what="the daemon exited")
        await asyncio.sleep(0.3)
        assert len(daemon.started) == 1  # not again within the retry interval
        assert status(state)["error"] == "chronyd exited with code 1: Fatal error"

    run([controller(tmp_path, daemon, retry=30.0)], body)


def test_a_daemon_that_does_not_answer_is_an_error_after_the_startup_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = FakeDaemon()
    daemon.tracking_result = timesync_io.TimeSyncError("chronyc tracking: 506 Cannot talk to daemon")

    async def body(state: State) -> None:
        publish_config(state, config({"servers": ["a.example"]}))
        await eventually(lambda: daemon.running, what="the daemon started")
        await settle()
        assert status(state)["error"] == ""  # just started: not answering yet is no error
        monkeypatch.setattr(time_sync, "STARTUP_GRACE", 0.0)
        await eventually(lambda: status(state)["error"], what="the error")
        assert status(state)["error"] == "chronyc tracking: 506 Cannot talk to daemon"

    run([controller(tmp_path, daemon)], body)


def test_stopping_the_runtime_stops_the_daemon(tmp_path: Path) -> None:
    daemon = FakeDaemon()

    async def body(state: State) -> None:
        publish_config(state, config({"servers": ["a.example"]}))
        await eventually(lambda: daemon.running, what="the daemon started")

    run([controller(tmp_path, daemon)], body)
    assert daemon.running is None
