"""Fixtures of the k8s controller tests: generated configs, node paths, a local HTTP server."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_harness import LocalServer

from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths


@pytest.fixture(scope="session")
def generated_docs() -> dict[str, Any]:
    """Generated machine config documents by machine type (copy before changing them)."""
    configs = gen.generate(gen.GenOptions(cluster_name="test", endpoint="10.5.0.1"), gen.new_secrets())
    return dict(configs.documents)


@pytest.fixture
def doc(generated_docs: dict[str, Any]) -> dict[str, Any]:
    """A fresh copy of the generated controlplane config."""
    return copy.deepcopy(generated_docs["controlplane"])


@pytest.fixture
def worker_doc(generated_docs: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(generated_docs["worker"])


@pytest.fixture
def paths(tmp_path: Path) -> NodePaths:
    return NodePaths(root=tmp_path / "node")


@pytest.fixture
def local_server() -> Iterator[LocalServer]:
    server = LocalServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()
