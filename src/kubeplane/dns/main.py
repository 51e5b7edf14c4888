"""``python3 -m kubeplane.dns -conf PATH``: the add-on's process, started like CoreDNS.

In a pod it reaches the API server as its service account: the token and CA files under
:data:`SERVICE_ACCOUNT` and ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` become
kubeconfig text for :class:`~kubeplane.clients.kube.KubeClient` (read once at start: a restart
picks up a rotated token). ``--kubeconfig FILE`` runs it outside a cluster (the tests do), and
``--address`` binds the DNS port to one address instead of all.

The process binds its ports, then lists and watches; it answers from the first moment (empty
cluster zone until the lists arrive, which ``/ready`` reports) and runs until SIGTERM or SIGINT.
It exits non-zero on a Corefile it cannot run, a port it cannot bind, or a non-retryable API
error (403: RBAC missing), so the kubelet restarts it visibly.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import yaml

from kubeplane.clients.kube import KubeClient
from kubeplane.dns import DNSError, corefile, forward, watch
from kubeplane.dns.server import Server

__all__ = ["SERVICE_ACCOUNT", "in_cluster_kubeconfig", "main"]

log = logging.getLogger("kubeplane.dns")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster_kubeconfig(directory: Path = SERVICE_ACCOUNT, environ: dict[str, str] | None = None) -> str:
    """Kubeconfig text for the pod's service account (token and CA embedded)."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise DNSError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are unset; pass --kubeconfig")
    try:
        token = (directory / "token").read_text().strip()
        ca = (directory / "ca.crt").read_bytes()
    except OSError as exc:
        raise DNSError(f"cannot read the service account: {exc}") from exc
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "in-cluster",
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca).decode()},
            }
        ],
        "users": [{"name": "service-account", "user": {"token": token}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account"}}],
        "current-context": "in-cluster",
    }
    return yaml.safe_dump(document)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m kubeplane.dns", description=__doc__.split("\n")[0])
    parser.add_argument("-conf", "--conf", required=True, metavar="PATH", help="the Corefile")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (default: the service account)")
    parser.add_argument(
        "--address", default=forward.ALL_ADDRESSES, help="address of the DNS port (default: all)"
    )
    return parser.parse_args(argv)


async def serve(config: corefile.Config, kubeconfig: str, address: str) -> None:
    """Bind, list, watch and answer until cancelled or a reflector fails for good."""
    for line in config.ignored:
        log.info("Corefile %s: not acted on", line)
    targets = forward.upstreams(config, forward.local_addresses(address))
    forwarder = forward.Forwarder(targets, cache_ttl=config.cache_ttl)
    async with KubeClient(kubeconfig) as client:
        # The wire cache drops its entries by itself when it sees a new table.
        mirror = watch.Mirror()
        server = Server(config, mirror, forwarder, address=address)
        await server.start()
        try:
            await watch.run(client, mirror)
        finally:
            await server.close()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = _arguments(argv)
    try:
        config = corefile.parse(Path(args.conf).read_text())
        kubeconfig = Path(args.kubeconfig).read_text() if args.kubeconfig else in_cluster_kubeconfig()
    except (OSError, DNSError) as exc:
        log.error("%s", exc)
        return 2

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        await serve(config, kubeconfig, args.address)

    try:
        asyncio.run(run())
    except asyncio.CancelledError:
        return 0
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        return 1
    except Exception as exc:  # a reflector's non-retryable error, reported once
        log.error("stopped: %s", exc)
        return 1
    return 0
