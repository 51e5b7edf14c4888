"""Local cluster commands: ``cluster create|add|remove|destroy|show`` and ``images``.

``cluster create`` plans and checks everything first (nothing on the host changes when the name,
CIDR, toolchain or a config patch is wrong), then runs the plan of
:class:`kubeplane.provision.create.Creation` plus (unless ``--no-wait``) a last step that waits
for the cluster to be healthy with the checks of :mod:`kubeplane.ops.health`, through the one
executor and progress display (:mod:`kubeplane.cli.progress`); ``--dry-run`` prints that plan.
A failure names the step or check and where to look; the half-made cluster stays for inspection
and the resume command destroys it and creates it again.

``cluster add`` and ``cluster remove`` grow and shrink a running cluster
(:mod:`kubeplane.provision.grow`) through the same executor and display, each followed by the
same health wait; ``--dry-run`` prints the plan, ``-o yaml|json`` prints the resulting nodes.
A removal that would break etcd quorum or remove the last control plane node is refused before
anything changes.

``images`` prints the images nodes pull for a Kubernetes version (or a machine config), one per
line, for the air-gapped guide's ``for image in $(kubeplane images) ...`` loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import shlex
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from kubeplane import api
from kubeplane import config as config_mod
from kubeplane import plan as plan_module
from kubeplane.cli import output, progress
from kubeplane.clients import kube
from kubeplane.config import client as client_config
from kubeplane.config import generate as gen
from kubeplane.ops import convert, health
from kubeplane.provision import (
    checkpointer_image,
    dns_image,
    grow,
    netns,
    planning,
    registry,
    state,
    teardown,
    toolchain,
)
from kubeplane.provision import cluster as cluster_mod
from kubeplane.provision import create as create_mod


def register(group: click.Group) -> None:
    group.add_command(cluster)
    group.add_command(images)


def load_patch(value: str, option: str) -> gen.Patch:
    """A patch given inline (JSON/YAML) or as ``@FILE``."""
    try:
        if value.startswith("@"):
            return gen.parse_patch(Path(value[1:]).read_text(), source=value[1:])
        return gen.parse_patch(value, source=option)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read patch file {value[1:]}: {exc.strerror}", param_hint=option
        ) from exc
    except gen.GenerateError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from exc


def _ip_addresses(values: Sequence[str], option: str) -> tuple[str, ...]:
    for value in values:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not an IP address", param_hint=option) from None
    return tuple(values)


def _service_subnet(name: str) -> str:
    """The Service subnet of cluster ``name``: the one its state records (a re-run), else a free one."""
    recorded = None
    try:
        netns.validate_cluster_name(name)  # before the name becomes part of a path
        with contextlib.suppress(state.StateError):
            network = state.ClusterState.load(name).network
            recorded = next(iter(network.routes), None) if network is not None else None
        taken = [other for other, _ in netns.host_networks(ignore_dev=netns.bridge_name(name))]
    except netns.NetworkError as exc:
        raise cluster_mod.PlanError(str(exc)) from exc
    return planning.service_subnet_for(taken, recorded=recorded)


#: Said when another ``cluster create`` holds :func:`~kubeplane.provision.netns.host_routes_lock`.
WAITING_FOR_ROUTES = "waiting for another cluster create to route its network"


@click.group()
def cluster() -> None:
    """Local multi-node clusters in network namespaces on this machine (needs root)."""


@cluster.command()
@click.option("--name", default=cluster_mod.DEFAULT_NAME, show_default=True, help="Cluster name.")
@click.option("--controlplanes", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=0))
@click.option("--kubernetes-version", default=cluster_mod.DEFAULT_VERSION, show_default=True)
@click.option("--cidr", default=netns.DEFAULT_CIDR, show_default=True, help="Network of the cluster.")
@click.option(
    "--registry-mirror", "mirrors", multiple=True, metavar="HOST=URL", help="Extra registry mirror."
)
@click.option("--config-patch", "patches", multiple=True, metavar="PATCH|@FILE", help="Patch every config.")
@click.option("--config-patch-controlplane", "cp_patches", multiple=True, metavar="PATCH|@FILE")
@click.option("--config-patch-worker", "worker_patches", multiple=True, metavar="PATCH|@FILE")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the cluster is healthy.")
@click.option("--wait-timeout", default="10m", show_default=True, help="How long to wait for health.")
@click.option(
    "--self-hosted",
    is_flag=True,
    help="Self-hosted control plane (DaemonSets + pod-checkpointer), as older releases ran; see convert-k8s.",
)
@click.option(
    "--checkpointer-grace-period",
    default=300,
    show_default=True,
    type=click.IntRange(min=0),
    help="Seconds a pod checkpoint outlives its parent (--self-hosted).",
)
@click.option(
    "--dns-upstream",
    "dns_upstreams",
    multiple=True,
    metavar="IP",
    callback=lambda _ctx, _param, values: _ip_addresses(values, "--dns-upstream"),
    help="Nameserver the cluster DNS forwards other names to (repeatable; the nodes' "
    "machine.network.nameservers). Default: none, names outside the cluster do not resolve in pods.",
)
@click.option(
    "--wireguard-cidr",
    metavar="CIDR",
    help="Give every node a WireGuard interface wg0 with an address in CIDR (e.g. 10.1.0.0/24): "
    f"control plane nodes listen on {planning.WIREGUARD_PORT}, every node peers with every control "
    "plane node, keepalive 5s (runs wireguard-go, which must be installed).",
)
@click.option(
    "--vip",
    metavar="ADDRESS",
    help="Make the endpoint https://ADDRESS:6443, a VIP the control plane nodes share (elected in "
    "etcd, machine.network.interfaces[].vip.ip) instead of haproxy on the host: a free address of "
    "--cidr, neither the host's nor a node's. `kubeplane get vip` shows its owner.",
)
@click.option(
    "--node-api-port",
    type=click.IntRange(1, 65535),
    help=f"machine.ports.nodeAPI of every node (default {config_mod.defaults.DEFAULT_NODE_API_PORT}): "
    "the node API moves there once a node booted; the client config's endpoints get it too.",
)
@click.option(
    "--trustd-port",
    type=click.IntRange(1, 65535),
    help=f"machine.ports.trustd of every node (default {config_mod.defaults.DEFAULT_TRUSTD_PORT}).",
)
@click.option(
    "--kubeadm",
    is_flag=True,
    help="A kubeadm cluster instead: `kubeadm init` on the first node, workers joined with "
    "`kubeadm join`, every node reached by SSH (the key is in the cluster directory); no kubeplaned. "
    "One control plane node, as the HA guide starts from: `kubeplane kubeadm ha` takes it to three.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
def create(
    *,
    name: str,
    controlplanes: int,
    workers: int,
    kubernetes_version: str,
    cidr: str,
    mirrors: tuple[str, ...],
    patches: tuple[str, ...],
    cp_patches: tuple[str, ...],
    worker_patches: tuple[str, ...],
    wait: bool,
    wait_timeout: str,
    self_hosted: bool,
    checkpointer_grace_period: int,
    dns_upstreams: tuple[str, ...],
    wireguard_cidr: str | None,
    vip: str | None,
    node_api_port: int | None,
    trustd_port: int | None,
    kubeadm: bool,
    dry_run: bool,
) -> None:
    """Create a local cluster: network, load balancer (or a VIP), registry, one agent per node, bootstrap.

    With --dry-run, print the steps (with the names, addresses and versions this request gets) and
    change nothing; the host checks (root, tools, toolchain, addresses) are not run then.
    """
    timeout = output.parse_duration(wait_timeout)
    if kubeadm:
        given = {
            "--controlplanes": controlplanes != 1,
            "--registry-mirror": bool(mirrors),
            "--config-patch": bool(patches or cp_patches or worker_patches),
            "--self-hosted": self_hosted,
            "--dns-upstream": bool(dns_upstreams),
            "--wireguard-cidr": wireguard_cidr is not None,
            "--vip": vip is not None,
            "--node-api-port": node_api_port is not None,
            "--trustd-port": trustd_port is not None,
        }
        refused = [option for option, set_ in given.items() if set_]
        if refused:
            raise click.UsageError(
                f"--kubeadm takes none of {', '.join(refused)}: a kubeadm cluster starts with one control "
                "plane node and kubeadm's own configuration (`kubeplane kubeadm ha` makes it three)"
            )
        _create_kubeadm(
            name=name,
            workers=workers,
            kubernetes_version=kubernetes_version,
            cidr=cidr,
            wait=wait,
            wait_timeout=wait_timeout,
            dry_run=dry_run,
        )
        return
    routes_lock = _routes_lock(dry_run=dry_run)
    try:
        request = planning.ClusterRequest(
            name=name,
            controlplanes=controlplanes,
            workers=workers,
            kubernetes_version=kubernetes_version,
            cidr=cidr,
            registry_mirrors=gen.parse_mirrors(mirrors),
            config_patches=tuple(load_patch(p, "--config-patch") for p in patches),
            controlplane_patches=tuple(load_patch(p, "--config-patch-controlplane") for p in cp_patches),
            worker_patches=tuple(load_patch(p, "--config-patch-worker") for p in worker_patches),
            self_hosted=self_hosted,
            checkpointer_grace_period=checkpointer_grace_period,
            dns_upstreams=dns_upstreams,
            wireguard_cidr=wireguard_cidr,
            vip=vip,
            node_api_port=node_api_port,
            trustd_port=trustd_port,
        )
        request = dataclasses.replace(request, service_subnet=_service_subnet(name))
        plan = planning.plan(request, progress=click.echo)
        paths = None if dry_run else create_mod.preflight(plan, toolchain=toolchain.Toolchain())
    except (cluster_mod.ClusterError, gen.GenerateError) as exc:
        raise click.ClickException(f"{exc}\nnothing was created") from exc
    config_path = client_config.resolve_path()
    with progress.display() as shown:
        creation = create_mod.Creation(
            plan,
            toolchain_paths=paths or toolchain.Toolchain().paths(kubernetes_version),
            client_config_path=config_path,
            progress=shown,
        )
        checks = "the self-hosted hand-over, then " if self_hosted else ""

        async def healthy() -> None:
            results = await asyncio.to_thread(
                wait_healthy, creation.created(), timeout=timeout, self_hosted=self_hosted, report=shown
            )
            failed = [r for r in results if not r.ok]
            if failed:
                raise cluster_mod.CreateError(
                    f"cluster {name!r} is not healthy after {wait_timeout}: {failed[0].name} failed; "
                    f"node logs are under {creation.cluster.directory}/nodes/<node>/var/log/kubeplane/ "
                    f"(or `kubeplane -n NODE logs kubelet`); `kubeplane health` checks again"
                )

        if not _run_creation(
            name,
            creation.plan(),
            creation.run_step,
            wait=healthy if wait else None,
            wait_target=f"{checks}every health check, {wait_timeout}",
            routes_lock=routes_lock,
            progress=shown,
            dry_run=dry_run,
        ):
            return
    click.echo(f"cluster {name!r} is up: kubectl --kubeconfig {creation.created().kubeconfig} get nodes")


def _routes_lock(*, dry_run: bool) -> contextlib.ExitStack:
    """Held from the choice of the Service subnet until the network step has routed it (or the
    command ends), so concurrent creates do not pick the same one."""
    lock = contextlib.ExitStack()
    click.get_current_context().call_on_close(lock.close)
    if not dry_run:
        lock.enter_context(netns.host_routes_lock(waiting=lambda: click.echo(WAITING_FOR_ROUTES, err=True)))
    return lock


def _run_creation(
    name: str,
    steps: plan_module.Plan,
    run_step: Callable[[plan_module.Step], Awaitable[plan_module.Outcome]],
    *,
    wait: Callable[[], Awaitable[None]] | None,
    wait_target: str,
    routes_lock: contextlib.ExitStack,
    progress: plan_module.Progress,
    dry_run: bool,
) -> bool:
    """Run a creation's steps, plus a last one that runs ``wait`` (the health wait) if given,
    through the one executor; the routes lock goes once the network step is done. With
    ``dry_run`` print the plan instead and return False."""
    waiting: plan_module.Step | None = None
    if wait is not None:
        waiting = plan_module.Step("wait", "cluster health", "", "", wait_target)
        steps = dataclasses.replace(steps, steps=(*steps.steps, waiting))
    if dry_run:
        click.echo(steps.render())
        click.echo("dry run: nothing was changed")
        return False

    async def each(step: plan_module.Step) -> plan_module.Outcome:
        if step is waiting and wait is not None:
            await wait()
            return plan_module.CHANGED
        outcome = await run_step(step)
        if step.component == "network":
            routes_lock.close()
        return outcome

    resume = f"kubeplane cluster destroy --name {name} && {shlex.join(['kubeplane', *sys.argv[1:]])}"
    try:
        asyncio.run(plan_module.execute(steps, each, progress=progress, resume=resume))
    except plan_module.StepFailed as exc:
        raise click.ClickException(str(exc)) from exc
    return True


def _create_kubeadm(
    *,
    name: str,
    workers: int,
    kubernetes_version: str,
    cidr: str,
    wait: bool,
    wait_timeout: str,
    dry_run: bool,
) -> None:
    """``cluster create --kubeadm`` (:mod:`kubeplane.provision.kubeadm`), then wait until every node
    and every kube-system pod is Ready and the cluster DNS answers."""
    from kubeplane.provision import kubeadm as kubeadm_mod  # noqa: PLC0415 - only this command needs it

    timeout = output.parse_duration(wait_timeout)
    routes_lock = _routes_lock(dry_run=dry_run)
    try:
        request = kubeadm_mod.KubeadmRequest(
            name=name,
            workers=workers,
            kubernetes_version=kubernetes_version,
            cidr=cidr,
            service_subnet=_service_subnet(name),
        )
        plan = kubeadm_mod.plan(request)
        paths = (
            toolchain.Toolchain().paths(kubernetes_version)
            if dry_run
            else kubeadm_mod.preflight(plan, toolchain=toolchain.Toolchain(), state_root=None)
        )
    except cluster_mod.ClusterError as exc:
        raise click.ClickException(f"{exc}\nnothing was created") from exc
    with progress.display() as shown:
        creation = kubeadm_mod.KubeadmCreation(plan, toolchain_paths=paths, progress=shown)
        kubeconfig = state.cluster_dir(name) / "kubeconfig"

        async def ready() -> None:
            text = kubeconfig.read_text()
            checks = health.kube_checks(
                health.Topology(controlplanes=(plan.first.ip,), workers=tuple(n.ip for n in plan.nodes[1:])),
                kube=lambda: kube.KubeClient(text, timeout=health.REQUEST_TIMEOUT),
            )
            order = (health.NODES_READY, health.SYSTEM_PODS_READY, health.CLUSTER_DNS)
            results = await asyncio.to_thread(
                health.run, [checks[n] for n in order], timeout=timeout, report=lambda r: shown.info(r.text())
            )
            failed = [r for r in results if not r.ok]
            if failed:
                raise cluster_mod.CreateError(
                    f"kubeadm cluster {name!r} is not ready after {wait_timeout}: {failed[0].name} failed; "
                    f"the nodes' logs are under {creation.cluster.directory}/nodes/<node>/var/log/kubeplane/"
                )

        if not _run_creation(
            name,
            creation.plan(),
            creation.run_step,
            wait=ready if wait else None,
            wait_target=f"nodes, kube-system pods and DNS ready, {wait_timeout}",
            routes_lock=routes_lock,
            progress=shown,
            dry_run=dry_run,
        ):
            return
    click.echo(f"kubeadm cluster {name!r} is up: kubectl --kubeconfig {kubeconfig} get nodes")
    creds = kubeadm_mod.credentials(creation.cluster.directory)
    click.echo(
        f"ssh to a node: ssh -i {creds.key} -o UserKnownHostsFile={creds.known_hosts} root@{plan.first.ip}"
    )


def wait_healthy(
    created: create_mod.CreatedCluster,
    *,
    timeout: float,
    report: plan_module.Progress,
    self_hosted: bool = False,
) -> list[health.Result]:
    """Run the health checks against a just-created cluster, reporting each as it finishes
    (a self-hosted one first has to finish handing over from its temporary control plane)."""
    kubeconfig = created.kubeconfig.read_text()

    def node_client(nodes: Sequence[str]) -> api.NodeClient:
        return api.NodeClient(created.endpoints, credentials=created.credentials, nodes=tuple(nodes))

    def kube_client() -> kube.KubeClient:
        return kube.KubeClient(kubeconfig, timeout=health.REQUEST_TIMEOUT)

    checks = health.default_checks(
        health.Topology(controlplanes=created.controlplanes, workers=created.workers),
        node_client=node_client,
        kube=kube_client,
    )
    if self_hosted:
        checks.insert(
            0,
            health.Check(
                "the self-hosted control plane to take over from the temporary one",
                lambda: health.kube_call(kube_client, convert.self_hosted_problems),
            ),
        )
    return health.run(checks, timeout=timeout, report=lambda result: report.info(result.text()))


@cluster.command()
@click.option("--name", default=cluster_mod.DEFAULT_NAME, show_default=True, help="Cluster name.")
def destroy(*, name: str) -> None:
    """Stop everything the cluster runs and remove its network, files and client config context."""
    try:
        removed = teardown.destroy(name, progress=click.echo)
    except (cluster_mod.ClusterError, state.StateError, netns.NetworkError) as exc:
        raise click.ClickException(f"destroying cluster {name!r}: {exc}") from exc
    click.echo(f"cluster {name!r} destroyed" if removed else f"no cluster {name!r}: nothing to destroy")


@cluster.command()
@click.option("--name", default=cluster_mod.DEFAULT_NAME, show_default=True, help="Cluster name.")
@output.output_option
def show(*, name: str, fmt: output.Format) -> None:
    """Show the cluster's nodes, roles, IPs and endpoint."""
    try:
        document = cluster_mod.show(name)
    except state.StateError as exc:
        known = ", ".join(cluster_mod.list_clusters()) or "none"
        raise click.ClickException(f"{exc} (local clusters: {known})") from exc
    _print_cluster(document, fmt)


