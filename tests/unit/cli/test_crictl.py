"""``kubeplane-crictl``'s output: the shapes kubeadm and the HA guide read (first column the
13-character ID, ``-q`` full IDs, ``-o json``), and its filters, against a fake runtime."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from kubeplane.api.proto.kubeplane.cri.v1alpha2 import cri_pb2
from kubeplane.cli import crictl

pytestmark = pytest.mark.unit

NOW = 1_700_000_000.0


class FakeRuntime:
    def __init__(self) -> None:
        self.stopped: list[str] = []
        self.removed: list[str] = []

    def sandboxes(self) -> list[cri_pb2.PodSandbox]:
        def pod(pid: str, name: str, namespace: str, age: float, ready: bool) -> cri_pb2.PodSandbox:
            return cri_pb2.PodSandbox(
                id=pid,
                metadata=cri_pb2.PodSandboxMetadata(name=name, namespace=namespace, attempt=0),
                state=cri_pb2.SANDBOX_READY if ready else cri_pb2.SANDBOX_NOTREADY,
                created_at=int((NOW - age) * 1e9),
                labels={"component": name.split("-cp", maxsplit=1)[0]},
            )

        return [
            pod("a" * 64, "kube-scheduler-cp1", "kube-system", 120, True),
            pod("b" * 64, "kube-controller-manager-cp1", "kube-system", 30, True),
            pod("c" * 64, "web-1", "default", 5, False),
        ]

    def stop_sandbox(self, sandbox_id: str) -> None:
        self.stopped.append(sandbox_id)

    def remove_sandbox(self, sandbox_id: str) -> None:
        self.removed.append(sandbox_id)


def _args(**values: Any) -> argparse.Namespace:
    defaults = {"quiet": False, "name": None, "namespace": None, "id": None, "state": None, "label": [],
                "no_trunc": False, "output": "table"}  # fmt: skip
    return argparse.Namespace(**{**defaults, **values})


def test_pods_table_starts_with_the_short_id_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crictl.time, "time", lambda: NOW)
    out = crictl.cmd_pods(FakeRuntime(), _args())  # type: ignore[arg-type]
    lines = out.splitlines()
    assert lines[0].split() == ["POD", "ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME"]
    assert [line.split()[0] for line in lines[1:]] == ["c" * 13, "b" * 13, "a" * 13]
    assert "30 seconds ago" in lines[2] and "2 minutes ago" in lines[3]
    assert "NotReady" in lines[1]
    # The guide's pipeline: crictl pods | grep kube-controller-manager | cut -d' ' -f1
    grepped = next(line for line in lines if "kube-controller-manager" in line)
    assert grepped.split(" ")[0] == "b" * 13


def test_pods_filters_quiet_and_json() -> None:
    runtime = FakeRuntime()
    assert crictl.cmd_pods(runtime, _args(quiet=True, name="kube-")) == f"{'b' * 64}\n{'a' * 64}\n"  # type: ignore[arg-type]
    assert crictl.cmd_pods(runtime, _args(quiet=True, state="notready")) == f"{'c' * 64}\n"  # type: ignore[arg-type]
    assert crictl.cmd_pods(runtime, _args(quiet=True, label=["component=kube-scheduler"])) == f"{'a' * 64}\n"  # type: ignore[arg-type]
    document = json.loads(crictl.cmd_pods(runtime, _args(name="scheduler", output="json")))  # type: ignore[arg-type]
    (item,) = document["items"]
    assert item["id"] == "a" * 64 and int(item["createdAt"]) == int((NOW - 120) * 1e9)
    with pytest.raises(crictl.CrictlError, match="--state 'gone'"):
        crictl.cmd_pods(runtime, _args(state="gone"))  # type: ignore[arg-type]
    with pytest.raises(crictl.CrictlError, match="KEY=VALUE"):
        crictl.cmd_pods(runtime, _args(label=["novalue"]))  # type: ignore[arg-type]


def test_rmp_force_stops_first_and_says_what_it_removed() -> None:
    runtime = FakeRuntime()
    out = crictl.cmd_rmp(runtime, argparse.Namespace(ids=["abc"], force=True))  # type: ignore[arg-type]
    assert out == "Removed sandbox abc\n"
    assert runtime.stopped == ["abc"] and runtime.removed == ["abc"]
    assert (
        crictl.cmd_stopp(runtime, argparse.Namespace(ids=["x", "y"]))
        == "Stopped sandbox x\nStopped sandbox y\n"
    )  # type: ignore[arg-type]


def test_ages_and_image_names_as_crictl_prints_them() -> None:
    assert crictl.ago(int((NOW - 0.2) * 1e9), now=NOW) == "Less than a second ago"
    assert crictl.ago(int((NOW - 1) * 1e9), now=NOW) == "1 second ago"
    assert crictl.ago(int((NOW - 7200) * 1e9), now=NOW) == "2 hours ago"
    assert crictl.ago(int((NOW - 86400 * 3) * 1e9), now=NOW) == "3 days ago"
    assert crictl._image_name("k8s.gcr.io/etcd:3.4.13-0") == ("k8s.gcr.io/etcd", "3.4.13-0")
    assert crictl._image_name("10.5.0.1:6000/pause") == ("10.5.0.1:6000/pause", "<none>")


def test_the_runtime_endpoint_comes_from_the_flag_the_config_file_or_containerd(tmp_path: Any) -> None:
    assert crictl.configured_endpoint(tmp_path / "missing.yaml") == crictl.DEFAULT_ENDPOINT
    config = tmp_path / "crictl.yaml"
    config.write_text("runtime-endpoint: unix:///run/other.sock\n")
    assert crictl.configured_endpoint(config) == "unix:///run/other.sock"
    parsed = crictl.parser().parse_args(["-r", "unix:///x.sock", "pods", "-q"])
    assert parsed.runtime_endpoint == "unix:///x.sock" and parsed.command == "pods" and parsed.quiet
