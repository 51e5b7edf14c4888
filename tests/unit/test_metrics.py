"""The agent's metrics: documented names match the code; the runtime and the supervisor record.

Samples are read from the process-wide registry as deltas, under names no other test uses.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from kubeplane import metrics
from kubeplane.resources import Registry, State
from kubeplane.runtime import ReconcileContext, Runtime
from kubeplane.services import process
from kubeplane.services.supervisor import Backoff, ServiceSpec, Supervisor

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_every_metric_is_documented_and_every_documented_metric_exists() -> None:
    documented = set(re.findall(r"^\| `(kubeplane_[a-z_]+)` \|", DOCS.read_text(), flags=re.MULTILINE))
    assert documented == metrics.names()


async def _until(predicate: Callable[[], bool], *, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


class Probe:
    """A controller that fails its first reconcile and succeeds after."""

    name = "test.MetricsProbe"
    inputs = ()
    outputs = ()

    def __init__(self) -> None:
        self.runs = 0

    async def reconcile(self, ctx: ReconcileContext) -> None:
        self.runs += 1
        if self.runs == 1:
            raise RuntimeError("first run fails")


def test_the_runtime_counts_and_times_reconciles_by_result() -> None:
    ok = value("kubeplane_controller_reconciles_total", controller=Probe.name, result="ok")
    failed = value("kubeplane_controller_reconciles_total", controller=Probe.name, result="error")
    timed = value("kubeplane_controller_reconcile_duration_seconds_count", controller=Probe.name)

    async def scenario() -> None:
        probe = Probe()
        runtime = Runtime(State(Registry(namespaces=[], definitions=[])), backoff_initial=0.01)
        runtime.register(probe)
        async with runtime:
            await _until(lambda: probe.runs == 2)

    asyncio.run(scenario())
    assert value("kubeplane_controller_reconciles_total", controller=Probe.name, result="error") == failed + 1
    assert value("kubeplane_controller_reconciles_total", controller=Probe.name, result="ok") == ok + 1
    assert value("kubeplane_controller_reconcile_duration_seconds_count", controller=Probe.name) == timed + 2


def test_the_supervisor_reports_the_state_and_counts_restarts(tmp_path: Path) -> None:
    service = "metrics-probe"
    restarts = value("kubeplane_service_restarts_total", service=service)

    def state() -> str:
        return next(
            s for s in ("Initialized", "Running", "Failed", "Waiting", "Stopping", "Finished")
            if value("kubeplane_service_state", service=service, state=s) == 1
        )  # fmt: skip

    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            spec = ServiceSpec(
                id=service,
                command=process.Command(argv=("sh", "-c", "exec sleep 30")),
                backoff=Backoff(initial=0.01, maximum=0.01),
            )
            sup.register(spec)
            assert state() == "Initialized"
            await sup.start(service)
            first = await sup.wait_up(service, timeout=5)
            assert state() == "Running"
            assert first.pid is not None
            os.kill(first.pid, signal.SIGKILL)
            await sup.wait_for(service, lambda s: s.pid not in (None, first.pid), timeout=5)
            assert state() == "Running"
        # Only one state is 1 at a time.
        assert (
            sum(
                value("kubeplane_service_state", service=service, state=s.value)
                for s in type(sup.snapshot(service).state)
            )
            == 1
        )

    asyncio.run(scenario())
    assert value("kubeplane_service_restarts_total", service=service) == restarts + 1


def test_serving_does_not_look_up_the_listen_address_in_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    # A local node's resolver does not answer: a reverse lookup held up every agent's start 10 s.
    def no_dns(*_: object) -> str:
        raise AssertionError("the metrics server asked DNS for its address's name")

    monkeypatch.setattr(socket, "getfqdn", no_dns)
    monkeypatch.setattr(socket, "gethostbyaddr", no_dns)
    server = metrics.serve("127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
            assert reply.status == 200
            assert b"kubeplane_controller_reconciles" in reply.read()
    finally:
        server.stop()
