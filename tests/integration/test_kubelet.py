"""containerd + kubelet on a machine node run a static pod; its mirror pod shows in the API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from kubernetes import client as k8s
from official_client import api_client

from kubeplane.services import kubelet as kubelet_service

if TYPE_CHECKING:
    from conftest import ApiServer, Node

pytestmark = pytest.mark.integration


def static_pod(*, image: str, kubeconfig: str) -> dict[str, Any]:
    """A hostNetwork kube-scheduler talking to the test's API server: a real, long-running process."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kube-scheduler",
            "namespace": "kube-system",
            "annotations": {"kubeplane.test/origin": "static"},
        },
        "spec": {
            "hostNetwork": True,
            "containers": [
                {
                    "name": "kube-scheduler",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": [
                        "/usr/local/bin/kube-scheduler",
                        "--kubeconfig=/etc/kubernetes/scheduler.conf",
                        "--leader-elect=false",
                        "--port=0",
                        "--bind-address=127.0.0.1",
                    ],
                    "volumeMounts": [
                        {
                            "name": "kubeconfig",
                            "mountPath": "/etc/kubernetes/scheduler.conf",
                            "readOnly": True,
                        }
                    ],
                }
            ],
            "volumes": [{"name": "kubeconfig", "hostPath": {"path": kubeconfig, "type": "File"}}],
        },
    }


def test_static_pod_mirror_pod(
    leak_check: None,
    start_apiserver: Callable[..., ApiServer],
    node: Node,
    wait_until: Callable[..., Any],
) -> None:
    # The API server listens on the host end of the node's veth, which the node reaches directly.
    server = start_apiserver(node.netns.host_ip)
    api = k8s.CoreV1Api(api_client(server.admin_kubeconfig))

    assert node.import_image("pause") == "k8s.gcr.io/pause:3.2"
    scheduler_image = node.import_image("kube-scheduler")
    assert scheduler_image in node.ctr("images", "ls", "-q").split()

    hostname = f"node-{node.netns.name}"
    # The node is a machine: what it sees at /etc/kubernetes is its directory's etc/kubernetes.
    scheduler_conf = Path("/etc/kubernetes/scheduler.conf")
    (node.root / "etc/kubernetes").mkdir(parents=True, exist_ok=True)
    (node.root / "etc/kubernetes/scheduler.conf").write_text(server.admin_kubeconfig)
    manifests = kubelet_service.KubeletPaths.under(node.root).pod_manifest_path
    manifests.mkdir(parents=True, exist_ok=True)
    (manifests / "kube-scheduler.yaml").write_text(
        yaml.safe_dump(static_pod(image=scheduler_image, kubeconfig=str(scheduler_conf)))
    )
    # system:masters is enough for this test; real nodes get system:node:<name> credentials.
    node.start_kubelet(
        kubeconfig=server.client_kubeconfig(user=f"system:node:{hostname}", organizations=["system:masters"]),
        hostname=hostname,
    )

    # Without a CNI config the node never turns Ready; hostNetwork static pods run regardless.
    registered = wait_until(
        lambda: api.read_node(hostname), timeout=90, what=f"node {hostname} to register", logs=node.logs
    )
    assert {a.address for a in registered.status.addresses if a.type == "InternalIP"} == {node.netns.node_ip}

    def running_mirror_pod() -> Any:
        pod = api.read_namespaced_pod(f"kube-scheduler-{hostname}", "kube-system")
        statuses = pod.status.container_statuses or []
        return pod if statuses and statuses[0].state.running is not None else None

    pod = wait_until(running_mirror_pod, timeout=120, what="the mirror pod to report Running", logs=node.logs)
    assert [(o.kind, o.name, o.controller) for o in pod.metadata.owner_references] == [
        ("Node", hostname, True)
    ]
    assert pod.metadata.annotations["kubeplane.test/origin"] == "static"
    assert "kubernetes.io/config.mirror" in pod.metadata.annotations
    assert pod.spec.node_name == hostname
    assert pod.status.pod_ip == node.netns.node_ip  # hostNetwork: the namespace containerd runs in
    assert pod.status.container_statuses[0].image == scheduler_image
