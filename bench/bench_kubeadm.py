"""Benchmark of the kubeadm flows through the CLI; prints figures, asserts nothing.

(a) ``cluster create --kubeadm`` 1+1: total seconds, ``kubeadm init`` and ``kubeadm join`` seconds
    (from the progress lines), and seconds until every node is Ready;
(b) ``cluster create`` (kubeplane) 1+1 on the same machine: seconds until every node is Ready, and
    the ratio of the two (issue 21's side-by-side of the two bootstraps);
(c) ``kubeadm ha`` on the kubeadm cluster: seconds per step and in all, and an API client polling
    ``/api/v1/namespaces/kube-system/pods`` through the endpoint from the moment the load balancer
    answers (HTTP/1.1 over one kept-alive connection, no retries): requests, failures, longest gap.

"Every node Ready" is read from the Nodes themselves: the latest ``lastTransitionTime`` of their
Ready conditions (the API server runs on this machine, so its clock is this clock), relative to the
moment the command started. Runs as root with the toolchain built; state and client config go to
a temporary directory.

Run: sudo .venv/bin/python bench/bench_kubeadm.py [--cidr 10.5.45.0/24] [--skip-kubeplane]
"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

KUBEPLANE = str(Path(sys.executable).with_name("kubeplane"))
STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
DONE = re.compile(r"^ < (done|already at target, skipped|FAILED) \((\d+(?:\.\d+)?)s\)")


def run(env: dict[str, str], *args: str, on_line: Any = None) -> tuple[float, list[str], float]:
    """``kubeplane ARGS``: (seconds, output lines, wall-clock start)."""
    wall = time.time()
    started = time.monotonic()
    process = subprocess.Popen(
        [KUBEPLANE, *args],
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if on_line is not None:
            on_line(lines[-1])
    if process.wait() != 0:
        sys.exit(f"kubeplane {' '.join(args)} failed:\n" + "\n".join(lines[-30:]))
    return time.monotonic() - started, lines, wall


def clean_up(env: dict[str, str], names: list[str], work: Path, *, keep_directory: bool = False) -> None:
    """Destroy the benchmark's clusters ``names``; then its temporary directory ``work``, unless
    kept or a destroy failed (its state is what a second destroy needs)."""
    destroyed = [
        subprocess.run(
            [KUBEPLANE, "cluster", "destroy", "--name", name], env={**os.environ, **env}, check=False
        ).returncode
        == 0
        for name in names
    ]
    if not keep_directory and all(destroyed):
        shutil.rmtree(work, ignore_errors=True)


def step_seconds(lines: list[str]) -> list[tuple[str, float]]:
    """(step headline, seconds) for every step of a plan's progress output."""
    found, current = [], None
    for line in lines:
        if (match := STEP.match(line)) is not None:
            current = match.group(3).split(":")[0]
        elif (match := DONE.match(line)) is not None and current is not None:
            found.append((current, float(match.group(2))))
            current = None
    return found


def tls_context(kubeconfig: Path) -> tuple[str, ssl.SSLContext]:
    """The server of the admin kubeconfig and a TLS context with its CA and client certificate."""
    document = yaml.safe_load(kubeconfig.read_text())
    cluster, user = document["clusters"][0]["cluster"], document["users"][0]["user"]
    context = ssl.create_default_context(
        cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
    )
    with tempfile.TemporaryDirectory() as directory:
        cert, key = Path(directory) / "cert", Path(directory) / "key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        context.load_cert_chain(cert, key)
    return str(cluster["server"]), context


