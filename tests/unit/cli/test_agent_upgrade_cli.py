"""``kubeplane upgrade`` (the agent, not Kubernetes) through the CLI against fake nodes: one node
at a time, each waited for on its new version before the next, the flags as the node receives
them, and a node's refusal stopping the roll."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kubeplane.cli import agentupgrade
from kubeplane.ops.upgrade import ClusterNode

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.unit

BUILD = "/var/lib/kubeplane/uploads/0.2.0"


def up(*ids: str) -> list[dict[str, object]]:
    return [{"id": id_, "up": True} for id_ in ids]


def test_rolls_one_node_at_a_time_and_waits_for_each(three: Cluster) -> None:
    for node in three.nodes:
        node.services = up("etcd")  # no kubelet: no Node to wait for
    nodes = ",".join(three.addresses)
    result = three.run("-n", nodes, "upgrade", "--path", BUILD)
    assert result.exit_code == 0, result.output
    for address, node in zip(three.addresses, three.nodes, strict=True):
        assert node.tag == "0.2.0"
        upgrades = [call for call in node.calls if call.startswith("upgrade")]
        assert upgrades == [f"upgrade path={BUILD} stage=False preserve=None force=False"]
        # Waited for: asked its version and services after the upgrade.
        assert node.calls.index(upgrades[0]) < max(i for i, c in enumerate(node.calls) if c == "service_list")
        assert f"node {address}: upgraded and back in" in result.stdout


def test_a_refused_node_stops_the_roll(three: Cluster) -> None:
    nodes = ",".join(three.addresses)
    result = three.run("-n", nodes, "upgrade", "--path", "/tmp/evil")
    assert result.exit_code != 0
    assert "not under /var/lib/kubeplane/uploads" in result.output
    assert not any(call.startswith("upgrade") for call in three.nodes[1].calls)


def test_stage_and_flags_reach_the_node_without_waiting(three: Cluster) -> None:
    node = three.addresses[0]
    result = three.run("-n", node, "upgrade", "--path", BUILD, "--stage", "--no-preserve", "--force")
    assert result.exit_code == 0, result.output
    assert (
        "upgrade path=/var/lib/kubeplane/uploads/0.2.0 stage=True preserve=False force=True"
        in three.nodes[0].calls
    )
    assert "service_list" not in three.nodes[0].calls
    assert three.nodes[0].tag == "0.1.0-test"


def test_dry_run_changes_nothing(three: Cluster) -> None:
    node = three.addresses[0]
    result = three.run("-n", node, "upgrade", "--path", BUILD, "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"upgrade kubeplaned on node {node}: 0.1.0-test -> {BUILD}" in result.stdout
    assert not any(call.startswith("upgrade") for call in three.nodes[0].calls)


@pytest.mark.parametrize(
    ("version", "services", "reason"),
    [
        ({"tag": "0.1.0", "phase": "running"}, up("etcd"), "runs kubeplaned 0.1.0, not 0.2.0"),
        ({"tag": "0.2.0", "phase": "booting"}, up("etcd"), "booting, not running"),
        ({"tag": "0.2.0", "phase": "running"}, [{"id": "etcd", "up": False}], "etcd not up"),
        ({"tag": "0.2.0", "phase": "running"}, up("etcd", "kubelet"), None),
    ],
)
def test_a_node_is_back_on_its_version_booted_with_its_services_up(
    version: dict[str, str], services: list[dict[str, object]], reason: str | None
) -> None:
    found = agentupgrade.missing(version, services, want="0.2.0")
    assert (found is None) if reason is None else (found is not None and reason in found)


@pytest.mark.parametrize(
    ("instance", "reason"),
    [
        ("first", "has not restarted yet"),  # the agent asked to upgrade still answers
        ("second", None),
        (None, None),  # a build from before the instance id: a new agent all the same
    ],
)
def test_a_same_version_reinstall_is_back_only_from_a_new_agent(
    instance: str | None, reason: str | None
) -> None:
    version = {"tag": "0.2.0", "phase": "running", **({"instance": instance} if instance else {})}
    found = agentupgrade.missing(version, up("etcd"), want="0.2.0", before="first")
    assert (found is None) if reason is None else (found is not None and reason in found)


def test_the_apiserver_of_a_node_is_its_advertise_address_and_local_port() -> None:
    spec = {"advertiseAddress": "10.5.0.2", "localAPIServerPort": 6443}
    assert agentupgrade.apiserver_url(spec) == "https://10.5.0.2:6443"
    spec = {"advertiseAddress": "fd00::2", "localAPIServerPort": 7443}
    assert agentupgrade.apiserver_url(spec) == "https://[fd00::2]:7443"


class FakeRotation:
    """A load balancer rotation recording what the CLI asks, in order, with the nodes' calls."""

    def __init__(self, cluster: Cluster, *, out: set[str] | None = None) -> None:
        self.cluster = cluster
        self.out = set(out or ())
        self.log: list[str] = []

    def _upgraded(self) -> list[str]:
        """The nodes asked to upgrade so far."""
        return [
            address
            for address, node in zip(self.cluster.addresses, self.cluster.nodes, strict=True)
            if any(call.startswith("upgrade") for call in node.calls)
        ]

    async def drain(self, node: ClusterNode) -> None:
        self.out.add(node.address)
        self.log.append(f"drain {node.address} (upgraded so far: {self._upgraded()})")

    async def restore(self, node: ClusterNode) -> None:
        self.out.discard(node.address)
        self.log.append(f"restore {node.address} (upgraded so far: {self._upgraded()})")

    async def serving(self) -> set[str]:
        return set(self.cluster.addresses) - self.out


