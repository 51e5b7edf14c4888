"""`kubeplane config ...`: contexts, switching, endpoints, nodes, add, merge, info — on files in tmp_path."""

from __future__ import annotations

import datetime
import json
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result

from kubeplane import pki
from kubeplane.cli.main import cli
from kubeplane.config import client as client_config

if TYPE_CHECKING:  # fixtures' types, defined in conftest.py
    from conftest import Material

pytestmark = pytest.mark.unit


def run(path: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--kubeplaneconfig", str(path), *args])


def context(material: Material, *endpoints: str) -> client_config.Context:
    return client_config.Context.from_pem(endpoints=endpoints, ca=material.os_ca.cert, client=material.admin)


@pytest.fixture
def config_path(tmp_path: Path, material: Material) -> Path:
    path = tmp_path / "config"
    config = client_config.add_context(client_config.ClientConfig(), "alpha", context(material, "10.5.0.2"))
    config = client_config.add_context(config, "beta", context(material, "10.6.0.2"), make_current=False)
    client_config.save(config, path)
    return path


def test_contexts_table_marks_the_current_one(config_path: Path) -> None:
    result = run(config_path, "config", "contexts")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        "CURRENT   NAME    ENDPOINTS   NODES\n*         alpha   10.5.0.2\n          beta    10.6.0.2\n"
    )
    as_json = [
        json.loads(line) for line in run(config_path, "config", "contexts", "-o", "json").stdout.splitlines()
    ]
    assert [(c["name"], c["current"]) for c in as_json] == [("alpha", True), ("beta", False)]


def test_switch_context_and_set_endpoints_and_nodes(config_path: Path) -> None:
    assert run(config_path, "config", "context", "beta").stdout == "switched to context 'beta'\n"
    assert run(config_path, "config", "endpoints", "10.6.0.3", "10.6.0.4,10.6.0.5").exit_code == 0
    assert run(config_path, "config", "nodes", "10.6.0.7").exit_code == 0
    assert run(config_path, "--context", "alpha", "config", "nodes", "10.5.0.9").exit_code == 0
    config = client_config.load(config_path)
    assert config.context == "beta"
    assert config.contexts["beta"].endpoints == ("10.6.0.3", "10.6.0.4", "10.6.0.5")
    assert config.contexts["beta"].nodes == ("10.6.0.7",)
    assert config.contexts["alpha"].nodes == ("10.5.0.9",)
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o600
    missing = run(config_path, "config", "context", "gamma")
    assert missing.exit_code == 1
    assert "'gamma'" in missing.stderr and "alpha, beta" in missing.stderr


def test_add_context_from_pem_files(tmp_path: Path, material: Material) -> None:
    files = {"ca": material.os_ca.cert, "crt": material.admin.cert, "key": material.admin.key}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    path = tmp_path / "new" / "config"
    args = ["--ca", str(tmp_path / "ca"), "--crt", str(tmp_path / "crt"), "--key", str(tmp_path / "key")]
    result = run(path, "-e", "10.7.0.2", "config", "add", "gamma", *args)
    assert result.exit_code == 0, result.stderr
    config = client_config.load(path)
    assert config.context == "gamma"
    assert config.contexts["gamma"].endpoints == ("10.7.0.2",)
    assert config.contexts["gamma"].client == pki.CertKey(cert=material.admin.cert, key=material.admin.key)
    again = run(path, "config", "add", "gamma", *args)
    assert again.exit_code == 1 and "already exists" in again.stderr
    unreadable = run(path, "config", "add", "delta", "--ca", str(tmp_path / "nope"), *args[2:])
    assert unreadable.exit_code == 1 and "cannot read CA certificate" in unreadable.stderr


def test_merge_prints_renames(config_path: Path, tmp_path: Path, material: Material) -> None:
    other_path = tmp_path / "other"
    other = client_config.add_context(client_config.ClientConfig(), "alpha", context(material, "10.9.0.2"))
    client_config.save(other, other_path)
    result = run(config_path, "config", "merge", str(other_path))
    assert result.exit_code == 0, result.stderr
    assert "renamed context 'alpha' to 'alpha-1'" in result.stdout
    merged = client_config.load(config_path)
    assert merged.context == "alpha-1"
    assert merged.contexts["alpha-1"].endpoints == ("10.9.0.2",)
    bad = tmp_path / "bad"
    bad.write_text("contexts: 3\n")
    failed = run(config_path, "config", "merge", str(bad))
    assert failed.exit_code == 1 and "contexts" in failed.stderr
    assert client_config.load(config_path) == merged


def test_info_shows_the_context_and_certificate(config_path: Path) -> None:
    result = run(config_path, "config", "info")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["Context:", "alpha"]
    assert lines[1].split() == ["Endpoints:", "10.5.0.2"]
    assert ["Roles:", "kubeplane:admin"] in [line.split() for line in lines]
    document = json.loads(run(config_path, "--context", "beta", "config", "info", "-o", "json").stdout)
    assert document["context"] == "beta" and document["roles"] == ["kubeplane:admin"]


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = run(tmp_path / "none", "config", "info")
    assert result.exit_code == 1
    assert "no contexts" in result.stderr


@pytest.mark.parametrize(
    ("shift", "expected"),
    [
        (-datetime.timedelta(hours=3), "expired at"),  # signed 3 h ago for 1 h
        (datetime.timedelta(hours=3), "is not valid before"),  # the clock is behind the signer's
    ],
)
def test_a_certificate_outside_its_validity_is_refused_before_any_node_is_called(
    tmp_path: Path, material: Material, shift: datetime.timedelta, expected: str
) -> None:
    signed_at = datetime.datetime.now(datetime.UTC) + shift
    client = pki.issue(
        ca=material.os_ca,
        common_name="admin",
        organizations=[pki.ROLE_ADMIN],
        usages=["client"],
        lifetime=datetime.timedelta(hours=1),
        now=signed_at,
    )
    path = tmp_path / "config"
    entry = client_config.Context.from_pem(endpoints=["192.0.2.1"], ca=material.os_ca.cert, client=client)
    client_config.save(client_config.add_context(client_config.ClientConfig(), "old", entry), path)

    # 192.0.2.1 (TEST-NET) is never dialled: the refusal comes first, so this returns at once.
    result = run(path, "version")
    assert result.exit_code == 1
    assert f"client certificate of context 'old' in {path} {expected}" in result.stderr
    if shift < datetime.timedelta(0):
        assert "ago)" in result.stderr and "Renewing an expired administrator certificate" in result.stderr
    # Commands that only edit the client config still work, so the user can put a renewed one in.
    assert run(path, "config", "info").exit_code == 0
