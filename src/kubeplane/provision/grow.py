"""``kubeplane cluster add`` / ``cluster remove``: a local cluster grows and shrinks.

Adding reuses the creation's steps (:mod:`kubeplane.provision.create`): each new node gets the
next free index of the cluster network (so the next free address and veth name) and the next
free number of its role (``<cluster>-controlplane-2``), a namespace on the cluster bridge, a
``kubeplaned`` in maintenance mode and its role's config, which is the running config of a node
of the same role with the new hostname: the cluster's secrets, the patches it was created with and
any version an upgrade moved it to, and the cluster's ``machine.ports`` (a new node is reached
on the maintenance port until it boots, then on the cluster's node API port, as every node). A
new control plane node then joins etcd by itself (as a learner, promoted once caught up;
:mod:`kubeplane.agent.etcd`) and renders its static pods; it enters the load balancer only once
its etcd member votes and its API server is ready, because haproxy puts a server in rotation
before its first health check. In a cluster whose endpoint is a VIP (``cluster create --vip``)
there is no load balancer: a new control plane node's config carries the VIP like its source's,
and it joins the election once its API server answers; its address is never the VIP's
(:func:`plan_additions` skips it).

Every new node is recorded in the state with ``joined: false`` before anything is made for it and
marked joined only at the end, so a failed add is undone by ``cluster remove`` (or ``cluster
destroy``), and a re-run of the same ``cluster add`` finishes the unjoined nodes first (they count
towards the numbers asked for) instead of making more.

Removing a control plane node, in order: it leaves the load balancer rotation (``drain``: no new
connections); its etcd leadership moves to another member if it leads; its etcd member is removed
through a remaining control plane node; its Node object is deleted; its agent is stopped (which
stops the kubelet, the containers and etcd) with whatever it left; its mounts, cgroups, directory,
veth and namespace go, and the state and the client config context follow. A worker skips the etcd
and load balancer steps, and a VIP cluster the load balancer steps: a control plane node that
holds the VIP when it leaves hands it over as a lost owner does, once its etcd member is removed
(the VIP's outage is then about the 2 s lease, see docs/ha.md). Before anything changes,
:func:`removal_refusal` refuses removals that would remove the last control plane node or leave
the *healthy* etcd members below quorum; the agent checks the quorum again when it removes the
member.

Errors: :class:`GrowError` (a :class:`~kubeplane.provision.cluster.ClusterError`) and its
:class:`RemovalRefused` (nothing was changed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import itertools
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from kubeplane import api, retry
from kubeplane import plan as plan_module
from kubeplane.agent import owned
from kubeplane.clients import errors as client_errors
from kubeplane.clients import etcd as etcd_client
from kubeplane.clients import kube
from kubeplane.config import client as client_config
from kubeplane.provision import create as create_mod
from kubeplane.provision import hostproc, netns, planning, teardown
from kubeplane.provision import loadbalancer as lb
from kubeplane.provision import state as state_mod
from kubeplane.provision.cluster import AGENT, ClusterError, ClusterMeta, PlanError, node_hint
from kubeplane.provision.create import new_step as _step
from kubeplane.services import etcd as etcd_rules


class GrowError(ClusterError):
    """Adding or removing nodes failed; the message names the node and where to look."""


class RemovalRefused(GrowError):
    """The removal would break etcd quorum or remove the last control plane node; nothing changed."""


# -- planning (pure) ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Addition:
    """One node ``cluster add`` makes (or finishes, when ``resumed``)."""

    name: str
    role: state_mod.Role
    index: int
    ip: str
    netns: str
    host_veth: str
    resumed: bool = False


def plan_additions(
    cluster: str,
    cidr: str,
    nodes: Sequence[state_mod.NodeState],
    *,
    controlplanes: int,
    workers: int,
    reserved: Collection[str] = (),
) -> tuple[Addition, ...]:
    """The nodes to add to ``cluster`` (whose nodes are ``nodes``): per role, the unjoined nodes
    of an earlier failed add first, then new ones with the next free number of the role and the
    next free index of the network whose address is not ``reserved`` (the cluster's VIP).
    Raises :class:`~kubeplane.provision.cluster.PlanError`."""
    if controlplanes < 0 or workers < 0:
        raise PlanError("--controlplanes and --workers take 0 or more")
    if controlplanes + workers == 0:
        raise PlanError("nothing to add: pass --controlplanes N and/or --workers N")
    network = ipaddress.IPv4Network(cidr)
    # Node N has the (N+1)th address of the network.
    reserved_indexes = {int(ipaddress.IPv4Address(ip)) - int(network.network_address) - 1 for ip in reserved}
    taken_indexes = {node.index for node in nodes} | reserved_indexes
    taken_names = {node.name for node in nodes}
    additions: list[Addition] = []
    counts: tuple[tuple[state_mod.Role, int], ...] = (("controlplane", controlplanes), ("worker", workers))
    for role, count in counts:
        pending = [node for node in nodes if node.role == role and not node.joined][:count]
        additions += [
            Addition(n.name, n.role, n.index, n.ip, n.netns, n.host_veth, resumed=True) for n in pending
        ]
        for _ in range(count - len(pending)):
            names = (f"{cluster}-{role}-{number}" for number in itertools.count(1))
            name = next(candidate for candidate in names if candidate not in taken_names)
            index = next(i for i in itertools.count(1) if i not in taken_indexes)
            if index + 1 >= network.num_addresses - 1:
                raise PlanError(
                    f"the cluster network {cidr} has no free address left for {name}: remove nodes first"
                )
            taken_names.add(name)
            taken_indexes.add(index)
            additions.append(
                Addition(
                    name=name,
                    role=role,
                    index=index,
                    ip=str(network[index + 1]),
                    netns=netns.netns_name(cluster, name),
                    host_veth=netns.veth_name(cluster, index),
                )
            )
    return tuple(additions)


def removal_refusal(
    cluster: str,
    *,
    controlplanes: Sequence[str],
    removing: Sequence[str],
    members: Sequence[etcd_client.Member],
    healthy: Collection[int],
) -> str | None:
    """Why removing the nodes ``removing`` from ``cluster`` must not happen (None: go ahead).

    ``controlplanes`` are the cluster's control plane node names, ``members`` its etcd members
    (named after their nodes) and ``healthy`` the IDs of the members that answer. Removing every
    control plane node is refused; so is any member removal that leaves fewer healthy voting
    members than the quorum of those remaining, checked one node after the other, in order
    (:func:`kubeplane.services.etcd.leave_refusal`)."""
    leaving = [name for name in removing if name in controlplanes]
    voters = [m for m in members if not m.is_learner]
    if leaving and not [name for name in controlplanes if name not in removing]:
        return (
            f"refusing to remove {', '.join(leaving)}: the cluster {cluster!r} would have no "
            f"control plane node left (it has {len(controlplanes)} control plane node(s) and "
            f"{len(voters)} etcd member(s)); "
            "use `kubeplane cluster destroy` to remove the whole cluster"
        )
    current = list(members)
    for name in leaving:
        member = next((m for m in current if m.name == name), None)
        if member is None:
            continue
        refusal = etcd_rules.leave_refusal(current, leaving=member.id, healthy=healthy)
        if refusal is not None:
            voting = [m for m in current if not m.is_learner]
            alive = [m for m in voting if m.id in healthy]
            return (
                f"refusing to remove control plane node {name}: etcd has {len(voting)} member(s), "
                f"{len(alive)} healthy; {refusal}"
            )
        current.remove(member)
    return None


def member_from_document(document: Mapping[str, Any]) -> etcd_client.Member:
    """An etcd member as the node API's ``etcd members`` call lists it (hex ID)."""
    return etcd_client.Member(
        id=int(str(document["id"]), 16),
        name=str(document.get("name", "")),
        peer_urls=list(document.get("peer_urls", [])),
        client_urls=list(document.get("client_urls", [])),
        is_learner=bool(document.get("learner", False)),
    )


# -- access to a running cluster -------------------------------------------------------------


def cluster_access(cluster: state_mod.ClusterState) -> create_mod.CreatedCluster:
    """How to reach the running cluster: its endpoint, kubeconfig, client config and credentials."""
    meta = ClusterMeta.load(cluster.directory)
    if meta is None or not meta.client_config_path or not meta.kubeconfig:
        raise GrowError(
            f"cluster {cluster.name!r} was never fully created (no client config or kubeconfig recorded): "
            f"destroy it with `kubeplane cluster destroy --name {cluster.name}`"
        )
    try:
        _, context = client_config.current(client_config.load(meta.client_config_path), meta.context)
    except client_config.ClientConfigError as exc:
        raise GrowError(f"cannot read context {meta.context!r} of cluster {cluster.name!r}: {exc}") from exc
    return create_mod.CreatedCluster(
        name=cluster.name,
        directory=cluster.directory,
        endpoint=meta.endpoint,
        kubeconfig=Path(meta.kubeconfig),
        client_config_path=Path(meta.client_config_path),
        controlplanes=tuple(n.ip for n in cluster.nodes if n.role == "controlplane" and n.joined),
        workers=tuple(n.ip for n in cluster.nodes if n.role == "worker" and n.joined),
        credentials=api.Credentials(ca=context.ca_pem, cert=context.client.cert, key=context.client.key),
        node_api_port=cluster.node_api_port,
    )


def sync_context(cluster: state_mod.ClusterState) -> None:
    """Point the cluster's client config context at its joined nodes (endpoints: control planes,
    with the cluster's node API port when it moved it)."""
    meta = ClusterMeta.load(cluster.directory)
    if meta is None or not meta.client_config_path or not meta.context:
        return
    path = Path(meta.client_config_path)
    config = client_config.load(path)
    context = config.contexts.get(meta.context)
    if context is None:
        return
    joined = [node for node in cluster.nodes if node.joined]
    updated = dataclasses.replace(
        context,
        endpoints=cluster.context_endpoints(),
        nodes=tuple(node.ip for node in joined),
    )
    client_config.save(dataclasses.replace(config, contexts={**config.contexts, meta.context: updated}), path)


def balanced(cluster: state_mod.ClusterState) -> bool:
    """Whether haproxy on the host is the cluster's endpoint (not a VIP the nodes share)."""
    return not (cluster.network is not None and cluster.network.vip)


def _haproxy(cluster: state_mod.ClusterState) -> lb.HAProxy:
    return lb.HAProxy(directory=Path(cluster.dirs["haproxy"]), record=cluster.processes.get("haproxy"))


def _update_backends(cluster: state_mod.ClusterState, names: Collection[str]) -> None:
    """haproxy's backends: the control plane nodes ``names``, in state order (reloads if changed)."""
    if cluster.network is None:
        raise GrowError(f"cluster {cluster.name!r} has no network recorded")
    _haproxy(cluster).update(
        bind_address=cluster.network.host_ip,
        backends=[
            lb.Backend(name=node.name, address=node.ip)
            for node in cluster.nodes
            if node.role == "controlplane" and node.name in names
        ],
    )


def _node_call(access: create_mod.CreatedCluster, ip: str, call: Callable[[api.NodeClient], Any]) -> Any:
    """``call`` on the booted node at ``ip`` (on the cluster's node API port), its one reply unwrapped."""

    async def scenario() -> Any:
        endpoint = access.node_api_endpoint(ip)
        async with api.NodeClient([endpoint], credentials=access.credentials, timeout=30.0) as client:
            return (await call(client))[0].unwrap()

    return asyncio.run(scenario())


def _kube(access: create_mod.CreatedCluster, call: Callable[[kube.KubeClient], Any]) -> Any:
    async def scenario() -> Any:
        async with kube.KubeClient(access.kubeconfig.read_text()) as client:
            return await call(client)

    return asyncio.run(scenario())


# -- adding ------------------------------------------------------------------------------------


class Growth:
    """``cluster add``: the plan and how to run each of its steps (through the one executor)."""

    def __init__(
        self,
        cluster: state_mod.ClusterState,
        additions: Sequence[Addition],
        *,
        progress: plan_module.Progress | None = None,
        step_timeout: float = 600.0,
    ) -> None:
        self.cluster = cluster
        self.additions = tuple(additions)
        self.progress = progress if progress is not None else plan_module.RecordingProgress()
        self.step_timeout = step_timeout
        self.access = cluster_access(cluster)
        self.sources = {role: self._source(role) for role in {a.role for a in self.additions}}

    def _source(self, role: state_mod.Role) -> state_mod.NodeState:
        """The joined node of ``role`` whose running config the new nodes of that role get."""
        for node in self.cluster.nodes:
            if node.role == role and node.joined:
                return node
        raise PlanError(
            f"cluster {self.cluster.name!r} has no {role} node to take the {role} config from; "
            f"add a {role} with `kubeplane gen config` and `apply-config --insecure` by hand (docs/ha.md)"
        )

    @property
    def new_controlplanes(self) -> tuple[Addition, ...]:
        return tuple(a for a in self.additions if a.role == "controlplane")

    def plan(self) -> plan_module.Plan:
        names = ", ".join(f"{a.name} ({a.ip}{', unfinished' if a.resumed else ''})" for a in self.additions)
        steps = [
            _step("write", "node records", f"{names}, not joined yet"),
            _step("create", "network", "a namespace and a veth on the cluster bridge per node"),
            _step("start", "node agents", f"{AGENT} in maintenance mode on {names}"),
        ]
        sources = ", ".join(f"{role}s from {node.name}" for role, node in sorted(self.sources.items()))
        steps.append(_step("apply", "configs", f"the running config with the node's hostname ({sources})"))
        for addition in self.new_controlplanes:
            steps.append(
                _step("wait", "etcd member and API server", f"{addition.name} votes, serves", addition.ip)
            )
        if self.new_controlplanes and balanced(self.cluster):
            backends = [n.name for n in self.cluster.nodes if n.role == "controlplane" and n.joined]
            backends += [a.name for a in self.new_controlplanes if a.name not in backends]
            steps.append(_step("update", "load balancer", f"haproxy backends {', '.join(backends)}"))
        steps.append(_step("write", "client config", f"context {self.access.name!r} with the joined nodes"))
        return plan_module.Plan(
            title=f"add {len(self.additions)} node(s) to cluster {self.cluster.name!r}",
            steps=tuple(steps),
            rerun=(
                "the nodes recorded but not joined are finished, not made again; "
                "`kubeplane cluster remove` takes them away instead"
            ),
        )

    async def run_step(self, step: plan_module.Step) -> plan_module.Outcome:
        handlers: dict[str, Callable[[], plan_module.Outcome]] = {
            "node records": self._record,
            "network": self._network,
            "node agents": self._agents,
            "configs": self._configs,
            "load balancer": self._load_balancer,
            "client config": self._client_config,
        }
        if step.component == "etcd member and API server":
            addition = next(a for a in self.new_controlplanes if a.ip == step.node)
            return await asyncio.to_thread(self._wait_controlplane, addition)
        return await asyncio.to_thread(handlers[step.component])

    def _plans(self) -> list[planning.NodePlan]:
        # start_agent needs the name and place of each node; its config comes later, from a peer.
        return [planning.NodePlan(a.name, a.role, a.ip, a.netns, config="") for a in self.additions]

    def _record(self) -> plan_module.Outcome:
        recorded = {node.name for node in self.cluster.nodes}
        for addition in self.additions:
            if addition.name not in recorded:
                self.cluster.nodes.append(
                    state_mod.NodeState(
                        name=addition.name,
                        role=addition.role,
                        index=addition.index,
                        ip=addition.ip,
                        netns=addition.netns,
                        host_veth=addition.host_veth,
                        joined=False,
                    )
                )
        self.cluster.save()
        return plan_module.CHANGED

    def _network(self) -> plan_module.Outcome:
        net = self.cluster.network
        if net is None:
            raise GrowError(f"cluster {self.cluster.name!r} has no network recorded")
        network_plan = netns.NetworkPlan(
            cluster=self.cluster.name,
            cidr=ipaddress.IPv4Network(net.cidr),
            host_ip=net.host_ip,
            bridge=net.bridge,
            nodes=tuple(
                netns.NodeAddress(a.name, a.index, a.ip, a.netns, a.host_veth) for a in self.additions
            ),
        )
        try:
            netns.create(network_plan, self.cluster, roles={a.name: a.role for a in self.additions})
        except netns.NetworkError as exc:
            raise GrowError(str(exc)) from exc
        return plan_module.CHANGED

    def _configured(self, addition: Addition) -> bool:
        """Whether a resumed node already runs with its config (it answers with the cluster's
        credentials): an earlier add got past applying it, so it is not in maintenance mode."""
        if not addition.resumed:
            return False
        try:
            _node_call(self.access, addition.ip, api.NodeClient.version)
        except api.APIError:
            return False
        return True

    def _agents(self) -> plan_module.Outcome:
        command = create_mod.agent_command()
        for node_plan in self._plans():
            create_mod.start_agent(self.cluster, node_plan, command=command)
        for addition in self.additions:
            if not self._configured(addition):
                create_mod.wait_maintenance(self.cluster.node(addition.name), timeout=self.step_timeout)
        return plan_module.CHANGED

    def _configs(self) -> plan_module.Outcome:
        documents = {role: self._role_document(node) for role, node in self.sources.items()}
        for addition in self.additions:
            if self._configured(addition):
                continue
            text = planning.node_config(
                documents[addition.role],
                hostname=addition.name,
                node_api_port=self.cluster.node_api_port,
                trustd_port=self.cluster.trustd_port,
            )
            create_mod.apply_config(self.cluster.node(addition.name), text, timeout=self.step_timeout)
        return plan_module.CHANGED

    def _role_document(self, source: state_mod.NodeState) -> dict[str, Any]:
        reply = _node_call(self.access, source.ip, api.NodeClient.machine_config)
        document = yaml.safe_load(reply.get("current") or "") or {}
        interfaces = ((document.get("machine") or {}).get("network") or {}).get("interfaces") or []
        if any(isinstance(i, dict) and "wireguard" in i for i in interfaces):
            raise GrowError(
                f"the config of {source.name} has a WireGuard interface: adding a node to a --wireguard-cidr "
                "cluster needs new keys and every node's peers changed, which `cluster add` does not do yet"
            )
        return dict(document)

    def _wait_controlplane(self, addition: Addition) -> plan_module.Outcome:
        node = self.cluster.node(addition.name)
        through = [n.ip for n in self.cluster.nodes if n.role == "controlplane" and n.joined]

        def voting() -> bool:
            record = node.processes.get(AGENT)
            if record is not None and not hostproc.is_running(record):
                raise GrowError(f"the agent of {node.name} exited; {node_hint(node)}")
            listed = _node_call(self.access, through[0], api.NodeClient.etcd_members)
            members = [member_from_document(m) for m in listed]
            ours = next((m for m in members if m.name == node.name), None)
            if ours is None or ours.is_learner:
                raise retry.NotYet(f"its etcd member is {'a learner' if ours else 'not listed yet'}")
            response = httpx.get(f"https://{node.ip}:{lb.API_PORT}/readyz", verify=False, timeout=5.0)  # noqa: S501
            if response.status_code != 200:
                raise retry.NotYet(f"its API server answers /readyz with HTTP {response.status_code}")
            return True

        retry.Wait(
            what=f"{node.name} to join etcd as a voting member and serve the API",
            timeout=self.step_timeout,
            backoff=retry.fixed(2.0),
            retry_on=(api.APIError, httpx.HTTPError),
            error=GrowError,
            hint=node_hint(node),
        ).poll(voting)
        return plan_module.CHANGED

    def _load_balancer(self) -> plan_module.Outcome:
        names = {n.name for n in self.cluster.nodes if n.role == "controlplane" and n.joined}
        names |= {a.name for a in self.new_controlplanes}
        _update_backends(self.cluster, names)
        proxy = _haproxy(self.cluster)
        for addition in self.new_controlplanes:
            proxy.wait_status(addition.name, until="healthy", timeout=30.0)
        return plan_module.CHANGED

    def _client_config(self) -> plan_module.Outcome:
        for addition in self.additions:
            self.cluster.node(addition.name).joined = True
        self.cluster.save()
        sync_context(self.cluster)
        return plan_module.CHANGED


# -- removing ----------------------------------------------------------------------------------


class Shrink:
    """``cluster remove``: the plan and how to run each of its steps (through the one executor)."""

    def __init__(
        self,
        cluster: state_mod.ClusterState,
        names: Sequence[str],
        *,
        progress: plan_module.Progress | None = None,
        step_timeout: float = 120.0,
    ) -> None:
        known = [node.name for node in cluster.nodes]
        unknown = [name for name in names if name not in known]
        if unknown:
            raise PlanError(
                f"cluster {cluster.name!r} has no node {', '.join(unknown)}; its nodes are {', '.join(known)}"
            )
        self.cluster = cluster
        self.nodes = tuple(cluster.node(name) for name in dict.fromkeys(names))
        self.progress = progress if progress is not None else plan_module.RecordingProgress()
        self.step_timeout = step_timeout
        self.access = cluster_access(cluster)
        removing = {node.name for node in self.nodes}
        self.remaining = tuple(
            n for n in cluster.nodes if n.role == "controlplane" and n.joined and n.name not in removing
        )

    @property
    def leaving_controlplanes(self) -> tuple[state_mod.NodeState, ...]:
        return tuple(node for node in self.nodes if node.role == "controlplane")

    def check(self) -> None:
        """Refuse (:class:`RemovalRefused`) a removal that would break quorum or leave no control plane."""
        controlplanes = [n.name for n in self.cluster.nodes if n.role == "controlplane" and n.joined]
        controlplanes += [n.name for n in self.leaving_controlplanes if n.name not in controlplanes]
        if not self.leaving_controlplanes:
            return
        members: list[etcd_client.Member] = []
        healthy: set[int] = set()
        answered: dict[str, list[etcd_client.Member]] = {}
        for node in self.cluster.nodes:
            if node.role != "controlplane":
                continue
            try:
                listed = _node_call(self.access, node.ip, api.NodeClient.etcd_members)
            except api.APIError:
                continue
            answered[node.name] = [member_from_document(m) for m in listed]
        for name, listed in answered.items():
            members = members or listed
            healthy |= {m.id for m in listed if m.name == name}
        refusal = removal_refusal(
            self.cluster.name,
            controlplanes=controlplanes,
            removing=[n.name for n in self.nodes],
            members=members,
            healthy=healthy,
        )
        if refusal is not None:
            raise RemovalRefused(refusal)
        if not [n for n in self.remaining if n.name in answered]:
            nodes = ", ".join(n.name for n in self.leaving_controlplanes)
            raise RemovalRefused(
                f"refusing to remove control plane node(s) {nodes}: no remaining control plane node "
                f"of cluster {self.cluster.name!r} answers with its etcd members "
                f"({len(members)} member(s) known)"
            )

    def plan(self) -> plan_module.Plan:
        steps = []
        through = self.remaining[0] if self.remaining else None
        for node in self.nodes:
            if node.role == "controlplane":
                if balanced(self.cluster):
                    steps.append(
                        _step("drain", "load balancer rotation", f"{node.name} out of rotation", node.ip)
                    )
                steps += [
                    _step("move", "etcd leadership", f"away from {node.name} if it leads", node.ip),
                    _step(
                        "remove",
                        "etcd member",
                        f"{node.name}, through {through.name if through else '(none)'}",
                        node.ip,
                    ),
                ]
            steps += [
                _step("delete", "Node object", node.name, node.ip),
                _step("stop", "node", "agent and processes; mounts, directory, veth, namespace", node.ip),
            ]
        if self.leaving_controlplanes and balanced(self.cluster):
            backends = ", ".join(n.name for n in self.remaining)
            steps.append(_step("update", "load balancer", f"haproxy backends {backends}"))
        names = ", ".join(node.name for node in self.nodes)
        return plan_module.Plan(
            title=f"remove {names} from cluster {self.cluster.name!r}",
            steps=tuple(steps),
            rerun="steps whose node or member is already gone are skipped",
        )

    async def run_step(self, step: plan_module.Step) -> plan_module.Outcome:
        if step.component == "load balancer":
            return await asyncio.to_thread(self._load_balancer)
        node = next(n for n in self.nodes if n.ip == step.node)
        handlers: dict[str, Callable[[state_mod.NodeState], plan_module.Outcome]] = {
            "load balancer rotation": self._drain,
            "etcd leadership": self._forfeit,
            "etcd member": self._remove_member,
            "Node object": self._delete_node,
            "node": self._stop,
        }
        return await asyncio.to_thread(handlers[step.component], node)

    def _drain(self, node: state_mod.NodeState) -> plan_module.Outcome:
        proxy = _haproxy(self.cluster)
        if node.name not in proxy.server_states():
            return plan_module.SKIPPED
        proxy.set_server_state(node.name, "drain")
        proxy.wait_status(node.name, until="out", timeout=30.0)
        return plan_module.CHANGED

    def _forfeit(self, node: state_mod.NodeState) -> plan_module.Outcome:
        try:
            said = _node_call(self.access, node.ip, api.NodeClient.etcd_forfeit_leadership)
        except api.APIError as exc:
            # A node whose etcd does not answer leads no one (a leader answers).
            self.progress.info(f"{node.name}: etcd does not answer ({exc}); it cannot be the leader")
            return plan_module.SKIPPED
        message = str(said.get("message", ""))
        self.progress.info(message)
        return plan_module.CHANGED if message.startswith("leadership moved") else plan_module.SKIPPED

    def _remove_member(self, node: state_mod.NodeState) -> plan_module.Outcome:
        if not self.remaining:
            raise RemovalRefused(f"no control plane node remains to remove the etcd member of {node.name}")
        through = self.remaining[0]

        def remove() -> plan_module.Outcome:
            listed = _node_call(self.access, through.ip, api.NodeClient.etcd_members)
            if not any(member.get("name") == node.name for member in listed):
                return plan_module.SKIPPED
            said = _node_call(self.access, through.ip, lambda c: c.etcd_remove_member(node.name))
            self.progress.info(str(said.get("message", "")))
            return plan_module.CHANGED

        # Right after a leadership move etcd may answer "leader changed" once: ask again.
        return retry.Wait(
            what=f"removing the etcd member of {node.name} through {through.name}",
            timeout=self.step_timeout,
            backoff=retry.fixed(1.0),
            retry_on=(api.UnavailableError, api.ConnectError),
            error=GrowError,
            hint=node_hint(through),
        ).poll(remove)

    def _delete_node(self, node: state_mod.NodeState) -> plan_module.Outcome:
        try:
            _kube(self.access, lambda client: client.delete(kube.node_path(node.name)))
        except client_errors.KubeNotFound:
            return plan_module.SKIPPED
        except client_errors.KubeError as exc:
            raise GrowError(f"deleting the Node object {node.name}: {exc}") from exc
        return plan_module.CHANGED

    def _stop(self, node: state_mod.NodeState) -> plan_module.Outcome:
        teardown.stop_node(node)
        if node.root_dir:
            root = Path(node.root_dir)
            teardown.unmount_under(root)
            for cgroup in node.cgroups:
                owned.remove_cgroup(Path(cgroup))
            shutil.rmtree(root, ignore_errors=True)
        self._reroute(node)
        netns.remove_node(self.cluster, node)
        self.cluster.nodes = [n for n in self.cluster.nodes if n.name != node.name]
        self.cluster.save()
        sync_context(self.cluster)
        return plan_module.CHANGED

    def _reroute(self, node: state_mod.NodeState) -> None:
        """Host routes through the leaving node (the Service subnet) go through a remaining control plane."""
        net = self.cluster.network
        if net is None or not self.remaining:
            return
        for destination, gateway in list(net.routes.items()):
            if gateway == node.ip:
                net.routes[destination] = self.remaining[0].ip
                self.cluster.save()
                netns.ip("route", "replace", destination, "via", self.remaining[0].ip, "dev", net.bridge)

    def _load_balancer(self) -> plan_module.Outcome:
        _update_backends(self.cluster, {n.name for n in self.remaining})
        return plan_module.CHANGED
