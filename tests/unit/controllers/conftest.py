"""Shared inputs and the golden-file helper for the control plane rendering tests.

Golden files live in tests/unit/golden/controllers/. After an intended rendering change,
regenerate them with ``KUBEPLANE_UPDATE_GOLDEN=1 pytest tests/unit/controllers`` and review the diff.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kubeplane.controllers.k8s import manifests, render

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden" / "controllers"
UPDATE_ENV = "KUBEPLANE_UPDATE_GOLDEN"


def _component(image: str, config_version: str) -> render.ComponentInputs:
    return render.ComponentInputs(image=image, config_version=config_version)


@pytest.fixture
def cp_inputs() -> render.ControlPlaneInputs:
    return render.ControlPlaneInputs(
        advertise_address="10.5.0.2",
        pod_cidrs=("10.244.0.0/16",),
        service_cidrs=("10.96.0.0/12",),
        apiserver=_component("k8s.gcr.io/kube-apiserver:v1.20.2", "2"),
        controller_manager=_component("k8s.gcr.io/kube-controller-manager:v1.20.2", "3"),
        scheduler=_component("k8s.gcr.io/kube-scheduler:v1.20.2", "4"),
        secrets_version="1",
    )


@pytest.fixture
def manifest_inputs() -> manifests.ManifestInputs:
    return manifests.ManifestInputs(
        kubernetes_version=render.KubeVersion(1, 20, 2),
        server="https://10.5.0.1:6443",
        bootstrap_token="abcdef.0123456789abcdef",
        pod_cidrs=("10.244.0.0/16",),
        dns_service_ip="10.96.0.10",
        proxy_image="k8s.gcr.io/kube-proxy:v1.20.2",
    )


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """Compare `text` with golden file `name`, or rewrite it when KUBEPLANE_UPDATE_GOLDEN=1."""

    def check(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if os.environ.get(UPDATE_ENV) == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"golden file {path} is missing; create it with {UPDATE_ENV}=1"
        assert text == path.read_text(), (
            f"rendering differs from {path}; if the change is intended, rerun with {UPDATE_ENV}=1 "
            "and review the diff"
        )

    return check
