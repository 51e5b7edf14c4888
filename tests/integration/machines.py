"""Integration nodes are machines, made the way ``kubeplane cluster create`` makes them.

Each node is a network namespace on a bridge of the test's own (the provisioner's
:mod:`kubeplane.provision.netns`, on a random ``10.214.N.0/24``), plus the mount and UTS namespaces
of :mod:`kubeplane.provision.machine`: its directory bind-mounted over the standard paths, its
own ``/etc/machine-id``, the hostname set. So every ``kubeplaned`` a test starts runs with the
default ``--root /`` and sees ``/etc/kubernetes``, ``/var/lib/etcd``, ``/run/containerd`` ... as
on a real machine, while its files are under the test's ``tmp_path`` on the host.

A node's processes are found by the network namespace they run in (their command lines name
standard paths only, not the test's directory); :meth:`Lan.destroy` kills and reports any that
outlived the test's own teardown before it deletes the network.

Mount points the host lacks are created once (:func:`prepare`) and removed at the end of the
session (:func:`remove_created_host_dirs`), unless another node on the machine still uses them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from kubeplane.provision import leftovers, machine, netns
from kubeplane.provision import state as state_mod

#: ``KUBEPLANE_TEST_STREAM`` (``a`` and ``b`` when two integration sessions run at once, e.g. the
#: agent's tests in one terminal and the rest in another): the letter in the names of everything
#: this session makes, so a leak check never takes the other stream's namespaces, links or cgroups
#: for its own leaks, and the half of every test subnet's third octet it draws from, so two
#: sessions never pick one subnet.
STREAM = os.environ.get("KUBEPLANE_TEST_STREAM", "")
#: The prefix of this session's namespaces (``kpta-...``), host links and cgroups.
PREFIX = f"kpt{STREAM}"


def octet() -> int:
    """A random third octet for a test subnet, from this stream's half of 0..255."""
    low, high = {"a": (0, 127), "b": (128, 255)}.get(STREAM, (0, 255))
    return random.randint(low, high)


#: Host mount points this session created for its machine nodes.
_CREATED: list[Path] = []
#: Names of the test networks this session made (a leak check looks for what is left of them).
LANS: set[str] = set()


def prepare(node_dir: Path) -> None:
    """The node directory's standard directories and the host's mount points (recorded)."""
    _CREATED.extend(path for path in machine.prepare(node_dir) if path not in _CREATED)


def remove_created_host_dirs() -> list[Path]:
    """Remove the mount points :func:`prepare` created; the ones kept because in use."""
    kept = machine.remove_host_dirs(_CREATED)
    _CREATED.clear()
    return kept


def argv(*, node_dir: Path, hostname: str, command: Sequence[str | Path]) -> list[str]:
    """``command`` started as the machine at ``node_dir`` (after :func:`prepare`)."""
    prepare(node_dir)
    return machine.argv(node_dir=node_dir, hostname=hostname, command=[str(arg) for arg in command])


def enter_argv(pid: int, command: Sequence[str | Path]) -> list[str]:
    """``command`` run inside the machine whose process ``pid`` holds its namespaces."""
    return ["nsenter", f"--target={pid}", "--mount", "--uts", "--net", "--", *map(str, command)]


def lan_leftovers() -> set[str]:
    """What exists now of the test networks this session made: namespaces and links."""
    netns_dir = Path("/run/netns")
    found = set()
    for name in LANS:
        prefix = netns.bridge_name(name) + "-"  # the namespaces are kp-<name>-<node>
        if netns_dir.is_dir():
            found |= {f"netns {p.name}" for p in netns_dir.iterdir() if p.name.startswith(prefix)}
        for link in Path("/sys/class/net").iterdir():
            with contextlib.suppress(OSError):
                if (link / "ifalias").read_text().strip() == netns.link_alias(name):
                    found.add(f"link {link.name}")
    return found


def kill_in_netns(name: str, *, timeout: float = 10.0) -> list[int]:
    """SIGKILL every process in namespace ``name`` and wait until they are gone; their PIDs."""
    found = leftovers.netns_members(name)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while leftovers.netns_members(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@dataclasses.dataclass(frozen=True)
class Host:
    """One node's place on the test network."""

    name: str
    address: str
    netns: str


class Lan:
    """A bridge with one network namespace per node, made by the provisioner's own network code."""

    PREFIX = PREFIX  # the cluster name's; its bridge is kp-kpt<hex>, its namespaces kp-kpt<hex>-<node>

    def __init__(self, directory: Path) -> None:
        self.name = f"{self.PREFIX}{uuid.uuid4().hex[:6]}"
        LANS.add(self.name)
        self.state = state_mod.ClusterState(name=self.name, directory=directory)
        self.cidr = f"10.214.{octet()}.0/24"
        self.names: list[str] = []

    def add(self, name: str | None = None) -> Host:
        """A new node namespace on the bridge (the bridge is made with the first one)."""
        self.names.append(name or f"n{len(self.names) + 1}")
        for _ in range(5):
            try:
                plan = netns.plan(self.name, self.names, cidr=self.cidr)
                netns.create(plan, self.state)
                break
            except netns.AddressConflict:
                if self.state.network is not None:
                    raise
                self.cidr = f"10.214.{octet()}.0/24"
        else:
            raise netns.AddressConflict(f"no free 10.214.N.0/24 for the test network {self.name}")
        node = plan.nodes[-1]
        netns.wait_reachable(node.ip)
        return Host(name=node.name, address=node.ip, netns=node.netns)

    def destroy(self) -> list[str]:
        """Kill what still runs in the node namespaces, delete the network; what was left running."""
        leaks = []
        for node in self.state.nodes:
            leaks += [f"process {pid} in {node.netns}" for pid in kill_in_netns(node.netns)]
        netns.destroy(self.state)
        return leaks
