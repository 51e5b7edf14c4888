"""Benchmark of ``convert-k8s`` on a real self-hosted local cluster; prints figures, asserts nothing.

Creates a self-hosted cluster (3 control planes + 1 worker by default), runs
``convert-k8s --force`` through the load balancer endpoint while a client lists kube-system pods
through it every 100 ms, then destroys the cluster. Prints:

- total conversion time (CLI wall time) and its waits as the CLI reports them (``time spent
  waiting:``): static pods rendered, checkpointer pods gone, checkpointer grace (pod checkpoints
  expiring: the reference waits ≈ 5 minutes here, its grace period), static pods appearing,
  DaemonSet hand-over;
- each step's duration, from the CLI's progress lines;
- API unavailability through the endpoint: failed requests, the longest time without a
  successful request and the total time without one (gaps longer than 1 s summed).

Runs as root with the toolchain built; state and client config go to a temporary directory.
Run: sudo .venv/bin/python bench/bench_convert.py [--grace SECONDS] [--controlplanes N]
     [--name NAME --cidr CIDR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

KUBEPLANE = str(Path(sys.executable).with_name("kubeplane"))
WAITS = re.compile(r"^time spent waiting: (?P<waits>.*)$")
STEP = re.compile(r"^\[\d+/\d+\] (?P<step>.*)$")
DONE = re.compile(r"^ < (?:done|already at target, skipped) \((?P<seconds>[0-9.]+)s\)")
#: A gap between successful requests longer than this counts as unavailability.
GAP = 1.0


def step_durations(progress: str) -> list[tuple[str, float]]:
    """(step, seconds) of each step the CLI's progress lines (one per event) report done."""
    found, step = [], ""
    for line in progress.splitlines():
        if started := STEP.match(line):
            step = started["step"]
        elif (done := DONE.match(line)) and step:
            found.append((step, float(done["seconds"])))
    return found


def kubeplane(env: dict[str, str], *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    result = subprocess.run([KUBEPLANE, *args], env=env, capture_output=True, text=True, check=False)
    return time.monotonic() - started, result


class Poller:
    """Lists kube-system pods every 100 ms; records failures and gaps between successes."""

    def __init__(self, kubeconfig: Path) -> None:
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
            yaml.safe_load(kubeconfig.read_text()), client_configuration=configuration, persist_config=False
        )
        configuration.retries = False
        self.core: Any = k8s_client.CoreV1Api(k8s_client.ApiClient(configuration))
        self.stop = threading.Event()
        self.requests = 0
        self.failed = 0
        self.failures: list[str] = []
        self.gaps: list[float] = []
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        last_ok = time.monotonic()
        while not self.stop.is_set():
            self.requests += 1
            try:
                self.core.list_namespaced_pod("kube-system", _request_timeout=5)
                now = time.monotonic()
                if now - last_ok > GAP:
                    self.gaps.append(now - last_ok)
                last_ok = now
            except Exception as exc:
                self.failed += 1
                self.failures.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {str(exc)[:200]}")
            self.stop.wait(0.1)
        if time.monotonic() - last_ok > GAP:
            self.gaps.append(time.monotonic() - last_ok)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grace", type=int, default=300, help="checkpointer grace period (s)")
    parser.add_argument("--controlplanes", type=int, default=3)
    parser.add_argument("--name", default="bconv")
    parser.add_argument("--cidr", default="10.5.73.0/24")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kpbc") as tmp:
        env = {**os.environ, "KUBEPLANE_STATE": f"{tmp}/s", "KUBEPLANECONFIG": f"{tmp}/config"}
        try:
            seconds, result = kubeplane(
                env,
                *("cluster", "create", "--name", args.name, "--cidr", args.cidr),
                *("--controlplanes", str(args.controlplanes), "--workers", "1"),
                *("--self-hosted", "--checkpointer-grace-period", str(args.grace)),
            )
            if result.returncode != 0:
                print(f"cluster create failed:\n{result.stdout}\n{result.stderr}")
                return 1
            print(f"self-hosted {args.controlplanes}+1 cluster created and healthy: {seconds:.0f}s")
            _, shown = kubeplane(env, "cluster", "show", "--name", args.name, "-o", "json")
            info = json.loads(shown.stdout)
            control_plane = [n["ip"] for n in info["nodes"] if n["role"] == "controlplane"]
            poller = Poller(Path(info["kubeconfig"]))
            poller.thread.start()
            seconds, result = kubeplane(
                env, "-n", control_plane[0], "convert-k8s", "--force", "--endpoint", info["endpoint"]
            )
            poller.stop.set()
            poller.thread.join()
            if result.returncode != 0:
                print(f"convert-k8s failed:\n{result.stdout}\n{result.stderr}")
                return 1
            waits = next((m["waits"] for line in result.stdout.splitlines() if (m := WAITS.match(line))), "")
            print(f"convert-k8s total: {seconds:.0f}s (checkpointer grace period {args.grace}s)")
            for wait in waits.split(", "):
                print(f"  {wait}")
            print("steps (the CLI's progress lines):")
            for step, took in step_durations(result.stderr):
                print(f"  {took:5.1f}s  {step}")
            print(
                f"API through the endpoint: {poller.requests} requests, {poller.failed} failed, "
                f"longest gap {max(poller.gaps, default=0.0):.1f}s, "
                f"unavailable {sum(poller.gaps):.1f}s in {len(poller.gaps)} gap(s) > {GAP:g}s"
            )
            for failure in poller.failures:
                print(f"  failed: {failure}")
        finally:
            kubeplane(env, "cluster", "destroy", "--name", args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
