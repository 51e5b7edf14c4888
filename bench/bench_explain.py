"""Benchmark of ``kubeplane health --explain`` on a real local 3+1 cluster; prints figures,
asserts nothing.

Wall time (median of 3 runs) on the healthy cluster, then with one failure at a time:
- the worker's kubelet stopped (a node-level service failure: no timeout on the way);
- one control plane node's etcd stopped (its member's calls time out: the slowest branch);
- kube-scheduler crash-looping on one control plane node (a wrong ``extraArgs`` flag).
Each failure is undone before the next one. The explain must read what is visible once, not wait
for timeouts to diagnose it.

Runs as root with the toolchain built; state goes to a temporary directory.
Run: sudo .venv/bin/python bench/bench_explain.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

KUBEPLANE = str(Path(sys.executable).with_name("kubeplane"))
NAME, CIDR = "bexpl", "10.5.36.0/24"
RUNS = 3


def run(env: dict[str, str], *args: str, check: bool = True, timeout: float = 900) -> str:
    result = subprocess.run(
        [KUBEPLANE, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"kubeplane {' '.join(args[:4])}... failed: {(result.stdout + result.stderr)[-1500:]}"
        )
    return result.stdout


def explain(env: dict[str, str]) -> tuple[float, list[str]]:
    started = time.monotonic()
    out = run(env, "health", "--explain", "-o", "json", check=False, timeout=300)
    elapsed = time.monotonic() - started
    # The cause's first words name the component or service (a node may have several diagnoses).
    return elapsed, sorted(
        f"{d['id']}@{d['node']} ({' '.join(d['cause'].split()[:2])})" for d in json.loads(out)["diagnoses"]
    )


def measure(env: dict[str, str], label: str, wanted: str | None) -> None:
    """Wait (up to 3 minutes) until the diagnosis ``wanted`` shows, then time RUNS explains."""
    deadline = time.monotonic() + 180
    while True:
        _, ids = explain(env)
        if (wanted is None and not ids) or (wanted is not None and any(i.startswith(wanted) for i in ids)):
            break
        if time.monotonic() > deadline:
            print(f"{label:40} did not show {wanted or 'healthy'}: {ids}")
            return
    runs = [explain(env) for _ in range(RUNS)]
    times = [elapsed for elapsed, _ in runs]
    ids = runs[-1][1]
    print(
        f"{label:40} median {statistics.median(times):5.2f}s  (runs {', '.join(f'{t:.2f}' for t in times)})"
    )
    print(f"{'':40} diagnoses: {', '.join(ids) or 'none'}")


def with_failure(
    env: dict[str, str], label: str, wanted: str, make: Callable[[], None], undo: Callable[[], None]
) -> None:
    make()
    try:
        measure(env, label, wanted)
    finally:
        undo()
        run(env, "health", "--wait-timeout", "5m")
        wait_services_up(env)


def wait_services_up(env: dict[str, str]) -> None:
    """Every service of every node running and healthy (``health`` passing is not enough: a
    kubelet started again leaves its Node Ready while its own health endpoint is not up yet)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        shown = json.loads(run(env, "cluster", "show", "--name", NAME, "-o", "json"))
        documents = []
        for node in shown["nodes"]:
            out = run(env, "-n", node["ip"], "service", "-o", "json", check=False)
            documents += [json.loads(line) for line in out.splitlines() if line.strip()]
        if documents and all(
            d.get("state") == "Running" and (d.get("health") or {}).get("healthy") for d in documents
        ):
            return
        time.sleep(2)
    print("services did not all come up within 3 minutes")


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="kpbexp-", dir="/tmp"))
    env = {**os.environ, "KUBEPLANE_STATE": str(base / "s"), "KUBEPLANECONFIG": str(base / "config")}
    try:
        run(
            env,
            "cluster",
            "create",
            "--name",
            NAME,
            "--cidr",
            CIDR,
            "--controlplanes",
            "3",
            "--wait-timeout",
            "5m",
        )
        shown = json.loads(run(env, "cluster", "show", "--name", NAME, "-o", "json"))
        nodes = {n["role"]: n["ip"] for n in reversed(shown["nodes"])}  # the first of each role
        cp, worker = nodes["controlplane"], nodes["worker"]
        wait_services_up(env)
        measure(env, "healthy 3+1", None)

        def service(node: str, name: str, action: str) -> Callable[[], None]:
            def act() -> None:
                run(env, "-n", node, "service", name, action)

            return act

        with_failure(env, "worker kubelet stopped", "kubelet-not-running", service(worker, "kubelet", "stop"),
                     service(worker, "kubelet", "start"))  # fmt: skip
        with_failure(env, "one etcd member stopped", "etcd-not-running", service(cp, "etcd", "stop"),
                     service(cp, "etcd", "start"))  # fmt: skip

        def scheduler_flag(value: object) -> Callable[[], None]:
            path = "/cluster/scheduler/extraArgs"
            op = (
                {"op": "remove", "path": path}
                if value is None
                else {"op": "add", "path": path, "value": value}
            )

            def patch() -> None:
                run(env, "-n", cp, "patch", "mc", "--immediate", "-p", json.dumps([op]))

            return patch

        with_failure(env, "kube-scheduler crash-looping", "component-not-running",
                     scheduler_flag({"no-such-flag": "1"}), scheduler_flag(None))  # fmt: skip
    finally:
        subprocess.run(
            [KUBEPLANE, "cluster", "destroy", "--name", NAME], env=env, capture_output=True, check=False
        )


if __name__ == "__main__":
    main()
