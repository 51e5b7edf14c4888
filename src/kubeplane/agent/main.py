"""Entry point of ``kubeplaned``, the node agent."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import click

import kubeplane
from kubeplane import config, metrics
from kubeplane.agent.node import Node
from kubeplane.config.paths import NodePaths
from kubeplane.runtime import LOGGER_NAME as CONTROLLER_RUNTIME
from kubeplane.services.logs import RotatingLogWriter

#: Where ``/metrics`` is served by default (on the node API's address): next to 50000 (node API)
#: and 50001 (trustd); the config's ``machine.ports`` may not take it.
METRICS_PORT = config.defaults.DEFAULT_METRICS_PORT


class _StreamHandler(logging.Handler):
    """Writes records to a size-capped rotating node log stream."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._writer = RotatingLogWriter(path)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._writer.write((self.format(record) + "\n").encode())
        except Exception:
            self.handleError(record)


def _setup_logging(paths: NodePaths, level: str) -> None:
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.setLevel(level.upper())
    for handler in (logging.StreamHandler(), _StreamHandler(paths.logs / "kubeplaned.log")):
        handler.setFormatter(formatter)
        root.addHandler(handler)
    controller_stream = _StreamHandler(paths.logs / f"{CONTROLLER_RUNTIME}.log")
    controller_stream.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logging.getLogger(CONTROLLER_RUNTIME).addHandler(controller_stream)


async def _serve(node: Node) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, node.stop)
    await node.run()


@click.group(
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="Node root directory: machine config, secrets, logs and service state live under it.",
)
@click.option(
    "--listen",
    default=f"0.0.0.0:{config.defaults.DEFAULT_NODE_API_PORT}",
    show_default=True,
    metavar="ADDR:PORT",
    help="Node API address. Once booted with a config that sets machine.ports.nodeAPI, the node API "
    "listens on that port instead (maintenance mode always uses this one); trustd listens on ADDR too.",
)
@click.option(
    "--node-name", metavar="NAME", help="Name of this node (default: config hostname or listen address)."
)
@click.option(
    "--services/--no-services",
    default=True,
    show_default=True,
    help="Run containerd, kubelet and etcd. --no-services runs an API-and-controllers-only node "
    "(several such agents can share one network namespace, e.g. on 127.0.0.X addresses).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=METRICS_PORT,
    show_default=True,
    help="Serve Prometheus metrics on http://<--listen host>:PORT/metrics (docs/metrics.md); 0: off. "
    "They are served without authentication and carry no secrets.",
)
@click.option(
    "--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning"])
)
@click.pass_context
def cli(
    ctx: click.Context,
    *,
    root: Path,
    listen: str,
    node_name: str | None,
    services: bool,
    metrics_port: int,
    log_level: str,
) -> None:
    """kubeplaned: the kubeplane node agent.

    Turns the node's machine configuration into running services (containerd, kubelet, etcd)
    and control plane static pods, and serves the node API the kubeplane CLI talks to.

    Without a machine config under --root the node starts in maintenance mode and accepts only
    `kubeplane apply-config --insecure`.
    """
    if ctx.invoked_subcommand is not None:
        return
    paths = NodePaths(root.resolve())
    paths.logs.mkdir(parents=True, exist_ok=True)
    _setup_logging(paths, log_level)
    exporter = None
    if metrics_port:
        host = listen.rpartition(":")[0].strip("[]")
        try:
            exporter = metrics.serve(host, metrics_port)
        except OSError as exc:
            raise click.ClickException(f"--metrics-port {metrics_port} on {host}: {exc.strerror}") from exc
    try:
        asyncio.run(_serve(Node(root=paths.root, listen=listen, name=node_name, services=services)))
    finally:
        if exporter is not None:
            exporter.stop()


@cli.command()
def version() -> None:
    """Print the agent version."""
    click.echo(f"kubeplaned {kubeplane.__version__}")


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="kubeplaned")
