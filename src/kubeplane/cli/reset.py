"""``kubeplane reset``: a node leaves its cluster and forgets it (the third seed's "Resetting a
Machine").

The plan, one node at a time (``-n NODE``):

1. ``check``: the node answers a dry run of its reset: its hostname, whether it leaves etcd, what
   it wipes; a graceful reset that would cost etcd its quorum is refused here, before anything
   changed (the node checks the members' health itself);
2. (graceful) ``cordon and drain`` the Kubernetes node with the admin kubeconfig
   (:mod:`kubeplane.ops.reset`);
3. ``reset``: the node leaves etcd (graceful), stops its services and wipes the chosen state,
   then reboots (``--reboot``: back in maintenance mode when ``state`` was wiped) or stops;
4. (graceful) ``delete`` the Node object, now that its kubelet is stopped.

``--graceful=false`` is for a broken cluster: no drain and no etcd leave (and no Kubernetes API
needed). Clean up afterwards from a healthy control plane node:
``kubeplane -n HEALTHY etcd remove-member NAME`` and ``kubectl delete node NAME``.
"""

from __future__ import annotations

from typing import Any

import click

from kubeplane import plan
from kubeplane.agent import reset as node_reset
from kubeplane.cli import connect, output, progress
from kubeplane.cli.health import fetch_kubeconfig
from kubeplane.clients import kube
from kubeplane.ops import reset as reset_ops


def register(group: click.Group) -> None:
    group.add_command(reset)


@click.command()
@click.option(
    "--graceful",
    type=click.BOOL,
    default=True,
    is_flag=False,
    flag_value=True,
    metavar="BOOL",
    show_default=True,
    help="Cordon and drain the node and leave etcd first. --graceful=false (a broken cluster): "
    "neither; then remove its etcd member from a healthy node (etcd remove-member) and its Node.",
)
@click.option(
    "--reboot",
    is_flag=True,
    help="Come back afterwards (in maintenance mode, waiting for apply-config --insecure, when the "
    "state is wiped) instead of stopping the agent.",
)
@click.option(
    "--wipe",
    metavar="LABELS",
    default=",".join(node_reset.WIPE_LABELS),
    show_default=True,
    help="What to wipe, comma-separated: state (machine config, secrets), etcd (its data), kubelet "
    "(its data, /etc/kubernetes, CNI config), containerd (images, containers).",
)
@click.option("--wait-timeout", default="3m", show_default=True, help="How long draining may take.")
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
def reset(*, graceful: bool, reboot: bool, wipe: str, wait_timeout: str, dry_run: bool) -> None:
    """Reset the node: leave the cluster, stop its services and wipe its state."""
    try:
        labels = node_reset.parse_labels(wipe)
    except node_reset.UnknownLabel as exc:
        raise click.BadParameter(str(exc), param_hint="--wipe") from exc
    timeout = output.parse_duration(wait_timeout)
    target = connect.resolve(connect.options())
    if len(target.nodes) != 1:
        raise click.UsageError("reset works on one node at a time: pass a single -n NODE")
    node = target.nodes[0]
    wipe_text = ",".join(labels)

    async def node_reset_call(*, dry_run: bool) -> dict[str, Any]:
        async with connect.client(target) as client:
            (reply,) = await client.reset(graceful=graceful, reboot=reboot, wipe=wipe_text, dry_run=dry_run)
        if reply.error is not None:
            raise click.ClickException(output.error_text(reply.error, where=f"node {node}"))
        return dict(reply.result or {})

    checked = connect.run(node_reset_call(dry_run=True), target=target)
    hostname = str(checked["hostname"])
    then = "reboot" if reboot else "stop the agent"
    leave = "leave etcd, " if checked.get("leaves_etcd") else ""
    steps = [plan.Step("check", "reset", node, "", checked["message"].removeprefix("dry run: "))]
    if graceful:
        steps.append(plan.Step("drain", "Kubernetes node", node, hostname, "cordoned, pods evicted"))
    steps.append(plan.Step("reset", "node", node, "", f"{leave}services stopped, {wipe_text} wiped, {then}"))
    if graceful:
        steps.append(plan.Step("delete", "Kubernetes node", node, hostname, "deleted"))
    the_plan = plan.Plan(
        title=f"reset (graceful: {str(graceful).lower()})",
        steps=tuple(steps),
        rerun="a node that was reset already is in maintenance mode or stopped: the reset step says so",
    )
    if dry_run:
        click.echo(the_plan.render())
        click.echo("dry run: nothing was changed")
        return
    kubeconfig = fetch_kubeconfig(target, server=None) if graceful else ""
    messages: list[str] = []

    async def run_step(step: plan.Step) -> plan.Outcome:
        if step.kind == "check":
            return plan.SKIPPED  # done above; kept in the plan so the reader sees it
        if step.kind == "reset":
            said = await node_reset_call(dry_run=False)
            messages.append(str(said.get("message", "done")))
            messages.extend(f"left in place: {item}" for item in said.get("left") or [])
            return plan.CHANGED
        async with kube.KubeClient(kubeconfig) as api:
            if step.kind == "drain":
                cordoned = await reset_ops.cordon(api, hostname)
                evicted = await reset_ops.drain(api, hostname, timeout=timeout)
                messages.append(
                    f"node {hostname}: {'cordoned, ' if cordoned else ''}{reset_ops.describe(evicted)}"
                )
                return plan.CHANGED if cordoned or evicted else plan.SKIPPED
            deleted = await reset_ops.delete_node(api, hostname)
            return plan.CHANGED if deleted else plan.SKIPPED

    words = ["reset", f"--graceful={str(graceful).lower()}", "--wipe", wipe_text]
    words += ["--reboot"] if reboot else []
    with progress.display() as shown:
        try:
            connect.run(
                plan.execute(the_plan, run_step, progress=shown, resume=connect.command_line(*words)),
                target=target,
            )
        except plan.StepFailed as exc:
            raise click.ClickException(str(exc)) from exc
    for message in messages:
        click.echo(message)
    if reboot and "state" in labels:
        click.echo(
            f"node {node} is in maintenance mode: give it a config with "
            f"`kubeplane -n {node} apply-config --insecure --file CONFIG`"
        )
