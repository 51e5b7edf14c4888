"""ManifestApply and BootstrapStatus controllers against a real etcd and the toolchain's kube-apiserver.

The controllers run on a real State + Runtime; inputs that other controllers produce on a node
(root secrets, Kubernetes and etcd secrets) are published into the state by the test.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import dynamic
from kubernetes.dynamic import exceptions as dynamic_errors
from official_client import api_client

from kubeplane.config import generate as gen
from kubeplane.controllers.k8s import etcd_access
from kubeplane.controllers.k8s.bootstrap_status import BootstrapStatusController
from kubeplane.controllers.k8s.control_plane import K8sControlPlaneController
from kubeplane.controllers.k8s.manifest import ManifestController
from kubeplane.controllers.k8s.manifest_apply import ManifestApplyController
from kubeplane.resources import Resource, Spec, State, catalog
from kubeplane.runtime import Controller, Runtime

if TYPE_CHECKING:
    from conftest import ApiServer, EtcdServer

pytestmark = pytest.mark.integration

BOOTSTRAP_TOKEN = "abcdef.0123456789abcdef"
STATUS = (catalog.CONTROLPLANE_NAMESPACE, catalog.MANIFEST_STATUSES, "manifests")
BOOTSTRAP = (catalog.RUNTIME_NAMESPACE, catalog.BOOTSTRAP_STATUSES, catalog.BOOTSTRAP_STATUS_ID)


def put(state: State, namespace: str, type_name: str, resource_id: str, spec: Spec) -> Resource:
    current = state.find(namespace, type_name, resource_id)
    if current is None:
        return state.create(namespace, type_name, resource_id, spec=spec)
    return state.update(namespace, type_name, resource_id, spec=spec, version=current.metadata.version)


def publish_etcd_secrets(state: State, etcd: EtcdServer) -> None:
    client = {"crt": etcd.client.cert.decode(), "key": etcd.client.key.decode()}
    spec = catalog.EtcdSecretSpec(data={"ca": etcd.ca.cert.decode(), "client": client})
    put(state, catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID, spec)


def publish_node_inputs(state: State, *, server: ApiServer, etcd: EtcdServer) -> None:
    """What the agent and the secrets controllers would have published on a control plane node."""
    configs = gen.generate(gen.GenOptions(cluster_name="test", endpoint="127.0.0.1"), gen.new_secrets())
    doc = copy.deepcopy(dict(configs.documents["controlplane"]))
    put(
        state,
        catalog.CONFIG_NAMESPACE,
        catalog.MACHINE_CONFIGS,
        catalog.MACHINE_CONFIG_ID,
        catalog.MachineConfigSpec(data=doc),
    )
    addresses = catalog.NodeAddressesSpec(hostname="node1", addresses=["127.0.0.1"])
    put(state, catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID, addresses)
    root = catalog.RootSecretSpec(data={"bootstrapToken": BOOTSTRAP_TOKEN})
    put(state, catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, "k8s", root)
    certs = catalog.KubernetesSecretSpec(data={"localAdminKubeconfig": server.admin_kubeconfig})
    put(state, catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, "k8s-certs", certs)
    publish_etcd_secrets(state, etcd)


def run(controllers: list[Controller], body: Callable[[State], Awaitable[None]]) -> None:
    async def main() -> None:
        state = State()
        runtime = Runtime(state, backoff_initial=0.05, backoff_max=1.0)
        for controller in controllers:
            runtime.register(controller)
        async with runtime:
            await body(state)
        for controller in controllers:
            connection = getattr(controller, "etcd", None)
            if isinstance(connection, etcd_access.EtcdConnection):
                await connection.aclose()

    asyncio.run(main())


async def eventually(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def status_of(state: State) -> dict[str, Any] | None:
    resource = state.find(*STATUS)
    return resource.spec.to_dict() if resource else None


def bad_extras() -> catalog.ManifestSpec:
    return catalog.ManifestSpec(
        items=[
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name"}, "data": {"a": "1"}},
            {"apiVersion": "v1", "metadata": {"name": "no-kind"}},
            {"apiVersion": "example.test/v1", "kind": "Unknown", "metadata": {"name": "x"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "good-cm"}, "data": {"a": "1"}},
        ]
    )


def test_applies_every_bootstrap_object_and_reports_bad_ones(
    start_apiserver: Callable[..., ApiServer],
    etcd_server: EtcdServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = start_apiserver("127.0.0.1")
    applied_after: list[float] = []

    async def body(state: State) -> None:
        publish_node_inputs(state, server=server, etcd=etcd_server)
        put(state, catalog.EXTRAS_NAMESPACE, catalog.MANIFESTS, "99-bad", bad_extras())
        start = time.monotonic()
        status = await eventually(lambda: status_of(state), timeout=60, what="ManifestStatuses")
        applied_after.append(time.monotonic() - start)
        bootstrap_ids = [
            resource.id for resource in state.list(catalog.CONTROLPLANE_NAMESPACE, catalog.MANIFESTS)
        ]
        assert "00-kubelet-bootstrapping-token" in bootstrap_ids and "05-flannel" in bootstrap_ids
        assert status["manifestsApplied"] == bootstrap_ids
        assert list(status["errors"]) == ["99-bad"]
        error = status["errors"]["99-bad"]
        assert "v1/ConfigMap/default/Bad_Name: creating it failed: 422" in error
        assert "not a Kubernetes object" in error
        assert "does not serve kind Unknown in example.test/v1" in error

        # Every object of every bootstrap manifest exists, checked with the official client.
        client = dynamic.DynamicClient(
            api_client(server.admin_kubeconfig), cache_file=str(tmp_path / "discovery.json")
        )
        manifest_objects = [
            obj
            for resource in state.list(catalog.CONTROLPLANE_NAMESPACE, catalog.MANIFESTS)
            for obj in resource.spec.to_dict()["items"]
        ]
        missing = []
        for obj in manifest_objects:
            api = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            namespace = obj["metadata"].get("namespace") if api.namespaced else None
            try:
                await asyncio.to_thread(api.get, name=obj["metadata"]["name"], namespace=namespace)
            except dynamic_errors.NotFoundError:
                missing.append(f"{obj['kind']}/{obj['metadata']['name']}")
        assert missing == []
        configmaps = client.resources.get(api_version="v1", kind="ConfigMap")
        assert api_get(configmaps, "good-cm", "default")["data"] == {"a": "1"}

    with caplog.at_level(logging.INFO, logger="controller-runtime"):
        run(
            [
                K8sControlPlaneController(),
                ManifestController(),
                BootstrapStatusController(etcd_endpoints=[etcd_server.endpoint], watch_window=5),
                ManifestApplyController(etcd_endpoints=[etcd_server.endpoint], retry_interval=30),
            ],
            body,
        )
    messages = [record.getMessage() for record in caplog.records]
    assert (
        f"k8s.ManifestApplyController: created v1/Secret/kube-system/bootstrap-token-{BOOTSTRAP_TOKEN[:6]}"
        in (messages)
    )
    assert (
        "k8s.ManifestApplyController: created rbac.authorization.k8s.io/v1/ClusterRole/psp:privileged"
        in messages
    )
    print(f"\nbootstrap manifests applied {applied_after[0]:.2f}s after the inputs were published")


def api_get(api: Any, name: str, namespace: str) -> dict[str, Any]:
    return dict(api.get(name=name, namespace=namespace).to_dict())


def test_waits_for_the_endpoint_and_the_mutex_then_syncs(
    start_apiserver: Callable[..., ApiServer], etcd_server: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_apiserver("127.0.0.1")
    configmap: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "synced"}}

    async def body(state: State) -> None:
        # An API server nobody listens on first: "not up yet", retried.
        down = server.admin_kubeconfig.replace(server.url, "https://127.0.0.1:9")
        put(
            state,
            catalog.SECRETS_NAMESPACE,
            catalog.KUBERNETES_SECRETS,
            "k8s-certs",
            catalog.KubernetesSecretSpec(data={"localAdminKubeconfig": down}),
        )
        publish_etcd_secrets(state, etcd_server)
        put(state, *BOOTSTRAP, catalog.BootstrapStatusSpec(self_hosted_control_plane=False))
        manifest = catalog.ManifestSpec(items=[{**configmap, "data": {"v": "1"}}])
        put(state, catalog.EXTRAS_NAMESPACE, catalog.MANIFESTS, "99-sync", manifest)
        await eventually(
            lambda: any("control plane endpoint not up yet" in r.getMessage() for r in caplog.records),
            timeout=10,
            what="the not-up-yet log line",
        )
        async with etcd_server.client_for() as etcd, etcd.lock(etcd_access.MANIFEST_APPLY_MUTEX, ttl=10):
            certs = catalog.KubernetesSecretSpec(data={"localAdminKubeconfig": server.admin_kubeconfig})
            put(state, catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, "k8s-certs", certs)
            # The controller queues behind the holder: etcd's lock keeps one key per contender.
            for _ in range(100):
                contenders = await etcd.get(etcd_access.MANIFEST_APPLY_MUTEX + b"/", prefix=True)
                if contenders.count == 2:
                    break
                await asyncio.sleep(0.05)
            assert contenders.count == 2, "the controller did not ask for the mutex"
            await asyncio.sleep(1)
            assert status_of(state) is None, "nothing is applied while another holder has the mutex"
        await eventually(lambda: status_of(state), timeout=20, what="apply after the mutex is released")
        assert status_of(state) == {"manifestsApplied": ["99-sync"], "errors": {}}

        # Sync mode: a changed manifest reaches the existing object, with the diff logged first.
        manifest = catalog.ManifestSpec(items=[{**configmap, "data": {"v": "2"}}])
        put(state, catalog.EXTRAS_NAMESPACE, catalog.MANIFESTS, "99-sync", manifest)
        api = api_client(server.admin_kubeconfig)
        client = dynamic.DynamicClient(api, cache_file=None)
        configmaps = client.resources.get(api_version="v1", kind="ConfigMap")
        await eventually(
            lambda: api_get(configmaps, "synced", "default")["data"] == {"v": "2"},
            timeout=20,
            what="the ConfigMap updated by server-side apply",
        )

    controller = ManifestApplyController(etcd_endpoints=[etcd_server.endpoint], sync=True, retry_interval=0.5)
    with caplog.at_level(logging.INFO, logger="controller-runtime"):
        run([controller], body)
    diffs = [
        r.getMessage() for r in caplog.records if "applying v1/ConfigMap/default/synced" in r.getMessage()
    ]
    assert diffs, "the dry-run diff is logged before applying"
    assert "-  v: '1'" in diffs[-1] and "+  v: '2'" in diffs[-1]


def test_bootstrap_status_follows_the_initialized_key(etcd_server: EtcdServer) -> None:
    flips: list[float] = []

    def self_hosted(state: State) -> bool | None:
        resource = state.find(*BOOTSTRAP)
        spec = resource.spec if resource else None
        return spec.self_hosted_control_plane if isinstance(spec, catalog.BootstrapStatusSpec) else None

    async def body(state: State) -> None:
        await asyncio.sleep(0.5)
        assert state.find(*BOOTSTRAP) is None, "nothing is published before etcd answered"
        publish_etcd_secrets(state, etcd_server)
        await eventually(
            lambda: self_hosted(state) is False, timeout=10, what="not self-hosted without the key"
        )
        async with etcd_server.client_for() as etcd:
            for value, expected in ((b"true", True), (b"false", False), (b"true", True), (None, False)):
                start = time.monotonic()
                if value is None:
                    await etcd.delete(etcd_access.INITIALIZED_KEY)
                else:
                    await etcd.put(etcd_access.INITIALIZED_KEY, value)
                await eventually(
                    lambda expected=expected: self_hosted(state) is expected,
                    timeout=5,
                    what=f"flag {expected}",
                )
                flips.append(time.monotonic() - start)

    # A long watch window: the flips must come from the watch, not from the window running out.
    run([BootstrapStatusController(etcd_endpoints=[etcd_server.endpoint], watch_window=60)], body)
    print(f"\nbootstrap status flips after {max(flips) * 1000:.0f} ms at most")
