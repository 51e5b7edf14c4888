"""``kubeplane upgrade-k8s``: the CLI of :mod:`kubeplane.ops.upgrade` and its adapters.

The operation declares what it needs (``NodeAPI``, ``KubeAPI``, ``Rotation``); this module
implements them:

- node API: one :class:`~kubeplane.api.NodeClient` per node, each forwarding through the client
  config's endpoints. The control plane nodes are always discovered (Kubernetes Nodes with the
  control plane label); ``-n`` of the global options only names the node to talk through, as in
  the upgrade guide's ``--nodes <master node>``: it gives the admin kubeconfig. Pre-pulling uses
  the node API's ``ImagePull`` call (the agent pulls through the node's registry mirrors); the
  check for the call stays so that a node API without it only drops the pre-pull steps (the
  plan says so and the kubelet pulls when the new pods start);
- Kubernetes API: :class:`~kubeplane.clients.kube.KubeClient` from the cluster's admin kubeconfig
  (``--kubeconfig``, or asked from a node with the ``Kubeconfig`` call), ``--endpoint`` replacing
  its server URL;
- rotation: when the control plane nodes belong to a local cluster (its state file lists them
  and it has a haproxy directory) the node's haproxy server goes to ``drain`` and back to
  ``ready``; otherwise nothing (readiness checks of the real load balancer are all there is).

Re-running the same command continues a failed or killed upgrade (see :mod:`kubeplane.plan`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import click
import yaml

from kubeplane import api
from kubeplane import plan as plan_module
from kubeplane.api import wire
from kubeplane.cli import connect, lease, output, progress
from kubeplane.clients import kube as kube_client
from kubeplane.config import defaults
from kubeplane.ops import oplock, upgrade
from kubeplane.ops.errors import NodeUnavailable, OpsError
from kubeplane.ops.upgrader import Upgrader
from kubeplane.provision import loadbalancer
from kubeplane.provision import state as cluster_state
from kubeplane.resources import catalog

#: How long a restored haproxy server may take to pass its health check and rejoin.
ROTATION_TIMEOUT = 30.0
IMAGE_PULL_CALL = "ImagePull"
#: Node API status codes that mean "not now": the call may succeed when made again.
TRANSIENT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
#: Waits of the operation (the original's 3 minutes per pod); tests shorten them.
TIMING = upgrade.Timing()


def register(group: click.Group) -> None:
    """Add ``upgrade-k8s`` to the root group."""
    group.add_command(upgrade_k8s)


# --- node API ------------------------------------------------------------------------------------


class NodeAPIAdapter:
    """:class:`kubeplane.ops.upgrade.NodeAPI` over the node API, one forwarding client per node.

    :meth:`ask` is the one way to call a node: its single reply's value, and a node that cannot
    serve now (no endpoint answered, ``UNAVAILABLE``, no answer in time) raised as the typed
    :class:`~kubeplane.ops.errors.NodeUnavailable`.
    """

    def __init__(self, target: connect.Target) -> None:
        self._target = target
        self._clients: dict[str, api.NodeClient] = {}
        self.can_pull = IMAGE_PULL_CALL in wire.CALLS_BY_NAME

    def client(self, node: str) -> api.NodeClient:
        """The forwarding client of ``node`` (made once, closed by :meth:`close`)."""
        if node not in self._clients:
            self._clients[node] = connect.client(self._target, nodes=(node,))
        return self._clients[node]

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for node_client in clients.values():
            await node_client.close()

    async def ask(
        self, node: str, call: Callable[[api.NodeClient], Awaitable[Sequence[api.Reply[Any]]]]
    ) -> Any:
        """Make ``call`` with ``node``'s client; the value of its reply."""
        return await self._ask(node, self.client(node), call)

    @staticmethod
    async def _ask(
        node: str,
        node_client: api.NodeClient,
        call: Callable[[api.NodeClient], Awaitable[Sequence[api.Reply[Any]]]],
    ) -> Any:
        try:
            for reply in await call(node_client):
                return reply.unwrap()
        except api.ConnectError as exc:
            raise NodeUnavailable(str(exc)) from exc
        except api.CallError as exc:
            if exc.code in TRANSIENT_CODES:
                raise NodeUnavailable(str(exc)) from exc
            raise
        raise OpsError(f"node {node} sent no reply")

    async def check(self, node: str) -> None:
        await self.ask(node, lambda c: c.version())

    async def component_config(self, node: str, component: str) -> upgrade.ComponentConfig:
        document = await self.ask(
            node, lambda c: c.resource_get(catalog.KUBERNETES_CONTROL_PLANE_CONFIGS, component)
        )
        return upgrade.ComponentConfig(
            version=int(document["metadata"]["version"]), image=str(document["spec"]["image"])
        )

    async def machine_config(self, node: str) -> str:
        document = await self.ask(node, lambda c: c.machine_config())
        current = document.get("current")
        if not current:
            raise OpsError(f"node {node} has no machine config")
        return str(current)

    async def apply_config(self, node: str, data: str, *, mode: str) -> None:
        await self.ask(node, lambda c: c.apply_configuration(data, mode=mode))

    async def service_healthy(self, node: str, service: str) -> bool:
        documents = await self.ask(node, lambda c: c.service_list())
        return any(
            d.get("id") == service and d.get("running") and (d.get("health") or {}).get("healthy")
            for d in documents
        )

    async def pull_image(self, node: str, image: str) -> bool:
        result = await self.ask(node, lambda c: c.call(IMAGE_PULL_CALL, {"image": image}, timeout=600))
        return bool(result.get("pulled", True)) if isinstance(result, Mapping) else True

    async def manifests(self, node: str) -> list[dict[str, Any]]:
        documents = await self.ask(node, lambda c: c.resource_list(catalog.MANIFESTS))
        objects: list[dict[str, Any]] = []
        for document in sorted(documents, key=lambda d: str(d["metadata"]["id"])):
            # A Manifests spec is {"items": [objects]} (the original's was the list itself).
            spec = document.get("spec") or {}
            objects += spec if isinstance(spec, list) else spec.get("items") or []
        return objects

    async def kubeconfig(self, node: str | None) -> str:
        """The cluster's admin kubeconfig, from ``node`` (or the endpoint's own node)."""
        if node:
            document = await self.ask(node, lambda c: c.kubeconfig())
        else:
            async with connect.client(self._target, nodes=()) as endpoint_client:
                document = await self._ask("", endpoint_client, lambda c: c.kubeconfig())
        return str(document["kubeconfig"])


