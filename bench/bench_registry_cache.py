"""Benchmark of the pull through cache guide: ``cluster create`` 1+1 through cold caches, then
through warm ones; prints figures, asserts nothing.

The internet registries are played by an *upstream* ``docker-registry`` on loopback holding a
copy of the images local clusters run (the registry storage ``cluster create`` keeps in the
toolchain cache); one cache per upstream host (``kubeplane registry cache start``: docker.io and
k8s.gcr.io, the hosts local clusters pull from) and the clusters are created with
``--registry-mirror HOST=http://BRIDGE:PORT`` for each, as the guide shows. Each repeat:

1. *cold*: caches purged and started empty; create (every image is fetched from the upstream
   through the caches), destroy;
2. *warm*: the same caches, the upstream still up (the guide's "second boot"): create, destroy;
3. *warm, upstream stopped*: the cluster can only come up from what the caches kept; create,
   destroy; the upstream is started again for the next repeat.

Per create: wall time to healthy, and the bytes the upstream sent (from its access log; 0 for the
warm run, whose upstream is down) and the caches sent to the nodes. A loopback upstream costs the
cold run only the caches' fetch-and-store; an internet upstream adds its download time on top,
which is what the guide's "next cluster boot should be much faster" is about.

Runs as root with the toolchain built and a cluster created once before (for the storage copy);
state, client config and caches go to a temporary directory.
Run: sudo .venv/bin/python bench/bench_registry_cache.py [--repeat 3] [--lock FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import sys
import tempfile
from pathlib import Path

from bench_cluster import held, kubeplane
from kubeplane.config import toolchain_cache
from kubeplane.provision import registry, toolchain

NAME, CIDR, BRIDGE = "bcache", "10.5.55.0/24", "10.5.55.1"
HOSTS = ("docker.io", "k8s.gcr.io")
STOPPED = "warm, upstream stopped"
LABELS = ("cold", "warm", STOPPED)
LOOPBACK = "127.0.0.1"
ANY = "0.0.0.0"
#: The bytes-sent field of a GET line of the registry's (combined format) access log.
_SENT = re.compile(r'"GET /v2/\S+ [^"]*" 200 (\d+) ')


def free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def bytes_sent(log: Path, *, skip: int = 0) -> tuple[int, int]:
    """Bytes sent for 200 GETs in ``log`` after its first ``skip`` lines, and its line count."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return sum(int(m[1]) for line in lines[skip:] if (m := _SENT.search(line))), len(lines)


def create(env: dict[str, str], mirrors: list[str], label: str) -> float | None:
    args = ["cluster", "create", "--name", NAME, "--cidr", CIDR, "--wait-timeout", "5m"]
    args += [arg for mirror in mirrors for arg in ("--registry-mirror", mirror)]
    try:
        elapsed, result = kubeplane(env, *args)
        if result.returncode != 0:
            print(f"{label}: create FAILED after {elapsed:.1f}s:\n{result.stderr[-2000:]}")
            return None
        return elapsed
    finally:
        took, destroyed = kubeplane(env, "cluster", "destroy", "--name", NAME)
        if destroyed.returncode != 0:
            print(f"{label}: destroy FAILED ({took:.1f}s): {destroyed.stderr}")


def one_repeat(
    env: dict[str, str], upstream: registry.Registry, root: Path, lock: Path | None
) -> dict[str, float]:
    figures: dict[str, float] = {}
    kubeplane(env, "registry", "cache", "stop", "--purge", "--root", str(root))
    upstream.start()
    ports = {}
    for host in HOSTS:
        ports[host] = free_port(ANY)
        _, started = kubeplane(
            env, "registry", "cache", "start", "--name", host, "--upstream", upstream.url,
            "--port", str(ports[host]), "--root", str(root),
        )  # fmt: skip
        if started.returncode != 0:
            sys.exit(f"cannot start the {host} cache: {started.stderr}")
    mirrors = [f"{host}=http://{BRIDGE}:{port}" for host, port in ports.items()]
    logs = [root / host / "registry.log" for host in HOSTS]
    for label in LABELS:
        if label == STOPPED:
            upstream.stop()  # this cluster comes up from the caches alone
        before_up = bytes_sent(upstream.log)[1]
        before = [bytes_sent(log)[1] for log in logs]
        with held(lock):
            elapsed = create(env, mirrors, label)
        if elapsed is None:
            continue
        from_upstream = bytes_sent(upstream.log, skip=before_up)[0]
        to_nodes = sum(bytes_sent(log, skip=skip)[0] for log, skip in zip(logs, before, strict=True))
        print(
            f"{label}: create 1+1 to healthy {elapsed:.1f}s; upstream sent {from_upstream / 2**20:.1f} MiB, "
            f"the caches sent the nodes {to_nodes / 2**20:.1f} MiB"
        )
        figures[label] = elapsed
    kubeplane(env, "registry", "cache", "stop", "--purge", "--root", str(root))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=1, help="cold, warm and warm-offline runs each (the median is reported)"
    )
    parser.add_argument("--lock", type=Path, help="a file to hold a lock on (flock) during each create")
    options = parser.parse_args()
    # A SIGTERM unwinds like Ctrl-C: the clusters, caches and upstream are taken down on the way.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = toolchain.Toolchain().require("v1.20.2").root.parent.parent / toolchain_cache.REGISTRY_STORAGE_DIR
    with tempfile.TemporaryDirectory(prefix="kpbench") as tmp:
        env = {**os.environ, "KUBEPLANE_STATE": f"{tmp}/s", "KUBEPLANECONFIG": f"{tmp}/config"}
        upstream = registry.Registry(
            directory=Path(tmp) / "upstream", address=LOOPBACK, port=free_port(LOOPBACK)
        )
        if not registry.restore_storage(seed, upstream.storage):
            sys.exit(f"no registry storage copy in {seed}: create a local cluster once first")
        runs = []
        try:
            for _ in range(options.repeat):
                runs.append(one_repeat(env, upstream, Path(tmp) / "caches", options.lock))
        finally:
            kubeplane(env, "registry", "cache", "stop", "--purge", "--root", str(Path(tmp) / "caches"))
            upstream.stop()
        for label in LABELS:
            seen = [run[label] for run in runs if label in run]
            if seen:
                spread = ", ".join(f"{s:.1f}" for s in seen)
                print(
                    f"{label}: median create 1+1 to healthy {statistics.median(seen):.1f}s (runs: {spread})"
                )


if __name__ == "__main__":
    main()
