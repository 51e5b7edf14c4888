"""``kubeplane health``: the checks of :mod:`kubeplane.ops.health`, each printed as it finishes.

Which nodes are control plane nodes: ``--control-plane-nodes`` / ``--worker-nodes`` if given;
else, when the context is named after a local cluster, that cluster's roles; else the context's
endpoints are the control plane nodes and its other nodes the workers (the layout
``cluster create`` writes). The Kubernetes API is reached with the admin kubeconfig the node API
hands out, through its server (the control plane endpoint) or ``--k8s-endpoint``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import click
import yaml

from kubeplane import api
from kubeplane.cli import connect, output
from kubeplane.clients import kube
from kubeplane.ops import health as health_ops
from kubeplane.provision import cluster as cluster_mod
from kubeplane.provision import state


def register(group: click.Group) -> None:
    group.add_command(health)


def _split(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def topology(
    target: connect.Target, *, controlplanes: tuple[str, ...], workers: tuple[str, ...]
) -> health_ops.Topology:
    """The expected nodes (see the module docstring)."""
    if controlplanes:
        return health_ops.Topology(controlplanes=controlplanes, workers=workers)
    if cluster_mod.exists(target.context):
        cluster = state.ClusterState.load(target.context)
        return health_ops.Topology(
            controlplanes=tuple(n.ip for n in cluster.nodes if n.role == "controlplane"),
            workers=workers or tuple(n.ip for n in cluster.nodes if n.role == "worker"),
        )
    return health_ops.Topology(
        controlplanes=target.endpoints,
        workers=workers or tuple(n for n in target.nodes if n not in target.endpoints),
    )


def fetch_kubeconfig(target: connect.Target, *, server: str | None) -> str:
    """The admin kubeconfig from the first reachable endpoint, with ``server`` replaced if given."""

    async def call() -> str:
        async with api.NodeClient(target.endpoints, credentials=target.credentials) as client:
            return str((await client.kubeconfig())[0].unwrap()["kubeconfig"])

    try:
        text = asyncio.run(call())
    except api.APIError as exc:
        raise click.ClickException(
            output.error_text(exc, where=f"fetching the kubeconfig from {', '.join(target.endpoints)}")
        ) from exc
    if server is None:
        return text
    document = yaml.safe_load(text)
    for entry in document.get("clusters", []):
        entry["cluster"]["server"] = server
    return str(yaml.safe_dump(document, sort_keys=False))


@click.command()
@click.option("--wait-timeout", default="5m", show_default=True, help="How long the checks may take in all.")
@click.option("--control-plane-nodes", "cp_nodes", multiple=True, metavar="ADDR[,ADDR]")
@click.option("--worker-nodes", "worker_nodes", multiple=True, metavar="ADDR[,ADDR]")
@click.option("--k8s-endpoint", metavar="URL", help="Kubernetes API URL (default: the kubeconfig's server).")
def health(
    *, wait_timeout: str, cp_nodes: tuple[str, ...], worker_nodes: tuple[str, ...], k8s_endpoint: str | None
) -> None:
    """Check the cluster: etcd, nodes Ready, control plane static pods, the API endpoint."""
    timeout = output.parse_duration(wait_timeout)
    target = connect.resolve(connect.options())
    expected = topology(target, controlplanes=_split(cp_nodes), workers=_split(worker_nodes))
    kubeconfig = fetch_kubeconfig(target, server=k8s_endpoint)

    def node_client(nodes: Sequence[str]) -> api.NodeClient:
        return api.NodeClient(target.endpoints, credentials=target.credentials, nodes=tuple(nodes))

    checks = health_ops.default_checks(
        expected,
        node_client=node_client,
        kube=lambda: kube.KubeClient(kubeconfig, timeout=health_ops.REQUEST_TIMEOUT),
    )
    results = health_ops.run(checks, timeout=timeout, report=lambda result: click.echo(result.text()))
    failed = [result for result in results if not result.ok]
    if failed:
        nodes = sorted(health_ops.failing_nodes(failed))
        raise click.ClickException(
            f"{len(failed)} of {len(results)} checks failed"
            + (f"; failing nodes: {', '.join(nodes)}" if nodes else "")
        )
