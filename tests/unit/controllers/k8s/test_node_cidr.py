"""NodeCIDRController: the pools from kube-controller-manager's flags, the lowest free block per
node (oldest first, never one a node has, dual-stack, a full pool), the patch guarded by the
listed resourceVersion, and the running controller, which assigns only beside a
kube-controller-manager that does not, under the etcd lock."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from k8s_harness import cluster_admin, eventually, publish_bootstrap_status, put, run, settle

from kubeplane.clients import kube
from kubeplane.controllers.k8s import files, node_cidr
from kubeplane.resources import Resource, State, catalog

pytestmark = pytest.mark.unit

KUBECONFIG = cluster_admin()[1]
LOGGER = logging.getLogger("test-node-cidr")


def node(name: str, *cidrs: str, created: str = "2026-11-28T00:00:00Z", version: str = "5") -> dict[str, Any]:
    spec: dict[str, Any] = {"podCIDR": cidrs[0], "podCIDRs": list(cidrs)} if cidrs else {}
    return {
        "metadata": {"name": name, "creationTimestamp": created, "resourceVersion": version},
        "spec": spec,
    }


def test_pools_take_kube_controller_managers_flags_and_defaults() -> None:
    (v4,) = node_cidr.pools({"cluster-cidr": "10.244.0.0/16"})
    assert (str(v4.subnet), v4.mask, v4.size) == ("10.244.0.0/16", 24, 256)
    v4, v6 = node_cidr.pools({"cluster-cidr": "10.244.0.0/16,fd00:10:244::/56"})
    assert (v4.mask, v6.mask) == (24, 64)
    v4, v6 = node_cidr.pools(
        {
            "cluster-cidr": "10.244.0.0/16, fd00:10:244::/56",
            "node-cidr-mask-size-ipv4": "26",
            "node-cidr-mask-size-ipv6": "72",
        }
    )
    assert (v4.mask, v6.mask) == (26, 72)
    (v4,) = node_cidr.pools({"cluster-cidr": "10.244.0.0/16", "node-cidr-mask-size": "20"})
    assert v4.mask == 20


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({}, "no --cluster-cidr"),
        ({"cluster-cidr": "10.244.0.0/33"}, "10.244.0.0/33"),
        ({"cluster-cidr": "10.244.0.0/16", "node-cidr-mask-size": "x"}, "not a number"),
        ({"cluster-cidr": "10.244.0.0/16", "node-cidr-mask-size": "12"}, "does not fit"),
        ({"cluster-cidr": "10.0.0.0/8", "node-cidr-mask-size": "26"}, "more than 2^16 blocks"),
        ({"cluster-cidr": "10.244.0.0/16,10.245.0.0/16"}, "two IPv4 subnets"),
    ],
)
def test_pools_refuse_what_kube_controller_manager_would_refuse(flags: dict[str, str], message: str) -> None:
    with pytest.raises(node_cidr.NodeCIDRError, match=message.replace("^", r"\^")):
        node_cidr.pools(flags)


def test_each_new_node_gets_the_lowest_free_block_oldest_first() -> None:
    pools = node_cidr.pools({"cluster-cidr": "10.244.0.0/16"})
    nodes = [
        node("cp1", "10.244.0.0/24"),
        node("w2", created="2026-11-28T00:00:02Z"),
        node("cp2", "10.244.2.0/24"),
        node("w1", created="2026-11-28T00:00:01Z"),
        # A block of another size (an old kube-controller-manager's) covers both it overlaps.
        node("old", "10.244.4.0/23"),
    ]
    plan = node_cidr.assign(pools, nodes)
    assert plan.cidrs == {"w1": ["10.244.1.0/24"], "w2": ["10.244.3.0/24"]}
    assert plan.starved == []
    # cp2 deleted: its block is the lowest free one again, the next node's.
    after = [
        node("cp1", "10.244.0.0/24"),
        node("w1", "10.244.1.0/24"),
        node("w2", "10.244.3.0/24"),
        node("old", "10.244.4.0/23"),
        node("w3"),
    ]
    assert node_cidr.assign(pools, after).cidrs == {"w3": ["10.244.2.0/24"]}


def test_dual_stack_nodes_get_one_block_per_family() -> None:
    pools = node_cidr.pools({"cluster-cidr": "10.244.0.0/16,fd00:10:244::/56"})
    plan = node_cidr.assign(pools, [node("cp1", "10.244.0.0/24", "fd00:10:244::/64"), node("w1")])
    assert plan.cidrs == {"w1": ["10.244.1.0/24", "fd00:10:244:1::/64"]}


def test_a_full_pool_starves_the_nodes_it_cannot_serve_only() -> None:
    pools = node_cidr.pools({"cluster-cidr": "10.244.0.0/23"})  # two /24 blocks
    plan = node_cidr.assign(
        pools,
        [
            node("cp1", "10.244.0.0/24"),
            node("w1", created="2026-11-28T00:00:01Z"),
            node("w2", created="2026-11-28T00:00:02Z"),
            node("w3", created="2026-11-28T00:00:03Z"),
        ],
    )
    assert plan.cidrs == {"w1": ["10.244.1.0/24"]}
    assert plan.starved == ["w2", "w3"]
    assert plan.full == "no free /24 left in 10.244.0.0/23"


class FakeNodes:
    """A fake API server's Nodes: a list, watches (the first delivers ``watched``), patches."""

    def __init__(
        self, listed: list[dict[str, Any]], watched: list[tuple[str, dict[str, Any]]] | None = None
    ) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in listed}
        self.watched = list(watched or ())
        self.watches = 0
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.conflicts: set[str] = set()

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == kube.NODES_PATH and request.url.params.get("watch"):
            self.watches += 1
            events, self.watched = self.watched, []
            for kind, obj in events:
                if kind == "DELETED":
                    self.nodes.pop(obj["metadata"]["name"], None)
                else:
                    self.nodes[obj["metadata"]["name"]] = obj
            lines = [json.dumps({"type": kind, "object": obj}) for kind, obj in events]
            return httpx.Response(200, content="\n".join(lines).encode())
        if path == kube.NODES_PATH:
            items = list(self.nodes.values())
            return httpx.Response(200, json={"metadata": {"resourceVersion": "9"}, "items": items})
        name = path.rsplit("/", 1)[1]
        assert request.method == "PATCH" and request.headers["content-type"] == "application/merge-patch+json"
        body = json.loads(request.content)
        self.patches.append((name, body))
        if name in self.conflicts:
            return httpx.Response(409, json={"kind": "Status", "reason": "Conflict", "code": 409})
        self.nodes[name] = {**self.nodes[name], "spec": body["spec"]}
        return httpx.Response(200, json=self.nodes[name])


