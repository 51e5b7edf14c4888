"""The cluster operation Lease (:mod:`kubeplane.ops.oplock`) over :class:`kubeplane.clients.kube.KubeClient`.

Times are sent as strings in the API's MicroTime format (six fractional digits, which the API
requires even when the microseconds are zero). Replace and delete name the ``resourceVersion``
read, so a Lease another process changed meanwhile is never overwritten or removed.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any

from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube as kube_client
from kubeplane.ops import oplock

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{oplock.NAMESPACE}/leases"
LEASE = f"{LEASES}/{oplock.NAME}"


def _micro(stamp: datetime.datetime) -> str:
    return stamp.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(value: object) -> datetime.datetime | None:
    return datetime.datetime.fromisoformat(value) if isinstance(value, str) and value else None


def _body(lease: oplock.Lease) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": oplock.NAME, "namespace": oplock.NAMESPACE}
    if lease.resource_version is not None:
        metadata["resourceVersion"] = lease.resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": lease.holder,
            "acquireTime": _micro(lease.acquired),
            "renewTime": _micro(lease.renewed),
            "leaseDurationSeconds": lease.duration,
        },
    }


class KubeLeaseStore:
    """:class:`kubeplane.ops.oplock.LeaseStore` for ``kube-system/kubeplane-cluster-operation``."""

    def __init__(self, api: kube_client.KubeClient) -> None:
        self._api = api

    async def read(self) -> oplock.Lease | None:
        found = await self._api.get_or_none(LEASE)
        if found is None:
            return None
        spec = found.get("spec") or {}
        epoch = datetime.datetime.fromtimestamp(0, datetime.UTC)
        acquired = _time(spec.get("acquireTime"))
        return oplock.Lease(
            holder=spec.get("holderIdentity") or "",
            acquired=acquired or epoch,
            renewed=_time(spec.get("renewTime")) or acquired or epoch,
            duration=spec.get("leaseDurationSeconds") or oplock.DURATION,
            resource_version=(found.get("metadata") or {}).get("resourceVersion"),
        )

    async def create(self, lease: oplock.Lease) -> bool:
        try:
            await self._api.create(LEASES, _body(lease))
        except client_errors.KubeConflict:
            return False
        return True

    async def replace(self, lease: oplock.Lease) -> bool:
        try:
            await self._api.replace(LEASE, _body(lease))
        except (client_errors.KubeNotFound, client_errors.KubeConflict):
            return False
        return True

    async def delete(self, lease: oplock.Lease) -> None:
        with contextlib.suppress(client_errors.KubeNotFound, client_errors.KubeConflict):
            await self._api.delete(LEASE, resource_version=lease.resource_version)
