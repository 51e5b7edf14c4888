"""Entry point of ``kubeplaned``, the node agent."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import kubeplane
from kubeplane import config, metrics
from kubeplane.agent import upgrade
from kubeplane.agent.node import Node, load_booted_modules
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


def _port(text: str) -> int:
    """A TCP port number, 0 included (argparse type of ``--metrics-port``)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid integer") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not in the range 0<=x<=65535")
    return port


def _parser() -> argparse.ArgumentParser:
    """The command line of ``kubeplaned``.

    argparse rather than click (which the ``kubeplane`` CLI uses): click costs the agent about
    1 MB of resident memory for a handful of options (docs/architecture.md, Memory).
    """
    parser = argparse.ArgumentParser(
        prog="kubeplaned",
        description="kubeplaned: the kubeplane node agent. Turns the node's machine configuration "
        "into running services (containerd, kubelet, etcd) and control plane static pods, and "
        "serves the node API the kubeplane CLI talks to. Without a machine config under --root the "
        "node starts in maintenance mode and accepts only `kubeplane apply-config --insecure`.",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="Node root directory: machine config, secrets, logs and service state live under it. "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--listen",
        default=f"0.0.0.0:{config.defaults.DEFAULT_NODE_API_PORT}",
        metavar="ADDR:PORT",
        help="Node API address. Once booted with a config that sets machine.ports.nodeAPI, the node API "
        "listens on that port instead (maintenance mode always uses this one); trustd listens on ADDR too. "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--node-name", metavar="NAME", help="Name of this node (default: config hostname or listen address)."
    )
    parser.add_argument(
        "--services",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Run containerd, kubelet and etcd. --no-services runs an API-and-controllers-only node "
        "(several such agents can share one network namespace, e.g. on 127.0.0.X addresses). "
        "(default: --services)",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=METRICS_PORT,
        metavar="PORT",
        help="Serve Prometheus metrics on http://<--listen host>:PORT/metrics (docs/metrics.md); 0: off. "
        "They are served without authentication and carry no secrets. (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning"], help="(default: %(default)s)"
    )
    commands = parser.add_subparsers(dest="command", title="commands")
    commands.add_parser("version", help="Print the agent version.", description="Print the agent version.")
    return parser


def run(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` (default: the process's arguments) and run the agent or the command."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "version":
        print(f"kubeplaned {kubeplane.__version__}")
        return
    root: Path = args.root
    if root.exists() and not root.is_dir():
        parser.error(f"argument --root: directory {str(root)!r} is a file.")
    paths = NodePaths(root.resolve())
    build = upgrade.startup_target(paths, dict(os.environ))
    if build is not None:
        # An upgrade staged (or done before this process started): run it, same PID and arguments.
        print(f"kubeplaned: starting the active build {build.version} from {build.path}", file=sys.stderr)
        upgrade.exec_into(build, list(argv) if argv is not None else sys.argv[1:])
    paths.logs.mkdir(parents=True, exist_ok=True)
    _setup_logging(paths, args.log_level)
    exporter = None
    if args.metrics_port:
        host = args.listen.rpartition(":")[0].strip("[]")
        try:
            exporter = metrics.serve(host, args.metrics_port)
        except OSError as exc:
            parser.exit(1, f"Error: --metrics-port {args.metrics_port} on {host}: {exc.strerror}\n")
    try:
        node = Node(root=paths.root, listen=args.listen, name=args.node_name, services=args.services)
        asyncio.run(_serve(node))
    finally:
        if exporter is not None:
            exporter.stop()


def check() -> None:
    """What an agent upgrade runs in a new build before installing it (:mod:`.upgrade`): import
    every module the agent imports on first use too, so a build that could start in maintenance
    mode but not boot is refused."""
    load_booted_modules()


def main() -> None:
    """Console-script entry point."""
    run()
