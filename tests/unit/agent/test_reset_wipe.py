"""What ``reset`` wipes on a node: the labels, their directories, and a wipe that empties them
without following a symlink out of the node and without removing the directories themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplane.agent import reset
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit


def test_labels_default_to_everything_and_keep_a_fixed_order() -> None:
    assert reset.parse_labels(None) == ("state", "etcd", "kubelet", "containerd")
    assert reset.parse_labels(" ") == reset.WIPE_LABELS
    assert reset.parse_labels("kubelet, state") == ("state", "kubelet")
    with pytest.raises(reset.UnknownLabel, match="unknown wipe label disk, ephemeral: choose from"):
        reset.parse_labels("etcd,ephemeral,disk")


def test_each_label_names_the_node_directories_it_owns(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path)
    assert reset.directories(paths, ["state"]) == [tmp_path / "system"]
    # Without the state, wiping etcd also drops the bootstrap marker: the member is a new one.
    assert reset.directories(paths, ["etcd"]) == [
        tmp_path / "var/lib/etcd",
        tmp_path / "system/etcd-bootstrap",
    ]
    assert reset.directories(paths, ["kubelet", "containerd"]) == [
        tmp_path / "var/lib/kubelet",
        tmp_path / "etc/kubernetes",
        tmp_path / "etc/cni/net.d",
        tmp_path / "var/lib/containerd",
        tmp_path / "run/containerd",
    ]


def test_wipe_empties_directories_and_never_follows_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the node's")
    kubelet = tmp_path / "var/lib/kubelet"
    (kubelet / "pki").mkdir(parents=True)
    (kubelet / "pki/kubelet-client-current.pem").write_text("cert")
    (kubelet / "escape").symlink_to(outside)
    marker = tmp_path / "system/etcd-bootstrap"
    marker.parent.mkdir()
    marker.write_text("done\n")

    left = reset.wipe([kubelet, marker, tmp_path / "absent"])
    assert left == []
    assert kubelet.is_dir() and list(kubelet.iterdir()) == []
    assert not marker.exists()
    assert (outside / "keep").read_text() == "not the node's"
