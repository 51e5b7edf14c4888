"""Local clusters (``kubeplane cluster ...``): names, errors, the cluster directory, ``show``.

A local cluster is made by these modules, each one job:

- :mod:`kubeplane.provision.planning`: :func:`~kubeplane.provision.planning.plan` (pure: names,
  addresses, the generated PKI and one validated machine config per node);
- :mod:`kubeplane.provision.create`: :func:`~kubeplane.provision.create.preflight` (only *reads*
  the host) and :class:`~kubeplane.provision.create.Creation` (a plan for the one executor, each
  step recorded in the cluster state before it acts);
- :mod:`kubeplane.provision.grow`: ``cluster add`` / ``cluster remove`` on a running cluster,
  with the creation's steps for new nodes;
- :mod:`kubeplane.provision.teardown`: :func:`~kubeplane.provision.teardown.destroy`, which
  undoes a half-made cluster as well as a whole one, and is safe to repeat;
- :mod:`kubeplane.provision.leftovers`: finding and killing what a node left running (by network
  namespace and cgroup membership, never by process name) and its pod network namespace names.

This module holds what they share: the cluster's metadata file beside its state
(:class:`ClusterMeta`), the files written for the user, where each node's directory is, and
:func:`show` / :func:`list_clusters`.

Errors (all :class:`ClusterError`): :class:`PlanError` (the request is invalid; nothing was
touched), :class:`PreflightError` (the host cannot run it: missing tools, toolchain, address
conflict, cluster exists; nothing was touched), :class:`CreateError` (a creation step failed;
the message names it and where to look; ``kubeplane cluster destroy`` cleans up). A failing
step stops the executor with :class:`kubeplane.plan.StepFailed` wrapping one of these.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kubeplane import api, fileio
from kubeplane import config as config_mod
from kubeplane.config import generate as gen
from kubeplane.provision import hostproc
from kubeplane.provision import state as state_mod

DEFAULT_NAME = "kubeplane"
DEFAULT_VERSION = config_mod.defaults.KUBERNETES_VERSION
AGENT = "kubeplaned"
#: The process record of a kubeadm node's init (:mod:`kubeplane.provision.kubeadm_node`), which
#: runs where a kubeplane node runs its agent.
KUBEADM_INIT = "init"
#: ``ClusterMeta.kind`` of a cluster made by ``cluster create --kubeadm``.
KIND_KUBEADM = "kubeadm"
AGENT_PORT = api.DEFAULT_PORT
#: The cluster's own metadata beside the state file (endpoint, client config it was merged into).
META_FILE = "cluster.json"
SECRETS_FILE = "secrets.yaml"


class ClusterError(Exception):
    """Base of the errors of local clusters."""


class PlanError(ClusterError):
    """The request is invalid (name, CIDR, counts, config patches); nothing was touched."""


class PreflightError(ClusterError):
    """The host cannot create this cluster as asked; nothing was touched."""


class CreateError(ClusterError):
    """A creation step failed; the message names it and where to look."""


# -- metadata --------------------------------------------------------------------------------


@dataclasses.dataclass
class ClusterMeta:
    """What the cluster directory records besides the state: endpoint, files written for the user."""

    endpoint: str
    kubernetes_version: str
    client_config_path: str = ""
    context: str = ""
    kubeconfig: str = ""
    #: ``kubeadm`` for a cluster kubeadm made (no kubeplaned: reached by SSH); empty: kubeplane.
    kind: str = ""

    @classmethod
    def load(cls, directory: Path) -> ClusterMeta | None:
        try:
            data = json.loads((directory / META_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return cls(**{field.name: str(data.get(field.name, "")) for field in dataclasses.fields(cls)})

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(dataclasses.asdict(self), indent=2) + "\n"
        fileio.write_atomic(directory / META_FILE, text, mode=fileio.PUBLIC_MODE)


def write_secrets_bundle(directory: Path, bundle: gen.SecretsBundle) -> Path:
    """``secrets.yaml`` (the cluster's CAs, keys and tokens), atomically and 0600 from the first byte."""
    path = directory / SECRETS_FILE
    fileio.write_atomic(path, gen.dump_yaml(gen.secrets_to_dict(bundle)), mode=fileio.SECRET_MODE)
    return path


def write_kubeconfig(path: Path, text: str) -> None:
    """The admin kubeconfig (cluster-admin credentials), atomically and 0600 from the first byte."""
    fileio.write_atomic(path, text, mode=fileio.SECRET_MODE)


def node_root(directory: Path, node: str) -> Path:
    """The directory holding node ``node``'s machine state (``nodes/controlplane-1`` under the
    cluster directory): bind-mounted over the node's standard paths (:mod:`.machine`), so
    ``nodes/controlplane-1/var/log/kubeplane`` is that node's ``/var/log/kubeplane``."""
    return (directory / "nodes" / node.removeprefix(f"{directory.name}-")).resolve()


def node_hint(node: state_mod.NodeState) -> str:
    """Where to look when a node misbehaves."""
    logs = Path(node.root_dir) / "var" / "log" / "kubeplane"
    return f"look at {logs}/*.log (kubeplaned.log, kubelet.log, ...) or `kubeplane -n {node.ip} logs kubelet`"


def exists(name: str, *, state_root: Path | None = None) -> bool:
    return (state_mod.cluster_dir(name, root=state_root) / state_mod.STATE_FILE).exists()


# -- show ------------------------------------------------------------------------------------


def show(name: str, *, state_root: Path | None = None) -> dict[str, Any]:
    """The cluster as a document: name, endpoint (and its VIP, if it is one), version, and each
    node's role, IP and agent."""
    cluster = state_mod.ClusterState.load(name, root=state_root)
    meta = ClusterMeta.load(cluster.directory)
    return {
        "name": cluster.name,
        "kind": (meta.kind if meta else "") or "kubeplane",
        "endpoint": meta.endpoint if meta else "",
        "kubernetes_version": meta.kubernetes_version if meta else "",
        "kubeconfig": meta.kubeconfig if meta else "",
        "client_config": meta.client_config_path if meta else "",
        "context": meta.context if meta else "",
        "cidr": cluster.network.cidr if cluster.network else "",
        "vip": cluster.network.vip if cluster.network else "",
        "nodes": [
            {
                "name": node.name,
                "role": node.role,
                "ip": node.ip,
                "netns": node.netns,
                "root": node.root_dir,
                "agent": "running"
                if any(
                    key in node.processes and hostproc.is_running(node.processes[key])
                    for key in (AGENT, KUBEADM_INIT)
                )
                else "stopped",
            }
            for node in cluster.nodes
        ],
    }


def list_clusters(*, state_root: Path | None = None) -> list[str]:
    root = state_root if state_root is not None else state_mod.clusters_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / state_mod.STATE_FILE).is_file())