def _print_cluster(document: dict[str, Any], fmt: output.Format) -> None:
    if fmt == "json":
        click.echo(json.dumps(document))
    elif fmt == "yaml":
        click.echo(yaml.safe_dump(document, sort_keys=False), nl=False)
    else:
        vip = (
            " (a VIP the control plane nodes share; owner: `kubeplane get vip`)"
            if document.get("vip")
            else ""
        )
        kind = " (made by kubeadm; nodes reached by SSH)" if document.get("kind") == "kubeadm" else ""
        click.echo(f"cluster: {document['name']}{kind}\nendpoint: {document['endpoint']}{vip}\n")
        rows = [[n["name"], n["role"], n["ip"], n["agent"]] for n in document["nodes"]]
        click.echo(output.table(["NAME", "ROLE", "IP", "AGENT"], rows), nl=False)


def _load(name: str) -> state.ClusterState:
    """A kubeplane cluster's state, for ``add`` and ``remove`` (they drive its agents)."""
    try:
        netns.validate_cluster_name(name)
        loaded = state.ClusterState.load(name)
    except (state.StateError, netns.NetworkError) as exc:
        known = ", ".join(cluster_mod.list_clusters()) or "none"
        raise click.ClickException(f"{exc} (local clusters: {known})") from exc
    meta = cluster_mod.ClusterMeta.load(loaded.directory)
    if meta is not None and meta.kind == cluster_mod.KIND_KUBEADM:
        raise click.ClickException(
            f"cluster {name!r} was made by kubeadm and has no kubeplane agents to add or remove nodes "
            f"with: `kubeplane kubeadm ha --name {name}` takes it to three control plane nodes"
        )
    return loaded


