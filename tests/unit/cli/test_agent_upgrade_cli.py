"""``kubeplane upgrade`` (the agent, not Kubernetes) through the CLI against fake nodes: one node
at a time, each waited for on its new version before the next, the flags as the node receives
them, and a node's refusal stopping the roll."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kubeplane.cli import agentupgrade

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