def nodes_ready_at(kubeconfig: Path) -> float:
    """Epoch seconds at which the last Node turned Ready."""
    server, context = tls_context(kubeconfig)
    with httpx.Client(verify=context, timeout=10) as client:
        items = client.get(f"{server}/api/v1/nodes").json()["items"]
    times = []
    for node in items:
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", node["metadata"]["name"]
        stamp = datetime.datetime.strptime(ready["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")
        times.append(stamp.replace(tzinfo=datetime.UTC).timestamp())
    return max(times)


class Poller:
    """Lists kube-system pods through ``server`` every 0.1 s on one kept-alive connection."""

    def __init__(self, kubeconfig: Path, server: str) -> None:
        _, context = tls_context(kubeconfig)
        self._client = httpx.Client(base_url=server, verify=context, timeout=5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.requests, self.failures, self.longest_gap = 0, [], 0.0

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            self.requests += 1
            try:
                self._client.get("/api/v1/namespaces/kube-system/pods").raise_for_status()
                last = time.monotonic()
            except Exception as exc:
                self.failures.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {exc}"[:160])
            self.longest_gap = max(self.longest_gap, time.monotonic() - last)
            self._stop.wait(0.1)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cidr", default="10.5.45.0/24", help="network of the kubeadm cluster")
    parser.add_argument("--kubeplane-cidr", default="10.5.46.0/24", help="network of the kubeplane cluster")
    parser.add_argument("--skip-kubeplane", action="store_true", help="no kubeplane cluster for (b)")
    parser.add_argument(
        "--keep", action="store_true", help="leave the kubeadm cluster running (inspect, then destroy)"
    )
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-kubeadm-"))
    env = {"KUBEPLANE_STATE": str(work / "state"), "KUBEPLANECONFIG": str(work / "config")}
    made: list[str] = []
    try:
        made.append("bka")
        seconds, lines, wall = run(
            env, "cluster", "create", "--kubeadm", "--name", "bka", "--cidr", options.cidr
        )
        steps = dict(step_seconds(lines))
        kubeconfig = work / "state" / "bka" / "kubeconfig"
        kubeadm_ready = nodes_ready_at(kubeconfig) - wall
        print(
            f"(a) cluster create --kubeadm 1+1: {seconds:.1f}s in all, "
            f"every node Ready after {kubeadm_ready:.1f}s"
        )
        for name, value in steps.items():
            print(f"      {value:6.1f}s  {name}")
        if not options.skip_kubeplane:
            made.append("bkp")
            seconds_kp, _, wall_kp = run(
                env, "cluster", "create", "--name", "bkp", "--cidr", options.kubeplane_cidr
            )
            kubeplane_ready = nodes_ready_at(work / "state" / "bkp" / "kubeconfig") - wall_kp
            print(f"(b) cluster create (kubeplane) 1+1: {seconds_kp:.1f}s to healthy, every node Ready after "
                  f"{kubeplane_ready:.1f}s")  # fmt: skip
            print(
                "    kubeadm init + join / kubeplane, to every node Ready: "
                f"{kubeadm_ready / kubeplane_ready:.2f}"
            )
            run(env, "cluster", "destroy", "--name", "bkp")
            made.remove("bkp")
        host_ip = options.cidr.rsplit(".", 1)[0] + ".1"
        poller = Poller(kubeconfig, f"https://{host_ip}:6443")

        def on_line(line: str) -> None:
            # From the moment the load balancer serves the re-signed certificate (step 2 done).
            if line.startswith("[3/") and not poller._thread.is_alive():
                poller.start()

        seconds_ha, lines_ha, _ = run(env, "kubeadm", "ha", "--name", "bka", on_line=on_line)
        poller.stop()
        print(f"(c) kubeadm ha: {seconds_ha:.1f}s in all")
        for name, value in step_seconds(lines_ha):
            print(f"      {value:6.1f}s  {name}")
        print(f"    API poller through the endpoint: {poller.requests} requests, "
              f"{len(poller.failures)} failed, "
              f"longest gap {poller.longest_gap:.2f}s {poller.failures[:5]}")  # fmt: skip
    finally:
        if options.keep and "bka" in made:
            made.remove("bka")
            print(f"kept: KUBEPLANE_STATE={env['KUBEPLANE_STATE']} kubeplane cluster destroy --name bka")
        clean_up(env, made, work, keep_directory=options.keep)


if __name__ == "__main__":
    main()