def _run_resizing(
    steps: plan_module.Plan,
    run: Callable[[plan_module.Step], Awaitable[plan_module.Outcome]],
    *,
    cluster: state.ClusterState,
    shown: plan_module.Progress,
    wait: bool,
    wait_timeout: str,
    dry_run: bool,
    resume: str,
) -> bool:
    """Run the plan of an add or remove, then wait for health; with ``dry_run`` print it and
    return False."""
    waiting: plan_module.Step | None = None
    if wait:
        waiting = plan_module.Step("wait", "cluster health", "", "", f"every health check, {wait_timeout}")
        steps = dataclasses.replace(steps, steps=(*steps.steps, waiting))
    if dry_run:
        click.echo(steps.render())
        click.echo("dry run: nothing was changed")
        return False
    timeout = output.parse_duration(wait_timeout)

    async def run_step(step: plan_module.Step) -> plan_module.Outcome:
        if step is not waiting:
            return await run(step)
        access = grow.cluster_access(state.ClusterState.load(cluster.name))
        results = await asyncio.to_thread(wait_healthy, access, timeout=timeout, report=shown)
        failed = [r for r in results if not r.ok]
        if failed:
            raise cluster_mod.CreateError(
                f"cluster {cluster.name!r} is not healthy after {wait_timeout}: {failed[0].name} failed; "
                f"node logs are under {cluster.directory}/nodes/<node>/var/log/kubeplane/; "
                "`kubeplane health` checks again"
            )
        return plan_module.CHANGED

    try:
        asyncio.run(plan_module.execute(steps, run_step, progress=shown, resume=resume))
    except plan_module.StepFailed as exc:
        raise click.ClickException(str(exc)) from exc
    return True


