"""Cluster formation commands: ``bootstrap``, ``etcd members|leave|forfeit-leadership|snapshot``,
``kubeconfig`` and ``containers``.

- ``bootstrap`` founds the etcd cluster on one control plane node, once per cluster lifetime; the
  node refuses (and changes nothing) on workers, when its etcd has data or was bootstrapped, or
  when another node already answers as the cluster. ``--recover-from SNAPSHOT`` sends an etcd
  snapshot file the node restores before starting. It is a one-step plan run by the one executor
  (:func:`kubeplane.plan.execute`): ``--dry-run`` prints it, a failure names the node and the
  command to re-run.
- ``kubeconfig [DIR|FILE]`` writes the admin kubeconfig the node hands out (default: the current
  directory's ``kubeconfig``); ``--merge`` merges it into an existing file, ``--force`` overwrites.
  It and ``etcd snapshot``'s file are written atomically with mode 0600 (:mod:`kubeplane.fileio`).
- ``containers -k`` lists the node's Kubernetes (CRI) containers; ``logs -k NS/POD:CONTAINER``
  lives with ``logs`` in :mod:`kubeplane.cli.node`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import click
import yaml

from kubeplane import fileio, plan
from kubeplane.api import NodeClient
from kubeplane.cli import connect, output, progress


def register(group: click.Group) -> None:
    for command in (bootstrap, etcd, kubeconfig, containers):
        group.add_command(command)


def _one_node(target: connect.Target, command: str) -> None:
    if len(target.nodes) > 1:
        raise click.UsageError(f"{command} works on one node at a time: pass a single -n NODE")


def _print_messages(replies: list[Any], outcome: connect.Outcome) -> None:
    results = outcome.results(replies)
    for node, result in results:
        click.echo(f"{output.node_label(node, len(replies) > 1)}{result.get('message', 'done')}")
    outcome.finish()


@click.command()
@click.option(
    "--recover-from",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="SNAPSHOT",
    help="Rebuild etcd from this snapshot file (from `kubeplane etcd snapshot`).",
)
@click.option(
    "--self-hosted",
    is_flag=True,
    help="Bring up a self-hosted control plane (DaemonSets + pod-checkpointer), as older releases did.",
)
@click.option("--checkpointer-image", default=None, help="Image of the pod-checkpointer (--self-hosted).")
@click.option(
    "--checkpointer-grace-period",
    type=click.IntRange(min=0),
    default=None,
    help="Seconds a checkpoint outlives its parent (--self-hosted; default 300).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
def bootstrap(
    *,
    recover_from: Path | None,
    self_hosted: bool,
    checkpointer_image: str | None,
    checkpointer_grace_period: int | None,
    dry_run: bool,
) -> None:
    """Found the etcd cluster on this control plane node (once per cluster lifetime)."""
    target = connect.resolve(connect.options())
    _one_node(target, "bootstrap")
    node = target.nodes[0] if target.nodes else ",".join(target.endpoints)
    founding = f"restored from snapshot {recover_from}" if recover_from is not None else "a new etcd cluster"
    control_plane = "self-hosted control plane" if self_hosted else "static pod control plane"
    step = plan.Step("bootstrap", "etcd", node, "", f"{founding}, {control_plane}")
    steps = plan.Plan(
        title="bootstrap",
        steps=(step,),
        rerun="the node refuses, changing nothing, once its etcd has data or was bootstrapped",
    )
    if dry_run:
        click.echo(steps.render())
        click.echo("dry run: nothing was changed")
        return
    snapshot = recover_from.read_bytes() if recover_from is not None else None
    words = ["bootstrap", *(["--recover-from", str(recover_from)] if recover_from is not None else [])]
    words += ["--self-hosted"] if self_hosted else []
    words += ["--checkpointer-image", checkpointer_image] if checkpointer_image else []
    if checkpointer_grace_period is not None:
        words += ["--checkpointer-grace-period", str(checkpointer_grace_period)]
    messages: list[str] = []

    async def run_step(step: plan.Step) -> plan.Outcome:
        async with connect.client(target) as node_client:
            replies = await node_client.bootstrap(
                snapshot=snapshot,
                self_hosted=self_hosted,
                checkpointer_image=checkpointer_image,
                checkpointer_grace_period=checkpointer_grace_period,
            )
        for reply in replies:
            if reply.error is not None:
                raise click.ClickException(output.error_text(reply.error, where=f"node {reply.node}"))
            said = (reply.result or {}).get("message", "done")
            messages.append(f"{output.node_label(reply.node, len(replies) > 1)}{said}")
        return plan.CHANGED

    with progress.display() as shown:
        try:
            connect.run(
                plan.execute(steps, run_step, progress=shown, resume=connect.command_line(*words)),
                target=target,
            )
        except plan.StepFailed as exc:
            raise click.ClickException(str(exc)) from exc
    for message in messages:
        click.echo(message)


@click.group()
def etcd() -> None:
    """Inspect and change the node's etcd membership."""


MEMBER_HEADERS = ("NODE", "ID", "HOSTNAME", "PEER URLS", "CLIENT URLS", "LEARNER", "LEADER")


