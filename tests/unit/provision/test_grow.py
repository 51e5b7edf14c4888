"""``cluster add`` / ``cluster remove`` planning: next free names and addresses, resuming a
failed add, and the refusals (last control plane node, quorum of the healthy members)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubeplane.clients import etcd as etcd_client
from kubeplane.config import client as client_config
from kubeplane.provision import grow, netns, planning, state, teardown
from kubeplane.provision.cluster import ClusterMeta, PlanError

pytestmark = pytest.mark.unit

CIDR = "10.5.21.0/24"


def _node(name: str, role: state.Role, index: int, *, joined: bool = True) -> state.NodeState:
    return state.NodeState(
        name=name,
        role=role,
        index=index,
        ip=f"10.5.21.{index + 1}",
        netns=netns.netns_name("e2e1", name),
        host_veth=netns.veth_name("e2e1", index),
        joined=joined,
    )


ONE_PLUS_ONE = [_node("e2e1-controlplane-1", "controlplane", 1), _node("e2e1-worker-1", "worker", 2)]


def test_new_nodes_take_the_next_free_names_and_addresses() -> None:
    added = grow.plan_additions("e2e1", CIDR, ONE_PLUS_ONE, controlplanes=2, workers=1)
    assert [(a.name, a.role, a.index, a.ip) for a in added] == [
        ("e2e1-controlplane-2", "controlplane", 3, "10.5.21.4"),
        ("e2e1-controlplane-3", "controlplane", 4, "10.5.21.5"),
        ("e2e1-worker-2", "worker", 5, "10.5.21.6"),
    ]
    assert added[0].netns == "kp-e2e1-e2e1-controlplane-2"
    assert added[0].host_veth == netns.veth_name("e2e1", 3)
    assert not any(a.resumed for a in added)


def test_a_removed_nodes_name_and_address_are_used_again() -> None:
    nodes = [*ONE_PLUS_ONE, _node("e2e1-controlplane-3", "controlplane", 4)]
    added = grow.plan_additions("e2e1", CIDR, nodes, controlplanes=1, workers=0)
    assert [(a.name, a.index, a.ip) for a in added] == [("e2e1-controlplane-2", 3, "10.5.21.4")]


def test_a_rerun_finishes_the_unjoined_nodes_instead_of_making_more() -> None:
    nodes = [*ONE_PLUS_ONE, _node("e2e1-controlplane-2", "controlplane", 3, joined=False)]
    added = grow.plan_additions("e2e1", CIDR, nodes, controlplanes=2, workers=0)
    assert [(a.name, a.index, a.resumed) for a in added] == [
        ("e2e1-controlplane-2", 3, True),
        ("e2e1-controlplane-3", 4, False),
    ]


def test_nothing_to_add_and_a_full_network_are_refused() -> None:
    with pytest.raises(PlanError, match="nothing to add"):
        grow.plan_additions("e2e1", CIDR, ONE_PLUS_ONE, controlplanes=0, workers=0)
    # A /29 holds the host and five nodes (.2 to .6): the sixth node has no address.
    with pytest.raises(PlanError, match="no free address left for e2e1-worker-3"):
        grow.plan_additions("e2e1", "10.5.21.0/29", ONE_PLUS_ONE, controlplanes=2, workers=2)


def _member(name: str, member_id: int, *, learner: bool = False) -> etcd_client.Member:
    return etcd_client.Member(
        id=member_id, name=name, peer_urls=[f"https://{name}:2380"], client_urls=[], is_learner=learner
    )


THREE = [_member("cp-1", 1), _member("cp-2", 2), _member("cp-3", 3)]
CPS = ["cp-1", "cp-2", "cp-3"]


def test_removing_the_last_control_plane_node_is_refused_naming_it() -> None:
    refusal = grow.removal_refusal(
        "e2e1", controlplanes=["cp-1"], removing=["cp-1"], members=[_member("cp-1", 1)], healthy={1}
    )
    assert refusal is not None
    assert "cp-1" in refusal
    assert "1 control plane node(s) and 1 etcd member(s)" in refusal


def test_removing_two_of_three_healthy_members_one_after_the_other_is_allowed() -> None:
    assert (
        grow.removal_refusal(
            "e2e1", controlplanes=CPS, removing=["cp-2", "cp-3"], members=THREE, healthy={1, 2, 3}
        )
        is None
    )


def test_removing_a_healthy_member_when_another_is_down_is_refused() -> None:
    # cp-3 is down: without cp-2, the two members left (cp-1, cp-3) need both for a quorum of 2.
    refusal = grow.removal_refusal(
        "e2e1", controlplanes=CPS, removing=["cp-2"], members=THREE, healthy={1, 2}
    )
    assert refusal is not None
    assert refusal.startswith("refusing to remove control plane node cp-2: etcd has 3 member(s), 2 healthy")
    assert "below the quorum of 2" in refusal


def test_removing_the_member_that_is_down_is_allowed() -> None:
    assert (
        grow.removal_refusal("e2e1", controlplanes=CPS, removing=["cp-3"], members=THREE, healthy={1, 2})
        is None
    )


def test_workers_and_unstarted_members_need_no_quorum_check() -> None:
    assert (
        grow.removal_refusal(
            "e2e1", controlplanes=["cp-1"], removing=["w-1"], members=THREE[:1], healthy=set()
        )
        is None
    )
    # A control plane node whose add failed before etcd listed it has no member to remove.
    assert (
        grow.removal_refusal(
            "e2e1", controlplanes=["cp-1", "cp-2"], removing=["cp-2"], members=THREE[:1], healthy={1}
        )
        is None
    )


def test_member_documents_from_the_node_api() -> None:
    document = {"id": "1a", "name": "cp-1", "peer_urls": ["p"], "client_urls": ["c"], "learner": True}
    assert grow.member_from_document(document) == etcd_client.Member(
        id=26, name="cp-1", peer_urls=["p"], client_urls=["c"], is_learner=True
    )


def test_unjoined_state_round_trips_and_old_states_read_as_joined(tmp_path: Path) -> None:
    cluster = state.ClusterState.open("e2e1", root=tmp_path)
    cluster.nodes = [ONE_PLUS_ONE[0], _node("e2e1-controlplane-2", "controlplane", 3, joined=False)]
    cluster.save()
    loaded = state.ClusterState.load("e2e1", root=tmp_path)
    assert [n.joined for n in loaded.nodes] == [True, False]
    old = ONE_PLUS_ONE[0].to_dict()
    del old["joined"]
    assert state.NodeState.from_dict(old).joined


@pytest.fixture
def running(tmp_path: Path) -> state.ClusterState:
    """A 1+1 cluster's state, metadata and client config as `cluster create` leaves them (no
    processes: the plans below are built without touching a node)."""
    cluster_plan = planning.plan(planning.ClusterRequest(name="e2e1", cidr=CIDR))
    cluster = state.ClusterState.open("e2e1", root=tmp_path)
    cluster.network = state.NetworkState(cidr=CIDR, host_ip="10.5.21.1", bridge="kp-e2e1")
    cluster.nodes = list(ONE_PLUS_ONE)
    cluster.save()
    config_path = tmp_path / "config"
    client_config.save(cluster_plan.client_config, config_path)
    (cluster.directory / "kubeconfig").write_text("")
    ClusterMeta(
        endpoint="https://10.5.21.1:6443",
        kubernetes_version="v1.20.2",
        client_config_path=str(config_path),
        context="e2e1",
        kubeconfig=str(cluster.directory / "kubeconfig"),
    ).save(cluster.directory)
    return cluster


def test_the_add_plan_names_every_new_node_and_where_its_config_comes_from(
    running: state.ClusterState,
) -> None:
    additions = grow.plan_additions("e2e1", CIDR, running.nodes, controlplanes=2, workers=0)
    text = grow.Growth(running, additions).plan().render()
    assert "e2e1-controlplane-2 (10.5.21.4), e2e1-controlplane-3 (10.5.21.5), not joined yet" in text
    assert "the running config with the node's hostname (controlplanes from e2e1-controlplane-1)" in text
    assert "wait etcd member and API server on node 10.5.21.4" in text
    assert "haproxy backends e2e1-controlplane-1, e2e1-controlplane-2, e2e1-controlplane-3" in text


def test_a_role_the_cluster_has_no_node_of_is_refused(running: state.ClusterState) -> None:
    running.nodes = [ONE_PLUS_ONE[0]]
    additions = grow.plan_additions("e2e1", CIDR, running.nodes, controlplanes=0, workers=1)
    with pytest.raises(PlanError, match="has no worker node to take the worker config from"):
        grow.Growth(running, additions)


def test_the_remove_plan_drains_moves_leadership_and_removes_the_member_first(
    running: state.ClusterState,
) -> None:
    running.nodes = [*ONE_PLUS_ONE, _node("e2e1-controlplane-2", "controlplane", 3)]
    steps = grow.Shrink(running, ["e2e1-controlplane-2"]).plan().steps
    assert [(s.kind, s.component) for s in steps] == [
        ("drain", "load balancer rotation"),
        ("move", "etcd leadership"),
        ("remove", "etcd member"),
        ("delete", "Node object"),
        ("stop", "node"),
        ("update", "load balancer"),
    ]
    assert steps[2].target == "e2e1-controlplane-2, through e2e1-controlplane-1"
    worker = grow.Shrink(running, ["e2e1-worker-1"]).plan().steps
    assert [s.component for s in worker] == ["Node object", "node"]


def test_removing_an_unknown_node_is_refused_listing_the_nodes(running: state.ClusterState) -> None:
    with pytest.raises(
        PlanError, match="has no node e2e1-controlplane-9; its nodes are e2e1-controlplane-1, e2e1-worker-1"
    ):
        grow.Shrink(running, ["e2e1-controlplane-9"])


def test_a_cluster_with_moved_ports_is_reached_and_listed_on_them(running: state.ClusterState) -> None:
    """`cluster add`/`remove` reach the booted nodes on the cluster's node API port, rewrite the
    context's endpoints with it, and destroy still recognises that context as the cluster's."""
    running.node_api_port, running.trustd_port = 51000, 51001
    access = grow.cluster_access(running)
    assert access.node_api_endpoint("10.5.21.3") == "10.5.21.3:51000"
    assert access.endpoints == ("10.5.21.2:51000",) and access.controlplanes == ("10.5.21.2",)
    running.nodes.append(_node("e2e1-controlplane-2", "controlplane", 3))
    grow.sync_context(running)
    path = Path(ClusterMeta.load(running.directory).client_config_path)  # type: ignore[union-attr]
    context = client_config.load(path).contexts["e2e1"]
    assert context.endpoints == ("10.5.21.2:51000", "10.5.21.4:51000")
    assert context.nodes == ("10.5.21.2", "10.5.21.3", "10.5.21.4")
    teardown._remove_context(path, "e2e1", endpoints=running.context_endpoints())
    assert "e2e1" not in client_config.load(path).contexts


def test_a_new_nodes_config_must_carry_the_clusters_ports(running: state.ClusterState) -> None:
    """The running config a new node copies has the cluster's ports; another value is refused."""
    moved = planning.plan(
        planning.ClusterRequest(name="e2e1", cidr=CIDR, node_api_port=51000, trustd_port=51001)
    )
    document = yaml.safe_load(moved.workers[0].config)
    text = planning.node_config(document, hostname="e2e1-worker-2", node_api_port=51000, trustd_port=51001)
    assert yaml.safe_load(text)["machine"]["ports"] == {"nodeAPI": 51000, "trustd": 51001}
    with pytest.raises(
        PlanError, match=r"sets machine.ports to nodeAPI 51000, trustd 51001, but the cluster's ports"
    ):
        planning.node_config(document, hostname="e2e1-worker-2")


