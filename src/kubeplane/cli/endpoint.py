"""``kubeplane endpoint set URL``: the CLI of :mod:`kubeplane.ops.endpoint` and its adapters.

Run like ``upgrade-k8s`` and ``certs renew`` (:mod:`kubeplane.cli.upgrade`, whose node API,
Kubernetes API and load balancer adapters it extends): the nodes are discovered from Kubernetes
Nodes, ``-n`` only names the node to talk through, the cluster operation Lease is held, and a
failed run prints the command that continues it (the same command).

What it reads beyond those adapters: a control plane node's issued certificates
(``KubernetesSecrets k8s-certs``: the admin kubeconfig's server and the issue time) beside the
files its pods use (``SecretStatuses static-pods``), the kubelet's kubeconfig
(``etc/kubernetes/kubelet.conf`` under the node root), and, from this host, the certificate
each kube-apiserver and the new endpoint present (:class:`TLSProbe`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import click

from kubeplane import pki
from kubeplane import plan as plan_module
from kubeplane.api import CallError
from kubeplane.cli import connect, output, progress
from kubeplane.cli import upgrade as cli_upgrade
from kubeplane.clients import kube as kube_client
from kubeplane.controllers.secrets.kubernetes import KUBERNETES_SECRETS_ID
from kubeplane.ops import endpoint, oplock
from kubeplane.ops.errors import OpsError
from kubeplane.resources import catalog

#: The kubelet's kubeconfig, relative to the node root (:class:`kubeplane.services.kubelet.KubeletPaths`).
KUBELET_KUBECONFIG = "etc/kubernetes/kubelet.conf"
#: Seconds a TLS handshake from this host may take.
TLS_TIMEOUT = 10.0


def register(group: click.Group) -> None:
    """Add ``endpoint`` to the root group."""
    group.add_command(endpoint_group)


kubeconfig_server = kube_client.kubeconfig_server
with_server = kube_client.with_server


class EndpointNodeAPI(cli_upgrade.NodeAPIAdapter):
    """:class:`kubeplane.ops.endpoint.NodeAPI` over the node API (one forwarding client per node)."""

    async def secrets_state(self, node: str) -> endpoint.SecretsState:
        issued = await self.ask(
            node,
            lambda c: c.resource_get(
                catalog.KUBERNETES_SECRETS, KUBERNETES_SECRETS_ID, namespace=catalog.SECRETS_NAMESPACE
            ),
        )
        spec = issued.get("spec") or {}
        try:
            status = await self.ask(
                node,
                lambda c: c.resource_get(
                    catalog.SECRET_STATUSES,
                    catalog.STATIC_POD_SECRETS_ID,
                    namespace=catalog.CONTROLPLANE_NAMESPACE,
                ),
            )
        except CallError as exc:
            if exc.code != "NOT_FOUND":
                raise
            status = {}
        disk = status.get("spec") or {}
        return endpoint.SecretsState(
            server=kubeconfig_server(str(spec.get("adminKubeconfig") or "")),
            issued=str(spec.get("issued") or ""),
            disk_issued=str(disk.get("issued") or ""),
            disk_version=int(disk.get("version") or 0),
        )

    async def kubelet_server(self, node: str) -> str:
        chunks: list[bytes] = []
        try:
            async for reply in self.client(node).read_file(KUBELET_KUBECONFIG):
                chunks.append(reply.unwrap())
        except CallError as exc:
            if exc.code == "NOT_FOUND":
                return ""
            raise
        return kubeconfig_server(b"".join(chunks).decode())


class EndpointKubeAPI(cli_upgrade.KubeAPIAdapter):
    """:class:`kubeplane.ops.endpoint.KubeAPI` over :class:`~kubeplane.clients.kube.KubeClient`."""

    async def configmap_server(self, namespace: str, name: str) -> str | None:
        item = await self.api.get_or_none(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        if item is None:
            return None
        return kubeconfig_server(str((item.get("data") or {}).get("kubeconfig") or ""))

    async def set_configmap_server(self, namespace: str, name: str, server: str) -> None:
        path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
        item = await self.api.get(path)
        text = with_server(str((item.get("data") or {}).get("kubeconfig") or ""), server)
        # The resourceVersion makes a concurrent change fail this call instead of being lost.
        body = {
            "metadata": {"resourceVersion": item["metadata"]["resourceVersion"]},
            "data": {"kubeconfig": text},
        }
        await self.api.patch(path, body, patch_type="merge")

    async def daemonset_annotation(self, namespace: str, name: str, key: str) -> str | None:
        item = await self.api.get_or_none(f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}")
        if item is None:
            return None
        annotations = item["spec"]["template"]["metadata"].get("annotations") or {}
        value = annotations.get(key)
        return str(value) if value is not None else None

    async def restart_daemonset(self, namespace: str, name: str, *, annotation: tuple[str, str]) -> None:
        key, value = annotation
        body = {"spec": {"template": {"metadata": {"annotations": {key: value}}}}}
        await self.api.patch(
            f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}", body, patch_type="merge"
        )


class TLSProbe:
    """:class:`kubeplane.ops.endpoint.Probe` from this host, with the cluster CA and admin kubeconfig."""

    def __init__(self, *, ca: bytes, admin_kubeconfig: str) -> None:
        self._ca = ca
        self._admin = admin_kubeconfig

    async def served(self, host: str, port: int) -> endpoint.Served:
        der = await asyncio.to_thread(_peer_certificate, host, port)
        pem = ssl.DER_cert_to_PEM_cert(der).encode()
        info = pki.cert_info(pem)
        return endpoint.Served(
            names=(*info.dns_names, *info.ip_addresses), by_cluster_ca=pki.is_issued_by(pem, self._ca)
        )

    async def api_answers(self, url: str) -> None:
        # The kubeconfig's CA and the URL's own host name are what the client verifies.
        async with kube_client.KubeClient(with_server(self._admin, url), timeout=TLS_TIMEOUT) as api:
            await api.get("/version")


def _peer_certificate(host: str, port: int) -> bytes:
    """The DER certificate ``host:port`` presents (not verified: the caller checks its issuer)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection((host, port), timeout=TLS_TIMEOUT) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    if der is None:
        raise OSError(f"{host}:{port} presented no certificate")
    return der


