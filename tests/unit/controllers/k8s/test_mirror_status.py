"""MirrorPodStatusController: which mirror pods get the kubelet's status (never-written ones of this
kubelet's static pods, at the same config hash), the patch guarded by the mirror's resourceVersion,
and the running controller on a control plane node only."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from k8s_harness import LocalServer, cluster_admin, eventually, publish_addresses, put, run, settle

from kubeplane.clients import kube
from kubeplane.controllers.k8s import mirror_status
from kubeplane.controllers.secrets import kubernetes as kubernetes_secrets
from kubeplane.resources import State, catalog

pytestmark = pytest.mark.unit

KUBECONFIG = cluster_admin()[1]
READY = {
    "phase": "Running",
    "hostIP": "10.5.0.2",
    "podIP": "10.5.0.2",
    "conditions": [{"type": "Ready", "status": "True"}],
}


NODE = "node1"  # k8s_harness.publish_addresses' hostname


def mirror(
    name: str,
    config_hash: str = "h1",
    *,
    status: dict[str, Any] | None = None,
    version: str | None = "5",
    node: str = NODE,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "kube-system",
        "annotations": {kube.MIRROR_ANNOTATION: config_hash},
    }
    if version is not None:
        metadata["resourceVersion"] = version
    return {
        "metadata": metadata,
        "spec": {"nodeName": node},
        "status": status if status is not None else {"phase": "Pending", "qosClass": "Burstable"},
    }


def static(
    name: str, config_hash: str = "h1", status: dict[str, Any] | None = None, *, node: str = NODE
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "annotations": {
                "kubernetes.io/config.source": "file",
                mirror_status.HASH_ANNOTATION: config_hash,
            },
        },
        "spec": {"nodeName": node},
        "status": READY if status is None else status,
    }


def test_only_unwritten_mirrors_of_this_kubelets_pods_at_the_same_hash_get_its_status() -> None:
    mirrors = [
        mirror("kube-apiserver-cp1", version="7"),
        mirror("kube-scheduler-cp1", status=READY),  # the kubelet wrote it already
        mirror("kube-controller-manager-cp1", "h2"),  # another version: the kubelet replaces it
        mirror("kube-apiserver-cp2"),  # another node's: not in this kubelet's list
        # Another node's, even where something on the kubelet's port claims it.
        mirror("kube-scheduler-cp3", node="cp3"),
        mirror("kube-proxy-cp1", version=None),  # no resourceVersion would guard the patch
        {"metadata": {"name": "coredns-1", "namespace": "kube-system"}, "status": {}},  # not a mirror
        mirror("etcd-cp1"),  # the kubelet has no status with a node IP for it yet
    ]
    kubelet = [
        static("kube-apiserver-cp1"),
        static("kube-scheduler-cp1"),
        static("kube-controller-manager-cp1", "h1"),
        static("kube-scheduler-cp3", node="cp3"),
        static("kube-proxy-cp1"),
        static("etcd-cp1", status={"phase": "Pending"}),
    ]
    assert mirror_status.status_patches(mirrors, kubelet, node=NODE) == {
        "kube-apiserver-cp1": {"metadata": {"resourceVersion": "7"}, "status": READY}
    }


class FakePods:
    """A fake API server's kube-system pods: a list, one watch with ``watched``, status patches."""

    def __init__(self, listed: list[dict[str, Any]], watched: list[tuple[str, dict[str, Any]]]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in listed}
        self.watched = list(watched)
        self.watches = 0
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.conflicts: set[str] = set()
        self.forbidden: set[str] = set()

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == mirror_status.PODS_PATH and request.url.params.get("watch"):
            self.watches += 1
            events, self.watched = self.watched, []
            for _, obj in events:
                self.pods[obj["metadata"]["name"]] = obj
            lines = [json.dumps({"type": kind, "object": obj}) for kind, obj in events]
            return httpx.Response(200, content="\n".join(lines).encode())
        if path == mirror_status.PODS_PATH:
            items = list(self.pods.values())
            return httpx.Response(200, json={"metadata": {"resourceVersion": "9"}, "items": items})
        prefix, name, subresource = path.rsplit("/", 2)
        assert prefix == mirror_status.PODS_PATH and subresource == "status", path
        assert request.method == "PATCH" and request.headers["content-type"] == "application/merge-patch+json"
        body = json.loads(request.content)
        self.patches.append((name, body))
        if name in self.conflicts:
            return httpx.Response(409, json={"kind": "Status", "reason": "Conflict", "code": 409})
        if name in self.forbidden:
            return httpx.Response(403, json={"kind": "Status", "reason": "Forbidden", "code": 403})
        self.pods[name] = {**self.pods[name], "status": body["status"]}
        return httpx.Response(200, json=self.pods[name])


