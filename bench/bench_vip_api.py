"""Benchmark of the API through a shared VIP while its owner goes; prints figures, asserts nothing.

Issue 17's figure, on a real local cluster: ``cluster create --vip`` with three control plane
nodes, then ROUNDS graceful losses of the VIP's owner (its agent's SIGTERM: it gives the VIP up,
then stops its services) and ROUNDS ungraceful ones (SIGKILL of the agent and of everything its
node runs, as a power cut), alternating; after each, the lost node is started again and the
cluster's health awaited before the next round (so a loss never costs etcd its quorum).

A client lists kube-system pods through ``https://VIP:6443`` every 50 ms on a kept-alive
connection (2 s to answer, 0.5 s to connect, so a request sent while no node has the address
does not hide the new owner's first answer behind its timeout; a failed request opens a new
connection on the next try). Per round:
the new owner's delay (loss → the first 50 ms sample of the nodes' interfaces in which another
node holds the VIP) and the API gap: the longest time between two answered requests around the
loss, i.e. the last answer served by the old owner to the first answered through the new one.
p50 and max per kind, failed requests, and in how many rounds the lost owner also led etcd (a
power cut of the etcd leader costs an etcd election first). bench/bench_vip.py times the election
alone (three processes on a real etcd, without the API).

Anchors: kube-vip about 3 s, keepalived 3-4 s at its default advert interval, the original up to
60 s (its etcd session TTL); targets: graceful under 1 s, ungraceful under 3 s.

Runs as root with the toolchain built; state and client config go to a temporary directory.
Run: sudo .venv/bin/python bench/bench_vip_api.py [--rounds 10] [--cidr 10.5.47.0/24]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench_kubeadm import KUBEPLANE, clean_up, run, tls_context
from kubeplane.provision import create, netns, state, teardown

NAME = "bvip"


class Poller:
    """Lists kube-system pods through the VIP every 50 ms; keeps when each answer arrived."""

    def __init__(self, kubeconfig: Path, server: str) -> None:
        _, context = tls_context(kubeconfig)
        self._client = httpx.Client(base_url=server, verify=context, timeout=httpx.Timeout(2, connect=0.5))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.answered: list[float] = []
        self.failed: list[float] = []

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._client.get(
                    "/api/v1/namespaces/kube-system/pods", params={"limit": 1}
                ).raise_for_status()
                self.answered.append(time.monotonic())
            except Exception:
                self.failed.append(time.monotonic())
            self._stop.wait(0.05)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._client.close()

    def gap(self, start: float, end: float) -> float:
        """The longest time between two answers in [start, end] (and the ones just around it)."""
        times = [t for t in self.answered if start <= t <= end]
        before = [t for t in self.answered if t < start][-1:]
        after = [t for t in self.answered if t > end][:1]
        times = before + times + after
        return max((b - a for a, b in itertools.pairwise(times)), default=end - start)


def holders(cluster: state.ClusterState, vip: str) -> list[str]:
    """The nodes whose cluster interface has the VIP now."""
    found = []
    for node in cluster.nodes:
        shown = subprocess.run(
            ["ip", "-n", node.netns, "-4", "-o", "addr", "show", "dev", netns.NODE_INTERFACE],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        if f"inet {vip}/" in shown:
            found.append(node.name)
    return found


def wait_for(what: str, check: object, *, timeout: float, period: float = 0.05) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(period)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def etcd_leader(cluster: state.ClusterState, env: dict[str, str]) -> str:
    """The name of the member leading etcd, as the first answering control plane node sees it."""
    for node in cluster.nodes:
        listed = subprocess.run(
            [KUBEPLANE, "--context", NAME, "-n", node.ip, "etcd", "members", "-o", "json"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=False,
        )
        if listed.returncode == 0:
            members = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
            return next((str(m["name"]) for m in members if m.get("leader")), "")
    return ""


def lose_owner(
    kind: str, *, root: Path, cluster: state.ClusterState, vip: str, poller: Poller, env: dict[str, str]
) -> tuple[float, float, int, bool]:
    """Lose the VIP's owner (``graceful`` or ``ungraceful``), then start it again and wait for the
    cluster's health: (seconds to a new owner, API gap, failed requests, whether the owner led etcd)."""
    wait_for("one owner of the VIP", lambda: len(holders(cluster, vip)) == 1, timeout=120)
    (owner,) = holders(cluster, vip)
    led = etcd_leader(cluster, env) == owner
    lost = state.ClusterState.load(NAME, root=root).node(owner)
    failed_before = len(poller.failed)
    stopping = None
    lost_at = time.monotonic()
    if kind == "graceful":
        stopping = threading.Thread(target=teardown.stop_node, args=(lost,), daemon=True)
        stopping.start()
    else:
        teardown.power_off(lost)
    moved = wait_for("another owner", lambda: [h for h in holders(cluster, vip) if h != owner], timeout=60)
    wait_for("an answer through the new owner", lambda: poller.answered[-1:] > [moved], timeout=60)
    time.sleep(2.5)  # requests sent to the old owner time out within 2 s
    result = (moved - lost_at, poller.gap(lost_at - 1.0, moved), len(poller.failed) - failed_before, led)
    if stopping is not None:
        stopping.join(timeout=120)
    create.power_on(state.ClusterState.load(NAME, root=root), owner)
    health = subprocess.run(
        [KUBEPLANE, "--context", NAME, "health", "--wait-timeout", "5m"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if health.returncode != 0:
        raise SystemExit(f"not healthy again after losing {owner}:\n{health.stdout}{health.stderr}")
    return result


def summary(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.2f}s, max {max(values):.2f}s" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="losses of each kind (default 10)")
    parser.add_argument("--cidr", default="10.5.47.0/24", help="the cluster's network")
    options = parser.parse_args()
    vip = options.cidr.rsplit(".", 1)[0] + ".250"
    work = Path(tempfile.mkdtemp(prefix="bench-vip-api-"))
    root = work / "state"
    env = {"KUBEPLANE_STATE": str(root), "KUBEPLANECONFIG": str(work / "config")}
    figures: dict[str, list[tuple[float, float, int, bool]]] = {"graceful": [], "ungraceful": []}
    try:
        seconds, _, _ = run(
            env, "cluster", "create", "--name", NAME, "--cidr", options.cidr,
            "--controlplanes", "3", "--workers", "0", "--vip", vip,
        )  # fmt: skip
        print(f"cluster create --vip, 3 control plane nodes: {seconds:.1f}s")
        cluster = state.ClusterState.load(NAME, root=root)
        with Poller(root / NAME / "kubeconfig", f"https://{vip}:6443") as poller:
            for index in range(2 * options.rounds):
                kind = ("graceful", "ungraceful")[index % 2]
                row = lose_owner(kind, root=root, cluster=cluster, vip=vip, poller=poller, env=env)
                figures[kind].append(row)
                moved, gap, failures, led = row
                print(
                    f"  {index + 1:2d} {kind:10s}: new owner after {moved:.2f}s, API gap {gap:.2f}s, "
                    f"{failures} failed requests{', the owner led etcd' if led else ''}",
                    flush=True,
                )
            requests = len(poller.answered) + len(poller.failed)
        print(f"API poller through the VIP: {requests} requests, {len(poller.failed)} failed")
        for kind, rows in figures.items():
            print(
                f"{kind} ({len(rows)}): new owner {summary([r[0] for r in rows])}; "
                f"API gap {summary([r[1] for r in rows])}; "
                f"failed requests per loss: max {max((r[2] for r in rows), default=0)}; "
                f"the owner led etcd in {sum(r[3] for r in rows)}"
            )
    finally:
        clean_up(env, [NAME], work)


if __name__ == "__main__":
    main()
