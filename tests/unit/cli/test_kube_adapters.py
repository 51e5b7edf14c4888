"""The CLI's Kubernetes API adapters over KubeClient: the cluster operation Lease (resourceVersion
preconditions, MicroTime), the upgrade's reads, strategic-merge image patch and server-side apply.
Requests are answered by ``httpx.MockTransport``."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from kubeplane import pki
from kubeplane.cli import lease, upgrade
from kubeplane.clients import kube
from kubeplane.ops import oplock
from kubeplane.ops import upgrade as ops_upgrade

pytestmark = pytest.mark.unit

CA = pki.new_ca("kubernetes")
KUBECONFIG = pki.kubeconfig(
    cluster_name="c",
    server="https://10.5.0.1:6443",
    ca_cert=CA.cert,
    user="admin",
    client=pki.issue(ca=CA, common_name="admin", organizations=["system:masters"], usages=("client",)),
)
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kubeplane-cluster-operation"
ROLE = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}}
T0 = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def run(handler: Callable[[httpx.Request], httpx.Response], use: Callable[[kube.KubeClient], Any]) -> Any:
    async def scenario() -> Any:
        async with kube.KubeClient(KUBECONFIG, transport=httpx.MockTransport(handler)) as api:
            return await use(api)

    return asyncio.run(scenario())


def test_lease_read_parses_micro_times_and_resource_version() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == LEASE_PATH
        spec = {
            "holderIdentity": "me",
            "acquireTime": "2026-01-02T03:04:05.000000Z",
            "renewTime": "2026-01-02T03:04:15.500000Z",
            "leaseDurationSeconds": 30,
        }
        return httpx.Response(200, json={"metadata": {"resourceVersion": "7"}, "spec": spec})

    found = run(handler, lambda api: lease.KubeLeaseStore(api).read())
    assert found == oplock.Lease(
        holder="me",
        acquired=T0,
        renewed=T0 + datetime.timedelta(seconds=10.5),
        duration=30,
        resource_version="7",
    )
    assert run(lambda r: httpx.Response(404, json={}), lambda api: lease.KubeLeaseStore(api).read()) is None


def test_lease_writes_name_the_version_read_and_lose_on_conflict() -> None:
    seen: list[httpx.Request] = []
    answers = [201, 409, 200, 409, 404, 200, 409]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(answers.pop(0), json={})

    held = oplock.Lease(holder="me", acquired=T0, renewed=T0, duration=30, resource_version="7")

    async def use(api: kube.KubeClient) -> list[object]:
        store = lease.KubeLeaseStore(api)
        new = oplock.Lease(holder="me", acquired=T0, renewed=T0)
        return [
            await store.create(new),
            await store.create(new),
            await store.replace(held),
            await store.replace(held),
            await store.replace(held),
            await store.delete(held),
            await store.delete(held),  # changed meanwhile: not ours to remove, no error
        ]

    assert run(handler, use) == [True, False, True, False, False, None, None]
    assert [r.method for r in seen] == ["POST", "POST", "PUT", "PUT", "PUT", "DELETE", "DELETE"]
    created = json.loads(seen[0].content)
    assert created["spec"]["acquireTime"] == "2026-01-02T03:04:05.000000Z"
    assert "resourceVersion" not in created["metadata"]
    assert json.loads(seen[2].content)["metadata"]["resourceVersion"] == "7"
    assert json.loads(seen[5].content)["preconditions"] == {"resourceVersion": "7"}


def test_upgrade_adapter_reads_patches_and_applies() -> None:
    seen: list[httpx.Request] = []
    node = {
        "metadata": {"name": "cp1", "labels": {"node-role.kubernetes.io/control-plane": ""}},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": "cp1"},
                {"type": "InternalIP", "address": "10.5.0.2"},
            ],
            "nodeInfo": {"kubeletVersion": "v1.20.2"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/api/v1/nodes":
            return httpx.Response(200, json={"items": [node, {"metadata": {"name": "nip"}, "status": {}}]})
        if request.url.path == "/api/v1/nodes/cp1":
            return httpx.Response(200, json=node)
        if request.url.path == "/apis/rbac.authorization.k8s.io/v1":
            resource = {"kind": "ClusterRole", "name": "clusterroles", "namespaced": False}
            return httpx.Response(200, json={"resources": [resource]})
        if request.method == "GET":
            return httpx.Response(404, json={"message": "not found"})
        return httpx.Response(200, json={})

    async def use(api: kube.KubeClient) -> list[object]:
        adapter = upgrade.KubeAPIAdapter(api)
        nodes = await adapter.nodes()
        kubelet = await adapter.kubelet("cp1")
        missing = await adapter.daemonset("kube-system", "kube-proxy")
        await adapter.set_daemonset_image("kube-system", "kube-proxy", container="kube-proxy", image="p:2")
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "r"},
        }
        await adapter.apply_objects([role])
        return [nodes, kubelet, missing]

    nodes, kubelet, missing = run(handler, use)
    assert nodes == [ops_upgrade.ClusterNode(name="cp1", address="10.5.0.2", control_plane=True)]
    assert kubelet == ops_upgrade.KubeletState(version="v1.20.2", ready=True)
    assert missing is None
    patch, _, applied = seen[-3:]
    assert patch.headers["Content-Type"] == "application/strategic-merge-patch+json"
    assert patch.url.path == "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy"
    assert applied.url.path == "/apis/rbac.authorization.k8s.io/v1/clusterroles/r"
    assert applied.headers["Content-Type"] == "application/apply-patch+yaml"
    assert dict(applied.url.params) == {"fieldManager": "kubeplane-upgrade", "force": "true"}
