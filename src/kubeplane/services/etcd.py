"""etcd as a node service: its command line and the pure membership decisions.

Pure: nothing here talks to etcd or touches the disk. The agent (:mod:`kubeplane.agent.etcd`)
gathers the facts (member list, data dir contents, probes) and asks these functions what to do,
so the rules that protect the cluster are unit-tested on their own:

- :func:`render_args`: etcd's flags for one control plane node — TLS everywhere (client and
  peer certificates from the etcd secrets directory), client URLs on the node IP and loopback,
  peer URL on the node IP, and the initial cluster only when the data dir is empty.
- :func:`plan_join`: a joining node's data dir is empty, so a member with our name lost its data:
  remove it and add us again (as a learner), never restart it under its old ID with an empty log;
  reuse only a member with our peer URL that never started; the ``--initial-cluster`` we need.
- :func:`leave_refusal`: removing a member must leave a quorum of healthy members behind.
- :func:`bootstrap_refusal`: bootstrap happens once per cluster lifetime (no split brain).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Literal

from kubeplane.clients import etcd as etcd_client

CLIENT_PORT = 2379
PEER_PORT = 2380

ClusterState = Literal["new", "existing"]


@dataclasses.dataclass(frozen=True)
class EtcdCerts:
    """The certificate files of one node's etcd (written by the etcd secrets controller)."""

    ca: Path
    server_crt: Path
    server_key: Path
    peer_crt: Path
    peer_key: Path
    client_crt: Path
    client_key: Path

    @classmethod
    def under(cls, directory: Path) -> EtcdCerts:
        return cls(
            ca=directory / "ca.crt",
            server_crt=directory / "server.crt",
            server_key=directory / "server.key",
            peer_crt=directory / "peer.crt",
            peer_key=directory / "peer.key",
            client_crt=directory / "client.crt",
            client_key=directory / "client.key",
        )

    def all(self) -> tuple[Path, ...]:
        return tuple(getattr(self, field.name) for field in dataclasses.fields(self))


def client_url(ip: str) -> str:
    return f"https://{_host(ip)}:{CLIENT_PORT}"


def peer_url(ip: str) -> str:
    return f"https://{_host(ip)}:{PEER_PORT}"


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def render_args(
    *,
    name: str,
    node_ip: str,
    data_dir: Path,
    certs: EtcdCerts,
    initial_cluster: Mapping[str, str] | None = None,
    initial_cluster_state: ClusterState = "new",
    extra_args: Mapping[str, str] | None = None,
) -> list[str]:
    """etcd's flags (without the binary). ``initial_cluster`` maps member name → peer URL; etcd
    reads it (and the cluster state) only when the data dir is empty. ``extra_args`` (flag name
    without dashes → value) come last and replace a rendered flag of the same name."""
    flags: dict[str, str] = {
        "name": name,
        "data-dir": str(data_dir),
        "listen-client-urls": f"{client_url(node_ip)},{client_url('127.0.0.1')}",
        "advertise-client-urls": client_url(node_ip),
        "listen-peer-urls": peer_url(node_ip),
        "initial-advertise-peer-urls": peer_url(node_ip),
        "cert-file": str(certs.server_crt),
        "key-file": str(certs.server_key),
        "trusted-ca-file": str(certs.ca),
        "client-cert-auth": "true",
        "peer-cert-file": str(certs.peer_crt),
        "peer-key-file": str(certs.peer_key),
        "peer-trusted-ca-file": str(certs.ca),
        "peer-client-cert-auth": "true",
        # A member cut off from the others (a node that lost its link) keeps campaigning; without
        # the pre-vote phase it comes back with a higher term and deposes a healthy leader, which
        # costs the API a failed request (etcd 3.4's default is off; 3.5 turned it on).
        "pre-vote": "true",
    }
    if initial_cluster:
        flags["initial-cluster"] = ",".join(f"{member}={url}" for member, url in initial_cluster.items())
        flags["initial-cluster-state"] = initial_cluster_state
    for flag, value in (extra_args or {}).items():
        flags.pop(flag, None)
        flags[flag] = value
    return [f"--{flag}={value}" for flag, value in flags.items()]


