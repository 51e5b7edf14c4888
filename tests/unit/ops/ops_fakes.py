"""In-process fakes of the node API and of the Kubernetes API for the upgrade executor's unit tests.

:class:`FakeCluster` behaves like the real thing where the executor's decisions depend on it: an
applied machine config bumps ``kcpc/<component>`` only when that component's image changed; a
mirror pod reports a new config version a couple of polls after the kcpc changed (so waits see
``config version mismatch``); the kube-proxy DaemonSet rolls out a couple of polls after its image
changed. Every change is recorded in ``events`` so tests can check order and that nothing is done
twice. These are fakes of interfaces the operation declares (``NodeAPI``, ``KubeAPI``,
``Rotation``), used by unit tests only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kubeplane import config
from kubeplane.ops import oplock, upgrade

NODES = (
    upgrade.ClusterNode("cp-1", "10.5.0.2", control_plane=True),
    upgrade.ClusterNode("cp-2", "10.5.0.3", control_plane=True),
    upgrade.ClusterNode("cp-3", "10.5.0.4", control_plane=True),
    upgrade.ClusterNode("worker-1", "10.5.0.5"),
)
#: Polls of a pod (or DaemonSet) after a change before it reports the new state.
LAG = 2


def images_of(text: str) -> dict[str, str]:
    """Every image a machine config sets, by component."""
    model = config.load(text).model
    cluster = model.cluster
    return {
        upgrade.APISERVER: cluster.api_server_image,
        upgrade.CONTROLLER_MANAGER: cluster.controller_manager_image,
        upgrade.SCHEDULER: cluster.scheduler_image,
        upgrade.PROXY: cluster.proxy_image,
        upgrade.KUBELET: model.machine.kubelet_image,
    }


class FakeClock:
    """Time that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclasses.dataclass
class Pod:
    config_version: str
    ready: bool = True
    pending: int = 0
    target_version: str = ""


class Broken(Exception):
    """An injected failure (stands for a crash or a kill of the CLI at that point)."""


