"""Which node directory the self-hosted pod-checkpointer DaemonSet mounts on each node."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kubeplane.agent.selfhosted import node_root_pattern
from kubeplane.config.paths import NodePaths
from kubeplane.provision import cluster

pytestmark = pytest.mark.unit


def test_local_cluster_nodes_each_get_their_own_directory(tmp_path: Path) -> None:
    directory = tmp_path / "lab"
    roots = {}
    for name in ("lab-controlplane-1", "lab-controlplane-2"):
        root = cluster.node_root(directory, name)
        root.mkdir(parents=True)
        cluster.link_node_name(root, name)
        cluster.link_node_name(root, name)  # re-running create keeps the one link
        roots[name] = root
    pattern = node_root_pattern(NodePaths(roots["lab-controlplane-1"]), "lab-controlplane-1")
    assert pattern == f"{directory.resolve()}/nodes/$(NODE_NAME)"
    # What the kubelet makes of the pattern on each node is that node's own root.
    for name, root in roots.items():
        assert Path(pattern.replace("$(NODE_NAME)", name)).resolve() == root
    # The link is relative: the cluster directory can move.
    assert (directory / "nodes" / "lab-controlplane-2").readlink() == Path("controlplane-2")


def test_a_root_not_reachable_by_node_name_is_used_as_it_is_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "nodes" / "controlplane-1"
    root.mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        assert node_root_pattern(NodePaths(root), "lab-controlplane-1") == str(root.resolve())
    assert "not reachable as" in caplog.text and "lab-controlplane-1" in caplog.text


def test_the_machine_root_is_used_as_it_is() -> None:
    assert node_root_pattern(NodePaths(Path("/")), "node-1") == "/"


def test_a_directory_in_the_way_of_the_link_is_named_not_removed(tmp_path: Path) -> None:
    root = cluster.node_root(tmp_path / "lab", "lab-controlplane-1")
    root.mkdir(parents=True)
    stale = root.parent / "lab-controlplane-1"
    stale.mkdir()
    (stale / "data").write_text("kept")
    with pytest.raises(cluster.CreateError, match="lab-controlplane-1 exists and is not a link"):
        cluster.link_node_name(root, "lab-controlplane-1")
    assert (stale / "data").read_text() == "kept"
