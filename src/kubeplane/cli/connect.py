"""Connecting the CLI to the node API: the target from the global options and the client config,
running a call's coroutine, and turning API errors into CLI errors.

Resolution. The client config (``--kubeplaneconfig`` / ``$KUBEPLANECONFIG`` / ``~/.kubeplane/config``)
gives the context (``--context`` or the current one) with its endpoints, nodes and credentials;
``-e/--endpoints`` and ``-n/--nodes`` replace the context's endpoints and nodes. Nodes given means
every call goes to the first reachable endpoint, which forwards it to each node
(:class:`~kubeplane.api.NodeClient` does that). Insecure (maintenance-mode) calls need no client
config: each address of ``-n`` (or, without nodes, of ``-e``) is contacted directly.

Results. Commands get one :class:`~kubeplane.api.Reply` per node; :class:`Outcome` prints a failed
node's error to stderr labelled with the node and remembers it, so the other nodes' results still
print and the command exits 1 at the end (:meth:`Outcome.finish`).
"""

from __future__ import annotations

import asyncio
import datetime
import shlex
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kubeplane import pki
from kubeplane.api import APIError, CallError, ConnectError, Credentials, NodeClient, Reply
from kubeplane.cli import output
from kubeplane.config import client as client_config

if TYPE_CHECKING:
    # main imports every command family, which import this module: only the type is needed here.
    from kubeplane.cli import main

T = TypeVar("T")

NO_ENDPOINTS = "no endpoints: pass -e or set them with `kubeplane config endpoints`"
#: Where the README explains the renewal an expired client certificate needs.
RENEWAL_HINT = (
    'renew it with the OS CA (README: "Renewing an expired administrator certificate") '
    "or mint a new config with `kubeplane config new` from a config that still works"
)


@dataclass(frozen=True)
class Target:
    """Where calls go: the endpoints to try, the nodes to forward to, and the credentials."""

    endpoints: tuple[str, ...]
    nodes: tuple[str, ...]
    credentials: Credentials
    context: str


def options(ctx: click.Context | None = None) -> main.Context:
    """The global options of the current command (the root group's context object)."""
    obj: main.Context = (ctx or click.get_current_context()).find_root().obj
    return obj


def command_line(*words: str) -> str:
    """``kubeplane`` with this invocation's global options (context, endpoints, nodes) and ``words``:
    the exact command a resume message tells the user to run again."""
    obj = options()
    line = ["kubeplane"]
    line += ["--context", obj.context] if obj.context else []
    line += ["-e", ",".join(obj.endpoints)] if obj.endpoints else []
    line += ["-n", ",".join(obj.nodes)] if obj.nodes else []
    return shlex.join([*line, *words])


def load_client_config(obj: main.Context) -> tuple[str, client_config.ClientConfig]:
    """The client config file path (as a string for messages) and its contents."""
    path = client_config.resolve_path(obj.config_path)
    try:
        return str(path), client_config.load(path)
    except client_config.ClientConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def resolve(obj: main.Context) -> Target:
    """The target of secure calls (see the module docstring); raises ClickException when incomplete."""
    path, config = load_client_config(obj)
    try:
        name, context = client_config.current(config, obj.context)
    except client_config.ClientConfigError as exc:
        raise click.ClickException(f"{exc} (client config {path})") from exc
    endpoints = obj.endpoints or context.endpoints
    if not endpoints:
        raise click.ClickException(NO_ENDPOINTS)
    if not (context.ca and context.crt and context.key):
        raise click.ClickException(
            f"context {name!r} in {path} has no credentials (ca, crt, key): "
            "add them with `kubeplane config add` or merge a generated client config"
        )
    _check_validity(context.client.cert, context=name, path=path)
    credentials = Credentials(ca=context.ca_pem, cert=context.client.cert, key=context.client.key)
    return Target(
        endpoints=tuple(endpoints), nodes=obj.nodes or context.nodes, credentials=credentials, context=name
    )