def _api(nodes: FakeNodes) -> kube.KubeClient:
    return kube.KubeClient(KUBECONFIG, transport=httpx.MockTransport(nodes.handle))


def test_the_patch_is_guarded_by_the_listed_version_and_a_conflict_is_left() -> None:
    nodes = FakeNodes([node("cp1", "10.244.0.0/24"), node("w1", version="17"), node("w2", version="18")])
    nodes.conflicts.add("w1")
    pools = node_cidr.pools({"cluster-cidr": "10.244.0.0/16"})

    async def scenario() -> node_cidr.Outcome:
        async with _api(nodes) as api:
            return await node_cidr.assign_pending(api, pools, LOGGER)

    outcome = asyncio.run(scenario())
    assert nodes.patches == [
        (
            "w1",
            {
                "metadata": {"resourceVersion": "17"},
                "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
            },
        ),
        (
            "w2",
            {
                "metadata": {"resourceVersion": "18"},
                "spec": {"podCIDR": "10.244.2.0/24", "podCIDRs": ["10.244.2.0/24"]},
            },
        ),
    ]
    assert outcome.done == {"w2": ["10.244.2.0/24"]} and outcome.starved == set()


class FakeEtcd:
    """The etcd lock: records who holds it, and fails if two passes ever overlap."""

    def __init__(self) -> None:
        self.held = False
        self.taken = 0

    async def client(self, secrets: Resource) -> FakeEtcd:
        return self

    @contextlib.asynccontextmanager
    async def lock(self, name: bytes, *, ttl: int = 10) -> AsyncIterator[bytes]:
        assert name == b"kubeplane:v1:nodeCIDRMutex" and not self.held
        self.held, self.taken = True, self.taken + 1
        try:
            yield name
        finally:
            self.held = False


def controller_manager(*flags: str) -> catalog.StaticPodSpec:
    command = ["kube-controller-manager", "--cluster-cidr=10.244.0.0/16", *flags]
    return catalog.StaticPodSpec(pod={"spec": {"containers": [{"name": "kcm", "command": command}]}})


def _inputs(
    state: State, *, self_hosted: bool = False, flags: tuple[str, ...] = ("--allocate-node-cidrs=false",)
) -> None:
    put(state, catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, "etcd", catalog.EtcdSecretSpec(data={}))
    certs = catalog.KubernetesSecretSpec(data={"localAdminKubeconfig": KUBECONFIG})
    put(state, catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, "k8s-certs", certs)
    publish_bootstrap_status(state, self_hosted=self_hosted)
    put(
        state,
        catalog.CONTROLPLANE_NAMESPACE,
        catalog.STATIC_PODS,
        files.CONTROLLER_MANAGER,
        controller_manager(*flags),
    )


def test_the_controller_assigns_listed_and_watched_nodes_under_the_lock() -> None:
    nodes = FakeNodes(
        [node("cp1", "10.244.0.0/24"), node("w1")],
        watched=[
            ("ADDED", node("w2", created="2026-11-28T00:00:05Z")),
            ("MODIFIED", node("cp1", "10.244.0.0/24")),  # has one: no pass
        ],
    )
    etcd = FakeEtcd()
    controller = node_cidr.NodeCIDRController(
        etcd=etcd, retry_interval=0.01, kube_client=lambda text: _api(nodes)
    )

    async def body(state: State) -> None:
        _inputs(state)
        await eventually(lambda: len(nodes.patches) == 2, what="both nodes assigned")
        await settle()
        assert [name for name, _ in nodes.patches] == ["w1", "w2"]
        assert nodes.nodes["w2"]["spec"]["podCIDRs"] == ["10.244.2.0/24"]
        assert etcd.taken == 2, "one pass under the lock per node that needed one"

    run([controller], body)


@pytest.mark.parametrize(
    ("self_hosted", "flags"),
    [
        (True, ("--allocate-node-cidrs=false",)),  # the DaemonSet allocates
        (False, ("--allocate-node-cidrs=true",)),  # extraArgs turned it back on
    ],
)
def test_nothing_is_assigned_beside_a_kube_controller_manager_that_allocates(
    self_hosted: bool, flags: tuple[str, ...]
) -> None:
    nodes = FakeNodes([node("cp1"), node("w1")])
    controller = node_cidr.NodeCIDRController(
        etcd=FakeEtcd(), retry_interval=0.01, kube_client=lambda text: _api(nodes)
    )

    async def body(state: State) -> None:
        _inputs(state, self_hosted=self_hosted, flags=flags)
        await settle()
        assert nodes.patches == [] and nodes.watches == 0

    run([controller], body)
