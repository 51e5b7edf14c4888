"""``kubeplane upgrade``: replace the node agent (``kubeplaned``) with another build, rolling.

Not ``upgrade-k8s`` (Kubernetes components). The build is a wheel or a directory holding a
``kubeplane`` package, put on each node under ``/var/lib/kubeplane/uploads`` first (there is no OS
image here); ``--path`` names it as the node sees it. What a node does with it is
:mod:`kubeplane.agent.upgrade` and :meth:`kubeplane.agent.node.Node.upgrade`.

The plan, one node at a time (``-n A,B,C``): ``upgrade`` (the node installs and checks the build,
refuses it when etcd would lose its quorum, answers, then restarts into it) and ``wait``: the node
answers ``version`` with the new build's version, has booted, its services are up (etcd's health
check is its member's health) and, where it runs a kubelet, its Node is Ready. Only then does
the next node start. ``--stage`` records the build for each node's next start and does not wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import click

from kubeplane import api, plan
from kubeplane.cli import connect, output, progress
from kubeplane.cli.health import fetch_kubeconfig
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube

#: Between two looks at a restarting node, in seconds.
POLL_INTERVAL = 1.0


def register(group: click.Group) -> None:
    group.add_command(upgrade)


def missing(version: Mapping[str, Any], services: Sequence[Mapping[str, Any]], *, want: str) -> str | None:
    """What a restarted node still lacks before it counts as back (None: it is back)."""
    if version.get("tag") != want:
        return f"it runs kubeplaned {version.get('tag')}, not {want} yet"
    if version.get("phase") != "running":
        return f"it is {version.get('phase')}, not running yet"
    down = sorted(str(service["id"]) for service in services if not service.get("up"))
    if down:
        return f"service(s) {', '.join(down)} not up yet"
    return None


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
    """Replace kubeplaned on the nodes with another build, one node at a time."""
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
    installed: dict[str, dict[str, Any]] = {}
    kubeconfig: list[str] = []
    messages: list[str] = []

    async def run_step(step: plan.Step) -> plan.Outcome:
        if step.kind == "upgrade":
            async with client_for(step.node) as client:
                (reply,) = await client.upgrade(path=build_path, stage=stage, preserve=preserve, force=force)
            if reply.error is not None:
                raise click.ClickException(output.error_text(reply.error, where=f"node {step.node}"))
            installed[step.node] = dict(reply.result or {})
            messages.append(str(installed[step.node].get("message", "")))
            return plan.CHANGED
        await wait_back(step.node, installed[step.node])
        return plan.CHANGED

    async def wait_back(node: str, said: Mapping[str, Any]) -> None:
        want = str(said["version"])
        deadline = time.monotonic() + timeout
        reason = "no answer yet"
        while time.monotonic() < deadline:
            reason = await still_missing(node, want, str(said.get("hostname") or node))
            if not reason:
                return
            await asyncio.sleep(POLL_INTERVAL)
        raise click.ClickException(f"node {node} did not come back within {wait_timeout}: {reason}")

    async def still_missing(node: str, want: str, hostname: str) -> str:
        try:
            async with client_for(node) as client:
                version = (await client.version())[0].unwrap()
                services = (await client.service_list())[0].unwrap()
        except api.APIError as exc:
            return f"it does not answer yet ({exc})"
        reason = missing(version, services, want=want)
        if reason is not None:
            return reason
        if not any(service.get("id") == "kubelet" for service in services):
            return ""
        if not kubeconfig:
            kubeconfig.append(await asyncio.to_thread(fetch_kubeconfig, target, server=None))
        try:
            async with kube.KubeClient(kubeconfig[0]) as cluster:
                found = await cluster.get_or_none(f"/api/v1/nodes/{hostname}")
        except client_errors.KubeError as exc:
            return f"the Kubernetes API does not answer ({exc})"
        return "" if found is not None and kube.is_ready(found) else f"Node {hostname} is not Ready yet"

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
            results = connect.run(
                plan.execute(the_plan, run_step, progress=shown, resume=connect.command_line(*words)),
                target=target,
            )
        except plan.StepFailed as exc:
            raise click.ClickException(str(exc)) from exc
    for message in messages:
        click.echo(message)
    if not stage:
        per_node: dict[str, float] = {}
        for result in results:
            per_node[result.step.node] = per_node.get(result.step.node, 0.0) + result.seconds
        for node, seconds in per_node.items():
            click.echo(f"node {node}: upgraded and back in {seconds:.1f}s")
