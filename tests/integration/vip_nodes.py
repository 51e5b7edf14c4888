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

    def holders(self) -> frozenset[str]:
        """The nodes whose eth0 has the VIP now."""
        return frozenset(
            name for name, host in self.hosts.items() if vip_io.NetlinkVip(host.netns).present(self.address)
        )

    def mac(self, name: str) -> str:
        """The MAC address of the node's eth0."""
        with vip_io.NetlinkVip(self.hosts[name].netns).inside(), IPRoute() as ip:
            (link,) = ip.get_links(ifname="eth0")
            return str(link.get("IFLA_ADDRESS"))


class Sampler:
    """Samples who holds the VIP in a thread until stopped; ``samples`` are (time, holders)."""

    def __init__(self, nodes: VipNodes, *, period: float = 0.005) -> None:
        self.nodes = nodes
        self.period = period
        self.samples: list[tuple[float, frozenset[str]]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self.samples.append((time.monotonic(), self.nodes.holders()))
            time.sleep(self.period)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def most_at_once(self) -> int:
        return max((len(holders) for _, holders in self.samples), default=0)

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