class FakeCluster:
    """Node API + Kubernetes API + load balancer of a 3 control plane + 1 worker cluster."""

    def __init__(
        self,
        documents: Mapping[str, Any],
        *,
        repository: str = "k8s.gcr.io",
        version: str = "v1.20.2",
        with_proxy: bool = True,
    ) -> None:
        self.events: list[tuple[str, ...]] = []
        self.configs: dict[str, str] = {}
        self.kcpc: dict[tuple[str, str], upgrade.ComponentConfig] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.unreachable: set[str] = set()
        self.fail_apply: set[tuple[str, str]] = set()
        self.frozen_pods: set[tuple[str, str]] = set()
        self.kube_errors: list[Exception] = []
        self.drained: set[str] = set()
        #: Control plane nodes the load balancer finds unhealthy.
        self.down: set[str] = set()
        self.images_present: dict[str, set[str]] = {node.address: set() for node in NODES}
        self.can_pull = True
        for node in NODES:
            kind = "controlplane" if node.control_plane else "worker"
            document = config.MachineConfig.from_dict(documents[kind])
            cluster: dict[str, Any] = {
                key: {"image": f"{repository}/{component}:{version}"}
                for component, (_, key, _) in upgrade.IMAGE_PATHS.items()
                if component != upgrade.KUBELET
            }
            document = config.apply_merge_patch(document, {"cluster": cluster})
            self.configs[node.address] = document.to_yaml()
            if node.control_plane:
                for component in upgrade.COMPONENTS:
                    self.kcpc[(node.address, component)] = upgrade.ComponentConfig(
                        version=2, image=f"{repository}/{component}:{version}"
                    )
                    self.pods[(node.name, component)] = Pod(config_version="2")
        self.ds: upgrade.RolloutState | None = (
            upgrade.RolloutState(
                image=f"{repository}/kube-proxy:{version}", desired=4, updated=4, available=4
            )
            if with_proxy
            else None
        )
        self._rollout_pending = 0
        self.kubelet_versions = {node.name: version for node in NODES}

    def name_of(self, address: str) -> str:
        return next(node.name for node in NODES if node.address == address)

    def patches(self) -> list[tuple[str, ...]]:
        return [event for event in self.events if event[0] == "patch"]

    # -- NodeAPI --

    def _reach(self, node: str) -> None:
        if node in self.unreachable:
            raise ConnectionError(f"connection refused: {node}:50000")

    async def check(self, node: str) -> None:
        self._reach(node)

    async def component_config(self, node: str, component: str) -> upgrade.ComponentConfig:
        self._reach(node)
        return self.kcpc[(node, component)]

    async def machine_config(self, node: str) -> str:
        self._reach(node)
        return self.configs[node]

    async def apply_config(self, node: str, data: str, *, mode: str) -> None:
        self._reach(node)
        old, new = images_of(self.configs[node]), images_of(data)
        changed = [component for component in new if new[component] != old[component]]
        for component in changed:
            if (node, component) in self.fail_apply:
                raise Broken(f"injected failure applying {component} on {node}")
        self.configs[node] = data
        for component in changed:
            image = new[component]
            self.events.append(("patch", node, component, image, mode))
            if component == upgrade.KUBELET:
                self.kubelet_versions[self.name_of(node)] = image.rsplit(":", 1)[1]
            if component in upgrade.COMPONENTS:
                old_config = self.kcpc[(node, component)]
                self.kcpc[(node, component)] = upgrade.ComponentConfig(
                    version=old_config.version + 1, image=image
                )
                pod = self.pods[(self.name_of(node), component)]
                pod.pending, pod.target_version = LAG, str(old_config.version + 1)

    async def service_healthy(self, node: str, service: str) -> bool:
        self.events.append(("service-health", node, service))
        return node not in self.unreachable

    async def pull_image(self, node: str, image: str) -> bool:
        self._reach(node)
        if image.endswith(":v9.9.9"):
            raise Broken(f"pull {image}: not found")
        self.events.append(("pull", node, image))
        if image in self.images_present[node]:
            return False
        self.images_present[node].add(image)
        return True

    async def manifests(self, node: str) -> list[dict[str, Any]]:
        return [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "kube-system"}}
        ]

    async def kubeconfig(self, node: str | None) -> str:
        return "apiVersion: v1\nclusters: []\n"

    async def close(self) -> None:
        self.events.append(("closed",))

    # -- KubeAPI --

    def _kube(self) -> None:
        if self.kube_errors:
            raise self.kube_errors.pop(0)

    def lease_store(self) -> MemoryStore:
        """The cluster operation Lease, shared by every run against this cluster."""
        if not hasattr(self, "lease"):
            self.lease = MemoryStore()
        return self.lease

    async def nodes(self) -> list[upgrade.ClusterNode]:
        self._kube()
        return list(NODES)

    async def mirror_pod(self, *, node_name: str, component: str) -> upgrade.PodState | None:
        self._kube()
        pod = self.pods.get((node_name, component))
        if pod is None:
            return None
        if pod.pending and (node_name, component) not in self.frozen_pods:
            pod.pending -= 1
            if not pod.pending:
                pod.config_version = pod.target_version
                self.events.append(("pod-updated", node_name, component, pod.config_version))
        return upgrade.PodState(
            name=f"{component}-{node_name}", config_version=pod.config_version, ready=pod.ready
        )

    async def daemonset(self, namespace: str, name: str) -> upgrade.RolloutState | None:
        self._kube()
        state = self.ds
        if state is not None and self._rollout_pending:
            self._rollout_pending -= 1
            if not self._rollout_pending:
                state = self.ds = dataclasses.replace(state, updated=state.desired, available=state.desired)
        return state

    async def set_daemonset_image(self, namespace: str, name: str, *, container: str, image: str) -> None:
        assert self.ds is not None
        self.events.append(("daemonset", namespace, name, container, image))
        self.ds = dataclasses.replace(self.ds, image=image, updated=0, available=3)
        self._rollout_pending = LAG

    async def kubelet(self, node_name: str) -> upgrade.KubeletState | None:
        return upgrade.KubeletState(version=self.kubelet_versions[node_name], ready=True)

    async def apply_objects(self, objects: Sequence[Mapping[str, Any]]) -> None:
        self.events.append(("apply", str(len(objects))))

    # -- Rotation --

    async def drain(self, node: upgrade.ClusterNode) -> None:
        self.events.append(("drain", node.name))
        self.drained.add(node.name)

    async def restore(self, node: upgrade.ClusterNode) -> None:
        self.events.append(("restore", node.name))
        self.drained.discard(node.name)

    async def serving(self) -> set[str]:
        return {n.address for n in NODES if n.control_plane and n.name not in self.drained | self.down}


class MemoryStore:
    """A Lease store with resourceVersion compare-and-swap, like the API server's."""

    def __init__(self) -> None:
        self.lease: oplock.Lease | None = None
        self.version = 0
        self.deleted = 0

    def _stamp(self, lease: oplock.Lease) -> None:
        self.version += 1
        self.lease = dataclasses.replace(lease, resource_version=str(self.version))

    async def read(self) -> oplock.Lease | None:
        return self.lease

    async def create(self, lease: oplock.Lease) -> bool:
        if self.lease is not None:
            return False
        self._stamp(lease)
        return True

    async def replace(self, lease: oplock.Lease) -> bool:
        if self.lease is None or lease.resource_version != self.lease.resource_version:
            return False
        self._stamp(lease)
        return True

    async def delete(self, lease: oplock.Lease) -> None:
        if self.lease is not None and lease.resource_version == self.lease.resource_version:
            self.lease = None
            self.deleted += 1
