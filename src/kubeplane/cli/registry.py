"""``kubeplane registry cache start|stop|list``: the pull through cache guide's caching proxies.

The guide starts one ``registry:2`` container per upstream with ``REGISTRY_PROXY_REMOTEURL`` on
host ports 5000 to 5004; these commands start the same caches as host processes of Debian's
``docker-registry`` (:mod:`kubeplane.provision.registry_cache`), tracked by PID and start time:

    kubeplane registry cache start --name k8s.gcr.io --upstream https://k8s.gcr.io --port 5001
    kubeplane registry cache start --guide        # all five of the guide, ports 5000-5004
    kubeplane cluster create --registry-mirror k8s.gcr.io=http://10.5.0.1:5001 ...
    kubeplane registry cache stop --name k8s.gcr.io [--purge]

docs/registries.md has the whole recipe.
"""

from __future__ import annotations

from pathlib import Path

import click

from kubeplane.cli import output
from kubeplane.provision import registry_cache


def register(group: click.Group) -> None:
    group.add_command(registry)


_ROOT = click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Where caches live (default ${registry_cache.ROOT_ENV} or ~/.kubeplane/registry-caches).",
)


@click.group()
def registry() -> None:
    """Image registries on this machine for local clusters."""


@registry.group()
def cache() -> None:
    """Pull-through caches of upstream registries (the pull through cache guide)."""


@cache.command()
@click.option("--name", help="Cache name: the upstream registry's host, e.g. k8s.gcr.io.")
@click.option("--upstream", metavar="URL", help="The registry it caches, e.g. https://k8s.gcr.io.")
@click.option("--port", type=click.IntRange(1, 65535), help="Port it listens on.")
@click.option(
    "--address", default=registry_cache.DEFAULT_ADDRESS, show_default=True, help="Address it listens on."
)
@click.option(
    "--guide",
    is_flag=True,
    help="Start the guide's five caches (docker.io, k8s.gcr.io, quay.io, gcr.io, ghcr.io on 5000-5004).",
)
@_ROOT
def start(
    *,
    name: str | None,
    upstream: str | None,
    port: int | None,
    address: str,
    guide: bool,
    root: Path | None,
) -> None:
    """Start a caching proxy (or leave it running if it already runs with these settings)."""
    if guide:
        if name or upstream or port:
            raise click.UsageError(
                "--guide starts the guide's caches: give it without --name, --upstream, --port"
            )
        wanted = [(host, url, number) for host, (url, number) in registry_cache.GUIDE_CACHES.items()]
    else:
        if not (name and upstream and port):
            raise click.UsageError("give --name, --upstream and --port (or --guide)")
        wanted = [(name, upstream, port)]
    for cache_name, cache_upstream, cache_port in wanted:
        try:
            started, fresh = registry_cache.start(
                cache_name, upstream=cache_upstream, port=cache_port, address=address, root=root
            )
        except registry_cache.CacheError as exc:
            raise click.ClickException(str(exc)) from exc
        verb = "started" if fresh else "already running"
        pid = started.record.pid if started.record is not None else "?"
        click.echo(
            f"cache {cache_name}: {verb} on {address}:{cache_port} for {cache_upstream} "
            f"(pid {pid}, log {started.registry().log})"
        )


@cache.command()
@click.option("--name", "names", multiple=True, help="Cache to stop (repeatable; default: every cache).")
@click.option("--purge", is_flag=True, help="Also remove the cached images (the guide's docker rm -f).")
@_ROOT
def stop(*, names: tuple[str, ...], purge: bool, root: Path | None) -> None:
    """Stop caches (by their recorded PID); the cached images stay unless --purge."""
    try:
        targets = list(names) or [found.name for found in registry_cache.list_caches(root=root)]
        for cache_name in targets:
            done = registry_cache.stop(cache_name, purge=purge, root=root)
            if purge:
                click.echo(f"cache {cache_name}: {'removed' if done else 'no such cache'}")
            else:
                click.echo(f"cache {cache_name}: {'stopped' if done else 'not running'}")
    except registry_cache.CacheError as exc:
        raise click.ClickException(str(exc)) from exc


@cache.command(name="list")
@output.output_option
@_ROOT
def list_(*, fmt: output.Format, root: Path | None) -> None:
    """The caches: name, upstream, address, whether running."""
    try:
        rows = [found.summary() for found in registry_cache.list_caches(root=root)]
    except registry_cache.CacheError as exc:
        raise click.ClickException(str(exc)) from exc
    if fmt != "table":
        click.echo(output.documents(rows, fmt), nl=False)
    else:
        table = [[r["name"], r["upstream"], r["listen"], "yes" if r["running"] else "no"] for r in rows]
        click.echo(output.table(["NAME", "UPSTREAM", "LISTEN", "RUNNING"], table), nl=False)
