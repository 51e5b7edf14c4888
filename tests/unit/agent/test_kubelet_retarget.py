"""The kubelet's kubeconfig follows an endpoint change with its credentials kept
(:func:`kubeplane.agent.services.retarget_kubeconfig`, used as the kubelet starts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubeplane.agent.services import retarget_kubeconfig

pytestmark = pytest.mark.unit

OLD = "https://10.5.0.1:6443"
NEW = "https://lb.example.test:443"
KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "default-cluster", "cluster": {"server": OLD, "certificate-authority": "/ca.crt"}}],
    "users": [
        {
            "name": "default-auth",
            "user": {
                "client-certificate": "/var/lib/kubelet/pki/kubelet-client-current.pem",
                "client-key": "/var/lib/kubelet/pki/kubelet-client-current.pem",
            },
        }
    ],
    "contexts": [
        {"name": "default-context", "context": {"cluster": "default-cluster", "user": "default-auth"}}
    ],
    "current-context": "default-context",
}


def test_the_server_changes_and_the_credentials_stay(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.conf"
    path.write_text(yaml.safe_dump(KUBECONFIG))
    assert retarget_kubeconfig(path, NEW) is True
    document = yaml.safe_load(path.read_text())
    assert document["clusters"][0]["cluster"] == {"server": NEW, "certificate-authority": "/ca.crt"}
    assert document["users"] == KUBECONFIG["users"]
    assert document["current-context"] == "default-context"
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_kubeconfig_at_the_endpoint_already_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.conf"
    text = yaml.safe_dump(KUBECONFIG)
    path.write_text(text)
    before = path.stat().st_mtime_ns
    assert retarget_kubeconfig(path, OLD) is False
    assert path.read_text() == text and path.stat().st_mtime_ns == before


def test_a_file_that_is_no_kubeconfig_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.conf"
    path.write_text("the kubelet's own")
    assert retarget_kubeconfig(path, NEW) is False
    assert path.read_text() == "the kubelet's own"
