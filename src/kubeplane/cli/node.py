"""Commands that read and change a node through its API: ``version``, ``get``, ``apply-config``,
``edit``, ``patch``, ``read``, ``ls``, ``logs``, ``service``, ``reboot``.

Every command works on the target of :mod:`kubeplane.cli.connect` (client config context,
``-e``/``-n`` overrides); with several nodes, each node's result is labelled with the node and one
node failing prints its error to stderr without hiding the others (the command then exits 1).
``version --insecure`` asks nodes serving the maintenance API (``-n`` names them), which includes a
worker whose boot waits for its first node API certificate: the reply's ``phase`` and ``waiting``
say where its boot is.

Changing the machine config:

- ``apply-config -f FILE`` sends a whole config; ``--insecure`` sends it to nodes in maintenance
  mode (no client config needed: ``-n`` or ``-e`` name the nodes, each contacted directly).
- ``patch mc`` applies an RFC 6902 JSON patch (a JSON/YAML list of operations; a mapping is taken
  as an RFC 7386 merge patch) to each node's current config here, on the client. Every node's
  patch is computed before anything is sent, so a patch that fails for any node (bad operation,
  invalid result, node unreachable) applies nothing anywhere.
- ``edit mc`` opens each node's current config in ``$KUBEPLANE_EDITOR``, ``$EDITOR`` or ``vi``
  (split like a shell command line), one node after the other. Saving it unchanged or empty
  cancels. When the node rejects the edited config (invalid, or a mode it does not allow), the
  editor is reopened on the edited text with the error as comment lines at the top, as kubectl
  does; leaving it unchanged then gives up on that node with the error.
- ``--immediate`` / ``--on-reboot`` choose the apply mode (default: restart the node's services);
  ``--dry-run`` makes the node validate and diff without changing anything, and prints the diff
  and the mode the change would be applied in.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import stat
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

import kubeplane
from kubeplane import config as machine_config
from kubeplane import resources
from kubeplane.api import NodeClient, Reply
from kubeplane.cli import connect, output
from kubeplane.resources import catalog

F = TypeVar("F", bound=Callable[..., Any])

#: Environment variables naming the editor, first match wins (then ``vi``).
EDITOR_VARIABLES = ("KUBEPLANE_EDITOR", "EDITOR")
CANCELLED = "edit cancelled, nothing applied"
#: Call error codes meaning "the node looked at the config and said no": worth re-editing.
REJECTED = ("INVALID_ARGUMENT", "FAILED_PRECONDITION")


#: One registry per process: ``get`` decodes every row with it.
_registry = functools.cache(catalog.default_registry)


def register(group: click.Group) -> None:
    """Add this family's commands to the root group."""
    for command in (version, get, apply_config, edit, patch, read, ls, logs, events, service, reboot):
        group.add_command(command)


