"""``kubeplane reset``: the Kubernetes side of leaving the cluster, around the node's own reset.

The node resets itself (:meth:`kubeplane.agent.node.Node.reset`: etcd leave, services stopped,
state wiped). What needs cluster credentials is done here, with the admin kubeconfig, because a
worker holds none that may evict pods:

1. ``cordon``: ``spec.unschedulable`` on the Node, so nothing new lands there;
2. ``drain``: every pod bound to the node is evicted through the Eviction API (so
   PodDisruptionBudgets are honoured: a 429 is retried until the deadline), except mirror pods
   (the node's static pods: they go with its kubelet) and DaemonSet pods (their controller would
   put them back at once); then wait until the evicted pods are gone;
3. after the node's reset answered (its kubelet is stopped, so it cannot register again):
   delete the Node object.

Each step re-reads the live state first and is skipped when already done, so re-running a reset
that failed half-way continues it (see :mod:`kubeplane.plan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubeplane import retry
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube as kube_client


def evictable(pod: Mapping[str, Any]) -> bool:
    """Whether draining evicts ``pod``: not a mirror (static) pod, not a DaemonSet's, not finished."""
    metadata = pod.get("metadata") or {}
    if kube_client.MIRROR_ANNOTATION in (metadata.get("annotations") or {}):
        return False
    if any(owner.get("kind") == "DaemonSet" for owner in metadata.get("ownerReferences") or []):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def pod_ref(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


async def cordon(api: kube_client.KubeClient, name: str) -> bool:
    """Mark Node ``name`` unschedulable; False when it already was (or does not exist)."""
    node = await api.get_or_none(kube_client.node_path(name))
    if node is None or (node.get("spec") or {}).get("unschedulable"):
        return False
    await api.patch(kube_client.node_path(name), {"spec": {"unschedulable": True}}, patch_type="merge")
    return True


async def pods_to_evict(api: kube_client.KubeClient, name: str) -> list[dict[str, Any]]:
    pods = await api.list("/api/v1/pods", field_selector=f"spec.nodeName={name}")
    return [pod for pod in pods if evictable(pod)]


async def drain(api: kube_client.KubeClient, name: str, *, timeout: float) -> list[str]:
    """Evict the node's pods (see the module docstring) until none is left; returns the pods
    evicted. Raises :class:`kubeplane.retry.WaitTimeout` naming the pods still there."""
    evicted: list[str] = []
    refused: dict[str, str] = {}

    async def evict_all() -> bool:
        pending = await pods_to_evict(api, name)
        for pod in pending:
            metadata = pod["metadata"]
            path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/eviction"
            body = {
                "apiVersion": "policy/v1beta1",
                "kind": "Eviction",
                "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]},
            }
            try:
                await api.create(path, body)
            except client_errors.KubeNotFound:
                continue  # gone already
            except client_errors.KubeUnavailable as exc:
                refused[pod_ref(pod)] = exc.reason or str(exc)  # a disruption budget: "not now"
                continue
            refused.pop(pod_ref(pod), None)
            if pod_ref(pod) not in evicted:
                evicted.append(pod_ref(pod))
        if pending:
            still = ", ".join(
                pod_ref(p) + (f" ({refused[pod_ref(p)]})" if pod_ref(p) in refused else "")
                for p in pending[:5]
            )
            raise retry.NotYet(f"pods still on node {name}: {still}")
        return True

    wait = retry.Wait(
        what=f"the pods of node {name} to be evicted",
        timeout=timeout,
        retry_on=(client_errors.KubeUnavailable,),
        backoff=retry.fixed(1.0),
    )
    await wait.poll_async(evict_all)
    return evicted


async def delete_node(api: kube_client.KubeClient, name: str) -> bool:
    """Delete Node ``name``; False when it was gone already."""
    try:
        await api.delete(kube_client.node_path(name))
    except client_errors.KubeNotFound:
        return False
    return True


def describe(evicted: Sequence[str]) -> str:
    return f"evicted {len(evicted)} pod(s)" + (f": {', '.join(evicted[:5])}" if evicted else "")