@dataclasses.dataclass(frozen=True)
class JoinPlan:
    """How to join: ``reuse`` names the member ID already standing for us (None: add one as a
    learner); ``remove`` a member of ours that lost its data, to remove before adding."""

    reuse: int | None
    initial_cluster: dict[str, str]
    remove: int | None = None

    @property
    def add(self) -> bool:
        return self.reuse is None


def plan_join(members: Sequence[etcd_client.Member], *, name: str, peer: str) -> JoinPlan:
    """Decide how the node ``name`` with peer URL ``peer`` joins a cluster of ``members``.

    Only a node whose data dir is empty joins. A member with our name has started (it published
    its name), so the raft log it acknowledged was in the data dir we lost: started again under
    that ID with an empty log, etcd panics or diverges. It is removed and we are added anew. A
    member with our peer URL but no name is us from an earlier attempt that died before etcd
    started: it never held a log and is reused. Other members that never started are left out
    of the initial cluster: etcd only checks started members against it, and their names are
    unknown anyway.
    """
    lost = next((m for m in members if m.name == name), None)
    ours = next((m for m in members if not m.name and peer in m.peer_urls), None)
    initial: dict[str, str] = {}
    for member in members:
        if member is ours or member is lost or not member.name or not member.peer_urls:
            continue
        initial[member.name] = member.peer_urls[0]
    initial[name] = peer
    return JoinPlan(
        reuse=ours.id if ours is not None else None,
        initial_cluster=initial,
        remove=lost.id if lost is not None else None,
    )


def quorum(voters: int) -> int:
    return voters // 2 + 1


def leave_refusal(
    members: Sequence[etcd_client.Member], *, leaving: int, healthy: Collection[int]
) -> str | None:
    """Why removing member ``leaving`` must not happen (None: it is safe).

    Safe means the members left behind still hold a quorum among themselves counting only the
    ``healthy`` ones (learners do not vote and do not count).
    """
    if not any(m.id == leaving for m in members):
        return f"member {leaving:x} is not in the cluster"
    voters = [m for m in members if not m.is_learner]
    remaining = [m for m in voters if m.id != leaving]
    if not remaining:
        return "this is the only etcd member: removing it would destroy the cluster (wipe the node instead)"
    alive = [m for m in remaining if m.id in healthy]
    needed = quorum(len(remaining))
    if len(alive) < needed:
        return (
            f"removing it would leave {len(remaining)} member(s) of which only {len(alive)} healthy, "
            f"below the quorum of {needed}: fix the unhealthy members first"
        )
    return None


def outage_refusal(
    members: Sequence[etcd_client.Member], *, stopping: int, healthy: Collection[int]
) -> str | None:
    """Why member ``stopping`` must not go down for a while (an agent upgrade keeping its data;
    None: it is safe).

    It stays a member, so the quorum is that of every voter; the voters that are still healthy
    while it is down must reach it. A single member always fails this: its cluster stops.
    """
    if not any(m.id == stopping for m in members):
        return f"member {stopping:x} is not in the cluster"
    voters = [m for m in members if not m.is_learner]
    alive = [m for m in voters if m.id != stopping and m.id in healthy]
    needed = quorum(len(voters))
    if len(alive) < needed:
        return (
            f"while it is down {len(alive)} of the {len(voters)} etcd voters would be healthy, "
            f"below the quorum of {needed}"
        )
    return None


def bootstrap_refusal(
    *,
    control_plane: bool,
    bootstrapped: bool,
    has_data: bool,
    other_cluster: str | None,
) -> str | None:
    """Why ``bootstrap`` must be refused on this node (None: go ahead).

    ``other_cluster`` is what a probe found of an already running cluster (e.g. "the control
    plane endpoint https://10.5.0.1:6443 answers"), None when nothing answered.
    """
    if not control_plane:
        return "bootstrap is only for control plane nodes; this node is a worker"
    if bootstrapped:
        return "this node was already bootstrapped; its etcd runs or restarts from its data"
    if has_data:
        return (
            "this node's etcd data directory is not empty: it already is (or was) a member of a cluster; "
            "use `bootstrap --recover-from SNAPSHOT` after wiping it, or let it rejoin"
        )
    if other_cluster is not None:
        return (
            f"another node is already bootstrapped ({other_cluster}); this node joins that cluster by itself"
        )
    return None
