"""Benchmark of the shared VIP's failover; prints figures, asserts nothing.

Three node processes in network namespaces on a bridge of their own elect the VIP's owner in a
real etcd (mutual TLS on loopback), as the integration test does (``tests/integration/
vip_nodes.py``). The owner is then stopped ROUNDS times gracefully (SIGTERM: it gives the VIP up
and revokes its lease) and ROUNDS times ungracefully (SIGKILL: its lease runs out), each time
started again as a follower, and its kube-apiserver health check fails ROUNDS times (it gives the
VIP up after ``Timing.unhealthy_after`` failed checks, then recovers as a follower). Failover
time: from the signal (or the failing check's switch) to the first sample (every 5 ms, in the
namespaces) in which another node has the address; also the gap, from the last sample with the
old owner to the first with the new one. p50 and max over the rounds, and the most nodes
ever seen holding it at once (1 means never two).

Anchors (issue 17): kube-vip about 3 s, keepalived 3-4 s at its default advert interval, the
original up to 60 s; targets: graceful under 1 s, ungraceful under 3 s.
Runs as root with etcd installed. Run: sudo .venv/bin/python bench/bench_vip.py
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

import machines
import vip_nodes

from kubeplane import pki

ROUNDS = 10
NODES = ("n1", "n2", "n3")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_etcd(directory: Path) -> tuple[subprocess.Popen[bytes], vip_nodes.EtcdAccess]:
    ca = pki.new_ca("etcd-ca")
    server = pki.issue(ca=ca, common_name="etcd", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    client = pki.issue(ca=ca, common_name="bench", usages=("client",))
    files = {
        "ca.crt": ca.cert,
        "server.crt": server.cert,
        "server.key": server.key,
        "client.crt": client.cert,
    }
    files["client.key"] = client.key
    for name, data in files.items():
        (directory / name).write_bytes(data or b"")
        (directory / name).chmod(0o600)
    port, peer = free_port(), free_port()
    endpoint = f"https://127.0.0.1:{port}"
    tls = [f"--cert-file={directory / 'server.crt'}", f"--key-file={directory / 'server.key'}"]
    tls += [f"--trusted-ca-file={directory / 'ca.crt'}", "--client-cert-auth=true"]
    argv = ["etcd", "--name=bench", f"--data-dir={directory / 'data'}", f"--listen-client-urls={endpoint}"]
    argv += [f"--advertise-client-urls={endpoint}", f"--listen-peer-urls=http://127.0.0.1:{peer}"]
    argv += [f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}"]
    argv += [f"--initial-cluster=bench=http://127.0.0.1:{peer}", *tls]
    health = ["etcdctl", f"--endpoints={endpoint}", f"--cacert={directory / 'ca.crt'}"]
    health += [
        f"--cert={directory / 'client.crt'}",
        f"--key={directory / 'client.key'}",
        "endpoint",
        "health",
    ]
    process = subprocess.Popen(
        argv,
        stdout=(directory / "etcd.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    access = vip_nodes.EtcdAccess(
        endpoint=endpoint,
        ca=directory / "ca.crt",
        cert=directory / "client.crt",
        key=directory / "client.key",
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            subprocess.run(
                health,
                check=True,
                capture_output=True,
                timeout=5,
            )
            break
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return process, access


def failover(
    nodes: vip_nodes.VipNodes, sampler: vip_nodes.Sampler, *, how: Literal["term", "kill", "unhealthy"]
) -> tuple[float, float]:
    """Take the owner out ``how`` ("term": SIGTERM, "kill": SIGKILL, "unhealthy": its kube-apiserver
    health check fails); (that moment → new owner, last sample with the old → first with the new)."""
    sampler.wait_for(lambda held: len(held) == 1, after=time.monotonic(), timeout=15)
    owner = vip_nodes.holder_of(sampler.samples[-1][1])
    while owner is None:
        time.sleep(0.01)
        owner = vip_nodes.holder_of(sampler.samples[-1][1])
    signalled = time.monotonic()
    if how == "unhealthy":
        nodes.set_healthy(owner, False)
    else:
        nodes.stop(owner, kill=how == "kill")
    moved = sampler.wait_for(lambda held: bool(held) and owner not in held, after=signalled, timeout=15)
    last_old = max(at for at, held in list(sampler.samples) if owner in held and at <= moved)
    if how == "unhealthy":
        nodes.set_healthy(owner, True)
    else:
        nodes.start(owner)
    time.sleep(1.0)  # the restarted (or recovered) node settles as a follower
    return moved - signalled, moved - last_old


def report(label: str, figures: list[tuple[float, float]]) -> None:
    total = [f[0] for f in figures]
    gaps = [f[1] for f in figures]
    print(
        f"{label}: signal -> new owner p50 {statistics.median(total) * 1000:.0f} ms, "
        f"max {max(total) * 1000:.0f} ms; gap without owner p50 {statistics.median(gaps) * 1000:.0f} ms, "
        f"max {max(gaps) * 1000:.0f} ms ({len(figures)} failovers)"
    )


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-vip-") as temporary:
        directory = Path(temporary)
        lan = machines.Lan(directory / "lan")
        etcd, access = start_etcd(directory)
        nodes: vip_nodes.VipNodes | None = None
        sampler: vip_nodes.Sampler | None = None
        try:
            hosts = [lan.add(name) for name in NODES]
            ip = lan.cidr.rsplit(".", 1)[0] + ".250"
            nodes = vip_nodes.VipNodes(
                etcd=access,
                hosts=[vip_nodes.Host(name=host.name, netns=host.netns) for host in hosts],
                ip=ip,
                directory=directory / "vip",
            )
            sampler = vip_nodes.Sampler(nodes)
            for name in NODES:
                nodes.start(name)
            graceful = [failover(nodes, sampler, how="term") for _ in range(ROUNDS)]
            ungraceful = [failover(nodes, sampler, how="kill") for _ in range(ROUNDS)]
            unhealthy = [failover(nodes, sampler, how="unhealthy") for _ in range(ROUNDS)]
            report("graceful (SIGTERM)", graceful)
            report("ungraceful (SIGKILL)", ungraceful)
            report("kube-apiserver unhealthy", unhealthy)
            print(f"most holders at once: {sampler.most_at_once()} over {len(sampler.samples)} samples")
        finally:
            if sampler is not None:
                sampler.stop()
            if nodes is not None:
                nodes.close()
            lan.destroy()
            etcd.terminate()
            etcd.wait(timeout=10)


if __name__ == "__main__":
    main()
