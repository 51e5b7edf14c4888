"""What the certificate report reads on a node: PEM files and kubeconfigs in the node's certificate
places, public parts only, never through a symlink, never a huge file, soonest expiry first."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import pytest
import yaml

from kubeplane import pki
from kubeplane.agent import certs
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit


def test_scan_reports_pem_files_kubeconfigs_and_bundles_soonest_expiry_first(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path)
    ca = pki.new_ca("etcd-ca")
    soon = pki.issue(ca=ca, common_name="etcd-peer", lifetime=datetime.timedelta(days=3))
    later = pki.issue(ca=ca, common_name="apiserver", lifetime=datetime.timedelta(days=300))
    kubelet = pki.issue(ca=ca, common_name="system:node:n1", usages=("client",))

    (paths.secrets / "etcd").mkdir(parents=True)
    (paths.secrets / "etcd" / "peer.crt").write_bytes(soon.cert)
    (paths.secrets / "etcd" / "peer.key").write_bytes(soon.key)  # never opened: not a certificate file
    (paths.secrets / "etcd" / "bundle.crt").write_bytes(later.cert + ca.cert)
    (paths.kubelet_root / "pki").mkdir(parents=True)
    # The kubelet keeps its key and certificate in one file: only the certificate is parsed.
    (paths.kubelet_root / "pki" / "kubelet-client-current.pem").write_bytes(kubelet.cert + kubelet.key)
    paths.kubernetes_etc.mkdir(parents=True)
    kubeconfig = {
        "clusters": [
            {"name": "c", "cluster": {"certificate-authority-data": base64.b64encode(ca.cert).decode()}}
        ],
        "users": [
            {"name": "kubelet", "user": {"client-certificate-data": base64.b64encode(kubelet.cert).decode()}}
        ],
    }
    (paths.kubernetes_etc / "kubelet.conf").write_text(yaml.safe_dump(kubeconfig))
    (paths.kubernetes_etc / "manifests").mkdir()
    (paths.kubernetes_etc / "manifests" / "not-looked-at.crt").write_bytes(later.cert)

    found = certs.scan(paths)
    seen = [(f.path, f.what, f.subject) for f in found]
    assert seen[0] == ("/system/secrets/etcd/peer.crt", "certificate", "etcd-peer")  # expires first
    assert sorted(seen[1:]) == sorted(
        [
            ("/system/secrets/etcd/bundle.crt", "certificate", "apiserver"),
            ("/system/secrets/etcd/bundle.crt", "certificate #2", "etcd-ca"),
            ("/var/lib/kubelet/pki/kubelet-client-current.pem", "certificate", "system:node:n1"),
            ("/etc/kubernetes/kubelet.conf", "client certificate of kubelet", "system:node:n1"),
            ("/etc/kubernetes/kubelet.conf", "cluster CA of c", "etcd-ca"),
        ]
    )
    assert [f.is_ca for f in found if f.subject == "etcd-ca"] == [True, True]
    assert all(f.issuer == "etcd-ca" for f in found)
    assert "PRIVATE" not in repr([f.as_dict() for f in found])


def test_scan_does_not_follow_symlinks_nor_read_huge_or_special_files(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path / "node")
    outside = tmp_path / "outside.crt"
    outside.write_bytes(pki.new_ca("outside").cert)
    (paths.secrets / "kubernetes").mkdir(parents=True)
    (paths.secrets / "kubernetes" / "link.crt").symlink_to(outside)
    (paths.secrets / "kubernetes" / "huge.crt").write_bytes(
        pki.new_ca("huge").cert + b"x" * certs.MAX_FILE_BYTES
    )
    (paths.secrets / "kubernetes" / "garbage.crt").write_bytes(
        b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"
    )
    (paths.secrets / "kubernetes" / "broken.conf").write_text("{not: [yaml")
    assert certs.scan(paths) == []
