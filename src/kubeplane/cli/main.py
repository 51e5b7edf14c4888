"""Root of the ``kubeplane`` command.

Each command family lives in its own module under ``kubeplane.cli`` and exposes
``register(group)``; this module only wires them together and owns the global options, so
adding a family never touches another family's file.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys

import click

# gRPC's C core logs TLS handshake failures to stderr at info level; the CLI reports errors itself.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

#: Command family modules, each with ``register(group: click.Group) -> None`` adding exactly these
#: commands. A family is imported when one of its commands runs (``--help`` imports them all), so
#: ``kubeplane get`` does not pay for the provisioner's imports; a unit test keeps this table true.
FAMILIES: dict[str, tuple[str, ...]] = {
    "kubeplane.cli.node": (
        "version", "get", "apply-config", "edit", "patch", "read", "ls", "logs", "events", "service",
        "reboot",
    ),
    "kubeplane.cli.clientconfig": ("config",),
    "kubeplane.cli.cluster_ops": ("bootstrap", "etcd", "kubeconfig", "containers"),
    "kubeplane.cli.cluster": ("cluster", "images"),
    "kubeplane.cli.registry": ("registry",),
    "kubeplane.cli.health": ("health",),
    "kubeplane.cli.gen": ("gen",),
    "kubeplane.cli.validate": ("validate",),
    "kubeplane.cli.toolchain": ("toolchain",),
    "kubeplane.cli.upgrade": ("upgrade-k8s",),
    "kubeplane.cli.convert": ("convert-k8s",),
    "kubeplane.cli.certs": ("certs",),
    "kubeplane.cli.endpoint": ("endpoint",),
    "kubeplane.cli.reset": ("reset",),
    "kubeplane.cli.agentupgrade": ("upgrade",),
    "kubeplane.cli.kubeadm": ("kubeadm",),
}  # fmt: skip
_FAMILY_OF = {command: family for family, commands in FAMILIES.items() for command in commands}


class _FamilyGroup(click.Group):
    """The root group: loads a command's family module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_FAMILY_OF})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        family = _FAMILY_OF.get(cmd_name)
        if cmd_name not in self.commands and family is not None:
            importlib.import_module(family).register(self)
        return self.commands.get(cmd_name)


@dataclasses.dataclass(frozen=True)
class Context:
    """Global options shared by every command (client config, context, endpoints, nodes)."""

    config_path: str | None
    context: str | None
    endpoints: tuple[str, ...]
    nodes: tuple[str, ...]


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


@click.group(
    cls=_FamilyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.option(
    "--kubeplaneconfig",
    "config_path",
    envvar="KUBEPLANECONFIG",
    metavar="PATH",
    help="Client config file (default ~/.kubeplane/config; env KUBEPLANECONFIG).",
)
@click.option(
    "--context",
    envvar="KUBEPLANECONTEXT",
    metavar="NAME",
    help="Context of the client config to use (default: current; env KUBEPLANECONTEXT).",
)
@click.option(
    "-e",
    "--endpoints",
    multiple=True,
    metavar="ADDR[,ADDR]",
    help="Node API endpoints to connect to: HOST, HOST:PORT or [IPv6]:PORT (default port 50000).",
)
@click.option(
    "-n", "--nodes", multiple=True, metavar="NODE[,NODE]", help="Nodes to target (proxied via the endpoint)."
)
@click.pass_context
def cli(
    ctx: click.Context,
    config_path: str | None,
    context: str | None,
    endpoints: tuple[str, ...],
    nodes: tuple[str, ...],
) -> None:
    """kubeplane runs and changes a Kubernetes control plane.

    Every node runs the kubeplaned agent, which turns a declarative machine configuration into
    etcd, kubelet and control plane static pods. This command talks to the agents over a
    mutually authenticated API, generates configs and PKI, and builds local clusters.
    """
    ctx.obj = Context(
        config_path=config_path, context=context, endpoints=_split(endpoints), nodes=_split(nodes)
    )


def main() -> None:
    """Console-script entry point."""
    try:
        cli(prog_name="kubeplane")
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
