"""K8sControlPlane, ControlPlaneStaticPod and KubeletStaticPod controllers on a real runtime."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from k8s_harness import (
    NODE_ADDRESS,
    LocalServer,
    eventually,
    publish_addresses,
    publish_bootstrap_status,
    publish_config,
    publish_secret_status,
    put,
    run,
    settle,
)

from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import control_plane, files, render
from kubeplane.controllers.k8s.control_plane import K8sControlPlaneController
from kubeplane.controllers.k8s.kubelet_static_pod import KubeletStaticPodController
from kubeplane.controllers.k8s.static_pod import ControlPlaneStaticPodController
from kubeplane.resources import Phase, State, catalog

pytestmark = pytest.mark.unit

KCPC = (catalog.CONFIG_NAMESPACE, catalog.KUBERNETES_CONTROL_PLANE_CONFIGS)
PODS = (catalog.CONTROLPLANE_NAMESPACE, catalog.STATIC_PODS)
CLOSED_URL = "http://127.0.0.1:9/pods"  # discard port: nothing listens, the kubelet "is not up"


def kcpc(state: State, config_id: str) -> Any:
    return state.find(*KCPC, config_id)


def test_kcpc_for_a_generated_config(doc: dict[str, Any], worker_doc: dict[str, Any]) -> None:
    doc["cluster"]["network"] = {"cni": {"name": "custom", "urls": ["https://example.test/cni.yaml"]}}
    doc["cluster"]["extraManifests"] = ["https://example.test/extra.yaml"]
    doc["cluster"]["extraManifestHeaders"] = {"Token": "x"}
    doc["cluster"]["inlineManifests"] = [{"name": "ns", "contents": "kind: Namespace"}]
    doc["cluster"]["apiServer"]["extraVolumes"] = [{"hostPath": "/srv", "mountPath": "/srv"}]

    async def body(state: State) -> None:
        publish_config(state, doc)
        await settle()
        assert state.list(*KCPC) == [], "no kcpc before the node's addresses are known"
        publish_addresses(state)
        await eventually(lambda: len(state.list(*KCPC)) == 5, what="five kcpcs")
        apiserver = kcpc(state, files.APISERVER).spec.to_dict()
        assert apiserver == {
            "image": "k8s.gcr.io/kube-apiserver:v1.20.2",
            "extraArgs": {},
            "extraVolumes": [{"hostPath": "/srv", "mountPath": "/srv", "readonly": False}],
            "advertiseAddress": NODE_ADDRESS,
            "endpoint": "https://10.5.0.1:6443",
            "localAPIServerPort": 6443,
            "etcdServers": ["https://127.0.0.1:2379"],
            "serviceCIDRs": ["10.96.0.0/12"],
            "dnsDomain": "cluster.local",
        }
        manager = kcpc(state, files.CONTROLLER_MANAGER).spec.to_dict()
        assert manager["podCIDRs"] == ["10.244.0.0/16"]
        assert manager["image"] == "k8s.gcr.io/kube-controller-manager:v1.20.2"
        system = kcpc(state, control_plane.SYSTEM_MANIFESTS).spec.to_dict()
        assert system["cni"] == "custom"
        assert system["dnsServiceIP"] == "10.96.0.10"
        assert system["kubernetesVersion"] == "v1.20.2"
        assert "bootstrapToken" not in system, "the token stays in the root secrets"
        extra = kcpc(state, control_plane.EXTRA_MANIFESTS).spec.to_dict()
        assert [(u["id"], u["priority"]) for u in extra["urls"]] == [
            ("05-https://example.test/cni.yaml", "05"),
            ("99-https://example.test/extra.yaml", "99"),
        ]
        assert extra["headers"] == {"Token": "x"}
        assert extra["inline"] == [
            {"id": "99-ns", "name": "ns", "contents": "kind: Namespace", "priority": "99"}
        ]

        # A worker has no control plane: everything goes away.
        publish_config(state, worker_doc)
        await eventually(lambda: state.list(*KCPC) == [], what="kcpcs removed on a worker")

    run([K8sControlPlaneController()], body)


def test_extra_args_patch_rolls_only_the_apiserver(doc: dict[str, Any], paths: NodePaths) -> None:
    async def body(state: State) -> None:
        publish_addresses(state)
        publish_config(state, doc)
        publish_secret_status(state, ready=True, version="7")
        await eventually(lambda: len(state.list(*PODS)) == 3, what="three static pods")
        before = {resource.id: resource for resource in state.list(*PODS)}
        kcpc_before = {resource.id: resource.metadata.version for resource in state.list(*KCPC)}
        for component, pod in before.items():
            annotations = pod.spec.to_dict()["pod"]["metadata"]["annotations"]
            assert annotations[render.ANNOTATION_CONFIG_VERSION] == str(kcpc_before[component])
            assert annotations[render.ANNOTATION_SECRETS_VERSION] == "7"
        root = str(paths.root)
        command = before[files.APISERVER].spec.to_dict()["pod"]["spec"]["containers"][0]["command"]
        assert f"--advertise-address={NODE_ADDRESS}" in command
        assert f"--tls-cert-file={root}/system/secrets/kubernetes/kube-apiserver/apiserver.crt" in command

        doc["cluster"]["apiServer"]["extraArgs"] = {"feature-gates": "EphemeralContainers=true"}
        publish_config(state, doc)
        new_version = kcpc_before[files.APISERVER] + 1
        await eventually(
            lambda: kcpc(state, files.APISERVER).metadata.version == new_version, what="apiserver kcpc bump"
        )
        await eventually(
            lambda: (
                state.get(*PODS, files.APISERVER).metadata.version > before[files.APISERVER].metadata.version
            ),
            what="apiserver static pod update",
        )
        await settle()
        after = {resource.id: resource.metadata.version for resource in state.list(*KCPC)}
        assert after == {**kcpc_before, files.APISERVER: new_version}
        pod = state.get(*PODS, files.APISERVER).spec.to_dict()["pod"]
        assert pod["metadata"]["annotations"][render.ANNOTATION_CONFIG_VERSION] == str(new_version)
        assert "--feature-gates=EphemeralContainers=true" in pod["spec"]["containers"][0]["command"]
        for component in (files.CONTROLLER_MANAGER, files.SCHEDULER):
            assert state.get(*PODS, component).metadata.version == before[component].metadata.version

    run([K8sControlPlaneController(), ControlPlaneStaticPodController(paths=paths)], body)


def test_no_static_pods_until_secrets_are_ready(doc: dict[str, Any], paths: NodePaths) -> None:
    async def body(state: State) -> None:
        publish_addresses(state)
        publish_config(state, doc)
        await eventually(lambda: len(state.list(*KCPC)) == 5, what="kcpcs")
        await settle()
        assert state.list(*PODS) == [], "no secrets status: no static pods"
        publish_secret_status(state, ready=False)
        await settle()
        assert state.list(*PODS) == [], "secrets not ready: no static pods"
        publish_secret_status(state, ready=True, version="3")
        await eventually(lambda: len(state.list(*PODS)) == 3, what="static pods once secrets are ready")
        # Secrets being refreshed (not ready) keep the running plane as it is.
        publish_secret_status(state, ready=False, version="3")
        await settle()
        assert len(state.list(*PODS)) == 3
        state.destroy(catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, catalog.STATIC_POD_SECRETS_ID)
        await eventually(lambda: state.list(*PODS) == [], what="static pods removed without secrets")

    run([K8sControlPlaneController(), ControlPlaneStaticPodController(paths=paths)], body)


def _pod(name: str, image: str = "k8s.gcr.io/kube-scheduler:v1.20.2") -> catalog.StaticPodSpec:
    return catalog.StaticPodSpec(
        pod={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"image": image}}
    )


def test_kubelet_static_pod_files(paths: NodePaths) -> None:
    manifests = paths.kubelet_manifests
    manifests.mkdir(parents=True)
    (manifests / "kubeplane-stray.yaml").write_text("stray")
    (manifests / "someone-else.yaml").write_text("not ours")
    scheduler_file = manifests / "kubeplane-kube-scheduler.yaml"

    async def body(state: State) -> None:
        put(state, *PODS, files.SCHEDULER, _pod(files.SCHEDULER))
        publish_secret_status(state, ready=True)
        await settle()
        assert not scheduler_file.exists(), "nothing is written before the bootstrap status is known"
        publish_bootstrap_status(state, self_hosted=False)
        await eventually(scheduler_file.exists, what="static pod file")
        assert scheduler_file.read_text() == render.dump_yaml(_pod(files.SCHEDULER).to_dict()["pod"])
        assert not (manifests / "kubeplane-stray.yaml").exists(), "stray files with our prefix go"
        assert (manifests / "someone-else.yaml").read_text() == "not ours"

        # Same bytes: the file is not rewritten (the kubelet would restart the pod).
        stat = scheduler_file.stat()
        publish_secret_status(state, ready=True, version="2")
        await settle()
        assert (scheduler_file.stat().st_ino, scheduler_file.stat().st_mtime_ns) == (
            stat.st_ino,
            stat.st_mtime_ns,
        )

        put(state, *PODS, files.SCHEDULER, _pod(files.SCHEDULER, image="k8s.gcr.io/kube-scheduler:v1.20.3"))
        await eventually(lambda: "v1.20.3" in scheduler_file.read_text(), what="rewritten static pod")
        assert [p.name for p in manifests.iterdir() if p.name.startswith(".")] == [], "no temp file left"

        # Torn down: the file goes first, then the finalizer is released and the pod can be destroyed.
        torn = state.teardown(*PODS, files.SCHEDULER)
        assert torn.metadata.finalizers == ("k8s.KubeletStaticPodController",)
        await eventually(lambda: not scheduler_file.exists(), what="file of a torn down pod removed")
        await eventually(lambda: not state.get(*PODS, files.SCHEDULER).metadata.finalizers, what="release")
        state.destroy(*PODS, files.SCHEDULER)

        put(state, *PODS, files.APISERVER, _pod(files.APISERVER))
        apiserver_file = manifests / "kubeplane-kube-apiserver.yaml"
        await eventually(apiserver_file.exists, what="apiserver file")
        publish_bootstrap_status(state, self_hosted=True)
        await eventually(lambda: not apiserver_file.exists(), what="files removed while self-hosted")
        publish_bootstrap_status(state, self_hosted=False)
        await eventually(apiserver_file.exists, what="files back once not self-hosted")
        state.destroy(catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, catalog.STATIC_POD_SECRETS_ID)
        await eventually(lambda: not apiserver_file.exists(), what="files removed without secrets")
        assert state.get(*PODS, files.APISERVER).metadata.phase is Phase.RUNNING

    run([KubeletStaticPodController(paths=paths, pods_url=CLOSED_URL)], body)


def test_kubelet_pod_statuses(paths: NodePaths, local_server: LocalServer) -> None:
    ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    pod_list = {
        "kind": "PodList",
        "items": [
            {
                "metadata": {
                    "name": "kube-apiserver-node1",
                    "namespace": "kube-system",
                    "annotations": {"kubernetes.io/config.source": "file"},
                },
                "status": ready,
            },
            {"metadata": {"name": "coredns-1", "namespace": "kube-system"}, "status": {"phase": "Running"}},
        ],
    }
    url = local_server.serve("/pods", json.dumps(pod_list).encode())
    statuses = (catalog.CONTROLPLANE_NAMESPACE, catalog.STATIC_POD_STATUSES)

    async def body(state: State) -> None:
        found = await eventually(lambda: state.list(*statuses), what="static pod statuses")
        assert [resource.id for resource in found] == ["kube-system/kube-apiserver-node1"]
        assert found[0].spec.to_dict() == {"podStatus": ready}
        # Polling: a change at the kubelet shows up without any input change.
        pod_list["items"] = []
        local_server.serve("/pods", json.dumps(pod_list).encode())
        await eventually(lambda: state.list(*statuses) == [], what="status of a gone pod removed")

    run([KubeletStaticPodController(paths=paths, pods_url=url, poll_interval=0.05)], body)


def test_kubelet_not_up_is_not_an_error(paths: NodePaths, caplog: pytest.LogCaptureFixture) -> None:
    def polls() -> list[logging.LogRecord]:
        return [record for record in caplog.records if "pods endpoint" in record.getMessage()]

    async def body(state: State) -> None:
        # Until it has polled twice (a loaded machine may take longer than a few intervals).
        deadline = time.monotonic() + 10
        while len(polls()) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    with caplog.at_level("DEBUG", logger="controller-runtime"):
        run([KubeletStaticPodController(paths=paths, pods_url=CLOSED_URL, poll_interval=0.05)], body)
    messages = polls()
    assert len(messages) >= 2, "it keeps polling"
    assert {record.levelname for record in messages} == {"DEBUG"}
    assert not [record for record in caplog.records if "controller failed" in record.getMessage()]


def _probed_pod(name: str, url: str) -> catalog.StaticPodSpec:
    """A pod whose readiness probe asks ``url`` (``http://host:port/path``)."""
    host_port, _, path = url.removeprefix("http://").partition("/")
    host, _, port = host_port.partition(":")
    probe = {"httpGet": {"host": host, "port": int(port), "path": "/" + path, "scheme": "HTTP"}}
    return catalog.StaticPodSpec(
        pod={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": name, "readinessProbe": probe}]},
        }
    )


def _later_files(paths: NodePaths) -> list[Path]:
    """The kube-controller-manager and kube-scheduler files, which wait for the API server."""
    return [
        paths.kubelet_manifests / f"kubeplane-{component}.yaml"
        for component in (files.CONTROLLER_MANAGER, files.SCHEDULER)
    ]


def _publish_plane_with_a_silent_api_server(state: State) -> None:
    """A control plane whose kube-apiserver's readiness probe finds nothing listening."""
    publish_bootstrap_status(state, self_hosted=False)
    publish_secret_status(state, ready=True)
    put(state, *PODS, files.APISERVER, _probed_pod(files.APISERVER, CLOSED_URL + "/readyz"))
    put(state, *PODS, files.CONTROLLER_MANAGER, _pod(files.CONTROLLER_MANAGER))
    put(state, *PODS, files.SCHEDULER, _pod(files.SCHEDULER))


def test_controller_manager_and_scheduler_wait_for_a_ready_api_server(
    paths: NodePaths, local_server: LocalServer
) -> None:
    apiserver_file = paths.kubelet_manifests / "kubeplane-kube-apiserver.yaml"
    held = _later_files(paths)
    ready_url = local_server.serve("/readyz", b"ok")

    async def body(state: State) -> None:
        # An API server that does not answer: its own file is written, the other two wait.
        _publish_plane_with_a_silent_api_server(state)
        await eventually(apiserver_file.exists, what="apiserver file")
        await asyncio.sleep(2.5)  # more than two rechecks
        assert not any(path.exists() for path in held), "written before the API server was ready"
        # It answers 200: both follow within a recheck.
        put(state, *PODS, files.APISERVER, _probed_pod(files.APISERVER, ready_url))
        await eventually(lambda: all(path.exists() for path in held), what="held pods written")
        # Once there, a file is rewritten at once whatever the API server says (an upgrade).
        put(state, *PODS, files.APISERVER, _probed_pod(files.APISERVER, CLOSED_URL + "/readyz"))
        put(state, *PODS, files.SCHEDULER, _pod(files.SCHEDULER, image="k8s.gcr.io/kube-scheduler:v1.20.3"))
        await eventually(lambda: "v1.20.3" in held[1].read_text(), what="rewritten while not ready")

    run([KubeletStaticPodController(paths=paths, pods_url=CLOSED_URL)], body)


def test_controller_manager_and_scheduler_wait_for_the_api_server_at_most_the_hold_limit(
    paths: NodePaths, caplog: pytest.LogCaptureFixture
) -> None:
    # The wait orders start-up; an API server that never answers (a loaded machine, a broken
    # flag) must not keep the other two components from starting.
    held = _later_files(paths)

    async def body(state: State) -> None:
        _publish_plane_with_a_silent_api_server(state)
        started = time.monotonic()
        await eventually(lambda: all(path.exists() for path in held), what="held pods written")
        assert time.monotonic() - started >= 2.0, "written before the hold limit"

    with caplog.at_level("WARNING", logger="controller-runtime"):
        run([KubeletStaticPodController(paths=paths, pods_url=CLOSED_URL, hold_limit=2.0)], body)
    warnings = [r.getMessage() for r in caplog.records if "not ready after" in r.getMessage()]
    assert warnings == [
        "k8s.KubeletStaticPodController: kube-apiserver not ready after 2 s;"
        " writing kube-controller-manager and kube-scheduler anyway"
    ]


def test_api_server_waits_while_another_holds_its_port(paths: NodePaths) -> None:
    # A self-hosted control plane's DaemonSet pod serving the port (convert-k8s replaces it):
    # written next to it, the static pod would crash-loop into a long back-off.
    manifests = paths.kubelet_manifests
    apiserver_file = manifests / "kubeplane-kube-apiserver.yaml"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    url = f"http://127.0.0.1:{port}/readyz"

    async def body(state: State) -> None:
        publish_bootstrap_status(state, self_hosted=False)
        publish_secret_status(state, ready=True)
        put(state, *PODS, files.APISERVER, _probed_pod(files.APISERVER, url))
        await asyncio.sleep(2.5)  # more than two rechecks
        assert not apiserver_file.exists(), "written while another server held the port"
        listener.close()
        await eventually(apiserver_file.exists, what="apiserver file once the port is free")
        # Once there, it is rewritten at once, whoever holds the port.
        with socket.create_server(("127.0.0.1", port)):
            put(state, *PODS, files.APISERVER, _probed_pod(files.APISERVER, url + "?v=2"))
            await eventually(lambda: "v=2" in apiserver_file.read_text(), what="rewritten")

    try:
        run([KubeletStaticPodController(paths=paths, pods_url=CLOSED_URL)], body)
    finally:
        listener.close()
