"""The supervisor keeping a real etcd alive: health over HTTP on loopback, restart after kill -9.

etcd runs with plain HTTP on free loopback ports (TLS is covered by the etcd client tests); the
health check reads ``/health``. The supervisor is used in ``async with`` so the etcd process group
is gone when the test ends, pass or fail.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from kubeplane.services import process
from kubeplane.services.supervisor import HealthCheck, ServiceSpec, ServiceTimeoutError, Supervisor

ETCD = Path("/usr/bin/etcd")

pytestmark = pytest.mark.integration


def etcd_spec(root: Path, *, client_port: int, peer_port: int) -> ServiceSpec:
    client_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    command = process.Command(
        argv=[
            str(ETCD),
            "--name=node-1",
            f"--data-dir={root / 'var' / 'lib' / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=node-1={peer_url}",
            "--initial-cluster-state=new",
        ]
    )

    async def check() -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            response = await client.get(f"{client_url}/health")
        if response.status_code != 200 or response.json().get("health") != "true":
            raise RuntimeError(f"GET {client_url}/health: {response.status_code} {response.text.strip()}")

    return ServiceSpec(id="etcd", command=command, health=HealthCheck(check=check, interval=0.1, timeout=1.0))


def _where(pid: int) -> str:
    """A process's state and the kernel function it waits in, or that it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text() or "-"
    except OSError:
        return f"PID {pid} is gone"
    state = next((line for line in status if line.startswith("State:")), "State: ?")
    return f"PID {pid} {state}, waiting in {wchan}"


def test_etcd_is_restarted_after_kill_and_healthy_again(tmp_path: Path, free_port: Callable[[], int]) -> None:
    if not ETCD.is_file():
        pytest.fail(f"{ETCD} is missing; run scripts/setup to install the real components", pytrace=False)
    spec = etcd_spec(tmp_path, client_port=free_port(), peer_port=free_port())

    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(spec)
            await sup.start("etcd")
            first = await sup.wait_up("etcd", timeout=30)
            assert first.pid is not None

            killed_at = time.monotonic()
            os.kill(first.pid, signal.SIGKILL)
            # Generous: a CI run with two e2e halves beside this tier once took over 30 s to see
            # the restart (the figure printed below is what a quiet machine takes: under 1 s).
            try:
                restarted = await sup.wait_for(
                    "etcd", lambda s: s.running and s.pid not in (None, first.pid), timeout=90
                )
            except ServiceTimeoutError as exc:
                # Seen once in a full run: a SIGKILLed process that does not exit is stuck in the
                # kernel (state D, e.g. an fsync on a saturated disk); say where.
                raise AssertionError(f"{exc}\nthe killed etcd: {_where(first.pid)}") from exc
            running_after = time.monotonic() - killed_at
            healthy = await sup.wait_up("etcd", timeout=30)
            healthy_after = time.monotonic() - killed_at
            print(f"\netcd after kill -9: running in {running_after:.2f}s, healthy in {healthy_after:.2f}s")

            assert healthy.pid == restarted.pid
            history = [f"[{e.state.value}] {e.message}" for e in healthy.events]
            crash = history.index("[Failed] Service exited with signal SIGKILL (9)")
            assert history[crash + 1 :][:2] == [
                "[Waiting] Restarting in 0.50s (restart 1)",
                f"[Running] Started task etcd (PID {restarted.pid}) for process etcd",
            ]
            assert history[-1] == "[Running] Health check successful"
            assert "etcd" in sup.log_path("etcd").read_text()  # its own startup output was captured
            assert process.group_members(first.pid) == []
        assert restarted.pid is not None and process.group_members(restarted.pid) == []

    asyncio.run(asyncio.wait_for(scenario(), 240))
