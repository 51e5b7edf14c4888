"""``kubeplane convert-k8s``: self-hosted control plane → static pods (:mod:`kubeplane.ops.convert`).

Implements :class:`kubeplane.ops.convert.Env` over the node API (reusing the upgrade command's
node adapter), :class:`~kubeplane.clients.kube.KubeClient` (admin kubeconfig asked from a node,
``--endpoint`` replaces its server) and etcd (a short-lived client certificate issued from the etcd CA in a
control plane node's machine config, for the ``initialized`` key). Prompts read from stdin, so
they work on a terminal and through a pipe or pseudo-terminal.
"""

from __future__ import annotations

import base64
import contextlib
from datetime import timedelta

import click

from kubeplane import config as machine_config
from kubeplane import pki
from kubeplane import plan as plan_module
from kubeplane.cli import connect, lease, progress
from kubeplane.cli.upgrade import KubeAPIAdapter, NodeAPIAdapter, rotation_of, with_server
from kubeplane.clients import errors as client_errors
from kubeplane.clients import etcd as etcd_client
from kubeplane.clients import kube as kube_client
from kubeplane.ops import convert, oplock
from kubeplane.ops.errors import OpsError
from kubeplane.ops.upgrade import ClusterNode
from kubeplane.resources import catalog

INITIALIZED_KEY = b"kubeplane:v1:initialized"
SYSTEM = "/api/v1/namespaces/kube-system"
DAEMONSETS = "/apis/apps/v1/namespaces/kube-system/daemonsets"


def register(group: click.Group) -> None:
    """Add ``convert-k8s`` to the root group."""
    group.add_command(convert_k8s)


class KubeplaneEnv:
    """:class:`kubeplane.ops.convert.Env` for a real (or local) cluster."""

    def __init__(self, target: connect.Target, *, endpoint: str | None) -> None:
        self.nodes = NodeAPIAdapter(target)
        self.endpoint = endpoint
        self._api: kube_client.KubeClient | None = None

    async def kube(self) -> kube_client.KubeClient:
        """The Kubernetes API, over the admin kubeconfig asked from a node (once)."""
        if self._api is None:
            text = await self.nodes.kubeconfig(None)
            self._api = kube_client.KubeClient(with_server(text, self.endpoint))
        return self._api

    async def close(self) -> None:
        await self.nodes.close()
        if self._api is not None:
            await self._api.aclose()

    async def master_nodes(self) -> list[tuple[str, str]]:
        nodes = await KubeAPIAdapter(await self.kube()).nodes()
        return sorted((node.address, node.name) for node in nodes if node.control_plane)

    async def self_hosted(self, node: str) -> bool:
        document = await self.nodes.ask(
            node, lambda c: c.resource_get(catalog.BOOTSTRAP_STATUSES, catalog.BOOTSTRAP_STATUS_ID)
        )
        return bool((document.get("spec") or {}).get("selfHostedControlPlane"))

    async def secret_value(self, namespace: str, name: str, key: str) -> bytes | None:
        secret = await (await self.kube()).get_or_none(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        value = ((secret or {}).get("data") or {}).get(key)
        return base64.b64decode(value) if value else None

    async def daemonset_image(self, name: str) -> str | None:
        ds = await (await self.kube()).get_or_none(f"{DAEMONSETS}/{name}")
        if ds is None or ds["metadata"].get("deletionTimestamp"):  # being deleted: gone for us
            return None
        return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])

    async def machine_config(self, node: str) -> str:
        return await self.nodes.machine_config(node)

    async def apply_config(self, node: str, data: str) -> None:
        await self.nodes.apply_config(node, data, mode="immediate")

    async def resource_ids(self, node: str, type_name: str) -> list[str]:
        documents = await self.nodes.ask(node, lambda c: c.resource_list(type_name))
        return [str(d["metadata"]["id"]) for d in documents]

    async def delete_daemonset(self, name: str, *, orphan: bool = False) -> bool:
        try:
            # Explicit either way: a DaemonSet already being deleted with Orphan keeps orphaning
            # (its finalizer says so) unless a later DELETE names another policy.
            await (await self.kube()).delete(
                f"{DAEMONSETS}/{name}", propagation_policy="Orphan" if orphan else "Background"
            )
        except client_errors.KubeNotFound:
            return False
        return True

    async def system_pods(self) -> list[convert.Pod]:
        pods = []
        for item in await (await self.kube()).list(f"{SYSTEM}/pods"):
            metadata = item["metadata"]
            pods.append(
                convert.Pod(
                    name=metadata["name"],
                    node_name=item.get("spec", {}).get("nodeName") or "",
                    phase=item.get("status", {}).get("phase") or "",
                    ready=kube_client.is_ready(item),
                    labels=dict(metadata.get("labels") or {}),
                    annotations=dict(metadata.get("annotations") or {}),
                    owner_kinds=tuple(ref["kind"] for ref in metadata.get("ownerReferences") or ()),
                )
            )
        return pods

    async def force_delete_pod(self, name: str) -> None:
        with contextlib.suppress(client_errors.KubeNotFound):
            await (await self.kube()).delete(f"{SYSTEM}/pods/{name}", grace_period_seconds=0)

    async def delete_pod(self, name: str, *, grace_period: int) -> None:
        with contextlib.suppress(client_errors.KubeNotFound):
            await (await self.kube()).delete(f"{SYSTEM}/pods/{name}", grace_period_seconds=grace_period)

    async def remove_initialized_key(self) -> None:
        masters = await self.master_nodes()
        if not masters:
            raise OpsError("no control plane nodes found to reach etcd through")
        document = machine_config.load(await self.nodes.machine_config(masters[0][0]))
        etcd_ca = document.model.cluster.etcd.ca if document.model.cluster.etcd else None
        if etcd_ca is None or not etcd_ca.key:
            raise OpsError(f"node {masters[0][0]}: the machine config has no cluster.etcd.ca key")
        pair = pki.issue(
            ca=pki.CertKey(cert=etcd_ca.crt_pem(), key=etcd_ca.key_pem()),
            common_name="kubeplane:convert-k8s",
            usages=("client",),
            lifetime=timedelta(hours=1),
        )
        tls = etcd_client.tls_context(ca=etcd_ca.crt_pem(), cert=pair.cert, key=pair.key)
        client = etcd_client.EtcdClient([f"https://{ip}:2379" for ip, _ in masters], tls=tls)
        try:
            await client.delete(INITIALIZED_KEY)
        finally:
            await client.aclose()

    async def containers(self, node: str) -> list[convert.Container]:
        found = await self.nodes.ask(node, lambda c: c.containers())
        return [
            convert.Container(pod=str(c["pod"]), name=str(c["name"]), running=c["state"] == "RUNNING")
            for c in found
            if c.get("namespace") == "kube-system"
        ]

    async def restart_kubelet(self, node: str) -> None:
        await self.nodes.ask(node, lambda c: c.service_restart("kubelet"))


