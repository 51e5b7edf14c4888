"""Control plane "nodes" that only run the shared VIP's election, for the integration test and
the failover benchmark (``bench/bench_vip.py``).

Each node is a process of its own (so it can be stopped with SIGTERM or SIGKILL for real) that
runs :class:`kubeplane.services.vip_election.Election` against the test's etcd and acts on the
VIP's address inside its network namespace on the test's bridge (:class:`machines.Lan`). Its
kube-apiserver health is a file: the node counts as unhealthy while ``<name>.unhealthy`` exists
in the flag directory. Each node prints its status changes as JSON lines into its log.

A :class:`Sampler` thread looks at every namespace's ``eth0`` every few milliseconds and records
who holds the VIP, so a test can check that two nodes never held it at once and measure how long
a failover took as the network shows it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pyroute2 import IPRoute  # type: ignore[import-untyped]

from kubeplane.services import vip, vip_io

NODE_SCRIPT = """
import asyncio, contextlib, json, logging, pathlib, signal, sys, time
from kubeplane.clients import etcd as etcd_client
from kubeplane.services import vip, vip_election, vip_io

endpoint, ca, cert, key, name, namespace, ip, flags = sys.argv[1:9]
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(message)s")

def changed(status):
    line = {"t": time.time(), "owner": status.owner, "held": status.held, "reason": status.reason}
    print(json.dumps(line), flush=True)

async def main():
    read = lambda path: pathlib.Path(path).read_bytes()
    tls = etcd_client.tls_context(ca=read(ca), cert=read(cert), key=read(key))
    flag = pathlib.Path(flags) / f"{name}.unhealthy"

    async def healthy():
        return not flag.exists()

    async with etcd_client.EtcdClient([endpoint], tls=tls) as etcd:
        election = vip_election.Election(
            etcd=etcd,
            address=vip.Vip(link="eth0", ip=ip, field="test"),
            node=name,
            network=vip_io.NetlinkVip(namespace),
            healthy=healthy,
            on_change=changed,
        )
        task = asyncio.create_task(election.run())
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
    print(json.dumps({"t": time.time(), "stopped": True}), flush=True)

asyncio.run(main())
"""


@dataclasses.dataclass(frozen=True)
class EtcdAccess:
    """Where the nodes find etcd: its URL and the PEM files of its CA and a client pair."""

    endpoint: str
    ca: Path
    cert: Path
    key: Path


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    netns: str


class VipNodes:
    """The node processes of one test, on one VIP; :meth:`close` stops every one of them."""

    def __init__(self, *, etcd: EtcdAccess, hosts: Sequence[Host], ip: str, directory: Path) -> None:
        self.etcd = etcd
        self.hosts = {host.name: host for host in hosts}
        self.address = vip.Vip(link="eth0", ip=ip, field="test")
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        host = self.hosts[name]
        argv = [sys.executable, "-c", NODE_SCRIPT, self.etcd.endpoint, str(self.etcd.ca)]
        argv += [
            str(self.etcd.cert),
            str(self.etcd.key),
            name,
            host.netns,
            self.address.ip,
            str(self.directory),
        ]
        with (self.directory / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    def stop(self, name: str, *, kill: bool = False) -> None:
        """SIGTERM (graceful: the node gives the VIP up) or SIGKILL the node, and reap it."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def set_healthy(self, name: str, healthy: bool) -> None:
        flag = self.directory / f"{name}.unhealthy"
        if healthy:
            flag.unlink(missing_ok=True)
        else:
            flag.touch()

    def close(self) -> None:
        for name in list(self.processes):
            self.stop(name, kill=True)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
            for path in sorted(self.directory.glob("*.log"))
        )

    def reasons(self, name: str) -> list[str]:
        """The reasons of every status change node ``name`` has printed, oldest first."""
        reasons = []
        for line in (self.directory / f"{name}.log").read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                printed = json.loads(line)
                if isinstance(printed, dict) and "reason" in printed:
                    reasons.append(str(printed["reason"]))
        return reasons

    def holders(self) -> frozenset[str]:
        """The nodes whose eth0 has the VIP now (asked one node after the other)."""
        return frozenset(name for name, _, _, present in self.observe() if present)

    def observe(self) -> list[tuple[str, float, float, bool]]:
        """Each node in turn: (name, when it was asked, when it answered, whether its eth0 had the
        VIP at some moment in between)."""
        seen = []
        for name, host in self.hosts.items():
            asked = time.monotonic()
            present = vip_io.NetlinkVip(host.netns).present(self.address)
            seen.append((name, asked, time.monotonic(), present))
        return seen

    def mac(self, name: str) -> str:
        """The MAC address of the node's eth0."""
        with vip_io.NetlinkVip(self.hosts[name].netns).inside(), IPRoute() as ip:
            (link,) = ip.get_links(ifname="eth0")
            return str(link.get("IFLA_ADDRESS"))


