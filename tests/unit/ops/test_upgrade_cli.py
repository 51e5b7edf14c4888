"""``kubeplane upgrade-k8s`` wiring: dry-run prints the plan and changes nothing; a run prints
progress; failures exit 1 with the resume command. The node and Kubernetes APIs are the unit
fakes, injected where the command builds its adapters."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from ops_fakes import FakeCluster

from kubeplane.cli import connect
from kubeplane.cli import upgrade as cli_upgrade
from kubeplane.cli.main import Context
from kubeplane.ops import oplock, upgrade
from kubeplane.provision import state as cluster_state

pytestmark = pytest.mark.unit


@pytest.fixture
def fake(generated: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    cluster = FakeCluster(generated)
    monkeypatch.setattr(cli_upgrade, "NodeAPIAdapter", lambda target: cluster)
    monkeypatch.setattr(cli_upgrade, "kube_api", lambda text, endpoint: cluster)
    monkeypatch.setattr(cli_upgrade, "local_rotation", lambda addresses: cluster)
    monkeypatch.setattr(connect, "resolve", lambda obj: None)
    # The waits poll every 1.5 s; the fake cluster answers within a few polls.
    timing = upgrade.Timing(pod_timeout=5, interval=0, config_timeout=5)
    monkeypatch.setattr(cli_upgrade, "TIMING", timing)
    return cluster


def invoke(*args: str) -> Any:
    group = click.Group()
    cli_upgrade.register(group)
    obj = Context(config_path=None, context=None, endpoints=(), nodes=())
    return CliRunner().invoke(group, ["upgrade-k8s", *args], obj=obj)


def test_dry_run_prints_the_plan_and_changes_nothing(fake: FakeCluster) -> None:
    before = dict(fake.kcpc)
    result = invoke("--to", "v1.20.2-kp.1", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "upgrade Kubernetes v1.20.2 -> v1.20.2-kp.1: 14 steps" in result.output
    assert (
        "static-pod kube-apiserver on node 10.5.0.2: "
        "k8s.gcr.io/kube-apiserver:v1.20.2 -> k8s.gcr.io/kube-apiserver:v1.20.2-kp.1" in result.output
    )
    assert "dry run: nothing was changed" in result.output
    assert fake.kcpc == before
    assert [e for e in fake.events if e[0] != "closed"] == []


def test_dry_run_as_json(fake: FakeCluster) -> None:
    result = invoke("--to", "v1.20.2-kp.1", "--dry-run", "--no-pre-pull", "-o", "json")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 10
    assert '"component":"kube-proxy"' in lines[-1]


def test_run_prints_progress_and_completes(fake: FakeCluster) -> None:
    result = invoke("--to", "v1.20.2-kp.1")
    assert result.exit_code == 0, result.output
    assert "[5/14] static-pod kube-apiserver on node 10.5.0.2" in result.output
    assert 'retrying error: config version mismatch: got "2", expected "3"' in result.output
    assert "completed: 14 steps changed, 0 already done" in result.output
    # The run held the cluster operation Lease and gave it back.
    assert fake.lease_store().version > 0 and fake.lease_store().lease is None
    again = invoke("--to", "v1.20.2-kp.1")
    assert "completed: 0 steps changed, 14 already done" in again.output


def test_unsupported_path_is_a_cli_error(fake: FakeCluster) -> None:
    result = invoke("--to", "v1.22.0")
    assert result.exit_code == 1
    assert "unsupported upgrade path: v1.20.2 -> v1.22.0" in result.output
    assert fake.patches() == []


def test_failure_names_the_step_and_the_resume_command(fake: FakeCluster) -> None:
    fake.fail_apply.add(("10.5.0.3", "kube-controller-manager"))
    result = invoke("--to", "v1.20.2-kp.1", "--no-pre-pull")
    assert result.exit_code == 1
    assert "step 5/10 failed: static-pod kube-controller-manager on node 10.5.0.3" in result.output
    assert "re-run `kubeplane upgrade-k8s --to v1.20.2-kp.1 --no-pre-pull` to continue" in result.output


# --- adapters the command builds -------------------------------------------------------------


def test_endpoint_replaces_the_kubeconfig_server() -> None:
    text = "apiVersion: v1\nclusters:\n- name: c\n  cluster:\n    server: https://10.5.0.2:6443\n"
    assert "server: https://10.5.0.1:6443" in cli_upgrade.with_server(text, "https://10.5.0.1:6443")
    assert cli_upgrade.with_server(text, None) == text


class RecordingProxy:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def set_server_state(self, name: str, state: str) -> None:
        self.calls.append(("set", name, state))

    def wait_status(self, name: str, *, until: str, timeout: float = 10.0) -> None:
        self.calls.append(("wait", name, until))


def test_local_cluster_rotation_drains_and_restores_by_server_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cluster_state.STATE_ENV, str(tmp_path))
    for name, first in (("other", 10), ("mine", 2)):
        state = cluster_state.ClusterState(name=name, directory=cluster_state.cluster_dir(name))
        state.nodes = [
            cluster_state.NodeState(
                name=f"{name}-cp-{i}",
                role="controlplane",
                index=i,
                ip=f"10.5.0.{first + i}",
                netns="",
                host_veth="",
            )
            for i in range(3)
        ]
        state.dirs["haproxy"] = str(state.directory / "haproxy")
        state.save()
    rotation = cli_upgrade.local_rotation(["10.5.0.2", "10.5.0.3", "10.5.0.4"])
    assert rotation is not None
    proxy = RecordingProxy()
    rotation._proxy = proxy  # type: ignore[assignment]
    node = upgrade.ClusterNode("cp-2", "10.5.0.3", control_plane=True)
    asyncio.run(rotation.drain(node))
    asyncio.run(rotation.restore(node))
    assert proxy.calls == [
        ("set", "mine-cp-1", "drain"),
        ("wait", "mine-cp-1", "out"),
        ("set", "mine-cp-1", "ready"),
        ("wait", "mine-cp-1", "healthy"),
    ]
    assert cli_upgrade.local_rotation(["10.5.0.99"]) is None


def test_a_running_operation_refuses_a_second_one(fake: FakeCluster) -> None:
    other = oplock.Holder("convert-k8s", "jumphost", 4242)
    stamp = datetime.datetime.now(datetime.UTC)
    fake.lease_store().lease = oplock.Lease(holder=other.identity, acquired=stamp, renewed=stamp)
    before = dict(fake.kcpc)
    result = invoke("--to", "v1.20.2-kp.1", "--no-pre-pull")
    assert result.exit_code == 1
    assert "another cluster operation is running (convert-k8s pid 4242 on jumphost" in result.output
    assert "Traceback" not in result.output
    assert fake.kcpc == before