@cluster.command()
@click.option("--name", default=cluster_mod.DEFAULT_NAME, show_default=True, help="Cluster name.")
@click.option("--controlplanes", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--workers", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the cluster is healthy.")
@click.option("--wait-timeout", default="10m", show_default=True, help="How long to wait for health.")
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@output.output_option
def add(
    *,
    name: str,
    controlplanes: int,
    workers: int,
    wait: bool,
    wait_timeout: str,
    dry_run: bool,
    fmt: output.Format,
) -> None:
    """Add control plane and/or worker nodes to a running local cluster.

    New nodes take the next free names and addresses and the running config of a node of their
    role; new control plane nodes join etcd and enter the load balancer once they serve. A re-run
    after a failure finishes the nodes the failed run recorded; `cluster remove` takes them away.
    """
    cluster_state = _load(name)
    try:
        network = cluster_state.network
        if network is None:
            raise cluster_mod.PlanError(f"cluster {name!r} has no network recorded: destroy and create it")
        additions = grow.plan_additions(
            name,
            network.cidr,
            cluster_state.nodes,
            controlplanes=controlplanes,
            workers=workers,
            reserved=[network.vip] if network.vip else [],
        )
        with progress.display() as shown:
            growth = grow.Growth(
                cluster_state, additions, progress=shown, step_timeout=output.parse_duration(wait_timeout)
            )
            done = _run_resizing(
                growth.plan(),
                growth.run_step,
                cluster=cluster_state,
                shown=shown,
                wait=wait,
                wait_timeout=wait_timeout,
                dry_run=dry_run,
                resume=shlex.join(["kubeplane", *sys.argv[1:]]),
            )
    except cluster_mod.ClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    if done:
        _print_cluster(cluster_mod.show(name), fmt)