def local(monkeypatch: pytest.MonkeyPatch, rotation: FakeRotation, addresses: list[str]) -> None:
    """Make ``addresses`` the control plane nodes of a local cluster behind ``rotation``."""
    monkeypatch.setattr(
        agentupgrade, "local_rotation", lambda nodes: rotation if set(nodes) <= set(addresses) else None
    )


def test_control_plane_nodes_leave_the_rotation_while_they_restart(
    three: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for node in three.nodes:
        node.services = up("etcd")
    first, second, _worker = three.addresses
    rotation = FakeRotation(three)
    local(monkeypatch, rotation, [first, second])
    result = three.run("-n", ",".join(three.addresses), "upgrade", "--path", BUILD)
    assert result.exit_code == 0, result.output
    # Out before its upgrade, back after it (and before the next node's); the worker never leaves.
    assert rotation.log == [
        f"drain {first} (upgraded so far: [])",
        f"restore {first} (upgraded so far: ['{first}'])",
        f"drain {second} (upgraded so far: ['{first}'])",
        f"restore {second} (upgraded so far: ['{first}', '{second}'])",
    ]
    assert not rotation.out
    assert f"taking node {first} out of the load balancer rotation" in result.output
    assert f"putting node {second} back into the load balancer rotation" in result.output


def test_a_refused_upgrade_puts_its_node_back(three: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    rotation = FakeRotation(three)
    local(monkeypatch, rotation, list(three.addresses))
    result = three.run("-n", ",".join(three.addresses), "upgrade", "--path", "/tmp/evil")
    assert result.exit_code != 0
    first = three.addresses[0]
    # Asked (and refused), then put back; the next node is never asked.
    assert rotation.log == [
        f"drain {first} (upgraded so far: [])",
        f"restore {first} (upgraded so far: ['{first}'])",
    ]
    assert not rotation.out


def test_a_node_an_interrupted_run_left_out_is_put_back_first(
    three: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for node in three.nodes:
        node.services = up("etcd")
    first, second, _ = three.addresses
    rotation = FakeRotation(three, out={second})
    local(monkeypatch, rotation, list(three.addresses))
    result = three.run("-n", first, "upgrade", "--path", BUILD)
    assert result.exit_code == 0, result.output
    # Only the nodes of this run: the second is not touched.
    assert rotation.log[0] == f"drain {first} (upgraded so far: [])"
    assert rotation.out == {second}
    rotation.out.add(first)  # as a run killed between drain and restore leaves it
    rotation.log.clear()
    result = three.run("-n", first, "upgrade", "--path", BUILD)
    assert result.exit_code == 0, result.output
    assert rotation.log[0] == f"restore {first} (upgraded so far: ['{first}'])", rotation.log
    assert f"node {first} is not serving through the load balancer: putting it back" in result.output


def test_a_staged_build_leaves_the_rotation_alone(three: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    rotation = FakeRotation(three)
    local(monkeypatch, rotation, list(three.addresses))
    result = three.run("-n", three.addresses[0], "upgrade", "--path", BUILD, "--stage")
    assert result.exit_code == 0, result.output
    assert rotation.log == []


@pytest.mark.parametrize(
    ("service", "up"),
    [
        # ServiceList documents, as a node sends them: no "up", running and health instead.
        ({"id": "etcd", "running": True, "health": {"healthy": True, "unknown": False}}, True),
        ({"id": "etcd", "running": True, "health": {"healthy": False, "unknown": False}}, False),
        ({"id": "cri", "running": True, "health": {"healthy": False, "unknown": True}}, True),
        ({"id": "etcd", "running": False, "health": {"healthy": True, "unknown": False}}, False),
        # A Services resource says "up" itself.
        ({"id": "etcd", "up": False, "running": True}, False),
    ],
)
def test_a_service_is_up_when_running_and_not_unhealthy(service: dict[str, object], up: bool) -> None:
    assert agentupgrade.service_up(service) is up