def _controller(pods: FakePods, pods_url: str) -> mirror_status.MirrorPodStatusController:
    return mirror_status.MirrorPodStatusController(
        pods_url=pods_url,
        retry_interval=0.01,
        kube_client=lambda text: kube.KubeClient(text, transport=httpx.MockTransport(pods.handle)),
    )


def _control_plane(state: State) -> None:
    publish_addresses(state)
    certs = catalog.KubernetesSecretSpec(data={"localAdminKubeconfig": KUBECONFIG})
    put(
        state,
        catalog.SECRETS_NAMESPACE,
        catalog.KUBERNETES_SECRETS,
        kubernetes_secrets.KUBERNETES_SECRETS_ID,
        certs,
    )


def test_the_controller_writes_listed_and_watched_mirrors_and_leaves_a_conflict(
    local_server: LocalServer,
) -> None:
    pods = FakePods(
        [
            mirror("kube-proxy-cp1", version="6"),  # refused (403): logged, the others still go
            mirror("kube-apiserver-cp1", version="7"),
            mirror("kube-scheduler-cp1", status=READY),
        ],
        watched=[
            ("ADDED", mirror("kube-controller-manager-cp1", version="8")),
            ("ADDED", mirror("etcd-cp1", version="9")),  # conflicts: the kubelet got there first
        ],
    )
    pods.conflicts.add("etcd-cp1")
    pods.forbidden.add("kube-proxy-cp1")
    kubelet = {
        "items": [
            static("kube-proxy-cp1"),
            static("kube-apiserver-cp1"),
            static("kube-scheduler-cp1"),
            static("kube-controller-manager-cp1"),
            static("etcd-cp1"),
        ]
    }
    url = local_server.serve("/pods", json.dumps(kubelet).encode())
    controller = _controller(pods, url)

    async def body(state: State) -> None:
        _control_plane(state)
        await eventually(lambda: len(pods.patches) == 4, what="four status patches")
        await settle()
        assert pods.patches == [
            ("kube-proxy-cp1", {"metadata": {"resourceVersion": "6"}, "status": READY}),
            ("kube-apiserver-cp1", {"metadata": {"resourceVersion": "7"}, "status": READY}),
            ("kube-controller-manager-cp1", {"metadata": {"resourceVersion": "8"}, "status": READY}),
            ("etcd-cp1", {"metadata": {"resourceVersion": "9"}, "status": READY}),
        ], "each unwritten mirror once, the written one never"
        assert pods.pods["kube-apiserver-cp1"]["status"] == READY
        assert pods.pods["etcd-cp1"]["status"]["phase"] == "Pending", "a conflict is left to the kubelet"

    run([controller], body)


def test_nothing_is_watched_without_the_local_admin_kubeconfig(local_server: LocalServer) -> None:
    pods = FakePods([mirror("kube-apiserver-cp1")], watched=[])
    url = local_server.serve("/pods", json.dumps({"items": [static("kube-apiserver-cp1")]}).encode())
    controller = _controller(pods, url)

    async def body(state: State) -> None:
        publish_addresses(state)
        put(
            state,
            catalog.SECRETS_NAMESPACE,
            catalog.KUBERNETES_SECRETS,
            kubernetes_secrets.KUBERNETES_SECRETS_ID,
            catalog.KubernetesSecretSpec(data={}),
        )
        await settle()
        assert pods.watches == 0 and pods.patches == []

    run([controller], body)