@cluster.command()
@click.option("--name", default=cluster_mod.DEFAULT_NAME, show_default=True, help="Cluster name.")
@click.argument("nodes", nargs=-1, required=True)
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the cluster is healthy.")
@click.option("--wait-timeout", default="10m", show_default=True, help="How long to wait for health.")
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@output.output_option
def remove(
    *, name: str, nodes: tuple[str, ...], wait: bool, wait_timeout: str, dry_run: bool, fmt: output.Format
) -> None:
    """Remove the nodes NODES (names from `cluster show`) from a running local cluster.

    A control plane node leaves the load balancer, hands over etcd leadership and has its etcd
    member removed first; refused, changing nothing, when that would leave the healthy etcd members
    below quorum or no control plane node at all.
    """
    cluster_state = _load(name)
    try:
        with progress.display() as shown:
            shrink = grow.Shrink(cluster_state, nodes, progress=shown)
            shrink.check()
            done = _run_resizing(
                shrink.plan(),
                shrink.run_step,
                cluster=cluster_state,
                shown=shown,
                wait=wait,
                wait_timeout=wait_timeout,
                dry_run=dry_run,
                resume=shlex.join(["kubeplane", *sys.argv[1:]]),
            )
    except cluster_mod.ClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    if done:
        _print_cluster(cluster_mod.show(name), fmt)


