"""``kubeplane kubeadm ha``: a kubeadm cluster's single control plane made highly available.

The operation is :mod:`kubeplane.ops.kubeadm_ha`; this module gives it the cluster. A local
cluster (``--name``, made by ``cluster create --kubeadm``) brings everything: SSH keys, the nodes,
haproxy on the host as the load balancer and new machines for the two control plane nodes to join
(:class:`LocalInfrastructure`). Real machines are named instead (``--control-plane``,
``--worker``, ``--join``, ``--endpoint`` of a load balancer you run), reached with your SSH key
and known-hosts file; kubeplane then checks the load balancer through the endpoint and tells you
which servers to put behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from kubeplane import plan as plan_module
from kubeplane.cli import output, progress
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube as kube_client
from kubeplane.clients import ssh
from kubeplane.ops import kubeadm_ha
from kubeplane.ops.errors import OpsError
from kubeplane.provision import cluster as cluster_mod
from kubeplane.provision import grow, hostproc, netns, state, toolchain
from kubeplane.provision import kubeadm as kubeadm_mod
from kubeplane.provision import loadbalancer as lb


def register(group: click.Group) -> None:
    group.add_command(kubeadm_group)


@click.group("kubeadm")
def kubeadm_group() -> None:
    """Operations on kubeadm clusters (local ones from `cluster create --kubeadm`, or real machines)."""


class LocalInfrastructure:
    """:class:`kubeplane.ops.kubeadm_ha.Infrastructure` of a local kubeadm cluster: haproxy on the
    host's bridge address is the load balancer; the new control plane nodes are machines made like
    the others, with the next free names and addresses, journaled (``joined: false``) before
    anything is made so a re-run finishes the same ones."""

    #: Control plane nodes of the highly available cluster.
    CONTROL_PLANES = 3

    def __init__(
        self,
        cluster: state.ClusterState,
        *,
        paths: toolchain.ToolchainPaths,
        step_timeout: float = 120.0,
        record: bool = True,
    ) -> None:
        if cluster.network is None:
            raise cluster_mod.ClusterError(f"cluster {cluster.name!r} has no network recorded")
        self.cluster = cluster
        self.network = cluster.network
        self.paths = paths
        self.registry_url = f"http://{self.network.host_ip}:6000"
        self.step_timeout = step_timeout
        self._new = self._plan_new(record=record)

    def _haproxy(self) -> lb.HAProxy:
        directory = Path(self.cluster.dirs.get("haproxy") or self.cluster.directory / "haproxy")
        return lb.HAProxy(directory=directory, record=self.cluster.processes.get("haproxy"))

    def describe_load_balancer(self) -> str:
        return f"haproxy on {self.network.host_ip}:{lb.API_PORT} (TCP, SSL health checks of /readyz)"

    async def load_balancer_backends(self) -> list[str] | None:
        record = self.cluster.processes.get("haproxy")
        if record is None or not hostproc.is_running(record):
            return []
        return await asyncio.to_thread(lambda: list(self._haproxy().server_states()))

    async def set_load_balancer(self, backends: Sequence[kubeadm_ha.Machine]) -> None:
        def apply() -> None:
            haproxy = self._haproxy()
            servers = [lb.Backend(name=m.name, address=m.address) for m in backends]
            record = self.cluster.processes.get("haproxy")
            if record is not None and hostproc.is_running(record):
                haproxy.update(bind_address=self.network.host_ip, backends=servers)
                return
            self.cluster.dirs["haproxy"] = str(haproxy.directory)
            self.cluster.save()
            haproxy.write_config(bind_address=self.network.host_ip, backends=servers)
            self.cluster.processes["haproxy"] = haproxy.start()
            self.cluster.save()

        await asyncio.to_thread(apply)

    async def wait_backend_healthy(self, machine: kubeadm_ha.Machine) -> None:
        await asyncio.to_thread(self._haproxy().wait_status, machine.name, until="healthy", timeout=90.0)

    def _plan_new(self, *, record: bool) -> list[kubeadm_mod.KubeadmNode]:
        controlplanes = [n for n in self.cluster.nodes if n.role == "controlplane"]
        missing = self.CONTROL_PLANES - len(controlplanes)
        additions = (
            grow.plan_additions(
                self.cluster.name, self.network.cidr, self.cluster.nodes, controlplanes=missing, workers=0
            )
            if missing > 0
            else ()
        )
        planned = [
            state.NodeState(
                name=a.name,
                role="controlplane",
                index=a.index,
                ip=a.ip,
                netns=a.netns,
                host_veth=a.host_veth,
                joined=False,
            )
            for a in additions
        ]  # fmt: skip
        if record and planned:
            self.cluster.nodes.extend(planned)
            self.cluster.save()
        return [
            kubeadm_mod.KubeadmNode(name=n.name, role="controlplane", ip=n.ip, netns=n.netns, index=n.index)
            for n in [*controlplanes[1:], *planned]
        ]

    def new_machines(self) -> list[kubeadm_ha.Machine]:
        return [
            kubeadm_ha.Machine(name=n.name, address=n.ip, target=kubeadm_mod.target(n)) for n in self._new
        ]

    async def make_machine(self, machine: kubeadm_ha.Machine, existing: Sequence[kubeadm_ha.Machine]) -> None:
        node = next(n for n in self._new if n.name == machine.name)

        def make() -> None:
            recorded = self.cluster.node(node.name)
            network_plan = netns.NetworkPlan(
                cluster=self.cluster.name,
                cidr=ipaddress.IPv4Network(self.network.cidr),
                host_ip=self.network.host_ip,
                bridge=self.network.bridge,
                nodes=(netns.NodeAddress(node.name, node.index, node.ip, node.netns, recorded.host_veth),),
            )
            netns.create(network_plan, self.cluster, roles={node.name: "controlplane"})
            kubeadm_mod.prepare_machine(self.cluster, node, paths=self.paths, registry_url=self.registry_url)
            kubeadm_mod.start_machine(self.cluster, node, paths=self.paths)
            kubeadm_mod.wait_ssh(self.cluster, node, timeout=self.step_timeout)
            kubeadm_mod.route_pod_networks(self.cluster, kubeadm_mod.all_nodes(self.cluster))

        await asyncio.to_thread(make)

    async def joined(self, machine: kubeadm_ha.Machine) -> None:
        def record() -> None:
            node = self.cluster.node(machine.name)
            if not node.joined:
                node.joined = True
                self.cluster.save()

        await asyncio.to_thread(record)

    def connect(self, machine: kubeadm_ha.Machine) -> contextlib.AbstractAsyncContextManager[ssh.Session]:
        return ssh.connect(machine.target, kubeadm_mod.credentials(self.cluster.directory))


class RealInfrastructure:
    """Real machines: the load balancer is the user's (only checked through the endpoint), the
    machines to join exist and have kubeadm, the kubelet and a container runtime installed."""

    def __init__(
        self, *, endpoint: str, joins: Sequence[kubeadm_ha.Machine], credentials: ssh.Credentials
    ) -> None:
        self.endpoint = endpoint
        self.joins = list(joins)
        self.credentials = credentials
        self.reminders: list[str] = []

    def describe_load_balancer(self) -> str:
        return f"yours at {self.endpoint} (checked: it must lead to this cluster's API server)"

    async def load_balancer_backends(self) -> list[str] | None:
        return None

    async def set_load_balancer(self, backends: Sequence[kubeadm_ha.Machine]) -> None:
        self.reminders.append(
            "put these behind " + self.endpoint + ": " + ", ".join(f"{m.address}:6443" for m in backends)
        )

    async def wait_backend_healthy(self, machine: kubeadm_ha.Machine) -> None:
        return None

    def new_machines(self) -> list[kubeadm_ha.Machine]:
        return list(self.joins)

    async def make_machine(self, machine: kubeadm_ha.Machine, existing: Sequence[kubeadm_ha.Machine]) -> None:
        return None

    async def joined(self, machine: kubeadm_ha.Machine) -> None:
        self.reminders.append(f"{machine.name} joined: add {machine.address}:6443 to the load balancer")

    def connect(self, machine: kubeadm_ha.Machine) -> contextlib.AbstractAsyncContextManager[ssh.Session]:
        return ssh.connect(machine.target, self.credentials)


def _machine(text: str, *, user: str, port: int, credentials: ssh.Credentials) -> kubeadm_ha.Machine:
    """``[NAME=][USER@]HOST[:PORT]`` as a machine; without NAME its node name is its hostname."""
    name, sep, rest = text.partition("=")
    if not sep:
        name, rest = "", text
    try:
        target = ssh.Target.parse(rest if "@" in rest else f"{user}@{rest}")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if target.port == 22 and port != 22:
        target = ssh.Target(host=target.host, port=port, user=target.user)
    if not name:

        async def hostname() -> str:
            async with ssh.connect(target, credentials) as session:
                return (await session.run("hostname")).stdout.strip().lower()

        try:
            name = asyncio.run(hostname())
        except ssh.SSHError as exc:
            raise click.ClickException(str(exc)) from exc
    return kubeadm_ha.Machine(
        name=name, address=target.host, target=ssh.Target(target.host, target.port, target.user, name)
    )


async def _admin(connect: kubeadm_ha.Connect, machine: kubeadm_ha.Machine) -> str:
    async with connect(machine) as session:
        return (await session.read("/etc/kubernetes/admin.conf")).decode()


@kubeadm_group.command("ha")
@click.option("--name", help="A local kubeadm cluster (cluster create --kubeadm).")
@click.option(
    "--control-plane",
    "control_plane",
    metavar="[NAME=][USER@]HOST[:PORT]",
    help="Real machines: the control plane node.",
)
@click.option(
    "--worker",
    "workers",
    multiple=True,
    metavar="[NAME=][USER@]HOST",
    help="Real machines: a worker (repeatable).",
)
@click.option(
    "--join",
    "joins",
    multiple=True,
    metavar="[NAME=][USER@]HOST",
    help="Real machines: a machine to join as a control plane node (repeatable; two make three).",
)
@click.option(
    "--endpoint",
    metavar="HOST[:PORT]",
    help="Real machines: your load balancer (TCP, SSL health checks) in front of the control plane nodes.",
)
@click.option("--ssh-user", default="root", show_default=True)
@click.option("--ssh-port", default=22, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--ssh-key",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Private key (default ~/.ssh/id_ed25519).",
)
@click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Host keys (default ~/.ssh/known_hosts).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@output.output_option
def ha(
    *,
    name: str | None,
    control_plane: str | None,
    workers: tuple[str, ...],
    joins: tuple[str, ...],
    endpoint: str | None,
    ssh_user: str,
    ssh_port: int,
    ssh_key: Path | None,
    known_hosts: Path | None,
    dry_run: bool,
    fmt: output.Format,
) -> None:
    """Make a kubeadm cluster's single control plane highly available, the HA guide's steps in order.

    A load balancer in front of the node (TCP, SSL health checks); the API server certificate
    re-signed by the cluster CA with the endpoint added and every old name kept; kubelet.conf,
    controller-manager.conf, scheduler.conf and admin.conf pointed at it and their components
    restarted; kube-proxy's ConfigMap and pods; the workers' kubelets; kubeadm-config
    (controlPlaneEndpoint, certSANs) and cluster-info; then two control plane nodes joined with
    a new token, the CA hash and an uploaded certificate key. Each step checks the live state
    first: re-running after a failure or a kill finishes the job.
    """
    if name is not None and (control_plane or workers or joins or endpoint):
        raise click.UsageError(
            "--name is a local cluster; --control-plane/--worker/--join/--endpoint are for real machines"
        )
    if name is None and not (control_plane and endpoint and joins):
        raise click.UsageError(
            "give --name (a local kubeadm cluster) or --control-plane, --join and --endpoint"
        )
    infra: LocalInfrastructure | RealInfrastructure
    with progress.display() as shown:
        if name is not None:
            request, infra, connect = _local(name, record=not dry_run)
        else:
            creds = ssh.Credentials(
                key=ssh_key or Path.home() / ".ssh" / "id_ed25519",
                known_hosts=known_hosts or Path.home() / ".ssh" / "known_hosts",
            )
            host, _, port = (
                (endpoint or "").rpartition(":") if (endpoint or "").count(":") == 1 else (endpoint, "", "")
            )
            cp = _machine(control_plane or "", user=ssh_user, port=ssh_port, credentials=creds)
            real = RealInfrastructure(
                endpoint=f"{host}:{port or 6443}",
                joins=[_machine(j, user=ssh_user, port=ssh_port, credentials=creds) for j in joins],
                credentials=creds,
            )
            request = kubeadm_ha.Request(
                control_plane=cp,
                workers=tuple(_machine(w, user=ssh_user, port=ssh_port, credentials=creds) for w in workers),
                endpoint_host=str(host),
                endpoint_port=int(port or 6443),
            )
            infra, connect = real, real.connect
        try:
            admin = asyncio.run(_admin(connect, request.control_plane))
            operation = kubeadm_ha.KubeadmHA(
                request, infrastructure=infra, connect=connect, admin=admin, progress=shown
            )
            asyncio.run(operation.preflight())
        except (ssh.SSHError, OpsError, client_errors.KubeError) as exc:
            raise click.ClickException(str(exc)) from exc
        plan = operation.plan()
        if dry_run:
            click.echo(plan.render())
            click.echo("dry run: nothing was changed")
            return
        resume = shlex.join(["kubeplane", *sys.argv[1:]])
        try:
            asyncio.run(plan_module.execute(plan, operation.run_step, progress=shown, resume=resume))
        except plan_module.StepFailed as exc:
            raise click.ClickException(str(exc)) from exc
        if name is not None:
            _finish_local(name, request)
        for reminder in getattr(infra, "reminders", ()):
            shown.info(reminder)
    document = asyncio.run(_summary(admin, request.endpoint))
    if fmt == "table":
        rows = [[n["name"], n["role"], n["ready"], n["address"]] for n in document["nodes"]]
        click.echo(f"endpoint: {document['endpoint']}\n")
        click.echo(output.table(["NAME", "ROLE", "READY", "ADDRESS"], rows), nl=False)
    else:
        click.echo(output.documents([document], fmt), nl=False)


def _local(name: str, *, record: bool) -> tuple[kubeadm_ha.Request, LocalInfrastructure, kubeadm_ha.Connect]:
    try:
        cluster = state.ClusterState.load(name)
    except state.StateError as exc:
        raise click.ClickException(
            f"{exc} (local clusters: {', '.join(cluster_mod.list_clusters()) or 'none'})"
        ) from exc
    meta = cluster_mod.ClusterMeta.load(cluster.directory)
    if meta is None or meta.kind != cluster_mod.KIND_KUBEADM:
        raise click.ClickException(
            f"cluster {name!r} was not made by kubeadm (cluster create --kubeadm); a kubeplane cluster "
            "grows with `kubeplane cluster add --controlplanes 2` and moves its endpoint with "
            "`kubeplane endpoint set`"
        )
    if cluster.network is None:
        raise click.ClickException(f"cluster {name!r} has no network recorded")
    try:
        paths = toolchain.Toolchain().require(meta.kubernetes_version)
    except toolchain.ToolchainError as exc:
        raise click.ClickException(str(exc)) from exc
    infra = LocalInfrastructure(cluster, paths=paths, record=record)
    first = next(n for n in cluster.nodes if n.role == "controlplane")
    request = kubeadm_ha.Request(
        control_plane=kubeadm_ha.Machine(name=first.name, address=first.ip, target=kubeadm_mod.target(first)),
        workers=tuple(
            kubeadm_ha.Machine(name=n.name, address=n.ip, target=kubeadm_mod.target(n))
            for n in cluster.nodes
            if n.role == "worker"
        ),
        endpoint_host=cluster.network.host_ip,
        endpoint_port=lb.API_PORT,
    )
    return request, infra, infra.connect


def _finish_local(name: str, request: kubeadm_ha.Request) -> None:
    """The local cluster's record follows: its endpoint, and its admin kubeconfig's server."""
    directory = state.cluster_dir(name)
    meta = cluster_mod.ClusterMeta.load(directory)
    if meta is None:
        return
    meta.endpoint = request.endpoint
    meta.save(directory)
    path = Path(meta.kubeconfig or directory / "kubeconfig")
    if path.is_file():
        cluster_mod.write_kubeconfig(path, kubeadm_ha.with_server(path.read_text(), request.endpoint))


async def _summary(admin: str, endpoint: str) -> dict[str, Any]:
    async with kube_client.KubeClient(kubeadm_ha.with_server(admin, endpoint), timeout=10.0) as api:
        nodes = await api.list(kube_client.NODES_PATH)
    rows = []
    for node in nodes:
        addresses = (node.get("status") or {}).get("addresses") or []
        rows.append(
            {
                "name": node["metadata"]["name"],
                "role": "controlplane" if kubeadm_ha.is_control_plane(node) else "worker",
                "ready": "True" if kube_client.is_ready(node) else "False",
                "address": next((a["address"] for a in addresses if a.get("type") == "InternalIP"), ""),
            }
        )
    return {
        "endpoint": endpoint,
        "nodes": sorted(rows, key=lambda row: (row["role"] != "controlplane", row["name"])),
    }
