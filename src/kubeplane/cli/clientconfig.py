"""`kubeplane config ...`: the client config file's contexts, endpoints, nodes and credentials.

The file is the one :mod:`kubeplane.cli.connect` reads (``--kubeplaneconfig``, ``$KUBEPLANECONFIG``,
``~/.kubeplane/config``). Commands that change it read it, change it with the pure functions of
:mod:`kubeplane.config.client` and write it back atomically (mode 0600); ``--context`` selects the
context that ``endpoints``, ``nodes`` and ``info`` work on (default: the current one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kubeplane import pki
from kubeplane.cli import connect, output
from kubeplane.config import client as client_config


def register(group: click.Group) -> None:
    """Add this family's commands to the root group."""
    group.add_command(config)


@click.group()
def config() -> None:
    """Show and change the client config (contexts, endpoints, nodes, credentials)."""


def _update(change: Any) -> client_config.ClientConfig:
    """Load the file, apply ``change`` (ClientConfig -> ClientConfig), save it; errors become CLI errors."""
    path, current = connect.load_client_config(connect.options())
    try:
        updated: client_config.ClientConfig = change(current)
    except client_config.ClientConfigError as exc:
        raise click.ClickException(f"{exc} (client config {path})") from exc
    try:
        client_config.save(updated, path)
    except OSError as exc:
        raise click.ClickException(f"cannot write client config {path}: {exc.strerror}") from exc
    return updated


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


@config.command()
@output.output_option
def contexts(*, fmt: output.Format) -> None:
    """List the contexts; `*` marks the current one."""
    _, current = connect.load_client_config(connect.options())
    names = sorted(current.contexts)
    if fmt != "table":
        items = [
            {
                "name": name,
                "current": name == current.context,
                "endpoints": list(current.contexts[name].endpoints),
                "nodes": list(current.contexts[name].nodes),
            }
            for name in names
        ]
        click.echo(output.documents(items, fmt), nl=False)
        return
    rows = (
        [
            "*" if name == current.context else "",
            name,
            ",".join(current.contexts[name].endpoints),
            ",".join(current.contexts[name].nodes),
        ]
        for name in names
    )
    click.echo(output.table(("CURRENT", "NAME", "ENDPOINTS", "NODES"), rows), nl=False)


@config.command()
@click.argument("name")
def context(name: str) -> None:
    """Make NAME the current context."""
    _update(lambda current: client_config.use_context(current, name))
    click.echo(f"switched to context {name!r}")


@config.command()
@click.argument("endpoints", nargs=-1, required=True)
def endpoints(endpoints: tuple[str, ...]) -> None:
    """Set the endpoints of the context (addresses of nodes running the API; HOST or HOST:PORT)."""
    obj = connect.options()
    addresses = _split(endpoints)
    updated = _update(lambda current: client_config.set_endpoints(current, addresses, context=obj.context))
    click.echo(f"context {obj.context or updated.context!r}: endpoints {', '.join(addresses)}")


@config.command()
@click.argument("nodes", nargs=-1)
def nodes(nodes: tuple[str, ...]) -> None:
    """Set the default target nodes of the context (none: the endpoint's own node)."""
    obj = connect.options()
    names = _split(nodes)
    updated = _update(lambda current: client_config.set_nodes(current, names, context=obj.context))
    click.echo(f"context {obj.context or updated.context!r}: nodes {', '.join(names) or '(none)'}")