@click.command()
@click.option("--kubernetes-version", default=cluster_mod.DEFAULT_VERSION, show_default=True)
@click.option(
    "-f",
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Take the images from this machine config instead.",
)
@click.option(
    "--local",
    is_flag=True,
    help="The images of a local cluster (`cluster create`): its own cluster DNS image. "
    "(A config given with -f names its images itself.)",
)
@click.option(
    "--self-hosted",
    is_flag=True,
    help="Add the pod-checkpointer image, which a self-hosted control plane runs "
    "(`cluster create --self-hosted`, `bootstrap --self-hosted`) until `convert-k8s`.",
)
def images(*, kubernetes_version: str, config_file: Path | None, local: bool, self_hosted: bool) -> None:
    """Print the images nodes pull (one per line): what an air-gapped registry must hold.

    Each is printed with its registry host (``docker.io/library/...`` spelled out), so the
    air-gapped guide's ``sed -E 's#^[^/]+/#HOST:PORT/#'`` gives where a mirror for ``*`` serves it.
    """
    pause = toolchain.image_ref(toolchain.PAUSE, kubernetes_version)
    defaults = config_mod.defaults
    if config_file is None:
        refs = [
            defaults.image(repository, kubernetes_version)
            for repository in (
                defaults.KUBE_APISERVER_IMAGE,
                defaults.KUBE_CONTROLLER_MANAGER_IMAGE,
                defaults.KUBE_SCHEDULER_IMAGE,
                defaults.KUBE_PROXY_IMAGE,
            )
        ]
        # A local cluster runs kubeplane's own DNS image (planning sets cluster.coreDNS.image).
        refs.append(dns_image.image_ref() if local else defaults.DEFAULT_COREDNS_IMAGE)
    else:
        try:
            model = config_mod.load(config_file.read_text()).model
        except config_mod.ConfigError as exc:
            raise click.ClickException(f"{config_file}: {exc}") from exc
        cluster_config = model.cluster
        refs = [
            cluster_config.api_server_image,
            cluster_config.controller_manager_image,
            cluster_config.scheduler_image,
            cluster_config.proxy_image,
        ]
        if not (cluster_config.core_dns and cluster_config.core_dns.disabled):
            refs.append(cluster_config.coredns_image)
    if self_hosted:
        refs.append(checkpointer_image.image_ref())
    for ref in [*refs, pause]:
        click.echo(registry.qualified(ref))