# --- Kubernetes API ----------------------------------------------------------------------------


class KubeAPIAdapter:
    """:class:`kubeplane.ops.upgrade.KubeAPI` over :class:`~kubeplane.clients.kube.KubeClient`."""

    def __init__(self, api: kube_client.KubeClient) -> None:
        self.api = api

    def lease_store(self) -> oplock.LeaseStore:
        """The cluster operation Lease (one upgrade-k8s / convert-k8s at a time)."""
        return lease.KubeLeaseStore(self.api)

    async def close(self) -> None:
        await self.api.aclose()

    async def nodes(self) -> list[upgrade.ClusterNode]:
        nodes = []
        for item in await self.api.list(kube_client.NODES_PATH):
            labels = item["metadata"].get("labels") or {}
            addresses = [
                a["address"]
                for a in item.get("status", {}).get("addresses") or ()
                if a["type"] == "InternalIP"
            ]
            if not addresses:
                continue
            nodes.append(
                upgrade.ClusterNode(
                    name=item["metadata"]["name"],
                    address=addresses[0],
                    control_plane=any(label in labels for label in upgrade.CONTROL_PLANE_LABELS),
                )
            )
        return sorted(nodes, key=lambda node: (not node.control_plane, node.name))

    async def mirror_pod(self, *, node_name: str, component: str) -> upgrade.PodState | None:
        items = await self.api.list(
            "/api/v1/namespaces/kube-system/pods",
            label_selector=f"k8s-app={component}",
            field_selector=f"spec.nodeName={node_name}",
        )
        if not items:
            return None
        pod = items[0]
        annotations = pod["metadata"].get("annotations") or {}
        return upgrade.PodState(
            name=pod["metadata"]["name"],
            config_version=annotations.get("kubeplane.dev/config-version"),
            secrets_version=annotations.get("kubeplane.dev/secrets-version"),
            ready=kube_client.is_ready(pod),
            images=tuple(container["image"] for container in pod["spec"]["containers"]),
        )

    async def daemonset(self, namespace: str, name: str) -> upgrade.RolloutState | None:
        item = await self.api.get_or_none(f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}")
        if item is None:
            return None
        containers = item["spec"]["template"]["spec"]["containers"]
        container = next((c for c in containers if c["name"] == name), containers[0])
        status = item.get("status") or {}
        return upgrade.RolloutState(
            image=container["image"],
            desired=status.get("desiredNumberScheduled") or 0,
            updated=status.get("updatedNumberScheduled") or 0,
            available=status.get("numberAvailable") or 0,
            generation=item["metadata"].get("generation") or 0,
            observed_generation=status.get("observedGeneration") or 0,
        )

    async def set_daemonset_image(self, namespace: str, name: str, *, container: str, image: str) -> None:
        # Strategic merge: the containers list is merged by name, the others are kept.
        body = {"spec": {"template": {"spec": {"containers": [{"name": container, "image": image}]}}}}
        path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
        await self.api.patch(path, body, patch_type="strategic")

    async def kubelet(self, node_name: str) -> upgrade.KubeletState | None:
        item = await self.api.get_or_none(kube_client.node_path(node_name))
        if item is None:
            return None
        return upgrade.KubeletState(
            version=item["status"]["nodeInfo"]["kubeletVersion"], ready=kube_client.is_ready(item)
        )

    async def apply_objects(self, objects: Sequence[Mapping[str, Any]]) -> None:
        for item in objects:
            path = await self.api.object_path(item)
            await self.api.apply(path, item, field_manager="kubeplane-upgrade", force=True)