def _read_pem(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {what} {path}: {exc.strerror}") from exc


@config.command()
@click.argument("name")
@click.option("--ca", "ca_path", required=True, metavar="FILE", help="OS CA certificate (PEM).")
@click.option("--crt", "crt_path", required=True, metavar="FILE", help="Client certificate (PEM).")
@click.option("--key", "key_path", required=True, metavar="FILE", help="Client private key (PEM).")
def add(*, name: str, ca_path: str, crt_path: str, key_path: str) -> None:
    """Add context NAME from PEM files; -e/-n give its endpoints and nodes. It becomes current."""
    obj = connect.options()
    new = client_config.Context.from_pem(
        endpoints=obj.endpoints,
        nodes=obj.nodes,
        ca=_read_pem(ca_path, "CA certificate"),
        client=pki.CertKey(
            cert=_read_pem(crt_path, "client certificate"), key=_read_pem(key_path, "client key")
        ),
    )
    _update(lambda current: client_config.add_context(current, name, new))
    click.echo(f"added context {name!r} and made it current")


#: Role names `config new --roles` also accepts (the original's ``os:`` names and bare names).
ROLE_ALIASES = {
    alias: role
    for role in (pki.ROLE_ADMIN, pki.ROLE_READER)
    for alias in (role, role.partition(":")[2], "os:" + role.partition(":")[2])
}


def _roles(values: tuple[str, ...]) -> tuple[str, ...]:
    chosen = _split(values)
    unknown = [value for value in chosen if value not in ROLE_ALIASES]
    if unknown or not chosen:
        raise click.BadParameter(
            f"{', '.join(unknown) or '(none)'}: choose from {', '.join(sorted(ROLE_ALIASES))}",
            param_hint="--roles",
        )
    return tuple(dict.fromkeys(ROLE_ALIASES[value] for value in chosen))


@config.command("new")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), default="kubeplaneconfig")
@click.option(
    "--roles",
    multiple=True,
    default=("admin",),
    show_default=True,
    help="Roles of the new certificate, comma-separated or repeated: admin, reader "
    "(also as kubeplane:admin or os:reader).",
)
@click.option(
    "--crt-ttl",
    default="8760h",
    show_default=True,
    metavar="DURATION",
    help="How long the certificate is valid: 1h, 720h, 8760h ...",
)
@click.option(
    "--name", "common_name", default="kubeplane-client", show_default=True, help="The client's name (CN)."
)
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
def new(*, path: Path, roles: tuple[str, ...], crt_ttl: str, common_name: str, force: bool) -> None:
    """Write a new client config to PATH whose certificate carries the chosen roles, signed by a
    control plane node (-n NODE, one node) for the current context's endpoints and nodes.

    The private key is made here and never leaves this machine: the node signs a CSR for it.
    Give someone read-only access with `kubeplane config new --roles reader reader.config`.
    """
    chosen = _roles(roles)
    lifetime = int(output.parse_duration(crt_ttl))
    if path.exists() and not force:
        raise click.ClickException(f"{path} exists: pass --force to overwrite it")
    target = connect.resolve(connect.options())
    if len(target.nodes) > 1:
        raise click.UsageError("config new asks one node to sign: pass a single -n NODE")
    key = pki.generate_key()
    try:
        csr = pki.new_csr(key=key, common_name=common_name)
    except pki.PKIError as exc:
        raise click.BadParameter(str(exc), param_hint="--name") from exc
    replies = connect.with_client(
        target, lambda c: c.client_certificate(csr, roles=chosen, lifetime_seconds=lifetime)
    )
    signed = replies[0].unwrap()
    context = client_config.Context.from_pem(
        endpoints=target.endpoints,
        nodes=target.nodes,
        ca=str(signed["ca"]).encode(),
        client=pki.CertKey(cert=str(signed["crt"]).encode(), key=key),
    )
    written = client_config.ClientConfig(context=target.context, contexts={target.context: context})
    try:
        client_config.save(written, path)
    except OSError as exc:
        raise click.ClickException(f"cannot write client config {path}: {exc.strerror}") from exc
    until = pki.cert_info(context.client.cert).not_after.isoformat(timespec="seconds")
    click.echo(f"wrote {path}: context {target.context!r}, roles {', '.join(chosen)}, valid until {until}")


@config.command()
@click.argument("path", type=click.Path(dir_okay=False))
def merge(path: str) -> None:
    """Merge the contexts of another client config into this one; renamed contexts are listed."""
    try:
        other = client_config.loads(Path(path).read_text(encoding="utf-8"), source=path)
    except OSError as exc:
        raise click.ClickException(f"cannot read client config {path}: {exc.strerror}") from exc
    except client_config.ClientConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    renames: dict[str, str] = {}

    def change(current: client_config.ClientConfig) -> client_config.ClientConfig:
        merged, found = client_config.merge(current, other)
        renames.update(found)
        return merged

    updated = _update(change)
    for old, new in renames.items():
        click.echo(f"renamed context {old!r} to {new!r}: a context of that name already existed")
    click.echo(f"merged {len(other.contexts)} context(s); current context: {updated.context}")


@config.command()
@output.output_option
def info(*, fmt: output.Format) -> None:
    """Show the context in use: endpoints, nodes, and the client certificate's roles and expiry."""
    obj = connect.options()
    path, current = connect.load_client_config(obj)
    try:
        name, ctx = client_config.current(current, obj.context)
    except client_config.ClientConfigError as exc:
        raise click.ClickException(f"{exc} (client config {path})") from exc
    document: dict[str, Any] = {
        "context": name,
        "endpoints": list(ctx.endpoints),
        "nodes": list(ctx.nodes),
    }
    if ctx.crt:
        try:
            cert = pki.cert_info(ctx.client.cert)
        except pki.PKIError as exc:
            raise click.ClickException(
                f"context {name!r}: the client certificate is unreadable: {exc}"
            ) from exc
        document["roles"] = list(cert.organizations)
        document["subject"] = cert.subject_cn
        document["expires"] = cert.not_after.isoformat()
    if fmt != "table":
        click.echo(output.documents([document], fmt), nl=False)
        return
    shown = {key: ", ".join(value) if isinstance(value, list) else value for key, value in document.items()}
    click.echo("\n".join(output.mapping_lines(shown, indent="")))
