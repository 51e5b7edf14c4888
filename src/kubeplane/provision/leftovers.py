"""What a local node leaves behind once its agent is gone, found without trusting process names.

A node's processes are the members of its network namespace or of its kubelet cgroup root
(:func:`node_processes`); :func:`kill_node_processes` SIGKILLs them until none is left. The pod
network namespaces the CNI plugin mounted inside a node's mount namespace die with it; their
empty names under ``/run/netns`` are read first (:func:`pod_netns_of_all`) and removed after
(:func:`remove_pod_netns_names`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from kubeplane import retry
from kubeplane.agent import owned
from kubeplane.provision import netns
from kubeplane.provision import state as state_mod
from kubeplane.provision.cluster import ClusterError


def _pod_netns(table: Sequence[owned.Mount]) -> set[str]:
    """Names of the pod network namespaces (``/run/netns/cni-*``) mounted in one mount table."""
    found = set()
    for mount in table:
        parent, _, leaf = str(mount.point).rpartition("/")
        if parent in ("/run/netns", "/var/run/netns") and leaf.startswith("cni-"):
            found.add(leaf)
    return found


def pod_netns_of(pid: int) -> set[str]:
    """Names of the pod network namespaces mounted in ``pid``'s mount namespace."""
    try:
        return _pod_netns(owned.mount_table(Path(f"/proc/{pid}/mountinfo")))
    except OSError:
        return set()


def netns_members(netns_name: str) -> list[int]:
    """PIDs whose network namespace is ``netns_name`` (the namespace file's inode)."""
    try:
        target = os.stat(netns.NETNS_DIR / netns_name)
    except FileNotFoundError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                ns = os.stat(entry / "ns" / "net")
                if (ns.st_ino, ns.st_dev) == (target.st_ino, target.st_dev):
                    found.append(int(entry.name))
    return found


def node_processes(node: state_mod.NodeState) -> list[int]:
    """Processes still running for ``node``: in its network namespace or its kubelet cgroup root."""
    return sorted(set(netns_members(node.netns)) | set(owned.cgroup_members(node.cgroups)))


def kill_node_processes(node: state_mod.NodeState, *, timeout: float = 10.0) -> None:
    """SIGKILL every process of :func:`node_processes` until none is left (or ``timeout``).

    The pod network namespaces mounted in those processes' mount namespaces die with them; their
    names, read first, are removed afterwards (see :func:`remove_pod_netns_names`).
    """
    pod_netns = pod_netns_of_all(node_processes(node))
    try:
        _kill_until_gone(node, timeout)
    finally:
        remove_pod_netns_names(pod_netns)


def pod_netns_of_all(pids: Sequence[int]) -> set[str]:
    """:func:`pod_netns_of` over ``pids``, reading each mount namespace once."""
    return {name for table in owned.mount_tables(pids) for name in _pod_netns(table)}


def remove_pod_netns_names(names: set[str]) -> None:
    """Remove the empty ``/run/netns`` names of pod namespaces whose mount namespace is gone.

    A name still mounted on in the host's namespace is someone else's live namespace: kept.
    """
    for netns_name in sorted(names):
        leftover = netns.NETNS_DIR / netns_name
        if leftover.exists() and not os.path.ismount(leftover):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def _kill_until_gone(node: state_mod.NodeState, timeout: float) -> None:
    def killed() -> bool:
        pids = node_processes(node)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        raise retry.NotYet(
            f"processes {pids} survive SIGKILL; check `ps -o pid,stat,cmd -p {','.join(map(str, pids))}`"
        )

    retry.Wait(
        what=f"the processes of node {node.name} to exit",
        timeout=timeout,
        backoff=retry.fixed(0.1),
        error=ClusterError,
        hint="run destroy again",
    ).poll(killed)