def _mode_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The apply mode options; the command receives them as one ``mode`` (an :class:`_ApplyMode`)."""

    @functools.wraps(command)
    def with_mode(
        *args: Any, immediate: bool, on_reboot: bool, mode_name: str | None, try_timeout: str, **kwargs: Any
    ) -> Any:
        return command(*args, mode=_mode(immediate, on_reboot, mode_name, try_timeout), **kwargs)

    function: Callable[..., Any] = click.option(
        "--dry-run", is_flag=True, help="Validate and show the diff; change nothing."
    )(with_mode)
    function = click.option(
        "--on-reboot", is_flag=True, help="Stage the config; it takes effect at the next reboot."
    )(function)
    function = click.option(
        "--timeout",
        "try_timeout",
        default="1m",
        show_default=True,
        metavar="DURATION",
        help="With --mode try: how long the node waits for the config to be applied again "
        "(--immediate) before it rolls back (1s to 1h).",
    )(function)
    function = click.option(
        "--mode",
        "mode_name",
        type=click.Choice(("reboot", "immediate", "on-reboot", "try")),
        help="The apply mode by name (instead of --immediate / --on-reboot). try: apply live "
        "without saving, and roll back unless applied again within --timeout.",
    )(function)
    return click.option(
        "--immediate",
        is_flag=True,
        help="Apply without restarting services (only for changes the node can apply live).",
    )(function)


@dataclasses.dataclass(frozen=True)
class _ApplyMode:
    """The mode an apply asks for, and for ``try`` the seconds until the node rolls back."""

    name: str
    try_seconds: int | None = None


def _mode(immediate: bool, on_reboot: bool, mode_name: str | None, try_timeout: str) -> _ApplyMode:
    chosen = [name for name, given in (("--immediate", immediate), ("--on-reboot", on_reboot)) if given]
    if mode_name is not None:
        chosen.append(f"--mode {mode_name}")
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)} exclude each other: choose one")
    name = mode_name or ("immediate" if immediate else "on-reboot" if on_reboot else "reboot")
    if name != "try":
        return _ApplyMode(name)
    seconds = int(output.parse_duration(try_timeout))
    if not 1 <= seconds <= 3600:
        raise click.BadParameter("must be between 1s and 1h", param_hint="--timeout")
    return _ApplyMode(name, seconds)


def _many(target: connect.Target | None, replies: Sequence[object] = ()) -> bool:
    return (target is not None and len(target.nodes) > 1) or len(replies) > 1


# --- version ----------------------------------------------------------------------------------


@click.command()
@click.option("--client", "client_only", is_flag=True, help="Print the client version only.")
@click.option(
    "--insecure",
    is_flag=True,
    help="Ask nodes serving the maintenance API (no client certificate), e.g. a worker whose boot "
    "waits for its first node API certificate; the reply shows what it waits for.",
)
@output.output_option
def version(*, client_only: bool, insecure: bool, fmt: output.Format) -> None:
    """Print the client version and each node's server version, boot phase and what a boot waits for."""
    client_version = {"tag": kubeplane.__version__}
    outcome = connect.Outcome()
    servers: list[tuple[str, dict[str, Any]]] = []
    target = None
    if insecure and not client_only:
        for address in connect.insecure_addresses(connect.options()):
            replies = connect.node_replies(None, NodeClient.version, node=address, insecure_address=address)
            servers += outcome.results(replies)
    elif not client_only:
        target = connect.resolve(connect.options())
        servers = outcome.results(connect.with_client(target, NodeClient.version))
    if fmt == "table":
        lines = ["Client:", *output.mapping_lines(client_version)]
        if servers:
            lines.append("Server:")
            for node, server in servers:
                shown = {"NODE": node, **server} if _many(target, servers) else server
                lines.extend(output.mapping_lines(shown))
        click.echo("\n".join(lines))
    else:
        document: dict[str, Any] = {"client": client_version}
        if not client_only:
            document["servers"] = [{"node": node, **server} for node, server in servers]
        click.echo(output.documents([document], fmt), nl=False)
    outcome.finish()


# --- get --------------------------------------------------------------------------------------

RESOURCE_HEADERS = ("NODE", "NAMESPACE", "TYPE", "ID", "VERSION")
WATCH_MARKERS = {"created": "+", "destroyed": "-"}


def resource_row(
    definition: resources.ResourceDefinition, node: str, document: Mapping[str, Any]
) -> list[str]:
    """One table row: node, namespace, display type, id, version, then the definition's columns."""
    metadata = document.get("metadata") or {}
    extras = [""] * len(definition.print_columns)
    try:
        _, resource = _registry().decode(document)
        extras = [column.value(resource) for column in definition.print_columns]
    except resources.ResourceError:
        pass  # an agent newer than this client: show what the generic columns can
    return [
        node,
        str(metadata.get("namespace", "")),
        definition.display_type,
        str(metadata.get("id", "")),
        str(metadata.get("version", "")),
        *extras,
    ]


def _output_document(node: str, document: Mapping[str, Any], **first: Any) -> dict[str, Any]:
    return {**first, "node": node, "metadata": document.get("metadata"), "spec": document.get("spec")}


def _resolve_type(name: str) -> resources.ResourceDefinition:
    try:
        return _registry().resolve(name)
    except resources.UnknownTypeError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command()
