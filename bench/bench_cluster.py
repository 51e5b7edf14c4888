"""Benchmark of local clusters through the CLI; prints figures, asserts nothing.

(a) 1 control plane + 1 worker: ``cluster create`` wall time until healthy, and ``destroy`` time
    (target from issue 21: 30 s with the toolchain cached);
(b) 3 control planes + 1 worker: time until healthy (target 60 s), and the RSS sum of every
    process of the cluster (agents, what runs in each node's namespace or kubelet cgroup, haproxy,
    registry).

Each create also gets a per-phase breakdown, every figure in seconds since the command started,
so a slow create shows where its time went. The marks come from what is observable from outside:

- the CLI's plain progress lines on stderr (``[i/n] ...`` / `` < done``), timestamped as they
  arrive: ``network``, ``registry``, ``agents up`` (every node's agent answers in maintenance
  mode), ``configs applied``, ``etcd bootstrapped``;
- the control plane agent's log (read after the create): ``etcd healthy`` (its first passing health
  check) and ``static pods written`` (the manifests handed to the kubelet);
- a poller of the Kubernetes API through the cluster's kubeconfig once it exists: ``API ready``
  (``/readyz`` through the load balancer), ``kubelet certs issued`` (a signed kubelet client CSR per
  node), ``nodes registered``, ``nodes Ready``, ``control plane pods Ready`` and ``DNS endpoint
  ready``;
- a DNS query for ``kubernetes.default`` sent to the cluster DNS Service from this host (a local
  cluster's Service subnet is routed to it): ``DNS answering``;
- ``healthy``: the create command returned.

Runs as root with the toolchain built; state and client config go to a temporary directory.
Run: sudo .venv/bin/python bench/bench_cluster.py [--sizes 1+1] [--repeat 3]
The reported figure is the median of the repeats, per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import fcntl
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubeplane.clients import kube
from kubeplane.provision import cluster as cluster_mod
from kubeplane.provision import hostproc, leftovers, state

KUBEPLANE = str(Path(sys.executable).with_name("kubeplane"))
#: Seconds between two polls of the Kubernetes API (and DNS queries) while a create runs.
POLL = 0.25
#: The phases in the order they normally happen (a phase not seen in a run is left out).
PHASES = (
    "network",
    "registry",
    "agents up",
    "configs applied",
    "etcd bootstrapped",
    "etcd healthy",
    "static pods written",
    "API ready",
    "kubelet certs issued",
    "nodes registered",
    "nodes Ready",
    "control plane pods Ready",
    "DNS endpoint ready",
    "DNS answering",
    "healthy",
)
#: Progress step (its headline after ``[i/n] ``) → the phase its `` < done`` line ends.
STEP_PHASES = {
    "create network": "network",
    "start registry": "registry",
    "start master nodes": "agents up",
    "start worker nodes": "agents up",
    "apply configs": "configs applied",
    "bootstrap etcd": "etcd bootstrapped",
}
#: Agent log line → phase (the first matching line counts).
LOG_PHASES = {
    "service etcd: [Running] Health check successful": "etcd healthy",
    "KubeletStaticPodController: wrote static pod": "static pods written",
}
#: The query of ``DNS answering``, run with the Python of this benchmark.
DNS_PROBE = """
import sys, time, dns.message, dns.query, dns.rcode
query = dns.message.make_query("kubernetes.default.svc.cluster.local", "A")
while True:
    try:
        reply = dns.query.udp(query, sys.argv[1], timeout=0.5)
        if reply.rcode() == dns.rcode.NOERROR and reply.answer:
            print(time.time(), flush=True)
            break
    except Exception:
        pass
    time.sleep(float(sys.argv[2]))
"""


class Marks:
    """Seconds since the start at which each phase was first seen (thread-safe, first mark wins)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def mark(self, phase: str, at: float | None = None) -> None:
        with self._lock:
            self.seen.setdefault(phase, (time.time() if at is None else at) - self.started)


def follow_progress(stream: Any, marks: Marks, lines: list[str]) -> None:
    """Read the CLI's progress lines as they come; a step's `` < done`` marks its phase (the last
    step of a phase, e.g. the worker nodes after the master nodes, moves the mark on)."""
    current: str | None = None
    for line in stream:
        lines.append(line)
        step = re.match(r"\[\d+/\d+\] (\S+ \S+(?: \S+)?)", line)
        if step is not None:
            current = next((phase for head, phase in STEP_PHASES.items() if step[1].startswith(head)), None)
        elif line.startswith(" < done") and current is not None:
            with marks._lock:
                marks.seen[current] = time.time() - marks.started
            current = None


