"""ManifestApplyController: ``Manifests`` (controlplane + extras) → objects in the API server,
with the outcome in ``controlplane/ManifestStatuses/manifests`` {manifestsApplied, errors}.

Runs only once the BootstrapStatus says the control plane is not self-hosted, and needs the
local admin kubeconfig (``KubernetesSecrets k8s-certs``) and the etcd client certificate
(``EtcdSecrets etcd``). While the API server does not answer it logs ``control plane endpoint
not up yet`` and tries again after ``retry_interval`` seconds.

Every control plane node runs this controller; the etcd lock ``kubeplane:v1:manifestApplyMutex``
(held on a lease, so a holder that dies frees it after ``lock_ttl`` seconds) makes them take turns.
Objects are applied in manifest id order, Namespaces first and CustomResourceDefinitions next
so that what depends on them finds them.

The endpoint check, the lock wait and the apply run as the controller's background task
(``ctx.start_task``), so a reconcile returns at once however long another node holds the lock.
The reconcile that the task's end queues publishes its outcome, and starts another apply only
when the inputs changed meanwhile; changes seen while an apply runs wait for it, as changes
during a reconcile wait for that reconcile.

Default mode, as the original: each object is read and created when missing, never updated or
deleted. Unlike the original, which stopped at the first failure, a failing object is recorded
against its manifest and the rest is still applied; the status lists the manifests applied
completely and an error per manifest that was not, and failures are retried after
``retry_interval`` seconds.

``sync=True`` (opt-in) makes existing objects follow the manifests through server-side apply
(field manager ``kubeplane``, conflicts forced): a dry run first, and when it differs from the
live object the diff is logged before the real apply. Nothing is ever deleted.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.controllers import ControllerError
from kubeplane.controllers.k8s import etcd_access, outputs, render
from kubeplane.controllers.secrets import kubernetes as kubernetes_secrets
from kubeplane.resources import Resource, catalog
from kubeplane.runtime import ControllerLogger, Input, Output, ReconcileContext

STATUS_ID = "manifests"
#: The controller's background task that waits for the endpoint and the lock, then applies.
APPLY_TASK = "apply"
FIELD_MANAGER = "kubeplane"
_KIND_RANK = {"Namespace": 0, "CustomResourceDefinition": 1}
# Fields the server owns; left out of sync diffs so only what a manifest sets shows up.
_SERVER_METADATA = ("managedFields", "resourceVersion", "generation", "uid", "creationTimestamp", "selfLink")


class ApplyError(ControllerError):
    """One object could not be applied; the message names the object and the reason."""


def apply_order(
    manifests: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
) -> list[tuple[str, dict[str, Any]]]:
    """(manifest id, object) pairs: manifests by id, objects in order, Namespaces then CRDs first."""
    pairs = [
        (manifest_id, dict(obj))
        for manifest_id, items in sorted(manifests, key=lambda pair: pair[0])
        for obj in items
    ]
    ranked = sorted(
        enumerate(pairs), key=lambda item: (_KIND_RANK.get(str(item[1][1].get("kind")), 2), item[0])
    )
    return [pair for _, pair in ranked]


def describe(obj: Mapping[str, Any]) -> str:
    """``apiVersion/Kind/[namespace/]name`` as the apply log lines show objects."""
    metadata = obj.get("metadata") or {}
    namespace = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
    return f"{obj.get('apiVersion', '?')}/{obj.get('kind', '?')}/{namespace}{metadata.get('name', '?')}"


def _for_diff(obj: Mapping[str, Any] | None) -> list[str]:
    if obj is None:
        return []
    shown = {key: value for key, value in obj.items() if key != "status"}
    metadata = {k: v for k, v in (shown.get("metadata") or {}).items() if k not in _SERVER_METADATA}
    annotations = {
        k: v
        for k, v in (metadata.get("annotations") or {}).items()
        if k != "kubectl.kubernetes.io/last-applied-configuration"
    }
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    shown["metadata"] = metadata
    return render.dump_yaml(shown).splitlines(keepends=True)


class Applier:
    """Applies objects through one API connection (see the module docstring for the modes)."""

    def __init__(self, api: kube.KubeClient, *, sync: bool, logger: ControllerLogger) -> None:
        self.api = api
        self.sync = sync
        self.logger = logger

    async def apply(self, obj: dict[str, Any]) -> None:
        """Create (or with ``sync`` server-side apply) one object; raises :class:`ApplyError`."""
        name = describe(obj)
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        fields = (api_version, kind, metadata.get("name"))
        if not all(isinstance(value, str) and value for value in fields):
            raise ApplyError(f"{name}: not a Kubernetes object; it needs apiVersion, kind and metadata.name")
        assert isinstance(api_version, str) and isinstance(kind, str)  # narrowed above, for mypy
        try:
            resource = await self.api.resource(api_version, kind)
        except client_errors.KubeError as exc:
            raise ApplyError(f"{name}: {exc}") from exc
        namespace = (metadata.get("namespace") or "default") if resource.namespaced else None
        if namespace is not None:
            obj = {**obj, "metadata": {**metadata, "namespace": namespace}}
            name = describe(obj)
        path = resource.path(namespace=namespace, name=metadata["name"])
        try:
            live = await self.api.get_or_none(path)
        except client_errors.KubeError as exc:
            raise ApplyError(f"{name}: reading it failed: {exc.answer}") from exc
        if self.sync:
            await self._server_side_apply(obj, path=path, name=name, live=live)
        elif live is None:
            try:
                await self.api.create(resource.path(namespace=namespace), obj)
            except client_errors.KubeConflict:
                return  # another writer created it meanwhile; create-only is satisfied
            except client_errors.KubeError as exc:
                raise ApplyError(f"{name}: creating it failed: {exc.answer}") from exc
            self.logger.info("created %s", name)

    async def _server_side_apply(
        self, obj: dict[str, Any], *, path: str, name: str, live: dict[str, Any] | None
    ) -> None:
        try:
            dry = await self.api.apply(path, obj, field_manager=FIELD_MANAGER, force=True, dry_run=True)
        except client_errors.KubeError as exc:
            raise ApplyError(f"{name}: server-side apply dry run failed: {exc.answer}") from exc
        diff = "".join(difflib.unified_diff(_for_diff(live), _for_diff(dry), "live", "manifest"))
        if not diff:
            return
        self.logger.info("applying %s with changes:\n%s", name, diff)
        try:
            await self.api.apply(path, obj, field_manager=FIELD_MANAGER, force=True)
        except client_errors.KubeError as exc:
            raise ApplyError(f"{name}: server-side apply failed: {exc.answer}") from exc
        self.logger.info("%s %s", "created" if live is None else "updated", name)


async def apply_manifests(
    applier: Applier, manifests: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]
) -> catalog.ManifestStatusSpec:
    """Apply every object, whatever fails; the status says which manifests made it."""
    failures: dict[str, list[str]] = {}
    for manifest_id, obj in apply_order(manifests):
        try:
            await applier.apply(obj)
        except ApplyError as exc:
            applier.logger.error("manifest %s: %s", manifest_id, exc)
            failures.setdefault(manifest_id, []).append(str(exc))
    ids = sorted(manifest_id for manifest_id, _ in manifests)
    return catalog.ManifestStatusSpec(
        manifests_applied=[manifest_id for manifest_id in ids if manifest_id not in failures],
        errors={manifest_id: "; ".join(messages) for manifest_id, messages in failures.items()},
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What one apply works from; plans are equal when every input resource has the same version."""

    kubeconfig: str = dataclasses.field(compare=False)
    etcd: Resource = dataclasses.field(compare=False)
    manifests: Sequence[tuple[str, Sequence[Mapping[str, Any]]]] = dataclasses.field(compare=False)
    versions: tuple[tuple[str, str, str, int], ...]


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """How one apply ended: the status to publish (None: not applied, retry later)."""

    plan: _Plan
    status: catalog.ManifestStatusSpec | None


