"""The cluster operation Lease (:mod:`kubeplane.ops.oplock`) over the official Kubernetes client.

Times are sent as strings in the API's MicroTime format (six fractional digits): the client
would serialize a datetime without them when its microseconds are zero, which the API refuses.
"""

from __future__ import annotations

import datetime
from typing import Any

from kubernetes import client as k8s_client

from kubeplane.clients import kube as kube_client
from kubeplane.ops import oplock


def _micro(stamp: datetime.datetime) -> str:
    return stamp.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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

    def __init__(self, api_client: Any) -> None:
        self._api = k8s_client.CoordinationV1Api(api_client)

    async def read(self) -> oplock.Lease | None:
        try:
            found = await kube_client.call(self._api.read_namespaced_lease, oplock.NAME, oplock.NAMESPACE)
        except k8s_client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        spec = found.spec
        epoch = datetime.datetime.fromtimestamp(0, datetime.UTC)
        return oplock.Lease(
            holder=spec.holder_identity or "",
            acquired=spec.acquire_time or epoch,
            renewed=spec.renew_time or spec.acquire_time or epoch,
            duration=spec.lease_duration_seconds or oplock.DURATION,
            resource_version=found.metadata.resource_version,
        )

    async def create(self, lease: oplock.Lease) -> bool:
        try:
            await kube_client.call(self._api.create_namespaced_lease, oplock.NAMESPACE, _body(lease))
        except k8s_client.ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def replace(self, lease: oplock.Lease) -> bool:
        try:
            await kube_client.call(
                self._api.replace_namespaced_lease, oplock.NAME, oplock.NAMESPACE, _body(lease)
            )
        except k8s_client.ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def delete(self, lease: oplock.Lease) -> None:
        options = k8s_client.V1DeleteOptions(
            preconditions=k8s_client.V1Preconditions(resource_version=lease.resource_version)
        )
        try:
            await kube_client.call(
                self._api.delete_namespaced_lease, oplock.NAME, oplock.NAMESPACE, body=options
            )
        except k8s_client.ApiException as exc:
            if exc.status not in (404, 409):
                raise