@click.argument("type_name", metavar="TYPE")
@click.argument("resource_id", metavar="[ID]", required=False)
@click.option("--namespace", metavar="NS", help="Namespace (default: the type's own namespace).")
@click.option("-w", "--watch", is_flag=True, help="Print the current state, then every change.")
@output.output_option
def get(
    *, type_name: str, resource_id: str | None, namespace: str | None, watch: bool, fmt: output.Format
) -> None:
    """Print resources of TYPE (any alias: `get sp`, `get staticpods`), or the one with ID."""
    definition = _resolve_type(type_name)
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    headers = [*RESOURCE_HEADERS, *(column.name for column in definition.print_columns)]
    if watch:
        connect.run(
            _watch(
                target=target,
                definition=definition,
                resource_id=resource_id,
                namespace=namespace,
                fmt=fmt,
                headers=headers,
                outcome=outcome,
            ),
            target=target,
        )
        outcome.finish()
        return

    async def fetch(node_client: NodeClient) -> list[tuple[str, dict[str, Any]]]:
        if resource_id is not None:
            replies = await node_client.resource_get(definition.type, resource_id, namespace=namespace)
            return outcome.results(replies)
        listed = outcome.results(await node_client.resource_list(definition.type, namespace=namespace))
        return [(node, item) for node, items in listed for item in items]

    found = connect.with_client(target, fetch)
    if fmt == "table":
        if found or not outcome.failed:
            click.echo(output.table(headers, (resource_row(definition, n, d) for n, d in found)), nl=False)
    else:
        click.echo(output.documents([_output_document(n, d) for n, d in found], fmt), nl=False)
    outcome.finish()


async def _watch(
    *,
    target: connect.Target,
    definition: resources.ResourceDefinition,
    resource_id: str | None,
    namespace: str | None,
    fmt: output.Format,
    headers: Sequence[str],
    outcome: connect.Outcome,
) -> None:
    rows = output.StreamingTable(["", *headers])
    first = True
    async with connect.client(target) as node_client:
        async for reply in node_client.resource_watch(definition.type, namespace=namespace, id=resource_id):
            if reply.error is not None:
                outcome.fail(reply.error, node=reply.node)
                continue
            event = reply.result or {}
            document = event.get("resource")
            if document is None:  # "bootstrapped": the initial state is complete; nothing to show
                continue
            kind = str(event.get("event", ""))
            if fmt == "table":
                marker = WATCH_MARKERS.get(kind, "")
                click.echo(rows.row([marker, *resource_row(definition, reply.node, document)]), nl=False)
            elif fmt == "yaml":
                text = output.yaml_document(_output_document(reply.node, document, event=kind))
                click.echo(("" if first else "---\n") + text, nl=False)
            else:
                click.echo(output.json_line(_output_document(reply.node, document, event=kind)), nl=False)
            first = False


# --- apply-config / edit / patch --------------------------------------------------------------


@click.command("apply-config")
@click.option(
    "-f", "--file", "path", required=True, type=click.Path(dir_okay=False), help="Machine config file."
)
@click.option("--insecure", is_flag=True, help="Send to nodes in maintenance mode (no client certificate).")
@_mode_options
def apply_config(
    *,
    path: str,
    insecure: bool,
    mode: _ApplyMode,
    dry_run: bool,
) -> None:
    """Apply a machine config to the nodes."""
    try:
        data = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"cannot read machine config {path}: {exc}") from exc
    outcome = connect.Outcome()
    obj = connect.options()
    if insecure:
        addresses = connect.insecure_addresses(obj)
        for address in addresses:
            replies = connect.node_replies(
                None, _apply_call(data, mode=mode, dry_run=dry_run), node=address, insecure_address=address
            )
            _print_applied(replies, outcome, dry_run=dry_run, many=len(addresses) > 1)
    else:
        target = connect.resolve(obj)
        replies = connect.with_client(target, _apply_call(data, mode=mode, dry_run=dry_run))
        _print_applied(replies, outcome, dry_run=dry_run, many=_many(target, replies))
    outcome.finish()


