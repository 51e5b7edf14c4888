"""Benchmark of a real ``kubeplaned`` over its node API; prints figures, asserts nothing.

One agent runs on a random loopback address with its root in a temporary directory, configured
with a generated control plane config, API-only (``kubeplaned --no-services``). Measured:

(a) reconcile latency: ApplyConfiguration(mode=immediate) of a ``.cluster`` field (what
    ``patch --immediate`` sends) until a watcher of the MachineConfig resource sees the new
    version, p50/p99 over 50 changes; plus the wall time of the ``kubeplane patch --immediate``
    command itself (process start, fetch, patch, apply) for a few runs;
(b) ``get`` over the API: ResourceList of the largest real collection (``rd``) and a small one
    (``ns``), p50 each; the 1,000-resource figure is a linear extrapolation from those two (the
    agent has no API to create arbitrary resources), labelled as such;
(c) watch fan-out: 10 watchers (each on its own connection) of the MachineConfig; latency from
    sending the change to each watcher receiving it, p50/p99, and the first-to-last spread;
(d) idle RSS of kubeplaned (VmRSS from /proc, with its anonymous and file-backed parts) a few
    idle seconds after it starts (maintenance mode: no config yet) and after it booted.

Run: .venv/bin/python bench/bench_agent.py [--rss-only]   (``--rss-only``: (d) alone)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kubeplane.api import Credentials, NodeClient
from kubeplane.config import client as client_config

BIN = Path(sys.executable).parent
CHANGES = 50
WATCHERS = 10
LIST_CALLS = 200


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def figure(name: str, values_ms: list[float]) -> None:
    print(
        f"{name:58s} p50 {statistics.median(values_ms):8.2f} ms   p99 {percentile(values_ms, 0.99):8.2f} ms"
        f"   (n={len(values_ms)})"
    )


def kubeplane(*args: str) -> str:
    return subprocess.run(
        [str(BIN / "kubeplane"), *args], check=True, capture_output=True, text=True, timeout=60
    ).stdout


def wait_port(address: str, port: int = 50000, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"kubeplaned did not listen on {address}:{port} within {timeout}s")


def config_with_domain(text: str, domain: str) -> str:
    return text.replace("dnsDomain: cluster.local", f"dnsDomain: {domain}")


async def first_change(stream: AsyncIterator[Any], version: int) -> float:
    """Monotonic time at which ``stream`` delivers the MachineConfig at ``version`` or later."""
    async for reply in stream:
        resource = reply.unwrap().get("resource")
        if resource is not None and resource["metadata"]["version"] >= version:
            return time.monotonic()
    raise RuntimeError("watch ended")


async def current_version(client: NodeClient) -> int:
    (reply,) = await client.resource_get("mc", "v1alpha1")
    version: int = reply.unwrap()["metadata"]["version"]
    return version


async def measure(address: str, credentials: Credentials, base: str, config_path: Path) -> None:
    def new_client() -> NodeClient:
        return NodeClient([address], credentials=credentials)

    async with new_client() as client:
        # (a) reconcile latency through the API.
        latencies: list[float] = []
        watch = client.resource_watch("mc", id="v1alpha1")
        for index in range(CHANGES):
            target = await current_version(client) + 1
            waiter = asyncio.ensure_future(first_change(watch, target))
            await asyncio.sleep(0)  # let the watcher be waiting before the change is sent
            start = time.monotonic()
            data = config_with_domain(base, f"d{index}.test")
            for reply in await client.apply_configuration(data, mode="immediate"):
                reply.unwrap()
            latencies.append((await waiter - start) * 1000)
        figure("(a) apply --immediate .cluster field -> MachineConfig watched", latencies)

        cli_runs = []
        for index in range(5):
            start = time.monotonic()
            patch = f'[{{"op":"replace","path":"/cluster/network/dnsDomain","value":"cli{index}.test"}}]'
            kubeplane(
                "--kubeplaneconfig",
                str(config_path),
                "-e",
                address,
                "patch",
                "mc",
                "--immediate",
                "-p",
                patch,
            )
            cli_runs.append((time.monotonic() - start) * 1000)
        figure("(a') `kubeplane patch --immediate` command wall time", cli_runs)

        # (b) listing.
        sizes = {}
        for alias in ("ns", "rd"):
            durations = []
            for _ in range(LIST_CALLS):
                start = time.monotonic()
                (listed,) = await client.resource_list(alias)
                items = listed.unwrap()
                durations.append((time.monotonic() - start) * 1000)
            sizes[alias] = (len(items), statistics.median(durations))
            figure(f"(b) ResourceList {alias} ({len(items)} resources)", durations)
        (n_small, t_small), (n_large, t_large) = sizes["ns"], sizes["rd"]
        per_item = (t_large - t_small) / (n_large - n_small) if n_large != n_small else 0.0
        estimate = t_large + per_item * (1000 - n_large)
        print(
            f"(b) ResourceList 1,000 resources: EXTRAPOLATED {estimate:.2f} ms "
            f"(linear: {per_item * 1000:.1f} us per resource over ns/rd; no 1,000-resource collection exists)"
        )

    # (c) watch fan-out to 10 watchers on their own connections.
    clients = [new_client() for _ in range(WATCHERS)]
    try:
        streams = [c.resource_watch("mc", id="v1alpha1") for c in clients]
        async with new_client() as writer:
            fanout: list[float] = []
            spreads: list[float] = []
            for index in range(20):
                target = await current_version(writer) + 1
                waiters = [asyncio.ensure_future(first_change(s, target)) for s in streams]
                await asyncio.sleep(0.05 if index == 0 else 0)
                start = time.monotonic()
                for reply in await writer.apply_configuration(
                    config_with_domain(base, f"f{index}.test"), mode="immediate"
                ):
                    reply.unwrap()
                seen = await asyncio.gather(*waiters)
                fanout += [(t - start) * 1000 for t in seen]
                spreads.append((max(seen) - min(seen)) * 1000)
            figure(f"(c) change -> each of {WATCHERS} watchers", fanout)
            figure("(c) first-to-last watcher spread per change", spreads)
    finally:
        for c in clients:
            await c.close()


def memory(pid: int) -> str:
    """VmRSS of ``pid`` with its split: anonymous (the interpreter's objects, mostly the code of
    imported modules) and file-backed (the shared libraries' pages, grpc's and OpenSSL's above all)."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())

    def mb(field: str) -> float:
        return int(status[field].split()[0]) / 1024

    return f"{mb('VmRSS'):.1f} MB (anonymous {mb('RssAnon'):.1f}, file-backed {mb('RssFile'):.1f})"


def main() -> None:
    address = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}.{random.randint(2, 254)}"
    with tempfile.TemporaryDirectory(prefix="kubeplane-bench-") as tmp:
        work = Path(tmp)
        kubeplane("gen", "config", "bench", "https://127.0.0.1:6443", "-o", str(work / "gen"))
        log = (work / "kubeplaned.log").open("wb")
        agent = subprocess.Popen(
            [
                str(BIN / "kubeplaned"),
                "--root",
                str(work / "node"),
                "--listen",
                f"{address}:50000",
                "--no-services",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_port(address)
            time.sleep(3)
            print(f"(d) idle kubeplaned RSS, maintenance mode: {memory(agent.pid)}")
            base = (work / "gen" / "controlplane.yaml").read_text()
            kubeplane(
                "-n", address, "apply-config", "--insecure", "-f", str(work / "gen" / "controlplane.yaml")
            )
            config_path = work / "gen" / "kubeplaneconfig"
            _, context = client_config.current(client_config.load(config_path))
            credentials = Credentials(ca=context.ca_pem, cert=context.client.cert, key=context.client.key)
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(subprocess.CalledProcessError):
                    kubeplane("--kubeplaneconfig", str(config_path), "-e", address, "get", "mt")
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the agent did not boot")
                time.sleep(0.2)
            time.sleep(3)
            print(f"(d) idle kubeplaned RSS, booted (API only): {memory(agent.pid)}")
            if "--rss-only" in sys.argv[1:]:
                return
            asyncio.run(measure(address, credentials, base, config_path))
            print(f"(d) kubeplaned RSS after the benchmark: {memory(agent.pid)}")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGTERM)
            try:
                agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(timeout=5)
            log.close()


if __name__ == "__main__":
    main()