def test_new_nodes_never_take_the_vips_address() -> None:
    added = grow.plan_additions(
        "e2e1", CIDR, ONE_PLUS_ONE, controlplanes=2, workers=0, reserved=["10.5.21.4"]
    )
    assert [(a.name, a.index, a.ip) for a in added] == [
        ("e2e1-controlplane-2", 4, "10.5.21.5"),
        ("e2e1-controlplane-3", 5, "10.5.21.6"),
    ]


def test_a_vip_cluster_adds_and_removes_without_load_balancer_steps(running: state.ClusterState) -> None:
    assert running.network is not None
    running.network.vip = "10.5.21.250"
    additions = grow.plan_additions("e2e1", CIDR, running.nodes, controlplanes=1, workers=0)
    added = [s.component for s in grow.Growth(running, additions).plan().steps]
    assert added == [
        "node records",
        "network",
        "node agents",
        "configs",
        "etcd member and API server",
        "client config",
    ]
    running.nodes = [*ONE_PLUS_ONE, _node("e2e1-controlplane-2", "controlplane", 3)]
    steps = grow.Shrink(running, ["e2e1-controlplane-2"]).plan().steps
    assert [s.component for s in steps] == ["etcd leadership", "etcd member", "Node object", "node"]


def test_the_vip_round_trips_in_the_state_and_old_states_have_none(tmp_path: Path) -> None:
    cluster = state.ClusterState.open("e2e1", root=tmp_path)
    cluster.network = state.NetworkState(cidr=CIDR, host_ip="10.5.21.1", bridge="kp-e2e1", vip="10.5.21.250")
    cluster.save()
    loaded = state.ClusterState.load("e2e1", root=tmp_path)
    assert loaded.network is not None and loaded.network.vip == "10.5.21.250"
    old = {"cidr": CIDR, "host_ip": "10.5.21.1", "bridge": "kp-e2e1"}
    assert state.NetworkState.from_dict(old).vip == ""
