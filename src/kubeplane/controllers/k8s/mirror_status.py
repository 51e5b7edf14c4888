"""MirrorPodStatusController: a static pod's status, as this node's kubelet holds it, written to its
mirror pod when the kubelet has not written it yet.

kubelet 1.20 writes a static pod's status to the API server when the status changes, and in a
batch every 10 s. A change made before the mirror pod existed is dropped ("does not exist on the
server") and waits for that batch. The first control plane node always hits this: its
kube-apiserver is Ready before its kubelet can register the node, and the mirror pod comes only
after registration. So for up to 10 s the mirror pod showed no status (``kubectl get pods``:
Pending, no node IP), and ``cluster create``, which waits for every control plane pod to be
Ready, waited with it (docs/architecture.md, Cluster create performance).

This controller runs on control plane nodes (it needs the local admin kubeconfig) and follows the
``kube-system`` pods. A mirror pod (annotation ``kubernetes.io/config.mirror``) whose status the
kubelet never wrote (no ``status.hostIP``: a kubelet's status always has one) gets the status
this node's kubelet reports for the same pod on its read-only ``/pods`` endpoint: same namespace
and name, and a ``kubernetes.io/config.hash`` equal to the mirror's annotation (the kubelet replaces
a mirror pod of another version anyway). The merge patch of the ``status`` subresource carries the
mirror pod's ``resourceVersion``: a mirror pod that changed meanwhile (the kubelet wrote it) is
left alone. Mirror pods of other nodes are not in this kubelet's list and are never touched.
The kubelet's next batch writes the same status over it.

Trust: the status is the local kubelet's own, read from ``127.0.0.1``; the worst a local process
impersonating that port could do is show a wrong status on this node's mirror pods until the
kubelet's next batch, 10 s later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.controllers.k8s import api_watch
from kubeplane.controllers.k8s.kubelet_static_pod import DEFAULT_PODS_URL
from kubeplane.controllers.secrets import common
from kubeplane.controllers.secrets import kubernetes as kubernetes_secrets
from kubeplane.resources import catalog
from kubeplane.runtime import ControllerLogger, Input, Output, ReconcileContext

if TYPE_CHECKING:
    import httpx

NAMESPACE = "kube-system"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
HASH_ANNOTATION = "kubernetes.io/config.hash"
WATCH_TASK = "mirror-pods"


def unwritten(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is a mirror pod whose status its kubelet has never written."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return MIRROR_ANNOTATION in annotations and not (pod.get("status") or {}).get("hostIP")


def status_patches(
    mirrors: Iterable[Mapping[str, Any]], kubelet_pods: Iterable[Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Mirror pod name → the merge patch that gives it the kubelet's status (see module docstring)."""
    statuses: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    for pod in kubelet_pods:
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        config_hash = (metadata.get("annotations") or {}).get(HASH_ANNOTATION)
        if config_hash and status.get("hostIP"):
            statuses[(metadata.get("namespace", ""), metadata.get("name", ""))] = (config_hash, status)
    patches = {}
    for mirror in mirrors:
        if not unwritten(mirror):
            continue
        metadata = mirror["metadata"]
        name = metadata.get("name", "")
        found = statuses.get((metadata.get("namespace", ""), name))
        if found is None or found[0] != metadata["annotations"][MIRROR_ANNOTATION]:
            continue
        patches[name] = {"metadata": {"resourceVersion": metadata.get("resourceVersion")}, "status": found[1]}
    return patches


@dataclasses.dataclass(frozen=True)
class _Settings:
    kubeconfig: str


class MirrorPodStatusController(api_watch.WatchingController[_Settings]):
    """Writes the kubelet's status to mirror pods it has not written yet (see module docstring)."""

    name = "k8s.MirrorPodStatusController"
    inputs = (
        Input(
            catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, kubernetes_secrets.KUBERNETES_SECRETS_ID
        ),
    )
    outputs: tuple[Output, ...] = ()  # it writes to the API server only
    task_name = WATCH_TASK
    task_what = "writing mirror pod statuses"

    def __init__(
        self,
        *,
        pods_url: str = DEFAULT_PODS_URL,
        retry_interval: float = 2.0,
        watch_timeout: int = 300,
        timeout: float = 5.0,
        kube_client: Callable[[str], kube.KubeClient] = kube.KubeClient,
    ) -> None:
        super().__init__()
        self.pods_url = pods_url
        self.retry_interval = retry_interval
        self.watch_timeout = watch_timeout
        self.timeout = timeout
        self.kube_client = kube_client
        self._http: httpx.AsyncClient | None = None

    def _read_settings(self, ctx: ReconcileContext) -> _Settings | None:
        certs = common.running_spec(
            ctx,
            catalog.SECRETS_NAMESPACE,
            catalog.KUBERNETES_SECRETS,
            kubernetes_secrets.KUBERNETES_SECRETS_ID,
        )
        if certs is None or not certs.get("localAdminKubeconfig"):
            return None  # not a control plane node
        return _Settings(kubeconfig=str(certs["localAdminKubeconfig"]))

    async def _kubelet_pods(self, logger: ControllerLogger) -> list[dict[str, Any]]:
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout)
        try:
            response = await self._http.get(self.pods_url)
            response.raise_for_status()
            items = response.json().get("items")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            logger.debug("kubelet pods endpoint %s: %s", self.pods_url, exc)
            return []
        return [pod for pod in items or () if isinstance(pod, dict)]

    async def _write(
        self, api: kube.KubeClient, mirrors: list[dict[str, Any]], logger: ControllerLogger
    ) -> None:
        if not any(unwritten(pod) for pod in mirrors):
            return
        for name, patch in status_patches(mirrors, await self._kubelet_pods(logger)).items():
            try:
                await api.patch(f"{PODS_PATH}/{name}/status", patch, patch_type="merge")
            except (client_errors.KubeConflict, client_errors.KubeNotFound) as exc:
                logger.debug("mirror pod %s/%s changed meanwhile, left alone: %s", NAMESPACE, name, exc)
                continue
            phase = patch["status"].get("phase")
            logger.info("wrote the kubelet's status (%s) to mirror pod %s/%s", phase, NAMESPACE, name)

    async def _watch(self, settings: _Settings, logger: ControllerLogger) -> None:
        async def listed(api: kube.KubeClient, items: api_watch.Items) -> None:
            await self._write(api, items, logger)

        async def changed(api: kube.KubeClient, kind: str, pod: dict[str, Any]) -> None:
            if kind in ("ADDED", "MODIFIED"):
                await self._write(api, [pod], logger)

        await api_watch.follow(
            lambda: self.kube_client(settings.kubeconfig),
            PODS_PATH,
            listed=listed,
            changed=changed,
            logger=logger,
            retry_interval=self.retry_interval,
            watch_timeout=self.watch_timeout,
            what="mirror pod statuses",
        )
