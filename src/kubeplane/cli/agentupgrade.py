"""``kubeplane upgrade``: replace the node agent (``kubeplaned``) with another build, rolling.

Not ``upgrade-k8s`` (Kubernetes components). The build is a wheel or a directory holding a
``kubeplane`` package, put on each node under ``/var/lib/kubeplane/uploads`` first (there is no OS
image here); ``--path`` names it as the node sees it. What a node does with it is
:mod:`kubeplane.agent.upgrade` and :meth:`kubeplane.agent.node.Node.upgrade`.

The plan, one node at a time (``-n A,B,C``): ``upgrade`` (the node installs and checks the build,
refuses it when etcd would lose its quorum, answers, then restarts into it) and ``wait``: the node
is *back* when its agent is a new process (``version``'s ``instance`` differs from the one asked
to upgrade, so re-installing the same version cannot pass early), runs the new build's version,
has booted, its services are up (etcd's health check is its member's health), where it runs a
kubelet its Node is Ready and, on a control plane node, its kube-apiserver (a static pod of that
kubelet) answers ``/readyz`` on the node's own address. Only then does the next node start.
``--stage`` records the build for each node's next start and does not wait.

The load balancer: a control plane node of a local cluster (``kubeplane cluster create``; ``-n``
gives node addresses) is taken out of its haproxy rotation before it is asked to upgrade, as
``upgrade-k8s`` and ``certs renew`` do (:func:`kubeplane.cli.upgrade.local_rotation`,
:func:`kubeplane.ops.upgrader.leave_rotation`), and put back once it is back; a failed step puts
it back too, and a run starts by putting back any node of the run that is out of the rotation
(an earlier run killed between the two). Elsewhere the real load balancer's readiness checks
are all there is (:class:`~kubeplane.ops.upgrade.NoRotation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import click

from kubeplane import api, plan
from kubeplane.cli import connect, output, progress
from kubeplane.cli.health import fetch_kubeconfig
from kubeplane.cli.upgrade import local_rotation, with_server
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.ops.upgrade import ClusterNode, Rotation
from kubeplane.ops.upgrader import leave_rotation
from kubeplane.provision import loadbalancer
from kubeplane.resources import catalog

#: Between two looks at a restarting node, in seconds.
POLL_INTERVAL = 1.0


def register(group: click.Group) -> None:
    group.add_command(upgrade)


def missing(
    version: Mapping[str, Any],
    services: Sequence[Mapping[str, Any]],
    *,
    want: str,
    before: str | None = None,
) -> str | None:
    """What a restarted node still lacks before it counts as back (None: it is back).

    ``before`` is the ``instance`` of the agent that was asked to upgrade: while that agent still
    answers, the node has not restarted, even when it already says ``want`` (the same version
    installed again). An agent that answers no ``instance`` (a build from before it) is a new one.
    """
    if version.get("tag") != want:
        return f"it runs kubeplaned {version.get('tag')}, not {want} yet"
    if before is not None and version.get("instance") == before:
        return "it has not restarted yet"
    if version.get("phase") != "running":
        return f"it is {version.get('phase')}, not running yet"
    down = sorted(str(service["id"]) for service in services if not service_up(service))
    if down:
        return f"service(s) {', '.join(down)} not up yet"
    return None


def service_up(service: Mapping[str, Any]) -> bool:
    """Whether a service of ``ServiceList`` is up: running, and healthy unless it has no health
    verdict (``health.unknown``). The call's documents carry no ``up`` (the ``Services``
    resources do: that one is used when present)."""
    if "up" in service:
        return bool(service["up"])
    health = service.get("health") or {}
    return bool(service.get("running")) and bool(health.get("healthy") or health.get("unknown"))


def apiserver_url(spec: Mapping[str, Any]) -> str:
    """Where a control plane node's own kube-apiserver serves, from the spec of its
    ``kcpc/kube-apiserver`` (its advertise address and local port)."""
    host = str(spec["advertiseAddress"])
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{int(spec['localAPIServerPort'])}"


def cluster_node(node: str) -> ClusterNode:
    """``node`` (an address given with ``-n``) as the rotation knows it."""
    return ClusterNode(name=node, address=node, control_plane=True)


@click.command()
@click.option(
    "--path",
    "build_path",
    required=True,
    metavar="PATH",
    help="The build on the node: a wheel (*.whl) or a directory holding the kubeplane package, "
    "under /var/lib/kubeplane/uploads (as the node sees it).",
)
@click.option("--stage", is_flag=True, help="Install it now; the agent runs it from its next start.")
@click.option(
    "--preserve/--no-preserve",
    default=None,
    help="Keep the node's etcd, kubelet and containerd data (default: on control plane nodes). "
    "Without it the node leaves etcd and wipes that data first, keeping its config, and rejoins.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Skip the etcd quorum check (a single control plane node: its cluster stops meanwhile).",
)
@click.option(
    "--wait-timeout", default="5m", show_default=True, help="How long each node may take to come back."
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
def upgrade(
    *, build_path: str, stage: bool, preserve: bool | None, force: bool, wait_timeout: str, dry_run: bool
) -> None:
    """Replace kubeplaned on the nodes with another build, one node at a time.

    A control plane node of a local cluster leaves the load balancer rotation while it restarts
    and is put back once its kube-apiserver is ready again.
    """
    timeout = output.parse_duration(wait_timeout)
    target = connect.resolve(connect.options())
    # Without -n the endpoint itself is upgraded (called directly, not forwarded to).
    nodes = target.nodes or target.endpoints[:1]

    def client_for(node: str) -> api.NodeClient:
        return connect.client(target, nodes=[node] if target.nodes else [])

    async def versions() -> dict[str, str]:
        found: dict[str, str] = {}
        for node in nodes:
            async with client_for(node) as client:
                (reply,) = await client.version()
            found[node] = str(reply.unwrap().get("tag", "?"))
        return found

    current = connect.run(versions(), target=target)
    steps: list[plan.Step] = []
    for node in nodes:
        steps.append(plan.Step("upgrade", "kubeplaned", node, current[node], build_path))
        if not stage:
            steps.append(plan.Step("wait", "node", node, "", "back healthy on the new build"))
    the_plan = plan.Plan(
        title="agent upgrade" + (" (staged for the next start)" if stage else ""),
        steps=tuple(steps),
        rerun="re-running installs the build again; a node that runs it already restarts once more",
    )
    if dry_run:
        click.echo(the_plan.render())
        click.echo("dry run: nothing was changed")
        return
    # The control plane nodes of a local cluster, each with its cluster's haproxy rotation; a
    # staged build restarts nothing, so nothing leaves the rotation then.
    rotations: dict[str, Rotation] = {}
    for node in [] if stage else nodes:
        found = local_rotation([node])
        if found is not None:
            rotations[node] = found
    installed: dict[str, dict[str, Any]] = {}
    instances: dict[str, str | None] = {}
    kubeconfig: list[str] = []
    messages: list[str] = []

    async def put_back(node: str) -> None:
        """Put ``node`` back into the rotation after a failure; its own error is what counts."""
        if node in rotations:
            with contextlib.suppress(Exception):
                await rotations[node].restore(cluster_node(node))

    async def put_back_left_out(shown: plan.Progress) -> None:
        """Put back the nodes of this run that an interrupted earlier run left out of rotation."""
        for node, rotation in rotations.items():
            if node in await rotation.serving():
                continue
            shown.info(f"node {node} is not serving through the load balancer: putting it back")
            try:
                await rotation.restore(cluster_node(node))
            except loadbalancer.LoadBalancerError as exc:
                shown.info(f"node {node} is not healthy behind the load balancer ({exc}); going on")

    async def run_step(step: plan.Step, shown: plan.Progress) -> plan.Outcome:
        if step.kind == "upgrade":
            await upgrade_node(step.node, shown)
            return plan.CHANGED
        try:
            await wait_back(step.node, installed[step.node])
        except BaseException:
            await put_back(step.node)
            raise
        if step.node in rotations:
            shown.info(f"putting node {step.node} back into the load balancer rotation")
            await rotations[step.node].restore(cluster_node(step.node))
        return plan.CHANGED

    async def upgrade_node(node: str, shown: plan.Progress) -> None:
        async with client_for(node) as client:
            (reply,) = await client.version()
            instances[node] = reply.unwrap().get("instance")
            if node in rotations:
                await leave_rotation(rotations[node], cluster_node(node), shown)
            try:
                (reply,) = await client.upgrade(path=build_path, stage=stage, preserve=preserve, force=force)
                if reply.error is not None:
                    raise click.ClickException(output.error_text(reply.error, where=f"node {node}"))
            except BaseException:
                await put_back(node)
                raise
        installed[node] = dict(reply.result or {})
        messages.append(str(installed[node].get("message", "")))

    async def wait_back(node: str, said: Mapping[str, Any]) -> None:
        want = str(said["version"])
        deadline = time.monotonic() + timeout
        reason = "no answer yet"
        while time.monotonic() < deadline:
            reason = await still_missing(node, want, said)
            if not reason:
                return
            await asyncio.sleep(POLL_INTERVAL)
        raise click.ClickException(f"node {node} did not come back within {wait_timeout}: {reason}")

    async def still_missing(node: str, want: str, said: Mapping[str, Any]) -> str:
        try:
            async with client_for(node) as client:
                version = (await client.version())[0].unwrap()
                services = (await client.service_list())[0].unwrap()
                reason = missing(version, services, want=want, before=instances.get(node))
                if reason is not None:
                    return reason
                if not any(service.get("id") == "kubelet" for service in services):
                    return ""  # no Node, and no kube-apiserver (the kubelet runs it)
                apiserver = None
                if said.get("control_plane"):
                    (reply,) = await client.resource_get(
                        catalog.KUBERNETES_CONTROL_PLANE_CONFIGS, "kube-apiserver"
                    )
                    apiserver = apiserver_url(reply.unwrap()["spec"])
        except api.APIError as exc:
            return f"it does not answer yet ({exc})"
        hostname = str(said.get("hostname") or node)
        try:
            async with kube.KubeClient(await admin_kubeconfig()) as cluster:
                found = await cluster.get_or_none(kube.node_path(hostname))
        except client_errors.KubeError as exc:
            return f"the Kubernetes API does not answer ({exc})"
        if found is None or not kube.is_ready(found):
            return f"Node {hostname} is not Ready yet"
        if apiserver is None:
            return ""
        try:
            async with kube.KubeClient(with_server(await admin_kubeconfig(), apiserver)) as own:
                status, _ = await own.raw_get("/readyz")
        except client_errors.KubeError as exc:
            return f"its kube-apiserver does not answer yet ({exc})"
        return "" if status == 200 else f"its kube-apiserver {apiserver}/readyz answers HTTP {status}"

    async def admin_kubeconfig() -> str:
        if not kubeconfig:
            kubeconfig.append(await asyncio.to_thread(fetch_kubeconfig, target, server=None))
        return kubeconfig[0]

    async def roll(shown: plan.Progress) -> list[plan.StepResult]:
        await put_back_left_out(shown)

        async def step(step: plan.Step) -> plan.Outcome:
            return await run_step(step, shown)

        return await plan.execute(the_plan, step, progress=shown, resume=connect.command_line(*words))

    words = [
        "upgrade",
        "--path",
        build_path,
        *(["--stage"] if stage else []),
        *(["--force"] if force else []),
    ]
    if preserve is not None:
        words.append("--preserve" if preserve else "--no-preserve")
    with progress.display() as shown:
        try:
            results = connect.run(roll(shown), target=target)
        except plan.StepFailed as exc:
            raise click.ClickException(str(exc)) from exc
        except loadbalancer.LoadBalancerError as exc:
            raise click.ClickException(f"load balancer: {exc}") from exc
    for message in messages:
        click.echo(message)
    if not stage:
        per_node: dict[str, float] = {}
        for result in results:
            per_node[result.step.node] = per_node.get(result.step.node, 0.0) + result.seconds
        for node, seconds in per_node.items():
            click.echo(f"node {node}: upgraded and back in {seconds:.1f}s")
