"""Benchmark of control plane formation on a real local cluster; prints figures, asserts nothing.

Creates a 3 control plane + 0 worker cluster with ``cluster create --no-wait`` (which returns
right after the first node's ``bootstrap`` call), then measures through the CLI and kubectl:

(a) bootstrap → all three static pods Ready on the bootstrap node (issue 5's "config applied to
    static pods Ready" is this plus the sub-second config → secrets → static pod file chain);
(b) bootstrap → the first Kubernetes node Ready;
(c) bootstrap → all three etcd members started, and per joining node the time from its etcd
    service's first start to its first successful health check (the join).

Runs as root with the toolchain built; state and client config go to a temporary directory.
Run: .venv/bin/python bench/bench_bootstrap.py
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubeplane.provision import toolchain

KUBEPLANE = str(Path(sys.executable).with_name("kubeplane"))
NAME, CIDR = "benchbs", "10.5.83.0/24"
NODES = ("10.5.83.2", "10.5.83.3", "10.5.83.4")


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBEPLANE, *args], env=env, capture_output=True, text=True, check=False)


def lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def wait(what: str, check: Callable[[], bool], *, since: float, timeout: float = 300) -> float:
    while time.monotonic() - since < timeout:
        if check():
            return time.monotonic() - since
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> None:
    kubectl = str(toolchain.Toolchain().require("v1.20.2").binary("kubectl"))
    with tempfile.TemporaryDirectory(prefix="kp-bench-") as tmp:
        env = {**os.environ, "KUBEPLANE_STATE": f"{tmp}/s", "KUBEPLANECONFIG": f"{tmp}/config"}
        try:
            args = ("cluster", "create", "--name", NAME, "--cidr", CIDR, "--controlplanes", "3")
            created = run(env, *args, "--workers", "0", "--no-wait")
            if created.returncode != 0:
                raise SystemExit(f"create failed:\n{created.stdout}\n{created.stderr}")
            since = time.monotonic()
            kubeconfig = f"{tmp}/s/{NAME}/kubeconfig"

            def static_pods_ready() -> bool:
                statuses = lines(run(env, "-n", NODES[0], "get", "staticpodstatus", "-o", "json"))
                return len(statuses) == 3 and all(
                    any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in s["spec"]["podStatus"]["conditions"]
                    )
                    for s in statuses
                )

            def node_ready() -> bool:
                result = subprocess.run(
                    [kubectl, "--kubeconfig", kubeconfig, "get", "nodes", "-o", "json"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if result.returncode != 0:
                    return False
                return any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for n in json.loads(result.stdout)["items"]
                    for c in n["status"]["conditions"]
                )

            def members_started() -> bool:
                members = lines(run(env, "-n", NODES[0], "etcd", "members", "-o", "json"))
                return len(members) == 3 and all(m.get("name") for m in members)

            pods = wait("static pods", static_pods_ready, since=since)
            print(f"(a) bootstrap -> 3 static pods Ready: {pods:.1f}s")
            print(f"(b) bootstrap -> first node Ready: {wait('a Ready node', node_ready, since=since):.1f}s")
            members = wait("members", members_started, since=since)
            print(f"(c) bootstrap -> 3 etcd members started: {members:.1f}s")
            for node in NODES[1:]:
                (etcd,) = [s for s in lines(run(env, "-n", node, "service", "etcd", "-o", "json"))]
                events = etcd.get("events", [])
                started = next(e for e in events if "Started task" in e["message"])
                healthy = next(e for e in events if e["message"] == "Health check successful")
                seconds = (stamp(healthy) - stamp(started)).total_seconds()
                print(f"    etcd join of {node}: {seconds:.1f}s from start to healthy")
        finally:
            run(env, "cluster", "destroy", "--name", NAME)


def stamp(event: dict[str, Any]) -> datetime.datetime:
    value = event.get("ts", event.get("timestamp"))
    if isinstance(value, int | float):
        return datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
    return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


if __name__ == "__main__":
    main()
