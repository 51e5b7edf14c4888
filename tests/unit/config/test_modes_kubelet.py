"""Which default-mode applies restart only the kubelet."""

from __future__ import annotations

import pytest

from kubeplane import config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        (["machine.kubelet.image"], True),
        (["machine.kubelet.extraArgs.v", "machine.kubelet.image"], True),
        (["machine.kubelet"], True),
        (["machine.kubelet.image", "cluster.apiServer.image"], False),
        (["machine.kubeletExtra"], False),
        (["machine.install.image"], False),
        ([], False),
    ],
)
def test_kubelet_only(changed: list[str], expected: bool) -> None:
    assert config.kubelet_only(changed) is expected
