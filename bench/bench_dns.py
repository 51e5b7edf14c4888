"""Benchmark of the cluster DNS on a real local cluster; prints figures, asserts nothing.

(a) time to an application: from ``cluster create`` (1 control plane + 1 worker) starting to the
    first answer for a new Service, seen from a pod (kind publishes about 47 s to an app with DNS,
    k3d about 33 s);
(b) query latency p50/p99 and queries per second from one pod: sequential and with 64 queries in
    flight, for ``kubernetes.default.svc.cluster.local`` through the kube-dns Service IP (kube-proxy),
    straight to one DNS pod, and a floor: the same client against a trivial responder on the pod's
    own loopback (what the client and the pod's network cost without any server work).

The client runs in a pod of the DNS image (it has python3); all traffic stays on this machine.
Runs as root with the toolchain and images built; state goes to a temporary directory.
Run: sudo .venv/bin/python bench/bench_dns.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubeplane.provision import cluster as cluster_mod
from kubeplane.provision import dns_image, toolchain

KUBEPLANE = str(Path(sys.executable).with_name("kubeplane"))
NAME, CIDR = "bdns", "10.5.35.0/24"
QUERIES = 5000

# Runs in the pod: python3 - SERVER NAME COUNT; prints JSON figures. With SERVER "loopback" it
# first starts a responder on 127.0.0.1:5353 that echoes a fixed answer (the floor).
CLIENT = r"""
import json, os, socket, statistics, struct, sys, threading, time
server, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
port = 53
if server == "loopback":
    server, port = "127.0.0.1", 5353
    responder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    responder.bind((server, port))
    def serve():
        while True:
            data, peer = responder.recvfrom(512)
            responder.sendto(data[:2] + b"\x81\x80" + data[4:], peer)
    threading.Thread(target=serve, daemon=True).start()
labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
def query(ident):
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0\1\0\1"
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.connect((server, port))
sock.settimeout(2)
latencies = []
started = time.perf_counter()
for i in range(count):
    t = time.perf_counter()
    sock.send(query(i & 0xFFFF))
    sock.recv(4096)
    latencies.append(time.perf_counter() - t)
sequential = count / (time.perf_counter() - started)
latencies.sort()
window, sent, received = 64, 0, 0
started = time.perf_counter()
while sent < window:
    sock.send(query(sent & 0xFFFF)); sent += 1
while received < count:
    sock.recv(4096); received += 1
    if sent < count:
        sock.send(query(sent & 0xFFFF)); sent += 1
inflight = count / (time.perf_counter() - started)
p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
print(json.dumps({"p50_ms": p50 * 1000, "p99_ms": p99 * 1000,
                  "sequential_qps": sequential, "inflight64_qps": inflight}))
"""


def run(env: dict[str, str], *argv: str, stdin: str | None = None, timeout: float = 900) -> str:
    result = subprocess.run(
        argv, env=env, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}... failed: {(result.stdout + result.stderr)[-1500:]}")
    return result.stdout


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="kpbdns-", dir="/tmp"))
    env = {**os.environ, "KUBEPLANE_STATE": str(base / "s"), "KUBEPLANECONFIG": str(base / "config")}
    kubectl = [str(toolchain.Toolchain().require("v1.20.2").binary("kubectl"))]
    try:
        started = time.monotonic()
        run(env, KUBEPLANE, "cluster", "create", "--name", NAME, "--cidr", CIDR, "--wait-timeout", "5m")
        created = time.monotonic() - started
        kubectl += ["--kubeconfig", cluster_mod.show(NAME, state_root=base / "s")["kubeconfig"]]
        run(env, *kubectl, "create", "service", "clusterip", "first", "--tcp=80:80")
        loop = "until nslookup first.default.svc.cluster.local >/dev/null 2>&1; do sleep 0.2; done"
        run(
            env,
            *kubectl,
            "run",
            "first",
            "--image=busybox",
            "--restart=Never",
            "--rm",
            "-i",
            "--",
            "sh",
            "-c",
            loop,
        )
        answered = time.monotonic() - started
        print(
            f"(a) cluster create 1+1: healthy after {created:.1f}s; first answer for a new Service from a pod"
        )
        print(f"    after {answered:.1f}s (kind ~47 s, k3d ~33 s to an app with DNS)")

        dns_ip = json.loads(run(env, *kubectl, "-n", "kube-system", "get", "svc", "kube-dns", "-o", "json"))
        pods = json.loads(
            run(env, *kubectl, "-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns", "-o", "json")
        )
        targets = {
            "kube-dns Service IP": dns_ip["spec"]["clusterIP"],
            "one DNS pod directly": pods["items"][0]["status"]["podIP"],
            "floor (pod loopback)": "loopback",
        }
        print(f"(b) {QUERIES} queries for kubernetes.default.svc.cluster.local from one pod:")
        for label, server in targets.items():
            out = run(
                env, *kubectl, "run", f"bench-{abs(hash(label)) % 10000}", f"--image={dns_image.image_ref()}",
                "--restart=Never", "--rm", "-i", "--command", "--", "python3", "-", server,
                "kubernetes.default.svc.cluster.local", str(QUERIES), stdin=CLIENT,
            )  # fmt: skip
            # kubectl adds its own lines ("pod ... deleted") around the client's one JSON line.
            figures = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
            print(
                f"    {label:22} p50 {figures['p50_ms']:.2f} ms  p99 {figures['p99_ms']:.2f} ms  "
                f"{figures['sequential_qps']:.0f} q/s sequential  "
                f"{figures['inflight64_qps']:.0f} q/s 64 in flight"
            )
    finally:
        subprocess.run(
            [KUBEPLANE, "cluster", "destroy", "--name", NAME], env=env, capture_output=True, check=False
        )


if __name__ == "__main__":
    main()