class Sampler:
    """Samples who holds the VIP in a thread until stopped; ``samples`` are (time, holders).

    One sample asks the nodes one after the other (each in its own network namespace: a few ms,
    tens under load), so a sample is not a snapshot: a handover that falls between two nodes'
    answers shows the old and the new holder in one sample though they never held the VIP at
    the same moment. :meth:`overlaps` therefore judges from each node's own answer times.
    """

    def __init__(self, nodes: VipNodes, *, period: float = 0.005) -> None:
        self.nodes = nodes
        self.period = period
        self.samples: list[tuple[float, frozenset[str]]] = []
        #: Every answer of every node, as :meth:`VipNodes.observe` gives them.
        self.answers: list[tuple[str, float, float, bool]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            started = time.monotonic()
            seen = self.nodes.observe()
            self.answers.extend(seen)
            self.samples.append((started, frozenset(name for name, _, _, present in seen if present)))
            time.sleep(self.period)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def tenures(self) -> dict[str, list[tuple[float, float]]]:
        return tenures(self.answers)

    def overlaps(self) -> list[tuple[str, str, float, float]]:
        return overlaps(self.answers)

    def most_at_once(self) -> int:
        """2 when :meth:`overlaps` found any, else whether anyone held it at all (0 or 1)."""
        if self.overlaps():
            return 2
        return 1 if any(present for *_, present in self.answers) else 0

    def wait_for(self, predicate: Callable[[frozenset[str]], bool], *, after: float, timeout: float) -> float:
        """The time of the first sample after ``after`` whose holders satisfy ``predicate``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, holders in list(self.samples):
                if at >= after and predicate(holders):
                    return at
            time.sleep(self.period)
        raise AssertionError(
            f"no sample satisfied the condition within {timeout}s: {self.samples[-5:]}\n"
            f"the election processes' logs:\n{self.nodes.logs()}"
        )


def tenures(answers: list[tuple[str, float, float, bool]]) -> dict[str, list[tuple[float, float]]]:
    """Per node, the spans it certainly held the VIP: in a run of answers that all had it, from
    the first one's answer to the last one's question (it held the VIP throughout: losing and
    winning it back between two answers a few ms apart would take etcd round trips). A run
    of one answer proves no span."""
    spans: dict[str, list[tuple[float, float]]] = {}
    current: dict[str, tuple[float, float]] = {}

    def close(name: str) -> None:
        start, end = current.pop(name)
        if start <= end:
            spans.setdefault(name, []).append((start, end))

    for name, asked, answered, present in answers:
        if present:
            start, _ = current.get(name, (answered, asked))
            current[name] = (start, asked)
        elif name in current:
            close(name)
    for name in list(current):
        close(name)
    return spans


def overlaps(answers: list[tuple[str, float, float, bool]]) -> list[tuple[str, str, float, float]]:
    """Moments two nodes provably held the VIP at once: (node, node, from, to) where their
    :func:`tenures` intersect."""
    found = []
    spans = sorted((span, name) for name, runs in tenures(answers).items() for span in runs)
    for i, ((_start, end), name) in enumerate(spans):
        for (other_start, other_end), other in spans[i + 1 :]:
            if other_start > end:
                break
            if other != name:
                found.append((name, other, other_start, min(end, other_end)))
    return found


def holder_of(holders: frozenset[str]) -> str | None:
    return next(iter(holders)) if len(holders) == 1 else None


def provoke_arp(ip: str) -> None:
    """Make the host resolve ``ip`` (a UDP datagram to the discard port): a neighbour entry."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"", (ip, 9))


def host_neighbour(ip: str) -> str | None:
    """The MAC address the host's neighbour table has for ``ip`` (None: no entry or incomplete)."""
    with IPRoute() as route:
        for entry in route.get_neighbours(family=socket.AF_INET, dst=str(ipaddress.ip_address(ip))):
            lladdr = entry.get("NDA_LLADDR")
            if lladdr:
                return str(lladdr)
    return None
