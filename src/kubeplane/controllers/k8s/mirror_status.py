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
``kube-system`` pods. A mirror pod (annotation ``kubernetes.io/config.mirror``) bound to this
node (``spec.nodeName``, the node's own name) whose status the kubelet never wrote (no
``status.hostIP``: a kubelet's status always has one) gets the status this node's kubelet
reports for the same pod on its read-only ``/pods`` endpoint: same namespace, name and node, and
a ``kubernetes.io/config.hash`` equal to the mirror's annotation (the kubelet replaces a mirror
pod of another version anyway). The merge patch of the ``status`` subresource carries the mirror
pod's ``resourceVersion``: a mirror pod that changed meanwhile (the kubelet wrote it) is left
alone. The kubelet's next batch writes the same status over it.

Trust: the status is read from the kubelet's read-only port on ``127.0.0.1``. Another local
process can listen there only while the kubelet does not; it could then show a made-up status
on this node's mirror pods that no kubelet has written to yet, and nothing else: other nodes'
mirror pods and every status a kubelet wrote are out of its reach.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.controllers.k8s import api_watch
from kubeplane.controllers.k8s.kubelet_static_pod import DEFAULT_PODS_URL, kubelet_pods
from kubeplane.controllers.secrets import kubernetes as kubernetes_secrets
from kubeplane.resources import catalog
from kubeplane.runtime import ControllerLogger, Input, Output, ReconcileContext

if TYPE_CHECKING:
    import httpx

NAMESPACE = "kube-system"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"
HASH_ANNOTATION = "kubernetes.io/config.hash"
WATCH_TASK = "mirror-pods"


def unwritten(pod: Mapping[str, Any], node: str) -> bool:
    """Whether ``pod`` is a mirror pod on ``node`` whose status no kubelet has written."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return (
        kube.MIRROR_ANNOTATION in annotations
        and (pod.get("spec") or {}).get("nodeName") == node
        and not (pod.get("status") or {}).get("hostIP")
    )


def status_patches(
    mirrors: Iterable[Mapping[str, Any]], static_pods: Iterable[Mapping[str, Any]], *, node: str
) -> dict[str, dict[str, Any]]:
    """Mirror pod name → the merge patch that gives it the status of the same static pod on the
    kubelet of ``node`` (see the module docstring)."""
    statuses: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    for pod in static_pods:
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        config_hash = (metadata.get("annotations") or {}).get(HASH_ANNOTATION)
        if config_hash and status.get("hostIP") and (pod.get("spec") or {}).get("nodeName") == node:
            statuses[(metadata.get("namespace", ""), metadata.get("name", ""))] = (config_hash, status)
    patches = {}
    for mirror in mirrors:
        metadata = mirror.get("metadata") or {}
        version = metadata.get("resourceVersion")
        if not unwritten(mirror, node) or not version:  # no version: nothing would guard the patch
            continue
        name = metadata.get("name", "")
        found = statuses.get((metadata.get("namespace", ""), name))
        if found is None or found[0] != metadata["annotations"][kube.MIRROR_ANNOTATION]:
            continue
        patches[name] = {"metadata": {"resourceVersion": version}, "status": found[1]}
    return patches


@dataclasses.dataclass(frozen=True)
class _Settings:
    kubeconfig: str
    node: str


class MirrorPodStatusController(api_watch.WatchingController[_Settings]):
    """Writes the kubelet's status to mirror pods it has not written yet (see module docstring)."""

    name = "k8s.MirrorPodStatusController"
    inputs = (
        Input(
            catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, kubernetes_secrets.KUBERNETES_SECRETS_ID
        ),
        Input(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID),
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
        kubeconfig = kubernetes_secrets.local_admin_kubeconfig(ctx)
        addresses = ctx.find(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID)
        if kubeconfig is None:
            return None  # not a control plane node
        if addresses is None or not isinstance(addresses.spec, catalog.NodeAddressesSpec):
            return None
        return _Settings(kubeconfig=kubeconfig, node=addresses.spec.hostname)

    async def _static_pods(self, logger: ControllerLogger) -> list[dict[str, Any]]:
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout, trust_env=False)
        try:
            return await kubelet_pods(self._http, self.pods_url)
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("kubelet pods endpoint %s: %s", self.pods_url, exc)
            return []

    async def _write(
        self, api: kube.KubeClient, mirrors: list[dict[str, Any]], node: str, logger: ControllerLogger
    ) -> None:
        if not any(unwritten(pod, node) for pod in mirrors):
            return
        for name, patch in status_patches(mirrors, await self._static_pods(logger), node=node).items():
            where = f"mirror pod {NAMESPACE}/{name}"
            try:
                await api.patch(f"{PODS_PATH}/{name}/status", patch, patch_type="merge")
            except (client_errors.KubeConflict, client_errors.KubeNotFound) as exc:
                logger.debug("%s changed meanwhile, left alone: %s", where, exc)
                continue
            except client_errors.KubeUnavailable:
                raise  # the API server went away: list again once it is back
            except client_errors.KubeError as exc:
                logger.warning("cannot write the kubelet's status to %s: %s", where, exc)
                continue
            logger.info("wrote the kubelet's status (%s) to %s", patch["status"].get("phase"), where)

    async def _watch(self, settings: _Settings, logger: ControllerLogger) -> None:
        async def listed(api: kube.KubeClient, items: api_watch.Items) -> None:
            await self._write(api, items, settings.node, logger)

        async def changed(api: kube.KubeClient, kind: str, pod: dict[str, Any]) -> None:
            if kind in ("ADDED", "MODIFIED"):
                await self._write(api, [pod], settings.node, logger)

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
