"""``endpoint set``: move a running cluster to another control plane endpoint, rolling, re-runnable.

``cluster.controlPlane.endpoint`` names the URL every client of the API reaches: the admin
kubeconfig, every kubelet, kube-proxy, and the name in the kube-apiserver serving certificate.
Changing it on the nodes with ``apply-config --immediate`` alone (what one had before this
operation) leaves gaps: each control plane node re-issues its certificates and restarts its
control plane pods at once (all nodes together when applied together), the new endpoint's name
is in the certificate only from that moment (clients of the new endpoint meet a certificate
without it until then), the kubelets keep the server of their first kubeconfig, and kube-proxy's
kubeconfig (a ConfigMap applied once at bootstrap) and ``kube-public/cluster-info`` keep the old
URL. This operation does it in an order where every client always finds a certificate with its
name, the API answers throughout (with more than one API server) and every reference follows:

1. :func:`prepare` — checks before any change: the URL is ``https://HOST:PORT``; every Node
   answers on the node API; the nodes' configs agree on one endpoint (or are already at the new
   one); the new endpoint answers TLS with a certificate of the cluster's CA, so it reaches this
   cluster's API servers (a load balancer, DNS name or VIP pointing elsewhere is refused here).
2. ``cert-sans`` on each control plane node in turn, out of the load balancer's rotation when
   another API server serves: ``cluster.apiServer.certSANs`` gains the new endpoint's host and the
   old one's (so the old name stays in the certificate after the switch), applied ``--immediate``;
   done when the node's kube-apiserver serves a certificate with both and its pods run the new
   secrets and are Ready.
3. ``check``: the new endpoint answers as this cluster's API, verified with the cluster CA
   against its own name (an authenticated ``/version``) — before anything is switched to it.
4. ``endpoint`` on each control plane node, then on each worker, in turn: the machine config's
   endpoint is switched (``--immediate``). A control plane node re-issues its certificates and
   kubeconfigs (the admin kubeconfig names the new endpoint; the kube-controller-manager and
   kube-scheduler ones reach the local API server) and restarts its pods; every node's kubelet
   restarts with its kubeconfig's server rewritten. Done when the node's issued admin kubeconfig
   (control plane) and the kubelet's kubeconfig name the new endpoint, the files are on disk, the
   pods run them and are Ready, and the kubelet is healthy.
5. ``kubeconfig`` of kube-proxy: the server in ConfigMap ``kube-system/kubeconfig-in-cluster``,
   then a rollout of DaemonSet ``kube-system/kube-proxy`` (its pod template's annotation
   :data:`ENDPOINT_ANNOTATION` records the endpoint it was restarted for).
6. ``kubeconfig`` of ``kube-public/cluster-info`` when that ConfigMap exists (kubeplane does not
   create it; clusters that came from kubeadm have it).

Every step reads the live state first and skips what is done, so re-running the same command
after a failure or a kill finishes the change; running it with the old URL moves the cluster back.
The old endpoint's name stays in the certificates (clients holding a kubeconfig for it keep
working); removing it from ``cluster.apiServer.certSANs`` later, once no client uses it, is a
config patch. The user's own kubeconfig is not touched: the CLI says how to get a new one.

The cluster is reached only through :class:`NodeAPI`, :class:`KubeAPI`, :class:`Probe` and
:class:`~kubeplane.ops.upgrade.Rotation`, which the CLI implements (and unit tests fake).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from kubeplane import config as machine_config
from kubeplane import plan as plan_module
from kubeplane.ops import upgrade
from kubeplane.ops.errors import OpsError, PreflightError
from kubeplane.ops.upgrade import (
    ClusterNode,
    KubeletState,
    PodState,
    RolloutState,
    Rotation,
    Timing,
)
from kubeplane.ops.upgrader import RollingExecutor, Sleep, out_of_rotation
from kubeplane.ops.versions import image_patch

KIND_SANS = "cert-sans"
KIND_CHECK = "check"
KIND_ENDPOINT = "endpoint"
KIND_KUBECONFIG = "kubeconfig"

APISERVER = upgrade.APISERVER
KUBELET = upgrade.KUBELET
PROXY = upgrade.PROXY
PROXY_NAMESPACE = upgrade.PROXY_NAMESPACE
#: kube-proxy's kubeconfig (rendered by :mod:`kubeplane.controllers.k8s.manifests`).
PROXY_CONFIGMAP = "kubeconfig-in-cluster"
CLUSTER_INFO_NAMESPACE = "kube-public"
CLUSTER_INFO = "cluster-info"
#: On kube-proxy's pod template: the endpoint its pods were restarted for.
ENDPOINT_ANNOTATION = "kubeplane.dev/endpoint"

SANS_PATH = ("cluster", "apiServer", "certSANs")
ENDPOINT_PATH = ("cluster", "controlPlane", "endpoint")

DEFAULT_TIMING = Timing()


# --- the endpoint URL ----------------------------------------------------------------------------


def parse_endpoint(text: str) -> str:
    """``text`` as the endpoint the config stores (``https://HOST:PORT``); refused otherwise."""
    try:
        url = urllib.parse.urlsplit(text.strip())
        port = url.port
    except ValueError as exc:
        raise PreflightError(f"{text!r} is not a URL: {exc}") from exc
    if url.scheme != "https" or not url.hostname or port is None:
        raise PreflightError(f"{text!r} is not an endpoint of the form https://HOST:PORT (an explicit port)")
    if url.path not in ("", "/") or url.query or url.fragment or url.username or url.password:
        raise PreflightError(
            f"{text!r}: an endpoint has no path, query or credentials, only https://HOST:PORT"
        )
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"https://{host}:{port}"


def host_of(endpoint: str) -> str:
    """The host an endpoint URL names (without IPv6 brackets)."""
    return urllib.parse.urlsplit(endpoint).hostname or ""


def port_of(endpoint: str) -> int:
    """The port an endpoint URL names (443 when it has none)."""
    return urllib.parse.urlsplit(endpoint).port or 443


def _same_name(a: str, b: str) -> bool:
    """Whether two SAN entries name the same host (IP addresses compared as addresses)."""
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a.lower() == b.lower()


def missing_names(present: Sequence[str], wanted: Sequence[str]) -> list[str]:
    """The names of ``wanted`` that ``present`` lacks, in ``wanted``'s order."""
    return [name for name in wanted if not any(_same_name(name, have) for have in present)]


# --- what the operation needs from the cluster ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SecretsState:
    """A control plane node's Kubernetes certificates: as issued, and as its pods' files hold them."""

    #: The server of the node's issued admin kubeconfig (the endpoint the certificates were issued for).
    server: str
    #: When the node issued its current certificates (``KubernetesSecrets k8s-certs``).
    issued: str
    #: When the certificates in the files on disk were issued, and the files' secrets version.
    disk_issued: str
    disk_version: int

    @property
    def on_disk(self) -> bool:
        """Whether the files on disk hold the current certificates."""
        return bool(self.issued) and self.issued == self.disk_issued


@dataclasses.dataclass(frozen=True)
class Served:
    """The certificate a TLS server presents: its names and whether the cluster CA issued it."""

    names: tuple[str, ...]
    by_cluster_ca: bool


class NodeAPI(Protocol):
    """The node API calls the operation makes, addressed by node address."""

    async def check(self, node: str) -> None:
        """Raise when ``node`` does not answer (used before any change)."""

    async def machine_config(self, node: str) -> str:
        """The node's current machine config (YAML)."""

    async def apply_config(self, node: str, data: str, *, mode: str) -> None:
        """Apply a machine config to ``node`` in ``mode``."""

    async def secrets_state(self, node: str) -> SecretsState:
        """A control plane node's certificate state (see :class:`SecretsState`)."""

    async def kubelet_server(self, node: str) -> str:
        """The server of the kubelet's kubeconfig on ``node`` (empty: it has none yet)."""

    async def service_healthy(self, node: str, service: str) -> bool:
        """Whether the node's service runs and passes its health check."""


class KubeAPI(Protocol):
    """The Kubernetes API calls the operation makes (through the endpoint the CLI was given)."""

    async def nodes(self) -> list[ClusterNode]:
        """Every Node with its first InternalIP; control plane by :data:`upgrade.CONTROL_PLANE_LABELS`."""

    async def mirror_pod(self, *, node_name: str, component: str) -> PodState | None:
        """The kube-system pod labelled ``k8s-app=<component>`` on ``node_name``, if any."""

    async def kubelet(self, node_name: str) -> KubeletState | None:
        """A Node's kubelet version and readiness, None when the Node does not exist."""

    async def configmap_server(self, namespace: str, name: str) -> str | None:
        """The server of the kubeconfig in a ConfigMap's ``kubeconfig`` key; None: no such ConfigMap."""

    async def set_configmap_server(self, namespace: str, name: str, server: str) -> None:
        """Point the kubeconfig in a ConfigMap's ``kubeconfig`` key to ``server``, nothing else changed."""

    async def daemonset(self, namespace: str, name: str) -> RolloutState | None:
        """A DaemonSet's state, None when it does not exist."""

    async def daemonset_annotation(self, namespace: str, name: str, key: str) -> str | None:
        """An annotation of a DaemonSet's pod template."""

    async def restart_daemonset(self, namespace: str, name: str, *, annotation: tuple[str, str]) -> None:
        """Set an annotation of a DaemonSet's pod template, which rolls its pods."""


class Probe(Protocol):
    """What the CLI's host sees of TLS servers (the new endpoint, each node's kube-apiserver)."""

    async def served(self, host: str, port: int) -> Served:
        """The certificate ``host:port`` presents, read without verifying it."""

    async def api_answers(self, endpoint: str) -> None:
        """Raise unless ``endpoint`` answers an authenticated ``/version`` with a certificate the
        cluster CA issued for the endpoint's own name."""


# --- options, planning -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    """What the user asked for (the CLI's arguments)."""

    #: The new endpoint, as :func:`parse_endpoint` returns it.
    endpoint: str
    #: The nodes the CLI talks through (``-n``); the plan covers every node.
    via: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Observed:
    """What :func:`prepare` read: the input of :func:`build_plan` (pure)."""

    endpoint: str
    control_plane: tuple[ClusterNode, ...]
    workers: tuple[ClusterNode, ...]
    #: Node address -> the endpoint of its machine config.
    endpoints: Mapping[str, str]
    #: Control plane node address -> its ``cluster.apiServer.certSANs``.
    cert_sans: Mapping[str, tuple[str, ...]]
    #: The port each control plane node's kube-apiserver serves on (``localAPIServerPort``).
    apiserver_port: int
    #: The server of kube-proxy's kubeconfig and of ``cluster-info`` (None: no such ConfigMap).
    proxy_server: str | None
    cluster_info_server: str | None

    @property
    def old_endpoints(self) -> tuple[str, ...]:
        """The endpoints the nodes have that are not the new one (empty: all switched)."""
        return tuple(dict.fromkeys(e for e in self.endpoints.values() if e != self.endpoint))

    @property
    def names(self) -> tuple[str, ...]:
        """The hosts every kube-apiserver certificate must carry: the old endpoints' and the new one's."""
        return tuple(dict.fromkeys([*(host_of(e) for e in self.old_endpoints), host_of(self.endpoint)]))


def build_plan(observed: Observed) -> plan_module.Plan:
    """The steps in execution order (see the module docstring)."""
    Step = plan_module.Step
    new = observed.endpoint
    steps: list[plan_module.Step] = []
    for node in observed.control_plane:
        present = observed.cert_sans[node.address]
        wanted = [*present, *missing_names(present, observed.names)]
        steps.append(
            Step(
                kind=KIND_SANS,
                component=APISERVER,
                node=node.address,
                current=",".join(present) or "-",
                target=",".join(wanted),
            )
        )
    steps.append(
        Step(
            kind=KIND_CHECK,
            component="endpoint",
            node="",
            current="",
            target=f"{new} answers as this cluster's API (cluster CA, name {host_of(new)})",
        )
    )
    for node in (*observed.control_plane, *observed.workers):
        steps.append(
            Step(
                kind=KIND_ENDPOINT,
                component="control-plane" if node.control_plane else KUBELET,
                node=node.address,
                current=observed.endpoints[node.address],
                target=new,
            )
        )
    notes = [
        f"kept in the kube-apiserver certificates: {', '.join(observed.names)} (clients of the old "
        "endpoint keep working; remove names from cluster.apiServer.certSANs later if no client uses them)",
    ]
    if observed.proxy_server is not None:
        steps.append(
            Step(kind=KIND_KUBECONFIG, component=PROXY, node="", current=observed.proxy_server, target=new)
        )
    else:
        notes.append(f"ConfigMap {PROXY_NAMESPACE}/{PROXY_CONFIGMAP} not found: kube-proxy is left as it is")
    if observed.cluster_info_server is not None:
        steps.append(
            Step(
                kind=KIND_KUBECONFIG,
                component=CLUSTER_INFO,
                node="",
                current=observed.cluster_info_server,
                target=new,
            )
        )
    else:
        notes.append(f"ConfigMap {CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO} not found: nothing to update there")
    old = ", ".join(observed.old_endpoints) or new
    return plan_module.Plan(
        title=f"change the control plane endpoint {old} -> {new}, one node at a time",
        steps=tuple(steps),
        notes=tuple(notes),
        rerun="steps already at the new endpoint are skipped",
    )


# --- preflight ---------------------------------------------------------------------------------


async def prepare(*, options: Options, node_api: NodeAPI, kube: KubeAPI, probe: Probe) -> Observed:
    """Every check before any change, and the state the plan is built from."""
    new = options.endpoint
    nodes = await upgrade.kube_read(kube.nodes(), what="list Kubernetes Nodes")
    control_plane = upgrade.select_control_plane(nodes, options.via)
    cp_addresses = {node.address for node in control_plane}
    workers = tuple(node for node in nodes if node.address not in cp_addresses)
    await upgrade.check_reachable(node_api, (*control_plane, *workers))
    documents = {
        node.address: machine_config.load(await node_api.machine_config(node.address))
        for node in (*control_plane, *workers)
    }
    endpoints = {address: d.model.cluster.control_plane.endpoint for address, d in documents.items()}
    others = sorted(set(endpoints.values()) - {new})
    if len(others) > 1:
        listing = "\n  ".join(f"{address}: {endpoint}" for address, endpoint in sorted(endpoints.items()))
        raise PreflightError(
            f"nothing was changed: the nodes' configs name {len(others)} endpoints besides {new}:\n  "
            f"{listing}\nmake them agree first (or run this command with the one they should have)"
        )
    first = documents[control_plane[0].address].model.cluster
    cert_sans = {}
    for node in control_plane:
        api_server = documents[node.address].model.cluster.api_server
        cert_sans[node.address] = tuple((api_server.cert_sans if api_server else None) or ())
    try:
        served = await probe.served(host_of(new), port_of(new))
    except (OSError, TimeoutError) as exc:
        raise PreflightError(
            f"nothing was changed: {new} does not answer TLS ({exc}); make it reach the control plane "
            "nodes' API servers first (a load balancer, a DNS name or a VIP), then re-run"
        ) from exc
    if not served.by_cluster_ca:
        raise PreflightError(
            f"nothing was changed: {new} answers with a certificate this cluster's CA did not issue: it "
            "reaches another cluster or something else; point it at this cluster's API servers"
        )
    proxy_server = await upgrade.kube_read(
        kube.configmap_server(PROXY_NAMESPACE, PROXY_CONFIGMAP),
        what=f"read ConfigMap {PROXY_NAMESPACE}/{PROXY_CONFIGMAP}",
    )
    cluster_info_server = await upgrade.kube_read(
        kube.configmap_server(CLUSTER_INFO_NAMESPACE, CLUSTER_INFO),
        what=f"read ConfigMap {CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO}",
    )
    return Observed(
        endpoint=new,
        control_plane=control_plane,
        workers=workers,
        endpoints=endpoints,
        cert_sans=cert_sans,
        apiserver_port=first.local_api_server_port,
        proxy_server=proxy_server,
        cluster_info_server=cluster_info_server,
    )


# --- the executor ------------------------------------------------------------------------------


class EndpointChanger(RollingExecutor[Observed, NodeAPI, KubeAPI]):
    """Runs an endpoint plan's steps, each deciding from live state (see the module docstring)."""

    def __init__(
        self,
        *,
        observed: Observed,
        node_api: NodeAPI,
        kube: KubeAPI,
        probe: Probe,
        rotation: Rotation,
        progress: plan_module.Progress,
        timing: Timing = DEFAULT_TIMING,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            observed=observed,
            node_api=node_api,
            kube=kube,
            rotation=rotation,
            progress=progress,
            timing=timing,
            sleep=sleep,
            clock=clock,
        )
        self.probe = probe

    def _known_nodes(self) -> Iterable[ClusterNode]:
        return (*self.observed.control_plane, *self.observed.workers)

    async def run(self, plan: plan_module.Plan, *, resume: str) -> list[plan_module.StepResult]:
        """Execute ``plan``; raises :class:`~kubeplane.plan.StepFailed` naming the step and ``resume``."""
        return await plan_module.execute(
            plan, self.run_step, progress=self.progress, resume=resume, clock=self._clock
        )

    async def run_step(self, step: plan_module.Step) -> plan_module.Outcome:
        """One step, by kind."""
        if step.kind == KIND_SANS:
            return await self._sans(self._nodes[step.node])
        if step.kind == KIND_CHECK:
            return await self._check()
        if step.kind == KIND_ENDPOINT:
            node = self._nodes[step.node]
            return await (self._control_plane(node) if node.control_plane else self._worker(node))
        if step.component == PROXY:
            return await self._proxy()
        return await self._cluster_info()

    def _steer(self) -> bool:
        return len(self.observed.control_plane) > 1

    async def _config(self, node: ClusterNode) -> machine_config.MachineConfig:
        return machine_config.load(await self.node_api.machine_config(node.address))

    async def _apply(self, node: ClusterNode, document: machine_config.MachineConfig, patch: Any) -> None:
        patched = machine_config.apply_json_patch(document, patch)
        await self.node_api.apply_config(node.address, patched.to_yaml(), mode="immediate")

    # -- steps --

    async def _sans(self, node: ClusterNode) -> plan_module.Outcome:
        wanted = self.observed.names
        document = await self._config(node)
        api_server = document.model.cluster.api_server
        present = list((api_server.cert_sans if api_server else None) or ())
        missing = missing_names(present, wanted)
        served = await self._served(node)
        done = not missing and served is not None and not missing_names(served.names, wanted)
        async with out_of_rotation(self.rotation, node, self.progress, steer=self._steer(), drain=not done):
            if missing:
                await self._apply(
                    node, document, image_patch(document.to_dict(), SANS_PATH, [*present, *missing])
                )
                self.progress.info(
                    f"added {', '.join(missing)} to cluster.apiServer.certSANs on node {node.name}"
                )

            async def serves() -> str | None:
                found = await self._served(node)
                if found is None:
                    return f"kube-apiserver on node {node.name} does not answer TLS yet"
                lacking = missing_names(found.names, wanted)
                return f"its certificate lacks {', '.join(lacking)}" if lacking else None

            await self._wait(
                serves,
                timeout=self.timing.pod_timeout,
                describe=f"kube-apiserver on node {node.name} to serve a certificate for {', '.join(wanted)}",
            )
            await self._wait_control_plane(node)
        return plan_module.SKIPPED if done else plan_module.CHANGED

    async def _served(self, node: ClusterNode) -> Served | None:
        try:
            return await self.probe.served(node.address, self.observed.apiserver_port)
        except (OSError, TimeoutError):
            return None

    async def _check(self) -> plan_module.Outcome:
        new = self.observed.endpoint
        failures: list[str] = []

        async def answers() -> str | None:
            try:
                await self.probe.api_answers(new)
            except Exception as exc:
                failures.append(str(exc))
                return f"{new}: {exc}"
            return None

        try:
            await self._wait(
                answers, timeout=self.timing.config_timeout, describe=f"{new} to answer as this cluster's API"
            )
        except OpsError as exc:
            raise OpsError(
                f"{new} does not answer as this cluster's API with its own name "
                f"({failures[-1] if failures else exc}): nothing was switched to it; every API server "
                "now also carries its name, so check what the load balancer, DNS name or VIP reaches"
            ) from exc
        self.progress.info(f"{new} answers as this cluster's API")
        return plan_module.SKIPPED

    async def _control_plane(self, node: ClusterNode) -> plan_module.Outcome:
        new = self.observed.endpoint
        document = await self._config(node)
        switched = document.model.cluster.control_plane.endpoint == new
        state = await self.node_api.secrets_state(node.address)
        done = (
            switched
            and state.server == new
            and state.on_disk
            and await self.node_api.kubelet_server(node.address) == new
        )
        async with out_of_rotation(self.rotation, node, self.progress, steer=self._steer(), drain=not done):
            if not switched:
                await self._apply(node, document, image_patch(document.to_dict(), ENDPOINT_PATH, new))
                self.progress.info(f"switched cluster.controlPlane.endpoint to {new} on node {node.name}")

            async def issued() -> str | None:
                found = await self.node_api.secrets_state(node.address)
                return None if found.server == new else f"its admin kubeconfig names {found.server}"

            await self._wait(
                issued,
                timeout=self.timing.config_timeout,
                describe=f"node {node.name} to issue kubeconfigs for {new}",
            )
            await self._wait_control_plane(node)
            await self._wait_kubelet(node)
        return plan_module.SKIPPED if done else plan_module.CHANGED

    async def _worker(self, node: ClusterNode) -> plan_module.Outcome:
        new = self.observed.endpoint
        document = await self._config(node)
        switched = document.model.cluster.control_plane.endpoint == new
        if not switched:
            await self._apply(node, document, image_patch(document.to_dict(), ENDPOINT_PATH, new))
            self.progress.info(f"switched cluster.controlPlane.endpoint to {new} on node {node.name}")
        kubelet_done = await self.node_api.kubelet_server(node.address) == new
        await self._wait_kubelet(node)
        return plan_module.SKIPPED if switched and kubelet_done else plan_module.CHANGED

    async def _proxy(self) -> plan_module.Outcome:
        new = self.observed.endpoint
        changed = await self._configmap(PROXY_NAMESPACE, PROXY_CONFIGMAP)
        if await self.kube.daemonset(PROXY_NAMESPACE, PROXY) is None:
            self.progress.info(f"DaemonSet {PROXY_NAMESPACE}/{PROXY} does not exist: nothing to restart")
            return plan_module.CHANGED if changed else plan_module.SKIPPED
        if await self.kube.daemonset_annotation(PROXY_NAMESPACE, PROXY, ENDPOINT_ANNOTATION) != new:
            await self.kube.restart_daemonset(PROXY_NAMESPACE, PROXY, annotation=(ENDPOINT_ANNOTATION, new))
            self.progress.info(f"restarting DaemonSet {PROXY_NAMESPACE}/{PROXY}'s pods")
            changed = True

        async def rolled_out() -> str | None:
            state = await self.kube.daemonset(PROXY_NAMESPACE, PROXY)
            if state is None:
                return f"DaemonSet {PROXY_NAMESPACE}/{PROXY} disappeared"
            if state.complete(state.image):
                return None
            return (
                f"rollout of {PROXY}: {state.updated} updated, {state.available} available of {state.desired}"
            )

        await self._wait(rolled_out, timeout=self.timing.rollout_timeout, describe=f"the {PROXY} rollout")
        return plan_module.CHANGED if changed else plan_module.SKIPPED

    async def _cluster_info(self) -> plan_module.Outcome:
        changed = await self._configmap(CLUSTER_INFO_NAMESPACE, CLUSTER_INFO)
        return plan_module.CHANGED if changed else plan_module.SKIPPED

    async def _configmap(self, namespace: str, name: str) -> bool:
        """Point a ConfigMap's kubeconfig at the new endpoint; False when it already was."""
        new = self.observed.endpoint
        current = await self.kube.configmap_server(namespace, name)
        if current is None:
            raise OpsError(f"ConfigMap {namespace}/{name} disappeared since the plan was made")
        if current == new:
            return False
        await self.kube.set_configmap_server(namespace, name, new)
        self.progress.info(f"ConfigMap {namespace}/{name}: server {current} -> {new}")
        return True

    # -- waiting --

    async def _wait_control_plane(self, node: ClusterNode) -> None:
        """Wait until the node's files hold its current certificates and its control plane pods
        run them and are Ready."""
        versions: list[int] = []

        async def written() -> str | None:
            state = await self.node_api.secrets_state(node.address)
            if not state.on_disk:
                return (
                    f"the files on node {node.name} hold certificates issued {state.disk_issued or 'never'}"
                )
            versions.append(state.disk_version)
            return None

        await self._wait(
            written,
            timeout=self.timing.config_timeout,
            describe=f"node {node.name} to write its certificates",
        )
        await self._wait_pods_on_secrets(node, versions[-1])

    async def _wait_kubelet(self, node: ClusterNode) -> None:
        """Wait until the node's kubelet reaches the new endpoint, is healthy and its Node Ready."""
        new = self.observed.endpoint

        async def reaches() -> str | None:
            server = await self.node_api.kubelet_server(node.address)
            if server != new:
                return f"the kubelet's kubeconfig on node {node.name} names {server or 'no server'}"
            if not await self.node_api.service_healthy(node.address, KUBELET):
                return f"the kubelet on node {node.name} is not healthy yet"
            state = await self.kube.kubelet(node.name)
            if state is None or not state.ready:
                return f"Node {node.name} is not Ready"
            return None

        await self._wait(
            reaches,
            timeout=self.timing.rollout_timeout,
            describe=f"the kubelet on node {node.name} to reach {new}",
        )