def poll_cluster(
    kubeconfig: Path, nodes: int, controlplanes: int, marks: Marks, stop: threading.Event
) -> None:
    """Poll the API once the kubeconfig exists until everything is marked or ``stop`` is set."""
    while not stop.is_set() and not kubeconfig.exists():
        time.sleep(POLL)
    if stop.is_set():
        return
    text = kubeconfig.read_text()
    checks: list[tuple[str, Callable[[kube.KubeClient], Any]]] = [
        ("API ready", _readyz),
        ("kubelet certs issued", lambda api: _certs_issued(api, nodes)),
        ("nodes registered", lambda api: _nodes(api, nodes, ready=False)),
        ("nodes Ready", lambda api: _nodes(api, nodes, ready=True)),
        ("control plane pods Ready", lambda api: _control_plane_pods(api, controlplanes)),
        ("DNS endpoint ready", _dns_endpoint),
    ]

    async def loop() -> None:
        async with kube.KubeClient(text, timeout=2.0) as api:
            while not stop.is_set() and any(name not in marks.seen for name, _ in checks):
                for name, check in checks:
                    if name in marks.seen:
                        continue
                    try:
                        if await check(api):
                            marks.mark(name)
                    except Exception:  # not up yet: the next poll asks again
                        pass
                await asyncio.sleep(POLL)

    asyncio.run(loop())


async def _readyz(api: kube.KubeClient) -> bool:
    status, _ = await api.raw_get("/readyz")
    return status == 200


async def _certs_issued(api: kube.KubeClient, nodes: int) -> bool:
    csrs = await api.list("/apis/certificates.k8s.io/v1/certificatesigningrequests")
    signer = "kubernetes.io/kube-apiserver-client-kubelet"
    issued = [
        c
        for c in csrs
        if c["spec"].get("signerName") == signer and (c.get("status") or {}).get("certificate")
    ]
    return len(issued) >= nodes


async def _nodes(api: kube.KubeClient, nodes: int, *, ready: bool) -> bool:
    found = await api.list("/api/v1/nodes")
    if ready:
        found = [n for n in found if kube.is_ready(n)]
    return len(found) >= nodes


async def _control_plane_pods(api: kube.KubeClient, controlplanes: int) -> bool:
    pods = await api.list("/api/v1/namespaces/kube-system/pods")
    components = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    ready = [
        p
        for p in pods
        if (p["metadata"].get("labels") or {}).get("k8s-app") in components and kube.is_ready(p)
    ]
    return len(ready) >= len(components) * controlplanes


async def _dns_endpoint(api: kube.KubeClient) -> bool:
    endpoints = await api.get_or_none("/api/v1/namespaces/kube-system/endpoints/kube-dns")
    return any(subset.get("addresses") for subset in (endpoints or {}).get("subsets") or ())