def _apply_call(
    data: str, *, mode: _ApplyMode, dry_run: bool
) -> Callable[[NodeClient], Awaitable[list[Reply[Any]]]]:
    return lambda node_client: node_client.apply_configuration(
        data, mode=mode.name, dry_run=dry_run, try_seconds=mode.try_seconds
    )


def _print_applied(replies: list[Reply[Any]], outcome: connect.Outcome, *, dry_run: bool, many: bool) -> None:
    for node, result in outcome.results(replies):
        mode = result.get("mode", "")
        message = result.get("message", "")
        if dry_run:
            allowed = result.get("allowed_modes")
            also = f" (allowed: {', '.join(allowed)})" if allowed else ""
            click.echo(f"node {node}: dry run, nothing applied: would apply in mode {mode}{also}")
            click.echo(result.get("diff") or "(no changes)\n", nl=False)
        else:
            click.echo(f"{output.node_label(node, many)}{message or f'applied in mode {mode}'}")


def _require_machine_config(type_name: str, command: str) -> None:
    definition = _resolve_type(type_name)
    if definition.type != catalog.MACHINE_CONFIGS:
        raise click.ClickException(
            f"{command} works on the machine config only (mc, machineconfig, machineconfigs), "
            f"not {definition.display_type}"
        )


@dataclasses.dataclass(frozen=True)
class _NodeConfig:
    """One node's current machine config, and the ``nodes`` a client needs to reach only that node."""

    node: str
    nodes: tuple[str, ...]
    current: str


def _current_configs(target: connect.Target, outcome: connect.Outcome) -> list[_NodeConfig]:
    """Every node's current config; failures are reported to ``outcome``."""
    configs = []
    for node, result in outcome.results(connect.with_client(target, NodeClient.machine_config)):
        current = result.get("current")
        if not current:
            outcome.fail(
                click.ClickException(f"node {node}: has no machine config to change; use apply-config")
            )
            continue
        # Without -n the endpoint's own node answered: reach it again the same way.
        configs.append(_NodeConfig(node=node, nodes=(node,) if target.nodes else (), current=str(current)))
    return configs


def _read_patch(patch_text: str | None, patch_file: str | None) -> str:
    if (patch_text is None) == (patch_file is None):
        raise click.UsageError("give the patch with exactly one of -p/--patch and --patch-file")
    if patch_text is not None and not patch_text.startswith("@"):
        return patch_text
    source = patch_file if patch_file is not None else (patch_text or "")[1:]
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"cannot read patch file {source}: {exc}") from exc


@click.command()
@click.argument("type_name", metavar="mc")
@click.option("-p", "--patch", "patch_text", metavar="JSON|@FILE", help="RFC 6902 JSON patch (or @file).")
@click.option("--patch-file", type=click.Path(dir_okay=False), help="File holding the patch.")
@_mode_options
def patch(
    *,
    type_name: str,
    patch_text: str | None,
    patch_file: str | None,
    mode: _ApplyMode,
    dry_run: bool,
) -> None:
    """Patch each node's machine config; nothing is applied anywhere if the patch fails for any node."""
    _require_machine_config(type_name, "patch")
    text = _read_patch(patch_text, patch_file)
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    patched: list[tuple[_NodeConfig, str]] = []
    for config in _current_configs(target, outcome):
        try:
            new = machine_config.apply_patch(machine_config.load(config.current), text)
        except machine_config.ConfigError as exc:
            outcome.fail(click.ClickException(f"node {config.node}: {exc}"))
            continue
        patched.append((config, new.to_yaml()))
    if outcome.failed:
        click.echo("Error: the patch was not applied to any node", err=True)
        outcome.finish()
    for config, data in patched:
        replies = connect.node_replies(
            target, _apply_call(data, mode=mode, dry_run=dry_run), nodes=config.nodes, node=config.node
        )
        _print_applied(replies, outcome, dry_run=dry_run, many=_many(target))
    outcome.finish()


