"""``kubeplane health --explain`` output: the healthy verdict with its checks, the diagnoses in
text and JSON, exit status 1 unless healthy, and ``-o json`` only with ``--explain``."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kubeplane import api
from kubeplane.cli import connect
from kubeplane.cli import health as health_cli
from kubeplane.cli.main import cli
from kubeplane.ops import diagnose, health

pytestmark = pytest.mark.unit

PASSED = [health.Result(name, (), 0.5) for name in health.CHECK_NAMES]
KUBELET = diagnose.Diagnosis(
    id="kubelet-not-running",
    node="10.5.0.5",
    cause="kubelet is not running on this node",
    evidence=("service kubelet: state Finished",),
    commands=("kubeplane -n 10.5.0.5 logs kubelet",),
    checks=(health.NODES_READY,),
)


def test_healthy_text_lists_the_checks(capsys: pytest.CaptureFixture[str]) -> None:
    health_cli._explain(PASSED, [], json_output=False)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"healthy: {len(PASSED)} checks passed, nothing to diagnose"
    assert out[1:] == [f"  checked: {name}" for name in health.CHECK_NAMES]


def test_healthy_json(capsys: pytest.CaptureFixture[str]) -> None:
    health_cli._explain(PASSED, [], json_output=True)
    document = json.loads(capsys.readouterr().out)
    assert document["healthy"] is True and document["diagnoses"] == []
    assert [c["name"] for c in document["checks"]] == list(health.CHECK_NAMES)


def test_a_diagnosis_fails_the_command_in_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(
        click.ClickException, match=f"0 of {len(health.CHECK_NAMES)} checks failed; 1 diagnosed"
    ):
        health_cli._explain(PASSED, [KUBELET], json_output=False)
    out = capsys.readouterr().out
    assert "[kubelet-not-running] node 10.5.0.5: kubelet is not running on this node" in out
    assert "  evidence: service kubelet: state Finished" in out
    assert "  run: kubeplane -n 10.5.0.5 logs kubelet" in out


def test_a_diagnosis_fails_the_command_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        health_cli._explain(PASSED, [KUBELET], json_output=True)
    assert exited.value.code == 1
    document = json.loads(capsys.readouterr().out)
    assert document["healthy"] is False
    assert document["diagnoses"] == [KUBELET.as_dict()]


def test_json_output_needs_explain() -> None:
    result = CliRunner().invoke(cli, ["health", "-o", "json"])
    assert result.exit_code == 2
    assert "-o json needs --explain" in result.output


def test_the_topology_of_a_context_knows_nodes_by_address_whatever_the_endpoints_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Endpoints ``HOST:PORT`` (a moved node API) are control plane nodes by their address, as
    the Node objects and pods' hostIP have them."""
    monkeypatch.setenv("KUBEPLANE_STATE", str(tmp_path))  # no local cluster of that name
    target = connect.Target(
        endpoints=("10.5.0.2:51000", "10.5.0.3"),
        nodes=("10.5.0.2", "10.5.0.3", "10.5.0.4"),
        credentials=api.Credentials(ca=b"", cert=b"", key=b""),
        context="elsewhere",
    )
    expected = health_cli.topology(target, controlplanes=(), workers=())
    assert expected == health.Topology(controlplanes=("10.5.0.2", "10.5.0.3"), workers=("10.5.0.4",))
