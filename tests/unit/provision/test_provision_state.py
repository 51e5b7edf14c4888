"""Cluster state file: location, round trip, atomic writes, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubeplane.provision import hostproc, state

pytestmark = pytest.mark.unit


def _record(name: str, pid: int) -> hostproc.ProcessRecord:
    return hostproc.ProcessRecord(
        name=name, pid=pid, start_time=1234, argv=(name, "--flag"), log=f"/logs/{name}.log", pidfile=None
    )


def test_clusters_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(state.STATE_ENV, str(tmp_path))
    assert state.cluster_dir("demo") == tmp_path / "demo"
    monkeypatch.delenv(state.STATE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state.cluster_dir("demo") == tmp_path / "home" / ".kubeplane" / "clusters" / "demo"


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    cluster = state.ClusterState.open("demo", root=tmp_path)
    cluster.network = state.NetworkState(
        cidr="10.5.0.0/24",
        host_ip="10.5.0.1",
        bridge="kp-demo",
        owns_bridge=True,
        netns=["kp-demo-cp1"],
        links=["kv12345678n1"],
        sysctls={"net.ipv4.ip_forward": "0"},
    )
    cluster.nodes.append(
        state.NodeState(
            name="cp1",
            role="controlplane",
            index=1,
            ip="10.5.0.2",
            netns="kp-demo-cp1",
            host_veth="kv12345678n1",
            root_dir=str(tmp_path / "nodes" / "cp1"),
            processes={"agent": _record("kubeplaned", 42)},
            cgroups=["/sys/fs/cgroup/cpu/kp-demo-cp1"],
        )
    )
    cluster.processes["haproxy"] = _record("haproxy", 7)
    cluster.dirs["haproxy"] = str(tmp_path / "haproxy")
    cluster.cgroups.append("/sys/fs/cgroup/memory/kp-demo")
    cluster.save()

    loaded = state.ClusterState.load("demo", root=tmp_path)
    assert loaded == cluster
    assert loaded.node("cp1").processes["agent"].argv == ("kubeplaned", "--flag")
    assert [p.name for p in tmp_path.joinpath("demo").iterdir()] == [state.STATE_FILE]


def test_the_ports_round_trip_and_old_states_have_the_defaults(tmp_path: Path) -> None:
    cluster = state.ClusterState.open("demo", root=tmp_path)
    assert (cluster.node_api_port, cluster.trustd_port) == (50000, 50001)
    assert cluster.node_api_endpoint("10.5.0.2") == "10.5.0.2"  # the default port: a bare address
    cluster.node_api_port, cluster.trustd_port = 51000, 51001
    cluster.save()
    loaded = state.ClusterState.load("demo", root=tmp_path)
    assert loaded == cluster and (loaded.node_api_port, loaded.trustd_port) == (51000, 51001)
    assert loaded.node_api_endpoint("10.5.0.2") == "10.5.0.2:51000"
    old = json.loads(cluster.path.read_text())
    del old["node_api_port"], old["trustd_port"]
    cluster.path.write_text(json.dumps(old))
    older = state.ClusterState.load("demo", root=tmp_path)
    assert (older.node_api_port, older.trustd_port) == (50000, 50001)


def test_open_creates_an_empty_state_once(tmp_path: Path) -> None:
    first = state.ClusterState.open("demo", root=tmp_path)
    first.dirs["x"] = "y"
    first.save()
    assert state.ClusterState.open("demo", root=tmp_path).dirs == {"x": "y"}


def test_missing_state_names_the_cluster_and_the_file(tmp_path: Path) -> None:
    with pytest.raises(state.StateNotFound, match=r"no local cluster named 'ghost'.*state.json"):
        state.ClusterState.load("ghost", root=tmp_path)


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"version": 99, "name": "demo"}), json.dumps({"version": 1})],
)
def test_corrupt_state_says_where_and_what_to_do(tmp_path: Path, content: str) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / state.STATE_FILE).write_text(content)
    with pytest.raises(state.StateCorrupt, match=r"cluster 'demo'.*fix or remove"):
        state.ClusterState.load("demo", root=tmp_path)


def test_bad_role_is_corrupt(tmp_path: Path) -> None:
    cluster = state.ClusterState.open("demo", root=tmp_path)
    cluster.nodes.append(state.NodeState(name="n", role="worker", index=1, ip="i", netns="ns", host_veth="v"))
    cluster.save()
    data = json.loads(cluster.path.read_text())
    data["nodes"][0]["role"] = "boss"
    cluster.path.write_text(json.dumps(data))
    with pytest.raises(state.StateCorrupt, match="boss"):
        state.ClusterState.load("demo", root=tmp_path)


def test_unknown_node_is_a_key_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="no node 'nope'"):
        state.ClusterState.open("demo", root=tmp_path).node("nope")


def test_remove_is_safe_twice(tmp_path: Path) -> None:
    cluster = state.ClusterState.open("demo", root=tmp_path)
    cluster.remove()
    cluster.remove()
    assert not (tmp_path / "demo").exists()