# --- load balancer rotation --------------------------------------------------------------------


class HAProxyRotation:
    """:class:`kubeplane.ops.upgrade.Rotation` over a local cluster's haproxy admin socket.

    ``drain`` stops new connections only. Connections already open to the node are left to the
    API server's graceful shutdown, which finishes requests in flight and closes idle
    connections, so clients reconnect to another node; haproxy's ``shutdown sessions`` was
    rejected because it cuts a request in the middle.
    """

    def __init__(self, proxy: loadbalancer.HAProxy, names: Mapping[str, str]) -> None:
        self._proxy = proxy
        #: Node address -> haproxy server name.
        self._names = dict(names)

    async def drain(self, node: upgrade.ClusterNode) -> None:
        name = self._names[node.address]
        await asyncio.to_thread(self._proxy.set_server_state, name, "drain")
        await asyncio.to_thread(
            functools.partial(self._proxy.wait_status, name, until="out", timeout=ROTATION_TIMEOUT)
        )

    async def serving(self) -> set[str]:
        states = await asyncio.to_thread(self._proxy.server_states)
        return {
            address
            for address, name in self._names.items()
            if name in states and states[name].in_rotation and states[name].healthy
        }

    async def restore(self, node: upgrade.ClusterNode) -> None:
        name = self._names[node.address]
        await asyncio.to_thread(self._proxy.set_server_state, name, "ready")
        await asyncio.to_thread(
            functools.partial(self._proxy.wait_status, name, until="healthy", timeout=ROTATION_TIMEOUT)
        )


def local_rotation(addresses: Sequence[str]) -> HAProxyRotation | None:
    """The rotation of the local cluster whose control plane nodes are ``addresses``, if any."""
    root = cluster_state.clusters_dir()
    if not root.is_dir():
        return None
    for directory in sorted(root.iterdir()):
        try:
            state = cluster_state.ClusterState.load(directory.name, root=root)
        except cluster_state.StateError:
            continue
        names = {node.ip: node.name for node in state.nodes if node.role == "controlplane"}
        if "haproxy" in state.dirs and set(addresses) <= set(names):
            return HAProxyRotation(loadbalancer.HAProxy(Path(state.dirs["haproxy"])), names)
    return None


# --- the command -------------------------------------------------------------------------------


