"""Which node directory the self-hosted pod-checkpointer DaemonSet mounts on each node."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kubeplane.agent.selfhosted import node_root_pattern
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit


def test_the_machine_root_is_used_as_it_is() -> None:
    # Local cluster nodes are machines too: their agents run at / over their own bind mounts.
    assert node_root_pattern(NodePaths(Path("/")), "node-1") == "/"


def test_another_root_is_used_as_it_is_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "nodes" / "controlplane-1"
    root.mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        assert node_root_pattern(NodePaths(root), "lab-controlplane-1") == str(root.resolve())
    assert "lab-controlplane-1 runs under root" in caplog.text
