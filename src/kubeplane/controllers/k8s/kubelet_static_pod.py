"""KubeletStaticPodController: ``StaticPods`` → files in the kubelet's manifest directory, and back
the kubelet's view of them → ``controlplane/StaticPodStatuses``.

Files are ``kubeplane-<id>.yaml`` in ``paths.kubelet_manifests``. The kubelet restarts a static
pod whenever its file changes, so a file is written only when its bytes differ, atomically with
mode 0600 (:func:`kubeplane.fileio.write_if_changed`: a hidden temporary file renamed over it,
which the kubelet ignores because of the leading dot).
A StaticPod being torn down loses its file before this controller lets go of its finalizer
(``StaticPods`` is a strong input), so the pod is never destroyed while it still runs; files with
the prefix that match no StaticPod are strays from an earlier run and are removed.

kube-controller-manager's and kube-scheduler's files, when they do not exist yet, are written
only once the node's kube-apiserver answers its readiness probe (the pod's own ``readinessProbe``,
checked every second meanwhile): the order kubeadm adopted (kubernetes #117984). Started next to
an API server that is still bootstrapping its RBAC policy, kube-controller-manager exits
("extension-apiserver-authentication is forbidden") and sits out the kubelet's crash-loop back-off
(10 s, then 20 s): on a new cluster that was most of the half-minute before the worker's kubelet
got its certificate. A file already there (an upgrade, an agent restart) is rewritten at once.
The wait only orders start-up, it must never keep a control plane down: each check allows
``ready_timeout`` seconds (a loaded machine's API server answers slowly), and after ``hold_limit``
seconds of waiting the files are written anyway, with a warning, and the kubelet's back-off
takes over as before.

Likewise kube-apiserver's file, when it does not exist yet, waits while something else accepts
connections on its port: a self-hosted control plane's DaemonSet pod, which ``convert-k8s``
replaces node by node. Written next to it, the static pod would crash-loop on the port and sit out
a back-off of up to 5 min once the port is free; held back, it starts within a second of the old
pod closing its listener.
This wait has no limit: while another process holds the port, the static pod could not serve
anyway.

All files are removed while the control plane is self-hosted (``BootstrapStatuses`` says so) or
when the secrets status is gone; without any BootstrapStatus yet nothing is written or removed,
since running the static pods next to a self-hosted control plane would fight over its ports.

Status: every ``poll_interval`` seconds the kubelet's read-only ``/pods`` endpoint is read and
each static (``kubernetes.io/config.source: file``) pod's ``status`` is published with id
``<namespace>/<pod name>`` (the kubelet names a static pod ``<name>-<node>``). A kubelet that is not
up yet is normal during boot: it is logged at debug level and the last statuses are kept.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubeplane import fileio
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import outputs, render
from kubeplane.resources import Phase, catalog
from kubeplane.runtime import Input, InputKind, Output, ReconcileContext

if TYPE_CHECKING:
    import httpx

#: The kubelet's read-only port (the agent starts the kubelet with ``--read-only-port=10255``).
DEFAULT_PODS_URL = "http://127.0.0.1:10255/pods"
FILE_PREFIX = "kubeplane-"
_CONFIG_SOURCE = "kubernetes.io/config.source"
#: StaticPods first written only once the node's API server is ready (module docstring).
AFTER_APISERVER = ("kube-controller-manager", "kube-scheduler")
APISERVER = "kube-apiserver"
#: How often the API server's readiness is checked while a pod is held back (seconds).
READY_RECHECK = 1.0
#: How long one readiness or port check may take (seconds): the kubelet allows this pod's probe
#: 15 s; a check here blocks the controller's other files, so it gets less.
READY_TIMEOUT = 5.0
#: How long kube-controller-manager and kube-scheduler wait for a ready API server at most
#: (seconds) before they are written anyway.
HOLD_LIMIT = 60.0


def manifest_name(static_pod_id: str) -> str:
    """The file name of a StaticPod in the kubelet manifest directory."""
    return f"{FILE_PREFIX}{static_pod_id}.yaml"


class KubeletStaticPodController:
    """Writes static pod files for the kubelet and reports their status (see module docstring)."""

    name = "k8s.KubeletStaticPodController"
    inputs = (
        Input(catalog.CONTROLPLANE_NAMESPACE, catalog.STATIC_PODS, kind=InputKind.STRONG),
        Input(catalog.RUNTIME_NAMESPACE, catalog.BOOTSTRAP_STATUSES, catalog.BOOTSTRAP_STATUS_ID),
        Input(catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, catalog.STATIC_POD_SECRETS_ID),
    )
    outputs = (Output(catalog.STATIC_POD_STATUSES),)

    def __init__(
        self,
        *,
        paths: NodePaths,
        pods_url: str = DEFAULT_PODS_URL,
        poll_interval: float = 15.0,
        timeout: float = 5.0,
        ready_timeout: float = READY_TIMEOUT,
        hold_limit: float = HOLD_LIMIT,
    ) -> None:
        self.directory = paths.kubelet_manifests
        self.pods_url = pods_url
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.ready_timeout = ready_timeout
        self.hold_limit = hold_limit
        # Made once: building a client loads CA certificates, which blocks the event loop for tens
        # of milliseconds — every 15 s, and in front of static pod writes queued behind a poll.
        self._http: httpx.AsyncClient | None = None
        self._probe: httpx.AsyncClient | None = None
        #: Static pods held back at the last reconcile, and why.
        self._holding: dict[str, str] = {}
        #: When the current wait for a ready API server began (monotonic seconds), while there is one.
        self._waiting_since: float | None = None

    async def reconcile(self, ctx: ReconcileContext) -> None:
        ctx.requeue_after(self.poll_interval)
        await self._sync_files(ctx)
        await self._refresh_statuses(ctx)

    # -- files -------------------------------------------------------------------------------

    async def _sync_files(self, ctx: ReconcileContext) -> None:
        # Read (and so hold) every StaticPod first, whatever happens next: the finalizer must stay
        # until this controller has removed the file of a pod being torn down.
        static_pods = ctx.list(catalog.CONTROLPLANE_NAMESPACE, catalog.STATIC_PODS)
        bootstrap = ctx.find(
            catalog.RUNTIME_NAMESPACE, catalog.BOOTSTRAP_STATUSES, catalog.BOOTSTRAP_STATUS_ID
        )
        if bootstrap is None:
            ctx.logger.debug("bootstrap status unknown yet; not touching static pod files")
            return
        secrets = ctx.find(
            catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, catalog.STATIC_POD_SECRETS_ID
        )
        self_hosted = (
            isinstance(bootstrap.spec, catalog.BootstrapStatusSpec)
            and bootstrap.spec.self_hosted_control_plane
        )
        wanted: dict[str, bytes] = {}
        pods: dict[str, Any] = {}
        if self_hosted:
            ctx.logger.debug("control plane is self-hosted; removing static pod files")
        elif secrets is None:
            ctx.logger.debug("control plane secrets are missing; removing static pod files")
        else:
            for resource in static_pods:
                if resource.metadata.phase is Phase.RUNNING and isinstance(
                    resource.spec, catalog.StaticPodSpec
                ):
                    pod: Any = resource.spec.to_dict()["pod"]
                    pods[resource.id] = pod
                    wanted[manifest_name(resource.id)] = render.dump_yaml(pod).encode()
        new = {pod_id for pod_id in pods if not (self.directory / manifest_name(pod_id)).exists()}
        held: dict[str, str] = {}
        if APISERVER in new and await self._port_taken(pods[APISERVER]):
            held[APISERVER] = "another kube-apiserver holds its port"
        later = [pod_id for pod_id in AFTER_APISERVER if pod_id in new]
        if later and APISERVER in pods and not await self._apiserver_ready(pods[APISERVER]):
            now = time.monotonic()
            if self._waiting_since is None:
                self._waiting_since = now
            if now - self._waiting_since < self.hold_limit:
                held.update((pod_id, "kube-apiserver is not ready") for pod_id in later)
            elif any(pod_id in self._holding for pod_id in later):  # said once
                ctx.logger.warning(
                    "kube-apiserver not ready after %.0f s; writing %s anyway",
                    self.hold_limit,
                    " and ".join(later),
                )
        else:
            self._waiting_since = None
        for pod_id, reason in held.items():
            del wanted[manifest_name(pod_id)]
            if self._holding.get(pod_id) != reason:  # said once, not every second
                ctx.logger.info("holding back static pod %s: %s", pod_id, reason)
        self._holding = held
        if held:
            ctx.requeue_after(READY_RECHECK)
        removed, written = await asyncio.to_thread(self._write_files, wanted)
        for path in removed:
            ctx.logger.info("removing static pod %r", str(path))
        for path in written:
            ctx.logger.info("wrote static pod %r", str(path))

    async def _port_taken(self, pod: Any) -> bool:
        """Whether something already accepts connections on the port of the pod's readiness probe."""
        probe = _readiness_probe(pod)
        if probe is None:
            return False
        _, host, port, _ = probe
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.ready_timeout)
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True

    async def _apiserver_ready(self, pod: Any) -> bool:
        """Whether the API server answers the readiness probe of its pod spec with a 2xx."""
        probe = _readiness_probe(pod)
        if probe is None:
            return True  # no probe to wait on: nothing to hold back for
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        scheme, host, port, path = probe
        url = f"{scheme}://{host}:{port}{path}"
        if self._probe is None:
            # What the kubelet's HTTPS probes do: no certificate check. The answer only decides
            # when a file is written; nothing read from it is trusted.
            self._probe = httpx.AsyncClient(verify=False, timeout=self.ready_timeout, trust_env=False)  # noqa: S501
        try:
            response = await self._probe.get(url)
        except httpx.HTTPError:
            return False
        return response.is_success

    def _write_files(self, wanted: dict[str, bytes]) -> tuple[list[Path], list[Path]]:
        """Make the directory hold exactly ``wanted`` of our files (blocking I/O: run in a thread);
        the files removed and the ones written. Stale files go first: whoever sees a new file
        (the kubelet, a test on the event loop) no longer sees the stale ones."""
        self.directory.mkdir(parents=True, exist_ok=True)
        removed = []
        for path in sorted(self.directory.glob(f"{FILE_PREFIX}*.yaml")):
            if path.name not in wanted:
                path.unlink(missing_ok=True)
                removed.append(path)
        written = []
        for name, data in wanted.items():
            path = self.directory / name
            # 0600 as the original writes them: only the kubelet (root) needs to read a pod spec.
            if fileio.write_if_changed(path, data, mode=fileio.SECRET_MODE):
                written.append(path)
        return removed, written

    # -- statuses ----------------------------------------------------------------------------

    async def _refresh_statuses(self, ctx: ReconcileContext) -> None:
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout, trust_env=False)
        try:
            pods = await kubelet_pods(self._http, self.pods_url)
        except httpx.HTTPError as exc:
            ctx.logger.debug("kubelet pods endpoint %s not available yet: %s", self.pods_url, exc)
            return
        except ValueError as exc:
            ctx.logger.warning("kubelet pods endpoint %s: %s", self.pods_url, exc)
            return
        keep = []
        for pod in pods:
            metadata = pod.get("metadata") or {}
            if (metadata.get("annotations") or {}).get(_CONFIG_SOURCE) != "file":
                continue
            pod_id = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
            spec = catalog.StaticPodStatusSpec(pod_status=pod.get("status") or {})
            outputs.publish(ctx, catalog.CONTROLPLANE_NAMESPACE, catalog.STATIC_POD_STATUSES, pod_id, spec)
            keep.append(pod_id)
        ctx.cleanup(catalog.CONTROLPLANE_NAMESPACE, catalog.STATIC_POD_STATUSES, keep)


async def kubelet_pods(http: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    """The pods of the kubelet's read-only ``/pods`` at ``url``; ``httpx.HTTPError`` when it does
    not answer, ``ValueError`` when the answer is not a PodList."""
    response = await http.get(url)
    response.raise_for_status()
    pod_list = response.json()
    items = (pod_list.get("items") or []) if isinstance(pod_list, dict) else None
    if not isinstance(items, list):
        raise ValueError("answered something other than a PodList")
    return [pod for pod in items if isinstance(pod, dict)]


def _readiness_probe(pod: Any) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of the first container's HTTP readiness probe; None without one."""
    try:
        probe = pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        return (
            str(probe.get("scheme", "HTTP")).lower(),
            str(probe.get("host") or "127.0.0.1"),
            int(probe["port"]),
            str(probe.get("path", "/")),
        )
    except (KeyError, IndexError, TypeError, ValueError):
        return None