def _confirm(prompt: str) -> bool:
    while True:
        answer = click.prompt(prompt.rstrip(": "), prompt_suffix=": ", default="", show_default=False)
        if answer.strip().lower() in ("yes", "y"):
            return True
        if answer.strip().lower() in ("no", "n"):
            return False


async def _convert(
    target: connect.Target,
    *,
    endpoint: str | None,
    force: bool,
    remove_key_only: bool,
    dry_run: bool,
    resume: str,
) -> convert.Timing:
    env = KubeplaneEnv(target, endpoint=endpoint)
    timing = convert.Timing()
    try:
        await env.kube()
        if dry_run:  # read calls only: not even the cluster operation Lease is taken
            converter = convert.Converter(
                env, options=convert.Options(force=force), echo=click.echo, confirm=_confirm
            )
            click.echo((await converter.plan()).render())
            click.echo("dry run: nothing was changed")
            return timing
        async with oplock.held(lease.KubeLeaseStore(await env.kube()), operation="convert-k8s"):
            if remove_key_only:
                click.echo("removing self-hosted initialized key")
                await env.remove_initialized_key()
                return timing
            with progress.display() as shown:

                def confirm(prompt: str) -> bool:
                    with shown.paused():
                        return _confirm(prompt)

                masters = await env.master_nodes()
                rotation = rotation_of(
                    [ClusterNode(name=name, address=address, control_plane=True) for address, name in masters]
                )
                converter = convert.Converter(
                    env,
                    options=convert.Options(force=force),
                    echo=click.echo,
                    confirm=confirm,
                    progress=shown,
                    timing=timing,
                    rotation=rotation,
                )
                await converter.run(resume=resume)
        return timing
    finally:
        await env.close()


@click.command("convert-k8s")
@click.option("--endpoint", metavar="URL", help="Kubernetes API endpoint to use instead of the kubeconfig's.")
@click.option("--force", is_flag=True, help="Answer yes to both confirmations.")
@click.option(
    "--remove-initialized-key",
    is_flag=True,
    help="Only remove the etcd key that keeps the control plane self-hosted, then stop: the agents "
    "start their static pods (step 6 of the manual procedure in docs/convert.md).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
def convert_k8s(*, endpoint: str | None, force: bool, remove_initialized_key: bool, dry_run: bool) -> None:
    """Convert a self-hosted control plane (DaemonSets + pod-checkpointer) to static pods.

    Safe to re-run after any failure or interruption. See docs/convert.md.
    """
    target = connect.resolve(connect.options())
    words = ["convert-k8s", *(["--endpoint", endpoint] if endpoint else []), *(["--force"] if force else [])]
    try:
        timing = connect.run(
            _convert(
                target,
                endpoint=endpoint,
                force=force,
                remove_key_only=remove_initialized_key,
                dry_run=dry_run,
                resume=connect.command_line(*words),
            ),
            target=target,
        )
    except convert.Aborted as exc:
        raise click.ClickException("aborted: the self-hosted control plane keeps running") from exc
    except plan_module.StepFailed as exc:
        raise click.ClickException(str(exc)) from exc
    except OpsError as exc:
        message = str(exc)
        if convert.RESUME not in message:
            message = f"{message}; {convert.RESUME}"
        raise click.ClickException(message) from exc
    if timing.waits:
        click.echo("time spent waiting: " + ", ".join(f"{k} {v:.0f}s" for k, v in timing.waits.items()))
