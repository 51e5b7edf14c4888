"""``kubeplane health``: the checks of :mod:`kubeplane.ops.health`, each printed as it finishes.

Which nodes are control plane nodes: ``--control-plane-nodes`` / ``--worker-nodes`` if given;
else, when the context is named after a local cluster, that cluster's roles; else the context's
endpoints (their hosts: ``HOST:PORT`` is a moved node API) are the control plane nodes and its
other nodes the workers (the layout ``cluster create`` writes). The Kubernetes API is reached
with the admin kubeconfig the node API hands out, through its server (the control plane
endpoint) or ``--k8s-endpoint``.

``--explain`` runs each check once (or within ``--wait-timeout`` when that is given), then gathers
evidence from every node and the Kubernetes API (:mod:`kubeplane.ops.evidence`) and prints the
diagnoses of :mod:`kubeplane.ops.diagnose`: cause, evidence, what to run. ``-o json`` prints the
same as one JSON document ``{"healthy", "checks", "diagnoses"}``. Either way the command fails
(exit 1) unless the cluster is healthy.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import click
import yaml

from kubeplane import api
from kubeplane.cli import connect, output
from kubeplane.clients import kube
from kubeplane.config.scalars import parse_host_port
from kubeplane.ops import diagnose as diagnose_ops
from kubeplane.ops import evidence as evidence_ops
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
    endpoints = tuple(_address(endpoint) for endpoint in target.endpoints)
    return health_ops.Topology(
        controlplanes=endpoints,
        workers=workers or tuple(n for n in target.nodes if n not in endpoints),
    )


def _address(endpoint: str) -> str:
    """The node address of a node API endpoint (``HOST:PORT`` when its node API moved): nodes are
    known by their addresses (Node objects, pods' hostIP); anything else as it is."""
    try:
        return parse_host_port(endpoint)[0]
    except ValueError:
        return endpoint


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
@click.option(
    "--explain",
    is_flag=True,
    help="Check once, then diagnose every failure: cause, evidence, the command to run next.",
)
@click.option(
    "-o",
    "--output",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="With --explain: json prints one document for scripts.",
)
@click.pass_context
def health(
    ctx: click.Context,
    *,
    wait_timeout: str,
    cp_nodes: tuple[str, ...],
    worker_nodes: tuple[str, ...],
    k8s_endpoint: str | None,
    explain: bool,
    output_format: str,
) -> None:
    """Check the cluster: etcd, nodes Ready, control plane static pods, the API endpoint."""
    if output_format == "json" and not explain:
        raise click.UsageError("-o json needs --explain")
    timeout = output.parse_duration(wait_timeout)
    target = connect.resolve(connect.options())
    expected = topology(target, controlplanes=_split(cp_nodes), workers=_split(worker_nodes))
    kubeconfig = fetch_kubeconfig(target, server=k8s_endpoint)

    def node_client(nodes: Sequence[str]) -> api.NodeClient:
        return api.NodeClient(target.endpoints, credentials=target.credentials, nodes=tuple(nodes))

    def kube_factory() -> kube.KubeClient:
        return kube.KubeClient(kubeconfig, timeout=health_ops.REQUEST_TIMEOUT)

    checks = health_ops.default_checks(expected, node_client=node_client, kube=kube_factory)
    if explain:
        # Diagnose what is visible now; wait first only when asked to with --wait-timeout.
        waited = ctx.get_parameter_source("wait_timeout") is not click.core.ParameterSource.DEFAULT
        text = output_format == "text"
        results = health_ops.run(
            checks,
            timeout=timeout if waited else 0.0,
            report=lambda result: click.echo(result.text()) if text else None,
        )
        evidence = evidence_ops.gather(
            expected,
            node_client=node_client,
            kube=kube_factory,
            cluster_ca=kube.kubeconfig_ca(kubeconfig),
            checks=results,
        )
        _explain(results, diagnose_ops.diagnose(evidence), json_output=not text)
        return
    results = health_ops.run(checks, timeout=timeout, report=lambda result: click.echo(result.text()))
    failed = [result for result in results if not result.ok]
    if failed:
        nodes = sorted(health_ops.failing_nodes(failed))
        raise click.ClickException(
            f"{len(failed)} of {len(results)} checks failed"
            + (f"; failing nodes: {', '.join(nodes)}" if nodes else "")
        )


def _explain(
    results: Sequence[health_ops.Result], diagnoses: Sequence[diagnose_ops.Diagnosis], *, json_output: bool
) -> None:
    """Print the verdict; exit 1 unless every check passed and nothing was diagnosed."""
    healthy = not diagnoses and all(result.ok for result in results)
    if json_output:
        document = {
            "healthy": healthy,
            "checks": [
                {"name": r.name, "ok": r.ok, "problems": list(r.problems), "elapsed": round(r.elapsed, 3)}
                for r in results
            ],
            "diagnoses": [d.as_dict() for d in diagnoses],
        }
        click.echo(json.dumps(document, indent=2))
    elif healthy:
        click.echo(f"healthy: {len(results)} checks passed, nothing to diagnose")
        for result in results:
            click.echo(f"  checked: {result.name}")
    else:
        click.echo(f"\n{len(diagnoses)} diagnos{'is' if len(diagnoses) == 1 else 'es'}:")
        for diagnosis in diagnoses:
            click.echo(diagnosis.text())
    if not healthy:
        failed = sum(not result.ok for result in results)
        if json_output:
            raise SystemExit(1)
        raise click.ClickException(f"{failed} of {len(results)} checks failed; {len(diagnoses)} diagnosed")
