"""Self-hosted bootstrap: the bootstrap node brings up a self-hosted control plane, bootkube style.

What the original's older releases did, and what ``convert-k8s`` converts from. Requested by
``bootstrap --self-hosted`` (``kubeplane cluster create --self-hosted`` uses it). The machine
configs of this mode lack ``cluster.serviceAccount`` and ``cluster.aggregatorCA``.

Sequence (:meth:`SelfHostedBootstrap.run`, a background task of the agent after etcd starts):

1. ``temporary control plane``: before etcd starts, the node publishes (in memory only, never
   persisted) its machine config plus a service account key and an aggregator CA generated for
   this bootstrap, its kube-apiserver without the static pod's shutdown delay and shared port
   (:data:`TEMPORARY_APISERVER_ARGS`); the ordinary controllers then render secrets and static
   pods from it (the etcd ``initialized`` key does not exist yet, so the node is not
   self-hosted) and apply the bootstrap manifests.
2. ``applying self-hosted objects``: once the API server answers, the Secrets (made of the very
   files the static pods use, so the temporary plane's service account tokens stay valid), the
   control plane DaemonSets and the pod-checkpointer (:mod:`kubeplane.controllers.k8s.selfhosted`).
3. ``waiting for self-hosted pods``: every DaemonSet has a pod on this node, running (the control
   plane ones crash on their ports while the temporary plane holds them) and the checkpointer Ready.
4. ``removing the temporary control plane``: etcd key ``kubeplane:v1:initialized`` = ``"true"``
   (BootstrapStatus turns self-hosted: the kubelet static pod files go away and manifests are no
   longer applied) and the config without the generated keys is published again. The kubelet's
   restart policy brings the DaemonSet pods up on the freed ports.
5. ``waiting for the self-hosted control plane``: every DaemonSet pod Ready through the API.

Each step logs what it waits for. The generated keys live only in memory: if the agent
restarts before step 4 the bootstrap cannot finish; wipe the node's etcd and bootstrap again.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path, PurePosixPath
from typing import Any

import kubeplane
from kubeplane import config, pki, retry
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import etcd_access, files, manifest_apply, render, selfhosted
from kubeplane.controllers.k8s import static_pod as static_pod_mod
from kubeplane.resources import State, catalog
from kubeplane.runtime.context import controller_logger

log = logging.getLogger(__name__)

#: The checkpointer image ``kubeplane cluster create`` pushes to the local registry.
DEFAULT_CHECKPOINTER_IMAGE = f"kubeplane/pod-checkpointer:{kubeplane.__version__}"
DEFAULT_GRACE_PERIOD = 300
#: How long each wait may take before the bootstrap gives up (logged, with what was missing).
STEP_TIMEOUT = 600.0
DAEMONSETS = (*files.COMPONENTS, selfhosted.CHECKPOINTER)
#: Seconds between two attempts of a wait.
POLL_INTERVAL = 2.0
#: What a wait retries: the API server not answering yet or refusing for now (a temporary
#: control plane still bootstrapping its RBAC answers 403 a while: every Kubernetes API error is
#: worth another try here), an object it refused for now, a file not written yet.
RETRYABLE = (client_errors.KubeError, manifest_apply.ApplyError, OSError, ValueError)


class SelfHostedError(Exception):
    """A step of the self-hosted bootstrap failed or timed out; the message names it."""


@dataclasses.dataclass(frozen=True)
class Options:
    """What ``bootstrap --self-hosted`` was asked for."""

    checkpointer_image: str = DEFAULT_CHECKPOINTER_IMAGE
    grace_period_seconds: int = DEFAULT_GRACE_PERIOD


#: kube-apiserver flags of the temporary control plane, unless its config sets them: its static
#: pod's shutdown delay and shared port (controllers/k8s/render.py) would only keep the port
#: from the DaemonSet pod, which waits for it, for longer (as in selfhosted.render_daemonset).
TEMPORARY_APISERVER_ARGS = render.APISERVER_NO_SHUTDOWN_DELAY


def temporary_config(document: config.MachineConfig) -> config.MachineConfig:
    """``document`` plus a generated service account key and aggregator CA where it has none,
    and :data:`TEMPORARY_APISERVER_ARGS` where its ``cluster.apiServer.extraArgs`` has none."""
    cluster = document.model.cluster
    patch: dict[str, Any] = {}
    own_args = (cluster.api_server.extra_args if cluster.api_server else None) or {}
    given = {name.lstrip("-") for name in own_args}
    missing = {name: value for name, value in TEMPORARY_APISERVER_ARGS.items() if name not in given}
    if missing:
        patch["apiServer"] = {"extraArgs": missing}
    if cluster.service_account is None or not cluster.service_account.key:
        key = pki.service_account_key()
        patch["serviceAccount"] = {"key": base64.b64encode(key).decode()}
    if cluster.aggregator_ca is None or not cluster.aggregator_ca.key:
        ca = pki.aggregator_ca()
        patch["aggregatorCA"] = {
            "crt": base64.b64encode(ca.cert).decode(),
            "key": base64.b64encode(ca.key).decode(),
        }
    if not patch:
        return document
    return config.load(gen.dump_yaml(gen.apply_patches(document.to_dict(), [{"cluster": patch}])))


def node_root_pattern(paths: NodePaths, node_name: str) -> str:
    """The node root as the checkpointer DaemonSet's host paths see it.

    On a machine, local cluster nodes included, that is ``/``. An agent under another root
    (a test directory) gets that root on every node, with a warning: nodes sharing one file
    system would then all be given this node's directory.
    """
    root = Path(paths.root).resolve()
    if str(root) == "/":
        return "/"
    log.warning(
        "node %s runs under root %s, not /: the pod-checkpointer DaemonSet uses %s on every node",
        node_name,
        root,
        root,
    )
    return str(root)


class SelfHostedBootstrap:
    """Runs steps 2-5 of the module docstring on the bootstrap node."""

    def __init__(
        self,
        *,
        state: State,
        paths: NodePaths,
        node_name: str,
        original: config.MachineConfig,
        kubeconfig: Callable[[], str],
        publish_config: Callable[[config.MachineConfig], None],
        options: Options,
        timeout: float = STEP_TIMEOUT,
    ) -> None:
        self.state = state
        self.paths = paths
        self.node_name = node_name
        self.original = original
        self.kubeconfig = kubeconfig
        self.publish_config = publish_config
        self.options = options
        self.timeout = timeout

    async def run(self) -> None:
        started = time.monotonic()
        log.info("self-hosted bootstrap: waiting for the temporary control plane")
        async with kube.KubeClient(self.kubeconfig()) as api:
            await self._wait("the temporary control plane API server to answer", lambda: _ready(api))
            objects = await self._wait("the temporary static pods and their secrets", self._objects)
            log.info("self-hosted bootstrap: applying %d self-hosted objects", len(objects))
            applier = manifest_apply.Applier(
                api, sync=False, logger=controller_logger("agent.SelfHostedBootstrap")
            )
            for obj in objects:
                await self._wait(
                    f"applying {manifest_apply.describe(obj)}", functools.partial(_applied, applier, obj)
                )
            await self._wait(
                f"self-hosted pods on {self.node_name} (control plane running, checkpointer Ready)",
                lambda: self._scheduled(api),
            )
            log.info("self-hosted bootstrap: removing the temporary control plane")
            await self._wait("setting the etcd initialized key", self._set_initialized)
            self.publish_config(self.original)
            await self._wait("every self-hosted control plane pod Ready", lambda: _all_ready(api))
        log.info("self-hosted bootstrap: done in %.0fs", time.monotonic() - started)

    async def _wait(self, what: str, attempt: Callable[[], Awaitable[Any]]) -> Any:
        log.info("self-hosted bootstrap: waiting for %s", what)
        return await retry.Wait(
            what=what,
            timeout=self.timeout,
            backoff=retry.fixed(POLL_INTERVAL),
            retry_on=RETRYABLE,
            error=lambda message: SelfHostedError(f"self-hosted bootstrap: {message}"),
        ).poll_async(attempt)

    async def _objects(self) -> list[dict[str, Any]] | None:
        status = self.state.find(
            catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, catalog.STATIC_POD_SECRETS_ID
        )
        if status is None or not isinstance(status.spec, catalog.SecretStatusSpec) or not status.spec.ready:
            return None
        secrets_root = PurePosixPath(self.paths.secrets.relative_to(self.paths.root)) / "kubernetes"
        per_component: dict[str, render.ControlPlaneInputs] = {}
        for component in files.COMPONENTS:
            kcpc = self.state.find(
                catalog.CONFIG_NAMESPACE, catalog.KUBERNETES_CONTROL_PLANE_CONFIGS, component
            )
            if kcpc is None:
                return None
            per_component[component] = static_pod_mod.component_inputs(
                kcpc.spec.to_dict(), config_version="", secrets_version="", secrets_root=secrets_root
            )
        secret_files = {
            component: {
                file.name: (PurePosixPath(self.paths.root) / secrets_root / component / file.name).as_posix()
                for file in files.LAYOUT[component]
            }
            for component in files.COMPONENTS
        }
        contents = {
            component: {name: await asyncio.to_thread(_read, path) for name, path in names.items()}
            for component, names in secret_files.items()
        }
        return selfhosted.render_self_hosted(
            selfhosted.SelfHostedInputs(
                control_plane=per_component[files.APISERVER],
                checkpointer_image=self.options.checkpointer_image,
                # Each component from its own config, as its static pod would be.
                components=per_component,
                node_root=node_root_pattern(self.paths, self.node_name),
                grace_period_seconds=self.options.grace_period_seconds,
            ),
            contents,
        )

    async def _scheduled(self, api: kube.KubeClient) -> bool:
        pods = await api.list(
            "/api/v1/namespaces/kube-system/pods", field_selector=f"spec.nodeName={self.node_name}"
        )
        for name in DAEMONSETS:
            mine = [pod for pod in pods if _owner(pod) == name]
            if not mine:
                return False
            if name == selfhosted.CHECKPOINTER:
                if not any(kube.is_ready(pod) for pod in mine):
                    return False
            elif not any(pod.get("status", {}).get("phase") == "Running" for pod in mine):
                return False
        return True

    async def _set_initialized(self) -> bool:
        secrets = self.state.find(
            catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID
        )
        if secrets is None:
            return False
        client = etcd_access.client_from_secrets(secrets.spec.to_dict())
        try:
            await client.put(etcd_access.INITIALIZED_KEY, b"true")
        finally:
            await client.aclose()
        return True


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


async def _ready(api: kube.KubeClient) -> bool:
    status, _ = await api.raw_get("/readyz")
    return status == HTTPStatus.OK


async def _applied(applier: manifest_apply.Applier, obj: dict[str, Any]) -> bool:
    await applier.apply(obj)
    return True


def _owner(pod: dict[str, Any]) -> str:
    for ref in pod.get("metadata", {}).get("ownerReferences") or ():
        if ref.get("kind") == "DaemonSet":
            return str(ref.get("name", ""))
    return ""


async def _all_ready(api: kube.KubeClient) -> bool:
    daemonsets = await api.list("/apis/apps/v1/namespaces/kube-system/daemonsets")
    by_name = {ds["metadata"]["name"]: ds for ds in daemonsets}
    for name in DAEMONSETS:
        status = by_name.get(name, {}).get("status", {})
        desired = status.get("desiredNumberScheduled", 0)
        if not desired or status.get("numberReady", 0) < desired:
            return False
    return True