@etcd.command()
@output.output_option
def members(*, fmt: output.Format) -> None:
    """List the etcd members as the node sees them."""
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    listed = outcome.results(connect.with_client(target, NodeClient.etcd_members))
    rows = [(node, member) for node, items in listed for member in items]
    if fmt != "table":
        click.echo(output.documents([{"node": n, **m} for n, m in rows], fmt), nl=False)
    else:
        table = (
            [
                node,
                str(m["id"]),
                str(m["name"]),
                ",".join(m["peer_urls"]),
                ",".join(m["client_urls"]),
                str(m["learner"]).lower(),
                str(m["leader"]).lower(),
            ]
            for node, m in rows
        )
        click.echo(output.table(MEMBER_HEADERS, table), nl=False)
    outcome.finish()


@etcd.command()
@click.option("--force", is_flag=True, help="Leave even when the remaining members would lose quorum.")
def leave(*, force: bool) -> None:
    """Remove this node from etcd, stop etcd and wipe its data."""
    target = connect.resolve(connect.options())
    _one_node(target, "etcd leave")
    _print_messages(connect.with_client(target, lambda c: c.etcd_leave(force=force)), connect.Outcome())


@etcd.command("remove-member")
@click.argument("member")
def remove_member(*, member: str) -> None:
    """Remove another node's etcd member (by name or hex ID), e.g. after `reset --graceful=false`.

    Run it on a healthy control plane node; refused when the remaining members would lose quorum.
    """
    target = connect.resolve(connect.options())
    _one_node(target, "etcd remove-member")
    _print_messages(connect.with_client(target, lambda c: c.etcd_remove_member(member)), connect.Outcome())


@etcd.command("forfeit-leadership")
def forfeit_leadership() -> None:
    """Move etcd leadership away from this node."""
    target = connect.resolve(connect.options())
    _print_messages(connect.with_client(target, NodeClient.etcd_forfeit_leadership), connect.Outcome())


@etcd.command()
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def snapshot(*, path: Path) -> None:
    """Save a consistent etcd snapshot of the node to PATH."""
    target = connect.resolve(connect.options())
    _one_node(target, "etcd snapshot")

    async def scenario(out: BinaryIO) -> int:
        written = 0
        async with connect.client(target) as node_client:
            async for reply in node_client.etcd_snapshot():
                chunk = reply.unwrap()
                out.write(chunk)
                written += len(chunk)
        return written

    # The snapshot holds every Kubernetes secret: 0600 from the first byte; a failed or interrupted
    # transfer leaves no partial file and an existing PATH as it was.
    with fileio.atomic_open(path, mode=fileio.SECRET_MODE) as out:
        size = connect.run(scenario(out), target=target)
    click.echo(f"etcd snapshot saved to {path} ({size} bytes)")


@click.command()
@click.argument("destination", required=False, type=click.Path(path_type=Path))
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing file.")
@click.option("-m", "--merge", is_flag=True, help="Merge into an existing kubeconfig (e.g. ~/.kube/config).")
def kubeconfig(*, destination: Path | None, force: bool, merge: bool) -> None:
    """Write the cluster's admin kubeconfig to DESTINATION (a directory or file; default ./kubeconfig)."""
    target = connect.resolve(connect.options())
    _one_node(target, "kubeconfig")
    replies = connect.with_client(target, NodeClient.kubeconfig)
    text = str(replies[0].unwrap()["kubeconfig"])
    path = destination or Path.cwd()
    if path.is_dir():
        path = path / "kubeconfig"
    if path.exists() and merge:
        text = merge_kubeconfigs(path.read_text(), text)
    elif path.exists() and not force:
        raise click.ClickException(f"{path} exists: pass --force to overwrite it or --merge to merge into it")
    path.parent.mkdir(mode=fileio.PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    # Replace the file a symlink points to (~/.kube/config is often one), not the symlink itself.
    fileio.write_atomic(path.resolve(), text, mode=fileio.SECRET_MODE)
    click.echo(f"admin kubeconfig written to {path}")


def merge_kubeconfigs(existing: str, new: str) -> str:
    """``new`` merged into ``existing``: entries of the same name are replaced, the context switches."""
    old: dict[str, Any] = yaml.safe_load(existing) or {}
    incoming: dict[str, Any] = yaml.safe_load(new) or {}
    for section in ("clusters", "users", "contexts"):
        names = {item["name"] for item in incoming.get(section) or []}
        kept = [item for item in old.get(section) or [] if item.get("name") not in names]
        old[section] = kept + list(incoming.get(section) or [])
    old.setdefault("apiVersion", "v1")
    old.setdefault("kind", "Config")
    old["current-context"] = incoming.get("current-context", old.get("current-context"))
    return yaml.safe_dump(old, sort_keys=False)


CONTAINER_HEADERS = ("NODE", "NAMESPACE", "POD", "CONTAINER", "IMAGE", "PID", "STATUS")


@click.command()
@click.option("-k", "--kubernetes", is_flag=True, required=True, help="Kubernetes (CRI) containers.")
@output.output_option
def containers(*, kubernetes: bool, fmt: output.Format) -> None:
    """List the node's Kubernetes containers (-k)."""
    del kubernetes  # the only kind of container a node runs
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    listed = outcome.results(connect.with_client(target, NodeClient.containers))
    rows = [(node, item) for node, items in listed for item in items]
    if fmt != "table":
        click.echo(output.documents([{"node": n, **c} for n, c in rows], fmt), nl=False)
    else:
        table = (
            [node, c["namespace"], c["pod"], c["name"], c["image"], str(c["pid"]), c["state"]]
            for node, c in rows
        )
        click.echo(output.table(CONTAINER_HEADERS, table), nl=False)
    outcome.finish()