def resume_command(*, options: upgrade.Options, endpoint: str | None, kubeconfig: str | None) -> str:
    """The command that continues this upgrade (the same one, whatever order the flags came in)."""
    words = ["upgrade-k8s", *(["--from", options.source] if options.source else []), "--to", options.to]
    words += ["--endpoint", endpoint] if endpoint else []
    words += ["--kubeconfig", kubeconfig] if kubeconfig else []
    words += [] if options.pre_pull else ["--no-pre-pull"]
    words += ["--upgrade-kubelet"] if options.upgrade_kubelet else []
    words += ["--sync-manifests"] if options.sync_manifests else []
    words += ["--allow-downgrade"] if options.allow_downgrade else []
    return connect.command_line(*words)


def with_server(kubeconfig_text: str, endpoint: str | None) -> str:
    """The kubeconfig with every cluster's server replaced by ``endpoint`` (``--endpoint``)."""
    return kube_client.with_server(kubeconfig_text, endpoint) if endpoint else kubeconfig_text


AdapterT = TypeVar("AdapterT", bound=KubeAPIAdapter)


@overload
def kube_api(kubeconfig_text: str, endpoint: str | None) -> KubeAPIAdapter: ...


@overload
def kube_api(kubeconfig_text: str, endpoint: str | None, *, adapter: type[AdapterT]) -> AdapterT: ...


