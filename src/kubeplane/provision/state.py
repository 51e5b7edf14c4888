"""The cluster state file: everything a local cluster's creation made, so destroy can undo it.

One JSON file per cluster, ``<clusters dir>/<name>/state.json``, where the clusters directory is
``$KUBEPLANE_STATE`` or ``~/.kubeplane/clusters``. The cluster directory also holds the cluster's
working files (haproxy and registry directories, node root directories, logs).

The file is the provisioner's journal: every step records what it is *about to* create before
creating it and saves the file (atomically: write a temporary file, fsync, rename), so a crash at
any point leaves a state from which :mod:`destroy <kubeplane.provision.netns>` removes exactly
what exists, no more (deleting a recorded thing that was never created is a no-op) and no less.

Errors: :class:`StateError`, with :class:`StateNotFound` (no such cluster) and
:class:`StateCorrupt` (the file exists but cannot be read back).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from kubeplane import fileio
from kubeplane.config import defaults as config_defaults
from kubeplane.config import generate as gen
from kubeplane.provision import hostproc

#: Environment variable naming the directory that holds one directory per cluster.
STATE_ENV = "KUBEPLANE_STATE"
STATE_FILE = "state.json"
SCHEMA_VERSION = 1

Role = Literal["controlplane", "worker"]


class StateError(Exception):
    """Base of this module's errors."""


class StateNotFound(StateError):
    """No state file for the named cluster."""


class StateCorrupt(StateError):
    """A state file exists but is not a state this version can read."""


def clusters_dir() -> Path:
    """Where cluster directories live: ``$KUBEPLANE_STATE`` or ``~/.kubeplane/clusters``."""
    configured = os.environ.get(STATE_ENV)
    return Path(configured) if configured else Path.home() / ".kubeplane" / "clusters"


def cluster_dir(name: str, *, root: Path | None = None) -> Path:
    """The directory of cluster ``name`` (under ``root`` or :func:`clusters_dir`)."""
    return (root if root is not None else clusters_dir()) / name


