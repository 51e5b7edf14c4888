"""``evidence.gather`` over fakes of the two factories: what it reads from the node API and the
Kubernetes API documents, which logs it fetches, and a node that cannot be reached."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from kubeplane import api, pki
from kubeplane.clients import errors as client_errors
from kubeplane.ops import diagnose, evidence, health

pytestmark = pytest.mark.unit

CP, WORKER = "10.5.0.2", "10.5.0.3"
TOPOLOGY = health.Topology(controlplanes=(CP,), workers=(WORKER,))
NOW = 1000.0


def service(service_id: str, *, running: bool = True) -> dict[str, Any]:
    return {
        "id": service_id,
        "state": "Running" if running else "Finished",
        "running": running,
        "health": {"healthy": running, "unknown": not running, "message": ""},
        "events": [{"state": "Running", "message": "Health check successful"}],
    }


class FakeNode:
    """A node API client for one node (``factory([address])``)."""

    def __init__(
        self, address: str, *, kubelet_running: bool = True, reachable: bool = True, boot_wait: str = ""
    ) -> None:
        self.address = address
        self.boot_wait = boot_wait
        self.cp = address == CP
        self.kubelet_running = kubelet_running
        self.reachable = reachable
        self.logs_read: list[str] = []

    async def __aenter__(self) -> FakeNode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _reply(self, result: Any) -> list[api.Reply[Any]]:
        return [api.Reply(node=self.address, result=result)]

    async def service_list(self) -> list[api.Reply[Any]]:
        if not self.reachable:
            return [api.Reply(node=self.address, error=api.CallError("UNAVAILABLE", "connection refused"))]
        names = ["containerd", "kubelet", *(["etcd"] if self.cp else [])]
        return self._reply([service(n, running=n != "kubelet" or self.kubelet_running) for n in names])

    async def version(self) -> list[api.Reply[Any]]:
        waiting = {"waiting": self.boot_wait} if self.boot_wait else {}
        return self._reply({"phase": "booting" if self.boot_wait else "running", **waiting})

    async def resource_get(self, type: str, id: str, *, namespace: str | None = None) -> list[api.Reply[Any]]:
        specs = {
            "NodeAddresses": {"hostname": f"node-{self.address[-1]}"},
            "ManifestStatuses": {"manifestsApplied": list(diagnose.CSR_MANIFESTS), "errors": {}},
            "BootstrapStatuses": {"selfHostedControlPlane": False},
        }
        return self._reply({"metadata": {"id": id}, "spec": specs[type]})

    async def resource_list(self, type: str, *, namespace: str | None = None) -> list[api.Reply[Any]]:
        return self._reply([{"metadata": {"id": c}, "spec": {}} for c in health.CONTROL_PLANE_COMPONENTS])

    async def list_dir(self, path: str = ".", *, recurse: bool = False) -> list[api.Reply[Any]]:
        return self._reply(
            [{"name": path, "is_dir": True}]
            + [
                {"name": f"{path}/kubeplane-{c}.yaml", "is_dir": False}
                for c in health.CONTROL_PLANE_COMPONENTS
            ]
        )

    async def containers(self) -> list[api.Reply[Any]]:
        return self._reply(
            [
                {"namespace": "kube-system", "pod": f"{c}-node-2", "name": c, "state": "RUNNING"}
                for c in health.CONTROL_PLANE_COMPONENTS
                if self.cp
            ]
        )

    async def events(self, *, since_seconds: int | None = None) -> AsyncIterator[api.Reply[Any]]:
        yield api.Reply(
            node=self.address, result={"kind": "service", "subject": "etcd", "timestamp": NOW - 5}
        )
        yield api.Reply(
            node=self.address,
            result={
                "kind": "controller",
                "subject": "k8s.X",
                "message": "reconcile failed: boom",
                "timestamp": NOW - 5,
            },
        )

    async def read_file(self, path: str) -> AsyncIterator[api.Reply[bytes]]:
        yield api.Reply(node=self.address, result=b"done\n")

    async def logs(self, service_id: str, *, tail: int | None = None) -> AsyncIterator[api.Reply[str]]:
        self.logs_read.append(service_id)
        yield api.Reply(node=self.address, result="line 1\nline 2")


class FakeKube:
    def __init__(self, *, tls_failure: bool = False, cp_ready: str = "True") -> None:
        self.server = "https://10.5.0.1:6443"
        self.tls_failure = tls_failure
        self.cp_ready = cp_ready

    async def __aenter__(self) -> FakeKube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def raw_get(self, path: str) -> tuple[int, str]:
        if self.tls_failure:
            raise client_errors.KubeForbidden("GET /readyz: TLS failed (...): CERTIFICATE_VERIFY_FAILED")
        return 200, "ok"

    async def list(self, path: str) -> list[dict[str, Any]]:
        if path.endswith("/nodes"):
            return [
                {
                    "metadata": {"name": "node-2"},
                    "status": {
                        "addresses": [{"type": "InternalIP", "address": CP}],
                        "conditions": [{"type": "Ready", "status": self.cp_ready}],
                    },
                }
            ]
        if path.endswith("/pods"):
            return [
                {
                    "metadata": {"name": "kube-scheduler-node-2", "labels": {"k8s-app": "kube-scheduler"}},
                    "spec": {"nodeName": "node-2"},
                    "status": {
                        "hostIP": CP,
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "False"}],
                        "containerStatuses": [
                            {"restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
                        ],
                    },
                }
            ]
        if path.endswith("/clusterrolebindings"):
            # The approver binding was deleted; other bindings are not reported.
            names = ("create-csrs-for-bootstrapping", "system:default-sa")
            return [{"metadata": {"name": name}} for name in names]
        key = pki.generate_key()
        request = pki.new_csr(key=key, common_name="system:node:node-3", organizations=("system:nodes",))
        return [
            {
                "metadata": {"name": "csr-1"},
                "spec": {"request": base64.b64encode(request).decode(), "username": "system:bootstrap:abc"},
                "status": {},
            }
        ]


def gather(nodes: dict[str, FakeNode], kube: FakeKube, **kwargs: Any) -> diagnose.Evidence:
    def node_client(addresses: Sequence[str]) -> Any:
        return nodes[addresses[0]]

    return evidence.gather(
        TOPOLOGY, node_client=node_client, kube=lambda: kube, cluster_ca=None, clock=lambda: NOW, **kwargs
    )


def test_gather_reads_nodes_and_the_kubernetes_api() -> None:
    nodes = {CP: FakeNode(CP), WORKER: FakeNode(WORKER, boot_wait="the node API certificate: refused")}
    found = gather(nodes, FakeKube())
    cp = found.nodes[CP]
    assert cp.hostname == "node-2"
    assert cp.boot_wait == "" and found.nodes[WORKER].boot_wait == "the node API certificate: refused"
    assert cp.services["etcd"].up and cp.bootstrap_node and not cp.self_hosted
    assert cp.static_pods == health.CONTROL_PLANE_COMPONENTS
    assert cp.manifest_files == tuple(f"kubeplane-{c}.yaml" for c in health.CONTROL_PLANE_COMPONENTS)
    assert cp.manifests_applied == diagnose.CSR_MANIFESTS
    assert cp.controller_errors == (diagnose.ControllerError("k8s.X", "reconcile failed: boom", 5.0),)
    assert found.kube.readyz == 200 and found.kube.error is None
    assert found.kube.nodes == (diagnose.KubeNode(name="node-2", address=CP, ready="True"),)
    (pod,) = found.kube.pods
    assert (pod.app, pod.ready, pod.restarts, pod.reason) == ("kube-scheduler", False, 3, "CrashLoopBackOff")
    assert found.kube.csrs == (diagnose.Csr("csr-1", "node-3", "system:bootstrap:abc", "Pending"),)
    assert found.kube.csr_bindings == ("create-csrs-for-bootstrapping",)
    # The worker is not registered: its kubelet log is read even though kubelet runs.
    assert nodes[WORKER].logs_read == ["kubelet"]
    assert found.nodes[WORKER].logs["kubelet"] == ("line 1", "line 2")
    assert nodes[CP].logs_read == []


def test_the_kubelet_log_of_a_registered_node_that_is_not_ready_is_read() -> None:
    # A kubelet that runs but stopped reporting (another cluster's endpoint, say) tells why in its log.
    nodes = {CP: FakeNode(CP), WORKER: FakeNode(WORKER)}
    found = gather(nodes, FakeKube(cp_ready="Unknown"))
    assert nodes[CP].logs_read == ["kubelet"]
    assert found.nodes[CP].logs["kubelet"] == ("line 1", "line 2")


def test_an_unreachable_node_and_a_tls_failure() -> None:
    nodes = {CP: FakeNode(CP, kubelet_running=False), WORKER: FakeNode(WORKER, reachable=False)}
    probed: list[str] = []

    def probe(server: str) -> str:
        probed.append(server)
        return "other-ca"

    ca = pki.new_ca("kubernetes").cert
    found = evidence.gather(
        TOPOLOGY,
        node_client=lambda addresses: nodes[addresses[0]],  # type: ignore[arg-type,return-value]
        kube=lambda: FakeKube(tls_failure=True),  # type: ignore[arg-type,return-value]
        cluster_ca=ca,
        probe_issuer=probe,
        clock=lambda: NOW,
    )
    assert (
        found.nodes[WORKER].unreachable is not None
        and "connection refused" in found.nodes[WORKER].unreachable
    )
    assert found.kube.tls_error and probed == ["https://10.5.0.1:6443"]
    assert (found.kube.endpoint_issuer, found.kube.cluster_ca) == ("other-ca", "kubernetes")
    assert nodes[CP].logs_read == ["kubelet"]
    ids = {d.id for d in diagnose.diagnose(found)}
    assert {"worker-node-api-unreachable", "kubelet-not-running", "endpoint-other-cluster"} <= ids