@click.command()
@click.argument("type_name", metavar="mc")
@_mode_options
def edit(
    *,
    type_name: str,
    mode: _ApplyMode,
    dry_run: bool,
) -> None:
    """Edit each node's machine config in an editor and apply it."""
    _require_machine_config(type_name, "edit")
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    for config in _current_configs(target, outcome):
        _edit_node(target, config, mode=mode, dry_run=dry_run, outcome=outcome)
    outcome.finish()


def _edit_node(
    target: connect.Target, config: _NodeConfig, *, mode: _ApplyMode, dry_run: bool, outcome: connect.Outcome
) -> None:
    text, header = config.current, ""
    while True:
        edited = _strip_header(run_editor(header + text, node=config.node), header)
        if not edited.strip() or edited == config.current:
            click.echo(f"node {config.node}: {CANCELLED}")
            return
        if header and edited == text:
            # Reopened on a rejected config and saved unchanged: the user gives up on this node.
            outcome.fail(click.ClickException(f"node {config.node}: {CANCELLED}; the node rejected it"))
            return
        replies = connect.node_replies(
            target, _apply_call(edited, mode=mode, dry_run=dry_run), nodes=config.nodes, node=config.node
        )
        rejected = next((r.error for r in replies if r.error is not None and r.error.code in REJECTED), None)
        if rejected is None:
            _print_applied(replies, outcome, dry_run=dry_run, many=_many(target))
            return
        text, header = edited, _error_header(output.error_text(rejected, where=f"node {config.node}"))


def _error_header(error: str) -> str:
    lines = ["the node rejected this config; fix it, or save it unchanged to give up:", *error.splitlines()]
    return "".join(f"# {line}\n" for line in lines) + "#\n"


def _strip_header(text: str, header: str) -> str:
    return text[len(header) :] if header and text.startswith(header) else text


def run_editor(text: str, *, node: str) -> str:
    """Let the user edit ``text`` in their editor (see the module docstring); returns the result."""
    command = next((os.environ[name] for name in EDITOR_VARIABLES if os.environ.get(name)), "vi")
    argv = shlex.split(command)
    safe_node = "".join(c if c.isalnum() or c in ".-" else "-" for c in node) or "node"
    fd, path = tempfile.mkstemp(prefix=f"kubeplane-edit-{safe_node}-", suffix=".yaml")
    try:
        # mkstemp made the file 0600: the config holds private keys.
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        try:
            completed = subprocess.run([*argv, path], check=False)
        except OSError as exc:
            raise click.ClickException(
                f"cannot run the editor {command!r}: {exc.strerror}; set KUBEPLANE_EDITOR or EDITOR"
            ) from exc
        if completed.returncode != 0:
            raise click.ClickException(
                f"the editor {command!r} exited with status {completed.returncode}; nothing applied"
            )
        return Path(path).read_text(encoding="utf-8")
    finally:
        Path(path).unlink(missing_ok=True)


# --- files, logs, services, reboot -----------------------------------------------------------


@click.command()
@click.argument("path")
def read(path: str) -> None:
    """Print a file of the node (PATH relative to the node's root) to stdout."""
    target = connect.resolve(connect.options())
    if len(target.nodes) > 1:
        raise click.UsageError("read works on one node at a time: pass a single -n NODE")

    async def scenario() -> None:
        async with connect.client(target) as node_client:
            async for reply in node_client.read_file(path):
                # click.echo writes bytes to the binary stdout unchanged.
                click.echo(reply.unwrap(), nl=False)

    connect.run(scenario(), target=target)


LONG_HEADERS = ("NODE", "MODE", "SIZE(B)", "MODIFIED", "NAME")


def _file_mode(entry: Mapping[str, Any]) -> str:
    mode = entry.get("mode")
    if isinstance(mode, int):
        kind = stat.S_IFMT(mode) or (stat.S_IFDIR if entry.get("is_dir") else stat.S_IFREG)
        return stat.filemode(kind | stat.S_IMODE(mode))
    return str(mode or "")