def _check_validity(cert_pem: bytes, *, context: str, path: str) -> None:
    """Refuse a client certificate outside its validity period before any node sees it.

    A node answers an expired certificate with a bare TLS alert that names neither the
    certificate nor the fix; here the user learns which context, since when, and what to do.
    """
    try:
        info = pki.cert_info(cert_pem)
    except (pki.PKIError, ValueError) as exc:
        raise click.ClickException(
            f"the client certificate of context {context!r} in {path} cannot be read: {exc}"
        ) from exc
    now = datetime.datetime.now(datetime.UTC)
    if now >= info.not_after:
        ago = output.duration((now - info.not_after).total_seconds())
        raise click.ClickException(
            f"the client certificate of context {context!r} in {path} expired at "
            f"{output.timestamp(info.not_after.timestamp())} ({ago} ago): {RENEWAL_HINT}"
        )
    if now < info.not_before:
        raise click.ClickException(
            f"the client certificate of context {context!r} in {path} is not valid before "
            f"{output.timestamp(info.not_before.timestamp())}: check this machine's clock"
        )


def client(target: Target, *, nodes: Sequence[str] | None = None) -> NodeClient:
    """A client for ``target``; ``nodes`` overrides the target's nodes (one node at a time for edit)."""
    return NodeClient(
        target.endpoints, credentials=target.credentials, nodes=target.nodes if nodes is None else nodes
    )


def insecure_addresses(obj: main.Context) -> tuple[str, ...]:
    """The nodes an insecure (maintenance-mode) call goes to, each contacted directly."""
    addresses = obj.nodes or obj.endpoints
    if not addresses:
        raise click.ClickException(
            "--insecure needs the node's address: pass -n NODE (or -e ENDPOINT); "
            "nodes in maintenance mode do not use the client config"
        )
    return addresses


def run(coroutine: Coroutine[Any, Any, T], *, target: Target | None = None) -> T:
    """Run a coroutine to completion; an API error the command did not handle becomes a CLI error.

    An error of the endpoint itself (not of one forwarded node) is labelled with the endpoint(s).
    """
    try:
        return asyncio.run(coroutine)
    except APIError as exc:
        where = f"endpoint {', '.join(target.endpoints)}" if target is not None else ""
        raise click.ClickException(output.error_text(exc, where=where)) from exc


def with_client(target: Target, call: Callable[[NodeClient], Awaitable[T]]) -> T:
    """Open a client on ``target``, make ``call`` with it and close it."""

    async def scenario() -> T:
        async with client(target) as node_client:
            return await call(node_client)

    return run(scenario(), target=target)


def node_replies(
    target: Target | None,
    call: Callable[[NodeClient], Awaitable[list[Reply[T]]]],
    *,
    nodes: Sequence[str] = (),
    node: str,
    insecure_address: str | None = None,
) -> list[Reply[T]]:
    """Make ``call`` for one node and return its replies; a failure at the endpoint becomes the
    error of ``node``'s reply, so the caller handles every node's failure the same way.

    ``insecure_address`` makes the call over an insecure client to that address (maintenance mode).
    """

    async def scenario() -> list[Reply[T]]:
        if insecure_address is not None:
            node_client = NodeClient.insecure([insecure_address])
        else:
            assert target is not None
            node_client = client(target, nodes=nodes)
        async with node_client:
            return await call(node_client)

    try:
        return asyncio.run(scenario())
    except CallError as exc:
        return [Reply(node=node, error=exc)]
    except ConnectError as exc:
        return [Reply(node=node, error=CallError("UNAVAILABLE", str(exc), node=node))]


class Outcome:
    """Collects per-node failures of one command (see the module docstring)."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def fail(self, error: Exception, *, node: str = "") -> None:
        """Print one node's error now; the command will exit 1 when it finishes."""
        output.print_error(error, where=f"node {node}" if node else "")
        self.failed.append(node)

    def results(self, replies: Iterable[Reply[T]]) -> list[tuple[str, T]]:
        """The successful ``(node, result)`` pairs; failures are reported as they are met."""
        successes: list[tuple[str, T]] = []
        for reply in replies:
            if reply.error is not None:
                self.fail(reply.error, node=reply.node)
            else:
                successes.append((reply.node, reply.result))  # type: ignore[arg-type]
        return successes

    def finish(self) -> None:
        """Exit 1 when any node failed."""
        if self.failed:
            raise click.exceptions.Exit(1)