def probe_dns(kubeconfig: Path, marks: Marks, stop: threading.Event) -> None:
    """Once the kube-dns Service exists, query it from this host (which routes the cluster's
    Service subnet to it) until it answers."""
    address = None
    while not stop.is_set() and address is None:
        time.sleep(POLL)
        if kubeconfig.exists():
            try:
                service = asyncio.run(_dns_service(kubeconfig.read_text()))
            except Exception:
                continue
            address = (service or {}).get("spec", {}).get("clusterIP")
    if address is None:
        return
    argv = [sys.executable, "-c", DNS_PROBE, address, str(POLL)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as probe:
        while probe.poll() is None and not stop.is_set():
            time.sleep(POLL)
        if probe.poll() is None:
            probe.kill()
        answered = (probe.communicate()[0] or "").strip()
        if answered:
            marks.mark("DNS answering", float(answered))


async def _dns_service(text: str) -> dict[str, Any] | None:
    async with kube.KubeClient(text, timeout=2.0) as api:
        return await api.get_or_none("/api/v1/namespaces/kube-system/services/kube-dns")


def agent_log_marks(log: Path, marks: Marks) -> None:
    """The first time each :data:`LOG_PHASES` line shows in an agent log (local time stamps)."""
    if not log.exists():
        return
    for line in log.read_text(errors="replace").splitlines():
        for needle, phase in LOG_PHASES.items():
            if needle in line and phase not in marks.seen:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                marks.mark(phase, stamp.timestamp())


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


def create(
    env: dict[str, str], *, name: str, cidr: str, controlplanes: int, workers: int, keep_logs: Path | None
) -> Marks | None:
    """One create with its phase marks (None when it failed); destroys the cluster after, having
    copied its logs (the agents' and every node's services') below ``keep_logs`` if given."""
    label = f"{controlplanes}+{workers}"
    root = Path(env["KUBEPLANE_STATE"])
    args = ["cluster", "create", "--name", name, "--cidr", cidr]
    args += ["--controlplanes", str(controlplanes), "--workers", str(workers), "--wait-timeout", "5m"]
    kubeconfig = root / name / "kubeconfig"
    marks, stop = Marks(), threading.Event()
    lines: list[str] = []
    try:
        with subprocess.Popen(
            [KUBEPLANE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as command:
            threads = [
                threading.Thread(target=follow_progress, args=(command.stdout, marks, lines)),
                threading.Thread(
                    target=poll_cluster,
                    args=(kubeconfig, controlplanes + workers, controlplanes, marks, stop),
                ),
                threading.Thread(target=probe_dns, args=(kubeconfig, marks, stop)),
            ]
            for thread in threads:
                thread.start()
            returncode = command.wait()
            marks.mark("healthy")
            # What the poller has not seen yet by now, it sees within a few polls.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not {"nodes Ready", "DNS answering"} <= marks.seen.keys():
                time.sleep(POLL)
            stop.set()
            for thread in threads:
                thread.join()
        if returncode != 0:
            print(f"{label}: create FAILED after {marks.seen['healthy']:.1f}s:\n  " + "  ".join(lines[-8:]))
            return None
        if cluster_mod.exists(name, state_root=root):
            cluster = state.ClusterState.load(name, root=root)
            agent_log_marks(root / name / "logs" / f"{cluster.nodes[0].name}.log", marks)
            print(
                f"{label}: create to healthy {marks.seen['healthy']:.1f}s, "
                f"RSS of all cluster processes {cluster_rss_mib(name, root):.0f} MiB"
            )
        return marks
    finally:
        stop.set()
        if keep_logs is not None and cluster_mod.exists(name, state_root=root):
            copy_logs(root / name, keep_logs / f"{name}-{time.strftime('%H%M%S')}")
        elapsed, result = kubeplane(env, "cluster", "destroy", "--name", name)
        print(
            f"{label}: destroy {elapsed:.1f}s"
            + ("" if result.returncode == 0 else f" FAILED: {result.stderr}")
        )


def copy_logs(cluster: Path, target: Path) -> None:
    """The cluster's own logs and each node's ``var/log/kubeplane`` (kubelet, containerd, etcd...)."""
    shutil.copytree(cluster / "logs", target)
    for node in (cluster / "nodes").iterdir():
        logs = node / "var/log/kubeplane"
        if logs.is_dir():
            shutil.copytree(logs, target / node.name)


def report(label: str, runs: list[Marks]) -> None:
    """The median of each phase over ``runs``, with the gap since the phase before it."""
    print(f"{label}: phases, median of {len(runs)} run(s), seconds since `cluster create` started")
    previous = 0.0
    for phase in sorted(PHASES, key=lambda p: statistics.median(_seen(runs, p)) if _seen(runs, p) else 1e9):
        seen = _seen(runs, phase)
        if not seen:
            continue
        at = statistics.median(seen)
        spread = f"  (runs: {', '.join(f'{s:.1f}' for s in seen)})" if len(seen) > 1 else ""
        print(f"  {phase:<26} {at:6.1f}  +{at - previous:5.1f}{spread}")
        previous = at


def _seen(runs: list[Marks], phase: str) -> list[float]:
    return [run.seen[phase] for run in runs if phase in run.seen]


@contextlib.contextmanager
def held(path: Path | None) -> Iterator[None]:
    """An exclusive flock on ``path`` (nothing without one): a machine shared with other heavy
    runs gets one measurement at a time, and they get their turn between the repeats."""
    if path is None:
        yield
        return
    with path.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


SIZES = {"1+1": ("bspeed1", "10.5.41.0/24", 1, 1), "3+1": ("bspeed3", "10.5.43.0/24", 3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1+1,3+1", help="comma-separated, of: " + ", ".join(SIZES))
    parser.add_argument("--repeat", type=int, default=1, help="creates per size (the median is reported)")
    parser.add_argument("--keep-logs", type=Path, help="copy each cluster's logs below this directory")
    parser.add_argument(
        "--lock", type=Path, help="a file to hold a lock on (flock) during each create and destroy"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kpbench") as tmp:
        env = {**os.environ, "KUBEPLANE_STATE": f"{tmp}/s", "KUBEPLANECONFIG": f"{tmp}/config"}
        for size in options.sizes.split(","):
            name, cidr, controlplanes, workers = SIZES[size]
            runs = []
            for _ in range(options.repeat):
                with held(options.lock):
                    marks = create(
                        env,
                        name=name,
                        cidr=cidr,
                        controlplanes=controlplanes,
                        workers=workers,
                        keep_logs=options.keep_logs,
                    )
                if marks is not None:
                    runs.append(marks)
            if runs:
                report(size, runs)


if __name__ == "__main__":
    main()