class ManifestApplyController:
    """Applies the bootstrap and extra manifests to the API server (see module docstring)."""

    name = "k8s.ManifestApplyController"
    inputs = (
        Input(catalog.CONTROLPLANE_NAMESPACE, catalog.MANIFESTS),
        Input(catalog.EXTRAS_NAMESPACE, catalog.MANIFESTS),
        Input(catalog.RUNTIME_NAMESPACE, catalog.BOOTSTRAP_STATUSES, catalog.BOOTSTRAP_STATUS_ID),
        Input(
            catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, kubernetes_secrets.KUBERNETES_SECRETS_ID
        ),
        Input(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID),
    )
    outputs = (Output(catalog.MANIFEST_STATUSES),)

    def __init__(
        self,
        *,
        etcd_endpoints: Sequence[str] = etcd_access.DEFAULT_ENDPOINTS,
        sync: bool = False,
        retry_interval: float = 5.0,
        lock_ttl: int = 30,
    ) -> None:
        self.etcd = etcd_access.EtcdConnection(etcd_endpoints)
        self.sync = sync
        self.retry_interval = retry_interval
        self.lock_ttl = lock_ttl

    async def reconcile(self, ctx: ReconcileContext) -> None:
        plan = self._plan(ctx)
        running = ctx.task(APPLY_TASK)
        if running is not None and not running.done():
            return  # its end queues this controller; what changed meanwhile is looked at then
        finished = await ctx.stop_task(APPLY_TASK)
        if finished is not None and not finished.cancelled():
            outcome: _Outcome = finished.result()  # an unexpected error fails this reconcile: backoff
            if outcome.status is not None:
                namespace, type_name = catalog.CONTROLPLANE_NAMESPACE, catalog.MANIFEST_STATUSES
                outputs.publish(ctx, namespace, type_name, STATUS_ID, outcome.status)
            if plan == outcome.plan:
                if outcome.status is None or outcome.status.errors:
                    ctx.requeue_after(self.retry_interval)
                return
        if plan is not None:
            ctx.start_task(APPLY_TASK, self._apply(plan, ctx.logger))

    def _plan(self, ctx: ReconcileContext) -> _Plan | None:
        """The inputs of an apply, None while there is nothing to apply."""
        bootstrap = ctx.find(
            catalog.RUNTIME_NAMESPACE, catalog.BOOTSTRAP_STATUSES, catalog.BOOTSTRAP_STATUS_ID
        )
        if bootstrap is None or not isinstance(bootstrap.spec, catalog.BootstrapStatusSpec):
            return None
        if bootstrap.spec.self_hosted_control_plane:
            ctx.logger.debug("control plane is self-hosted; not applying manifests")
            return None
        k8s = ctx.find(
            catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, kubernetes_secrets.KUBERNETES_SECRETS_ID
        )
        etcd = ctx.find(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID)
        kubeconfig = str(k8s.spec.to_dict().get("localAdminKubeconfig") or "") if k8s else ""
        if not kubeconfig or k8s is None or etcd is None:
            return None
        resources = [
            resource
            for namespace in (catalog.CONTROLPLANE_NAMESPACE, catalog.EXTRAS_NAMESPACE)
            for resource in ctx.list(namespace, catalog.MANIFESTS)
            if isinstance(resource.spec, catalog.ManifestSpec)
        ]
        if not resources:
            return None
        return _Plan(
            kubeconfig=kubeconfig,
            etcd=etcd,
            manifests=[(resource.id, resource.spec.to_dict()["items"]) for resource in resources],
            versions=tuple(
                (item.metadata.namespace, item.metadata.type, item.id, item.metadata.version)
                for item in (bootstrap, k8s, etcd, *resources)
            ),
        )

    async def _apply(self, plan: _Plan, logger: ControllerLogger) -> _Outcome:
        """Wait for the endpoint and the lock, then apply (the background task, see module docstring)."""
        async with kube.KubeClient(plan.kubeconfig) as api:
            try:
                code, text = await api.raw_get("/version")
                up, reason = code == HTTPStatus.OK, f"{code} {text[:200].strip()}"
            except client_errors.KubeError as exc:
                up, reason = False, str(exc)
            if not up:
                logger.info("control plane endpoint not up yet, will retry: %s", reason)
                return _Outcome(plan, None)
            client = await self.etcd.client(plan.etcd)
            try:
                async with client.lock(etcd_access.MANIFEST_APPLY_MUTEX, ttl=self.lock_ttl):
                    status = await apply_manifests(
                        Applier(api, sync=self.sync, logger=logger), plan.manifests
                    )
            except client_errors.EtcdError as exc:
                logger.info("cannot take the manifest apply mutex in etcd, will retry: %s", exc)
                return _Outcome(plan, None)
        return _Outcome(plan, status)
