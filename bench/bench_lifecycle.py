"""Benchmark of a node's day-2 life through the CLI (issue 18); prints figures, asserts nothing.

On a local 3 control plane + 1 worker cluster:

(a) reset and rejoin of a control plane node, ROUNDS times: ``kubeplane -n NODE reset --reboot``
    (graceful: cordon, drain, leave etcd, wipe; the node comes back in maintenance mode), then
    ``apply-config --insecure`` with the config it had, until ``kubeplane health`` passes (it
    rejoined etcd as a voter, its Node is Ready): seconds for each;
(b) a rolling agent upgrade of all four nodes with ``kubeplane upgrade --path`` (a copy of this
    source under another version, put in each node's uploads directory), seconds per node as
    the command reports them ("upgraded and back in"), while a client lists pods through the
    endpoint every 0.1 s: requests, failures, longest gap.

Runs as root with the toolchain built; state and client config go to a temporary directory.
Run: sudo .venv/bin/python bench/bench_lifecycle.py [--rounds 3] [--cidr 10.5.48.0/24]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

import kubeplane
from bench_kubeadm import KUBEPLANE, Poller, clean_up, run
from kubeplane.provision import state

NAME = "blife"
BUILD = "/var/lib/kubeplane/uploads/bench"
BACK = re.compile(r"^node (?P<node>\S+): upgraded and back in (?P<seconds>[\d.]+)s$")


def cli(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [KUBEPLANE, "--context", NAME, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"kubeplane {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def timed(env: dict[str, str], *args: str) -> float:
    started = time.monotonic()
    cli(env, *args)
    return time.monotonic() - started


def put_build(root_dir: str, version: str) -> None:
    """This source with another version string, in the node's uploads directory."""
    target = Path(root_dir) / BUILD.lstrip("/") / "kubeplane"
    shutil.rmtree(target.parent, ignore_errors=True)
    shutil.copytree(Path(kubeplane.__file__).parent, target, ignore=shutil.ignore_patterns("__pycache__"))
    init = target / "__init__.py"
    init.write_text(
        init.read_text().replace(f'__version__ = "{kubeplane.__version__}"', f'__version__ = "{version}"')
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="resets and rejoins (default 3)")
    parser.add_argument("--cidr", default="10.5.48.0/24", help="the cluster's network")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-lifecycle-"))
    root = work / "state"
    env = {"KUBEPLANE_STATE": str(root), "KUBEPLANECONFIG": str(work / "config")}
    try:
        seconds, _, _ = run(
            env, "cluster", "create", "--name", NAME, "--cidr", options.cidr,
            "--controlplanes", "3", "--workers", "1",
        )  # fmt: skip
        print(f"cluster create 3+1: {seconds:.1f}s")
        cluster = state.ClusterState.load(NAME, root=root)
        control_plane = [n.ip for n in cluster.nodes if n.role == "controlplane"]
        node = control_plane[-1]
        shown = cli(env, "-n", node, "get", "mc", "-o", "json")
        saved = work / "controlplane.yaml"
        saved.write_text(yaml.safe_dump(json.loads(shown.splitlines()[0])["spec"], sort_keys=False))

        resets, rejoins = [], []
        for index in range(options.rounds):
            resets.append(timed(env, "-n", node, "reset", "--reboot"))
            started = time.monotonic()
            cli(env, "-n", node, "apply-config", "--insecure", "--file", str(saved))
            cli(env, "health", "--wait-timeout", "5m")
            rejoins.append(time.monotonic() - started)
            print(f"  {index + 1}: reset {resets[-1]:.1f}s, rejoin to healthy {rejoins[-1]:.1f}s", flush=True)
        print(
            f"(a) reset of a control plane node: median {statistics.median(resets):.1f}s, "
            f"max {max(resets):.1f}s; rejoin to healthy: median {statistics.median(rejoins):.1f}s, "
            f"max {max(rejoins):.1f}s ({options.rounds} rounds)"
        )

        for record in state.ClusterState.load(NAME, root=root).nodes:
            put_build(record.root_dir, f"{kubeplane.__version__}+bench")
        nodes = [n.ip for n in cluster.nodes]
        shown_cluster = json.loads(cli(env, "cluster", "show", "--name", NAME, "-o", "json"))
        poller = Poller(root / NAME / "kubeconfig", shown_cluster["endpoint"])
        poller.start()
        started = time.monotonic()
        output = cli(env, "-n", ",".join(nodes), "upgrade", "--path", BUILD)
        total = time.monotonic() - started
        poller.stop()
        per_node = [float(m["seconds"]) for line in output.splitlines() if (m := BACK.match(line))]
        print(
            f"(b) rolling agent upgrade of {len(nodes)} nodes: {total:.1f}s in all; per node "
            f"{', '.join(f'{s:.1f}' for s in per_node)}s (median {statistics.median(per_node):.1f}s)"
        )
        print(
            f"    API poller through the endpoint: {poller.requests} requests, {len(poller.failures)} "
            f"failed, longest gap {poller.longest_gap:.2f}s {poller.failures[:5]}"
        )
    finally:
        clean_up(env, [NAME], work)


if __name__ == "__main__":
    main()
