"""Benchmark of local clusters through the CLI; prints figures, asserts nothing.

(a) 1 control plane + 1 worker: ``cluster create`` wall time until healthy, and ``destroy`` time
    (target from the issue: create under 60 s with the toolchain cached);
(b) 3 control planes + 1 worker: time until healthy, and the RSS sum of every process of the
    cluster (agents, what runs in each node's namespace or kubelet cgroup, haproxy, registry).

Runs as root with the toolchain built; state and client config go to a temporary directory.
Run: sudo .venv/bin/python bench/bench_cluster.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubeplane.provision import cluster as cluster_mod
from kubeplane.provision import hostproc, leftovers, state

KUBEPLANE = str(Path(sys.executable).with_name("kubeplane"))


def kubeplane(env: dict[str, str], *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    result = subprocess.run([KUBEPLANE, *args], env=env, capture_output=True, text=True, check=False)
    return time.monotonic() - started, result


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cluster_rss_mib(name: str, root: Path) -> float:
    cluster = state.ClusterState.load(name, root=root)
    pids = {r.pid for r in cluster.processes.values() if hostproc.is_running(r)}
    for node in cluster.nodes:
        pids |= {r.pid for r in node.processes.values() if hostproc.is_running(r)}
        pids |= set(leftovers.node_processes(node))
    return sum(rss_kib(pid) for pid in pids) / 1024


def measure(env: dict[str, str], *, name: str, cidr: str, controlplanes: int, workers: int) -> None:
    label = f"{controlplanes}+{workers}"
    args = ["cluster", "create", "--name", name, "--cidr", cidr]
    args += ["--controlplanes", str(controlplanes), "--workers", str(workers), "--wait-timeout", "5m"]
    try:
        elapsed, result = kubeplane(env, *args)
        if result.returncode != 0:
            last = (result.stdout + result.stderr).strip().splitlines()[-8:]
            print(f"{label}: create FAILED after {elapsed:.1f}s:\n  " + "\n  ".join(last))
        else:
            print(f"{label}: create to healthy {elapsed:.1f}s (target for 1+1: < 60 s)")
        root = Path(env["KUBEPLANE_STATE"])
        if cluster_mod.exists(name, state_root=root):
            print(f"{label}: RSS of all cluster processes {cluster_rss_mib(name, root):.0f} MiB")
    finally:
        elapsed, result = kubeplane(env, "cluster", "destroy", "--name", name)
        print(
            f"{label}: destroy {elapsed:.1f}s"
            + ("" if result.returncode == 0 else f" FAILED: {result.stderr}")
        )


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kpbench") as tmp:
        env = {**os.environ, "KUBEPLANE_STATE": f"{tmp}/s", "KUBEPLANECONFIG": f"{tmp}/config"}
        measure(env, name="bench1", cidr="10.5.31.0/24", controlplanes=1, workers=1)
        measure(env, name="bench3", cidr="10.5.33.0/24", controlplanes=3, workers=1)


if __name__ == "__main__":
    main()
