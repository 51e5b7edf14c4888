"""`kubeplane validate -f FILE`."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kubeplane.cli import validate

pytestmark = pytest.mark.unit


def run(*args: str) -> tuple[int, str, str]:
    group = click.Group()
    validate.register(group)
    result = CliRunner().invoke(group, ["validate", *args])
    return result.exit_code, result.stdout, result.stderr


def test_valid_file(tmp_path: Path, full_text: str) -> None:
    path = tmp_path / "controlplane.yaml"
    path.write_text(full_text)
    code, out, err = run("-f", str(path), "--mode", "metal")
    assert (code, out, err) == (0, f"{path} is valid for metal mode\n", "")
    code, out, err = run("-f", str(path))
    assert out == f"{path} is valid for local mode\n"
    assert "warning: machine.install: ignored in local mode" in err


def test_every_problem_is_printed(tmp_path: Path, minimal_text: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(minimal_text.replace("type: controlplane", "type: master").replace("https://", "tcp://"))
    code, out, err = run("-f", str(path), "--mode", "container")
    assert code == 1 and out == ""
    assert err.splitlines() == [
        'machine.type: "master" is not allowed (expected init, controlplane, join or worker)',
        'cluster.controlPlane.endpoint: "tcp://10.5.0.1:6443" is not a valid URL (expected https://HOST[:PORT][/PATH])',
        f"Error: {path} is not valid for container mode (2 problems)",
    ]


def test_missing_file(tmp_path: Path) -> None:
    code, _, err = run("-f", str(tmp_path / "nope.yaml"))
    assert code == 1 and "cannot read" in err and "No such file" in err
