"""Secrets directory layout and the rendered API server configuration files."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import PurePosixPath

import pytest
import yaml

from kubeplane.controllers.k8s import RenderError, files

pytestmark = pytest.mark.unit

AESCBC_SECRET = base64.b64encode(bytes(range(32))).decode()


def test_encryption_config_matches_golden(golden: Callable[[str, str], None]) -> None:
    golden("encryptionconfig.yaml", files.render_encryption_config(AESCBC_SECRET))


def test_audit_policy_matches_golden(golden: Callable[[str, str], None]) -> None:
    golden("auditpolicy.yaml", files.render_audit_policy())


def test_encryption_config_encrypts_secrets_and_still_reads_plaintext() -> None:
    config = yaml.safe_load(files.render_encryption_config(AESCBC_SECRET))
    (resource,) = config["resources"]
    assert resource["resources"] == ["secrets"]
    aescbc, identity = resource["providers"]
    assert aescbc["aescbc"]["keys"][0]["secret"] == AESCBC_SECRET
    assert identity == {"identity": {}}


@pytest.mark.parametrize(
    ("secret", "reason"),
    [("not base64!", "not valid base64"), (base64.b64encode(b"short").decode(), "decodes to 5 bytes")],
)
def test_bad_encryption_secret_is_refused(secret: str, reason: str) -> None:
    with pytest.raises(RenderError, match=rf"cluster\.aescbcEncryptionSecret.*{reason}.*urandom"):
        files.render_encryption_config(secret)


def test_audit_policy_logs_metadata() -> None:
    assert yaml.safe_load(files.render_audit_policy())["rules"] == [{"level": "Metadata"}]


def test_layout_names_are_unique_and_key_material_is_private() -> None:
    for component, layout in files.LAYOUT.items():
        names = [f.name for f in layout]
        assert len(names) == len(set(names)), component
        for file in layout:
            secret = file.name.endswith(".key") or file.name in ("kubeconfig", "encryptionconfig.yaml")
            assert file.private is secret, f"{component}/{file.name}"
            assert file.mode == (0o400 if secret else 0o444)


def test_layout_per_component() -> None:
    assert {f.name for f in files.LAYOUT[files.CONTROLLER_MANAGER]} == {
        "ca.crt",
        "ca.key",
        "service-account.key",
        "kubeconfig",
    }
    assert [f.name for f in files.LAYOUT[files.SCHEDULER]] == ["kubeconfig"]
    # The cluster CA key must never reach the API server's directory.
    assert files.CA_KEY not in files.LAYOUT[files.APISERVER]


def test_paths_are_relative_to_the_node_root() -> None:
    root = PurePosixPath("/nodes/cp2")
    assert files.secret_path(files.APISERVER, files.APISERVER_KEY, node_root=root) == PurePosixPath(
        "/nodes/cp2/system/secrets/kubernetes/kube-apiserver/apiserver.key"
    )


def test_file_outside_the_layout_is_refused() -> None:
    with pytest.raises(RenderError, match=r"ca\.key is not part of the kube-scheduler"):
        files.secret_path(files.SCHEDULER, files.CA_KEY, node_root=PurePosixPath("/"))


def test_absolute_secrets_root_is_refused() -> None:
    with pytest.raises(RenderError, match="relative to the node root"):
        files.secrets_dir(files.SCHEDULER, node_root=PurePosixPath("/n"), secrets_root=PurePosixPath("/etc"))