def kube_api(
    kubeconfig_text: str, endpoint: str | None, *, adapter: type[KubeAPIAdapter] = KubeAPIAdapter
) -> KubeAPIAdapter:
    """The Kubernetes API ``adapter`` for an admin kubeconfig, its server replaced by ``endpoint``."""
    try:
        return adapter(kube_client.KubeClient(with_server(kubeconfig_text, endpoint)))
    except (ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise OpsError(f"cannot use the admin kubeconfig: {exc}") from exc


def rotation_of(control_plane: Sequence[upgrade.ClusterNode]) -> upgrade.Rotation:
    """The load balancer rotation a rolling operation steers: the local cluster's haproxy in front
    of ``control_plane``, or none (readiness checks alone protect the endpoint)."""
    return local_rotation([node.address for node in control_plane]) or upgrade.NoRotation()


def show_plan(
    plan: plan_module.Plan,
    control_plane: Sequence[upgrade.ClusterNode],
    *,
    fmt: output.Format,
    dry_run: bool,
) -> bool:
    """Print a rolling operation's control plane nodes and, with ``dry_run``, its plan (a table,
    or documents with ``-o json|yaml``); True when it was a dry run, which changes nothing more."""
    click.echo(
        f"control plane nodes: {', '.join(f'{n.name} ({n.address})' for n in control_plane)}",
        err=fmt != "table",
    )
    if not dry_run:
        return False
    if fmt == "table":
        click.echo(plan.render())
        click.echo("dry run: nothing was changed")
    else:
        click.echo(output.documents(plan_documents(plan), fmt), nl=False)
    return True


def plan_documents(plan: plan_module.Plan) -> list[dict[str, Any]]:
    """A plan's steps as documents (``--dry-run -o json|yaml``)."""
    return [
        {
            "index": index,
            "kind": s.kind,
            "component": s.component,
            "node": s.node,
            "from": s.current,
            "to": s.target,
        }
        for index, s in enumerate(plan.steps, start=1)
    ]


async def _upgrade(
    *,
    options: upgrade.Options,
    target: connect.Target,
    kubeconfig: str | None,
    endpoint: str | None,
    dry_run: bool,
    fmt: output.Format,
    resume: str,
) -> None:
    node_api = NodeAPIAdapter(target)
    kube: KubeAPIAdapter | None = None
    try:
        kubeconfig_text = kubeconfig or await node_api.kubeconfig(options.via[0] if options.via else None)
        kube = kube_api(kubeconfig_text, endpoint)
        observed = await upgrade.prepare(options=options, node_api=node_api, kube=kube)
        plan = upgrade.build_plan(observed)
        if options.pre_pull and not node_api.can_pull:
            plan = plan.with_notes(
                "the node API has no ImagePull call: images are pulled when the new pods start"
            )
        if show_plan(plan, observed.control_plane, fmt=fmt, dry_run=dry_run):
            return
        rotation = rotation_of(observed.control_plane)
        click.echo(plan.render())
        with progress.display() as shown:
            upgrader = Upgrader(
                observed=observed,
                node_api=node_api,
                kube=kube,
                rotation=rotation,
                progress=shown,
                timing=TIMING,
            )
            async with oplock.held(kube.lease_store(), operation="upgrade-k8s"):
                results = await upgrader.run(plan, resume=resume)
        changed = len(plan_module.changed_steps(results))
        click.echo(
            f"upgrade to {observed.target} completed: "
            f"{changed} steps changed, {len(results) - changed} already done"
        )
    finally:
        await node_api.close()
        if kube is not None:
            await kube.close()


@click.command("upgrade-k8s")
@click.option(
    "--from", "source", metavar="VERSION", help="Current version (default: detected from kube-apiserver)."
)
@click.option(
    "--to",
    "to",
    metavar="VERSION",
    default=defaults.KUBERNETES_VERSION,
    show_default=True,
    help="Target version.",
)
@click.option(
    "--endpoint", metavar="URL", help="Kubernetes API endpoint to use instead of the kubeconfig's server."
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, exists=True),
    help="Admin kubeconfig (default: asked from a node).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@click.option(
    "--pre-pull/--no-pre-pull",
    default=True,
    show_default=True,
    help="Pull the target images on every node first.",
)
@click.option(
    "--upgrade-kubelet", is_flag=True, help="Also upgrade every node's kubelet, one node at a time."
)
@click.option(
    "--sync-manifests", is_flag=True, help="Re-apply the bootstrap manifests (server-side apply) at the end."
)
@click.option(
    "--allow-downgrade",
    is_flag=True,
    help="Allow a target older than the running version (refused by default).",
)
@output.output_option
def upgrade_k8s(
    *,
    source: str | None,
    to: str,
    endpoint: str | None,
    kubeconfig: str | None,
    dry_run: bool,
    pre_pull: bool,
    upgrade_kubelet: bool,
    sync_manifests: bool,
    allow_downgrade: bool,
    fmt: output.Format,
) -> None:
    """Upgrade the Kubernetes control plane, one component and node at a time.

    Order: kube-apiserver on each control plane node (every node labelled control plane; -n
    only names the node to talk through and fetch the admin kubeconfig from), then
    kube-controller-manager, kube-scheduler, the kube-proxy DaemonSet, optionally kubelets. Each
    step patches the node's machine config image (keeping its registry) and waits for the new pod
    to be Ready. Safe to re-run: steps already at the target are skipped.

    The target images are pulled on every node first, through its registry mirrors; a version
    whose images cannot be pulled fails there, before any change. A local cluster's registry holds
    every complete toolchain build cached when the cluster was created: build the target first
    (`kubeplane toolchain build --version V`), then `cluster create`.
    """
    obj = connect.options()
    target = connect.resolve(obj)
    options = upgrade.Options(
        to=to,
        source=source,
        via=obj.nodes,
        allow_downgrade=allow_downgrade,
        pre_pull=pre_pull,
        upgrade_kubelet=upgrade_kubelet,
        sync_manifests=sync_manifests,
    )
    kubeconfig_text = Path(kubeconfig).read_text(encoding="utf-8") if kubeconfig else None
    run_operation(
        _upgrade(
            options=options,
            target=target,
            kubeconfig=kubeconfig_text,
            endpoint=endpoint,
            dry_run=dry_run,
            fmt=fmt,
            resume=resume_command(options=options, endpoint=endpoint, kubeconfig=kubeconfig),
        ),
        target=target,
    )


def run_operation(operation: Coroutine[Any, Any, None], *, target: connect.Target) -> None:
    """Run a rolling operation (``upgrade-k8s``, ``certs renew``) to its end; its failures (a
    refused precondition, a failed step with the command that continues it, the load balancer)
    become the command's error message."""
    try:
        connect.run(operation, target=target)
    except (OpsError, plan_module.StepFailed) as exc:
        raise click.ClickException(str(exc)) from exc
    except loadbalancer.LoadBalancerError as exc:
        raise click.ClickException(f"load balancer: {exc}") from exc
