"""``kubeplane cluster destroy``: remove everything a local cluster made, safe to repeat.

Destroy order, and why: agents first with SIGTERM (each stops its kubelet, containers,
containerd and etcd as a powered-off machine would); then whatever still runs *inside a node* —
found by membership of the node's network namespace or of its kubelet cgroup root, never by
process name (:mod:`kubeplane.provision.leftovers`) — is killed; then mounts under each node root
are unmounted deepest first, the cgroup directories removed, haproxy and the registry stopped,
links and namespaces deleted, the client config context removed and the cluster directory
deleted. Every step tolerates what is already gone, so destroy is safe to repeat.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from kubeplane.agent import owned
from kubeplane.config import client as client_config
from kubeplane.provision import hostproc, machine, netns
from kubeplane.provision import state as state_mod
from kubeplane.provision.cluster import AGENT, KUBEADM_INIT, ClusterError, ClusterMeta, list_clusters
from kubeplane.provision.leftovers import (
    kill_node_processes,
    node_processes,
    pod_netns_of_all,
    remove_pod_netns_names,
)

#: How long an agent may take to stop its services before it is killed.
AGENT_STOP_TIMEOUT = 60.0
#: What runs a node: its agent, or a kubeadm node's init; each stops the node's services.
NODE_MAIN = (AGENT, KUBEADM_INIT)


def _main_process(node: state_mod.NodeState) -> hostproc.ProcessRecord | None:
    return next((node.processes[key] for key in NODE_MAIN if key in node.processes), None)


def destroy(
    name: str, *, state_root: Path | None = None, progress: Callable[[str], None] = lambda _: None
) -> bool:
    """Remove everything cluster ``name`` made; False if there was nothing to remove."""
    directory = state_mod.cluster_dir(name, root=state_root)
    if not (directory / state_mod.STATE_FILE).exists():
        if directory.exists():
            shutil.rmtree(directory)
        return False
    cluster = state_mod.ClusterState.load(name, root=state_root)
    meta = ClusterMeta.load(directory)
    progress("stopping node agents")
    agents = [record for node in cluster.nodes if (record := _main_process(node)) is not None]
    pod_netns = pod_netns_of_all([record.pid for record in agents if hostproc.is_running(record)])
    for record in agents:
        if hostproc.is_running(record):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGTERM)
    for record in agents:
        hostproc.stop(record, timeout=AGENT_STOP_TIMEOUT)
    progress("stopping what the nodes left running")
    for node in cluster.nodes:
        kill_node_processes(node)
    # The CNI plugin's per-pod network namespaces were mounted inside the nodes' mount namespaces;
    # with those gone only their (empty) names are left under /run/netns.
    remove_pod_netns_names(pod_netns)
    progress("unmounting node filesystems and removing cgroups")
    for node in cluster.nodes:
        if node.root_dir:
            unmount_under(Path(node.root_dir))
        for cgroup in node.cgroups:
            owned.remove_cgroup(Path(cgroup))
    for path in cluster.cgroups:
        owned.remove_cgroup(Path(path))
    left = machine.remove_host_dirs([Path(path) for path in cluster.host_dirs])
    if left:
        heir = _hand_over_host_dirs(left, leaving=name, state_root=state_root)
        progress(
            f"keeping mount points another node still mounts on: {', '.join(map(str, left))}"
            + (f" (cluster {heir!r} removes them when it is destroyed)" if heir else "")
        )
    progress("stopping the load balancer and the registry")
    for record in cluster.processes.values():
        hostproc.stop(record)
    progress("removing the network")
    netns.destroy(cluster)
    if meta is not None and meta.client_config_path and meta.context:
        progress(f"removing context {meta.context!r} from {meta.client_config_path}")
        _remove_context(Path(meta.client_config_path), meta.context, endpoints=cluster.context_endpoints())
    cluster.remove()
    return True


def _remove_context(path: Path, name: str, *, endpoints: tuple[str, ...]) -> None:
    try:
        config = client_config.load(path)
    except client_config.ClientConfigError:
        return
    context = config.contexts.get(name)
    # Only the context this cluster wrote: a same-named one pointing elsewhere is the user's.
    if context is not None and context.endpoints == endpoints:
        client_config.save(client_config.remove_context(config, name), path)


def stop_node(node: state_mod.NodeState) -> None:
    """Take one node down for good: stop its agent (or init), kill what it left running, remove pod
    netns names."""
    record = _main_process(node)
    pod_netns = pod_netns_of_all([record.pid] if record is not None and hostproc.is_running(record) else [])
    if record is not None:
        hostproc.stop(record, timeout=AGENT_STOP_TIMEOUT)
    kill_node_processes(node)
    remove_pod_netns_names(pod_netns)


def power_off(node: state_mod.NodeState) -> None:
    """SIGKILL the node's agent and every process of the node at once, as a power cut would:
    nothing is stopped in order, nothing given up (``create.power_on`` switches it back on)."""
    record = _main_process(node)
    processes = node_processes(node)
    pod_netns = pod_netns_of_all(processes)
    if record is not None and hostproc.is_running(record):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
    for pid in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    kill_node_processes(node)
    remove_pod_netns_names(pod_netns)


def unmount_under(root: Path) -> None:
    """Unmount everything at or below ``root``, deepest first (lazily if a mount stays busy)."""
    for _ in range(3):
        points = owned.mounts_under(root)
        if not points:
            return
        for point in points:
            owned.unmount(point)
    left = owned.mounts_under(root)
    if left:
        raise ClusterError(
            f"cannot unmount {', '.join(map(str, left))}; unmount them by hand and run destroy again"
        )


def _hand_over_host_dirs(paths: list[Path], *, leaving: str, state_root: Path | None) -> str | None:
    """Record ``paths`` (mount points still in use) in another cluster's state, so that the last
    cluster destroyed removes them; the name of that cluster, or None when there is none."""
    for other in list_clusters(state_root=state_root):
        if other == leaving:
            continue
        try:
            heir = state_mod.ClusterState.load(other, root=state_root)
        except state_mod.StateError:
            continue
        heir.host_dirs = list(dict.fromkeys([*heir.host_dirs, *map(str, paths)]))
        heir.save()
        return other
    return None