@dataclasses.dataclass
class NodeState:
    """One node: its place on the network and what runs for it on the host."""

    name: str
    role: Role
    index: int
    ip: str
    netns: str
    host_veth: str
    root_dir: str = ""
    processes: dict[str, hostproc.ProcessRecord] = dataclasses.field(default_factory=dict)
    cgroups: list[str] = dataclasses.field(default_factory=list)
    #: False while ``cluster add`` is still making the node (a re-run of the add finishes it,
    #: ``cluster remove`` takes it away); nodes made by ``cluster create`` are always True.
    joined: bool = True

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["processes"] = {key: rec.to_dict() for key, rec in self.processes.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeState:
        role = data["role"]
        if role not in ("controlplane", "worker"):
            raise ValueError(f"role {role!r} is neither controlplane nor worker")
        return cls(
            name=str(data["name"]),
            role=role,
            index=int(data["index"]),
            ip=str(data["ip"]),
            netns=str(data["netns"]),
            host_veth=str(data["host_veth"]),
            root_dir=str(data.get("root_dir", "")),
            processes={
                key: hostproc.ProcessRecord.from_dict(rec) for key, rec in data.get("processes", {}).items()
            },
            cgroups=[str(path) for path in data.get("cgroups", [])],
            joined=bool(data.get("joined", True)),
        )


@dataclasses.dataclass
class NetworkState:
    """The cluster network: recorded before each piece is created, removed after it is deleted."""

    cidr: str
    host_ip: str
    bridge: str
    #: True once this cluster has (started to) create the bridge; destroy deletes it only then.
    owns_bridge: bool = False
    #: Network namespaces this cluster created (or was about to create).
    netns: list[str] = dataclasses.field(default_factory=list)
    #: Host-side links (veth ends) this cluster created.
    links: list[str] = dataclasses.field(default_factory=list)
    #: Host sysctls changed, with the value to restore (none are changed today).
    sysctls: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Host routes this cluster added: destination CIDR → gateway (a node), on the bridge.
    routes: dict[str, str] = dataclasses.field(default_factory=dict)
    #: The control plane's shared VIP, the cluster's endpoint (``cluster create --vip``): no node
    #: is given this address and no load balancer runs. Empty: haproxy on :attr:`host_ip`.
    vip: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetworkState:
        return cls(
            cidr=str(data["cidr"]),
            host_ip=str(data["host_ip"]),
            bridge=str(data["bridge"]),
            owns_bridge=bool(data.get("owns_bridge", False)),
            netns=[str(x) for x in data.get("netns", [])],
            links=[str(x) for x in data.get("links", [])],
            sysctls={str(k): str(v) for k, v in data.get("sysctls", {}).items()},
            routes={str(k): str(v) for k, v in data.get("routes", {}).items()},
            vip=str(data.get("vip", "")),
        )


@dataclasses.dataclass
class ClusterState:
    """The whole state of one local cluster; :meth:`save` after every change."""

    name: str
    directory: Path
    network: NetworkState | None = None
    nodes: list[NodeState] = dataclasses.field(default_factory=list)
    #: Host-namespace processes by role ("haproxy", "registry").
    processes: dict[str, hostproc.ProcessRecord] = dataclasses.field(default_factory=dict)
    #: Working directories by role ("haproxy", "registry", ...), all inside :attr:`directory`.
    dirs: dict[str, str] = dataclasses.field(default_factory=dict)
    #: cgroup directories to rmdir on destroy (deepest first), cluster-wide.
    cgroups: list[str] = dataclasses.field(default_factory=list)
    #: Empty mount-point directories this cluster created on the host for its machine nodes.
    host_dirs: list[str] = dataclasses.field(default_factory=list)
    #: Every node's ``machine.ports`` (``cluster create --node-api-port/--trustd-port``): where the
    #: provisioner reaches a booted node's node API. States from before the flags have the defaults.
    node_api_port: int = config_defaults.DEFAULT_NODE_API_PORT
    trustd_port: int = config_defaults.DEFAULT_TRUSTD_PORT

    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE

    def node_api_endpoint(self, ip: str) -> str:
        """The node API of the booted node at ``ip``: ``ip``, or ``ip:port`` when the cluster moved it
        (a node in maintenance mode listens on the default port, whatever the cluster's)."""
        return gen.node_api_endpoint(ip, self.node_api_port)

    def context_endpoints(self) -> tuple[str, ...]:
        """The node API endpoints of the cluster's client config context: its joined control
        plane nodes (a failed ``cluster add`` recorded nodes the context does not list yet)."""
        return tuple(
            self.node_api_endpoint(node.ip)
            for node in self.nodes
            if node.role == "controlplane" and node.joined
        )

    def node(self, name: str) -> NodeState:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"cluster {self.name!r} has no node {name!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "name": self.name,
            "network": None if self.network is None else dataclasses.asdict(self.network),
            "nodes": [node.to_dict() for node in self.nodes],
            "processes": {key: rec.to_dict() for key, rec in self.processes.items()},
            "dirs": dict(self.dirs),
            "cgroups": list(self.cgroups),
            "host_dirs": list(self.host_dirs),
            "node_api_port": self.node_api_port,
            "trustd_port": self.trustd_port,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, directory: Path) -> ClusterState:
        if data.get("version") != SCHEMA_VERSION:
            raise ValueError(f"version {data.get('version')!r} is not {SCHEMA_VERSION}")
        network = data.get("network")
        return cls(
            name=str(data["name"]),
            directory=directory,
            network=None if network is None else NetworkState.from_dict(network),
            nodes=[NodeState.from_dict(node) for node in data.get("nodes", [])],
            processes={
                key: hostproc.ProcessRecord.from_dict(rec) for key, rec in data.get("processes", {}).items()
            },
            dirs={str(k): str(v) for k, v in data.get("dirs", {}).items()},
            cgroups=[str(x) for x in data.get("cgroups", [])],
            host_dirs=[str(x) for x in data.get("host_dirs", [])],
            node_api_port=int(data.get("node_api_port", config_defaults.DEFAULT_NODE_API_PORT)),
            trustd_port=int(data.get("trustd_port", config_defaults.DEFAULT_TRUSTD_PORT)),
        )

    def save(self) -> None:
        """Write the state atomically: a crash leaves either the old or the new file, whole."""
        self.directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        fileio.write_atomic(self.path, text, mode=fileio.PUBLIC_MODE)

    @classmethod
    def load(cls, name: str, *, root: Path | None = None) -> ClusterState:
        """Read cluster ``name``'s state, or raise :class:`StateNotFound` / :class:`StateCorrupt`."""
        directory = cluster_dir(name, root=root)
        path = directory / STATE_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise StateNotFound(
                f"no local cluster named {name!r}: {path} does not exist "
                f"(list clusters in {directory.parent})"
            ) from None
        try:
            return cls.from_dict(json.loads(text), directory=directory)
        except (ValueError, KeyError, TypeError) as exc:
            raise StateCorrupt(
                f"cannot read the state of cluster {name!r} from {path}: {exc}; "
                "fix or remove the file, then clean up its namespaces and links by hand"
            ) from exc

    @classmethod
    def open(cls, name: str, *, root: Path | None = None) -> ClusterState:
        """The existing state of cluster ``name``, or a new empty one (saved at once)."""
        try:
            return cls.load(name, root=root)
        except StateNotFound:
            state = cls(name=name, directory=cluster_dir(name, root=root))
            state.save()
            return state

    def remove(self) -> None:
        """Delete the cluster directory (the last step of destroy; safe to repeat)."""
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.directory)