def _cluster_ca(kubeconfig_text: str) -> bytes:
    """The CA certificate (PEM) of the admin kubeconfig's first cluster."""
    ca = kube_client.kubeconfig_ca(kubeconfig_text)
    if ca is None:
        raise OpsError("the admin kubeconfig has no cluster CA (certificate-authority-data)")
    return ca


def _resume_command(*, url: str, kubeconfig: str | None) -> str:
    words = ["endpoint", "set", url]
    words += ["--kubeconfig", kubeconfig] if kubeconfig else []
    return connect.command_line(*words)


def _client_advice(observed: endpoint.Observed) -> list[str]:
    """What the user does about the kubeconfigs and client config they hold."""
    new = observed.endpoint
    node = observed.control_plane[0].address
    lines = [
        f"kubeconfigs made before name the old endpoint ({', '.join(observed.old_endpoints) or '-'}): "
        "they keep working while it reaches the API servers (its name stays in their certificates)",
        f"a kubeconfig for {new}: {connect.command_line('-n', node, 'kubeconfig', '--force')} "
        f"(or: kubectl config set-cluster NAME --server={new})",
        "the client config's node API endpoints are node addresses: unchanged",
    ]
    return lines


async def _set(
    *,
    options: endpoint.Options,
    target: connect.Target,
    kubeconfig: str | None,
    dry_run: bool,
    fmt: output.Format,
    resume: str,
) -> None:
    node_api = EndpointNodeAPI(target)
    kube: EndpointKubeAPI | None = None
    try:
        kubeconfig_text = kubeconfig or await node_api.kubeconfig(options.via[0] if options.via else None)
        kube = cli_upgrade.kube_api(kubeconfig_text, None, adapter=EndpointKubeAPI)
        probe = TLSProbe(ca=_cluster_ca(kubeconfig_text), admin_kubeconfig=kubeconfig_text)
        observed = await endpoint.prepare(options=options, node_api=node_api, kube=kube, probe=probe)
        plan = endpoint.build_plan(observed)
        if cli_upgrade.show_plan(plan, observed.control_plane, fmt=fmt, dry_run=dry_run):
            return
        rotation = cli_upgrade.rotation_of(observed.control_plane)
        click.echo(plan.render())
        # Printed before any change: a run killed outright prints no resume message of its own.
        click.echo(f"to continue this change if it is interrupted: {resume}")
        with progress.display() as shown:
            changer = endpoint.EndpointChanger(
                observed=observed,
                node_api=node_api,
                kube=kube,
                probe=probe,
                rotation=rotation,
                progress=shown,
                timing=cli_upgrade.TIMING,
            )
            async with oplock.held(kube.lease_store(), operation="endpoint-set"):
                results = await changer.run(plan, resume=resume)
        changed = len(plan_module.changed_steps(results))
        click.echo(
            f"endpoint change to {observed.endpoint} completed: {changed} step(s) changed, "
            f"{len(results) - changed} already done"
        )
        for line in _client_advice(observed):
            click.echo(line)
    finally:
        await node_api.close()
        if kube is not None:
            await kube.close()


@click.group("endpoint")
def endpoint_group() -> None:
    """The cluster's control plane endpoint (cluster.controlPlane.endpoint)."""


@endpoint_group.command("set")
@click.argument("url")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, exists=True),
    help="Admin kubeconfig (default: asked from a node).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@output.output_option
def set_command(*, url: str, kubeconfig: str | None, dry_run: bool, fmt: output.Format) -> None:
    """Move the running cluster to the control plane endpoint URL (https://HOST:PORT), rolling.

    URL must already reach this cluster's API servers (a load balancer, a DNS name or a VIP).
    In order: each control plane node's kube-apiserver certificate gains URL's host, keeping the
    old endpoint's (cluster.apiServer.certSANs), one node at a time; URL is checked to answer
    as this cluster's API; each node (control plane first, then workers) switches its
    cluster.controlPlane.endpoint: kubeconfigs re-issued, kubelet and control plane pods
    restarted, one node at a time; kube-proxy's kubeconfig and kube-public/cluster-info follow.
    Safe to re-run: steps already done are skipped; the old URL moves the cluster back.
    """
    obj = connect.options()
    target = connect.resolve(obj)
    try:
        new = endpoint.parse_endpoint(url)
    except OpsError as exc:
        raise click.BadParameter(str(exc), param_hint="URL") from exc
    options = endpoint.Options(endpoint=new, via=obj.nodes)
    kubeconfig_text = Path(kubeconfig).read_text(encoding="utf-8") if kubeconfig else None
    cli_upgrade.run_operation(
        _set(
            options=options,
            target=target,
            kubeconfig=kubeconfig_text,
            dry_run=dry_run,
            fmt=fmt,
            resume=_resume_command(url=new, kubeconfig=kubeconfig),
        ),
        target=target,
    )