@click.command("ls")
@click.argument("path", default=".")
@click.option("-r", "--recurse", is_flag=True, help="List subdirectories too.")
@click.option("-l", "--long", "long_format", is_flag=True, help="Show mode, size and modification time.")
@output.output_option
def ls(*, path: str, recurse: bool, long_format: bool, fmt: output.Format) -> None:
    """List a directory of the node (PATH relative to the node's root)."""
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    listed = outcome.results(connect.with_client(target, lambda c: c.list_dir(path, recurse=recurse)))
    entries = [(node, entry) for node, items in listed for entry in items]
    if fmt != "table":
        click.echo(output.documents([{"node": n, **e} for n, e in entries], fmt), nl=False)
    elif long_format:
        rows = (
            [
                n,
                _file_mode(e),
                str(e.get("size", "")),
                output.timestamp(e.get("modified")),
                str(e.get("name", "")),
            ]
            for n, e in entries
        )
        click.echo(output.table(LONG_HEADERS, rows), nl=False)
    else:
        click.echo(
            output.table(("NODE", "NAME"), ([n, str(e.get("name", ""))] for n, e in entries)), nl=False
        )
    outcome.finish()


@click.command()
@click.argument("service_id", metavar="SERVICE|NS/POD:CONTAINER")
@click.option(
    "-k", "--kubernetes", is_flag=True, help="Read a Kubernetes container's log (NS/POD:CONTAINER) via CRI."
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("--tail", type=click.IntRange(min=0), metavar="N", help="Only the last N lines.")
def logs(*, service_id: str, kubernetes: bool, follow: bool, tail: int | None) -> None:
    """Print a service's log (`controller-runtime` is the controllers' log).

    With -k, print the log of a Kubernetes container instead: `logs -k
    kube-system/kube-apiserver-NODE:kube-apiserver` (`kubeplane containers -k` lists them).
    """
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    many = len(target.nodes) > 1

    async def scenario() -> None:
        async with connect.client(target) as node_client:
            lines = (
                node_client.container_logs(service_id, tail=tail, follow=follow)
                if kubernetes
                else node_client.logs(service_id, tail=tail, follow=follow)
            )
            async for reply in lines:
                if reply.error is not None:
                    outcome.fail(reply.error, node=reply.node)
                else:
                    click.echo(f"{output.node_label(reply.node, many)}{reply.result}")

    connect.run(scenario(), target=target)
    outcome.finish()


EVENT_HEADERS = ("NODE", "ID", "TIME", "KIND", "SUBJECT", "MESSAGE")


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events (until interrupted).")
@click.option("--tail", type=click.IntRange(min=0), metavar="N", help="Only the last N events (per node).")
@click.option("--since", metavar="DURATION", help="Only the events of the last DURATION: 90s, 5m, 1h.")
@output.output_option
def events(*, follow: bool, tail: int | None, since: str | None, fmt: output.Format) -> None:
    """Print what happened on the nodes: service state changes, config applies, controller
    errors and boot phases (maintenance, boot, reboot, bootstrap, halt), oldest first.

    A node keeps its last 1000 events in memory; a restarted agent starts a new history. With
    -n A,B the events of every node are printed as they arrive, labelled by node. -o json prints
    one object per line: {"node", "id", "timestamp", "kind", "subject", "message"}.
    """
    since_seconds = int(output.parse_duration(since)) if since is not None else None
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    rows = output.StreamingTable(EVENT_HEADERS)

    async def scenario() -> None:
        first = True
        async with connect.client(target) as node_client:
            stream = node_client.events(since_seconds=since_seconds, tail=tail, follow=follow)
            async for reply in stream:
                if reply.error is not None:
                    outcome.fail(reply.error, node=reply.node)
                    continue
                event = {"node": reply.node, **(reply.result or {})}
                if fmt == "table":
                    cells = ("id", "timestamp", "kind", "subject", "message")
                    row = [reply.node, *(str(event.get(key, "")) for key in cells)]
                    row[2] = output.timestamp(event.get("timestamp"))
                    click.echo(rows.row(row), nl=False)
                elif fmt == "yaml":
                    click.echo(("" if first else "---\n") + output.yaml_document(event), nl=False)
                else:
                    click.echo(output.json_line(event), nl=False)
                first = False

    connect.run(scenario(), target=target)
    outcome.finish()


SERVICE_HEADERS = ("NODE", "SERVICE", "STATE", "HEALTH", "LAST CHANGE", "LAST EVENT")


def _health(service: Mapping[str, Any]) -> str:
    health = service.get("health")
    if isinstance(health, Mapping):
        if health.get("unknown"):
            return "?"
        return "OK" if health.get("healthy") else "Fail"
    return str(health) if health is not None else "?"


def _events(service: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    events = service.get("events") or []
    return [event for event in events if isinstance(event, Mapping)]


def _event_time(event: Mapping[str, Any]) -> Any:
    # RFC 3339 text or Unix seconds, under "ts" (node API) or "timestamp" (service supervisor).
    return event.get("ts", event.get("timestamp"))


def service_row(node: str, service: Mapping[str, Any]) -> list[str]:
    """One row of the service list."""
    events = _events(service)
    last = events[-1] if events else {}
    return [
        node,
        str(service.get("id", "")),
        str(service.get("state", "")),
        _health(service),
        output.age(_event_time(last)),
        str(last.get("message", "")),
    ]


def service_detail(node: str, service: Mapping[str, Any]) -> str:
    """The detail view of one service: node, id, state, health, then its events newest first."""
    fields = {"NODE": node, "ID": str(service.get("id", "")), "STATE": str(service.get("state", ""))}
    fields["HEALTH"] = _health(service)
    width = max(len(key) for key in [*fields, "EVENTS"]) + 3
    lines = [f"{key.ljust(width)}{value}" for key, value in fields.items()]
    events = [
        f"[{event.get('state', '')}]: {event.get('message', '')}"
        + (f" ({output.age(_event_time(event))})" if _event_time(event) is not None else "")
        for event in reversed(_events(service))
    ]
    for index, event in enumerate(events or [""]):
        lines.append(f"{('EVENTS' if index == 0 else '').ljust(width)}{event}".rstrip())
    return "\n".join(lines) + "\n"


@click.command()
@click.argument("service_id", metavar="[ID]", required=False)
@click.argument("action", required=False, type=click.Choice(("start", "stop", "restart")))
@output.output_option
def service(*, service_id: str | None, action: str | None, fmt: output.Format) -> None:
    """List services, show one (ID), or start/stop/restart it (ID ACTION)."""
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    if service_id is not None and action is not None:
        replies = connect.with_client(target, lambda c: getattr(c, f"service_{action}")(service_id))
        for node, result in outcome.results(replies):
            message = result.get("message") or f"{action} {service_id}"
            click.echo(f"{output.node_label(node, _many(target, replies))}{message}")
        outcome.finish()
        return
    listed = outcome.results(connect.with_client(target, NodeClient.service_list))
    services = [(node, item) for node, items in listed for item in items]
    if service_id is not None:
        wanted = [(n, s) for n, s in services if s.get("id") == service_id]
        found_on = {n for n, _ in wanted}
        for node, _ in listed:
            if node not in found_on:
                outcome.fail(
                    click.ClickException(f"node {node}: no service {service_id!r} (see `kubeplane service`)")
                )
        services = wanted
    if fmt != "table":
        click.echo(output.documents([{"node": n, **s} for n, s in services], fmt), nl=False)
    elif service_id is not None:
        click.echo("".join(service_detail(n, s) for n, s in services), nl=False)
    else:
        click.echo(output.table(SERVICE_HEADERS, (service_row(n, s) for n, s in services)), nl=False)
    outcome.finish()


@click.command()
def reboot() -> None:
    """Restart the node's services in order, applying a staged config."""
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    replies = connect.with_client(target, NodeClient.reboot)
    for node, result in outcome.results(replies):
        click.echo(f"{output.node_label(node, _many(target, replies))}{result.get('message', 'rebooting')}")
    outcome.finish()
