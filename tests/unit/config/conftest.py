"""Shared fixtures for the config tests: the example configs under ``examples/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplane import config

EXAMPLES = Path(__file__).parent / "examples"

MINIMAL = """\
version: v1alpha1
machine:
  type: controlplane # the node runs etcd and the control plane
  time:
    servers:
      - time.cloudflare.com
  kubelet:
    image: ghcr.io/talos-systems/kubelet:v1.20.2
cluster:
  controlPlane:
    endpoint: https://10.5.0.1:6443
  apiServer:
    image: k8s.gcr.io/kube-apiserver:v1.20.2
"""


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture
def full_text() -> str:
    return (EXAMPLES / "controlplane_full.yaml").read_text()


@pytest.fixture
def minimal_text() -> str:
    return MINIMAL


@pytest.fixture
def minimal() -> config.MachineConfig:
    return config.load(MINIMAL)
