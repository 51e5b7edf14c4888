"""Local cluster nodes as machines: their directories, mount points and the boot command line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubeplane.agent import services as agent_services
from kubeplane.provision import machine

pytestmark = pytest.mark.unit


def test_prepare_makes_the_node_dirs_and_only_the_missing_host_mount_points(tmp_path: Path) -> None:
    host, node = tmp_path / "host", tmp_path / "node"
    _host_etc(host)
    (host / "var/lib/etcd").mkdir(parents=True)  # Debian's etcd-server made it already
    created = machine.prepare(node, host_root=host)
    assert all((node / relative).is_dir() for relative in machine.MACHINE_DIRS)
    assert host / "var/lib/etcd" not in created
    assert sorted(created) == sorted(host / r for r in machine.MACHINE_DIRS if r != "var/lib/etcd")
    assert machine.prepare(node, host_root=host) == []  # re-running creates nothing more


def _host_etc(host: Path) -> None:
    (host / "etc").mkdir(parents=True)
    (host / "etc/machine-id").write_text("0" * 32 + "\n")
    (host / "etc/hosts").write_text("127.0.0.1 localhost\n")
    (host / "etc/resolv.conf").write_text("nameserver 192.0.2.53\n")


def test_a_node_has_its_own_hosts_and_resolv_conf_copied_once_from_the_host(tmp_path: Path) -> None:
    host, node = tmp_path / "host", tmp_path / "node"
    _host_etc(host)
    machine.prepare(node, host_root=host)
    assert (node / "etc/hosts").read_text() == "127.0.0.1 localhost\n"
    assert (node / "etc/resolv.conf").read_text() == "nameserver 192.0.2.53\n"
    # The node's agent changes its own copy; preparing the node again keeps what it wrote.
    (node / "etc/resolv.conf").write_text("nameserver 10.5.0.1\n")
    machine.prepare(node, host_root=host)
    assert (node / "etc/resolv.conf").read_text() == "nameserver 10.5.0.1\n"
    assert (host / "etc/resolv.conf").read_text() == "nameserver 192.0.2.53\n"


def test_a_host_without_the_file_a_node_mounts_its_own_over_is_named(tmp_path: Path) -> None:
    host = tmp_path / "host"
    _host_etc(host)
    (host / "etc/resolv.conf").unlink()
    with pytest.raises(machine.MachineError, match=r"resolv\.conf is missing"):
        machine.prepare(tmp_path / "node", host_root=host)


def test_a_node_starts_with_a_copy_of_the_hosts_certificates_and_keeps_its_own(tmp_path: Path) -> None:
    host, node = tmp_path / "host", tmp_path / "node"
    _host_etc(host)
    (host / "etc/ssl/certs").mkdir(parents=True)
    (host / "etc/ssl/certs/ca-certificates.crt").write_text("HOST CAS\n")
    (host / "etc/ssl/certs/one.pem").symlink_to("/usr/share/ca-certificates/one.crt")
    machine.prepare(node, host_root=host)
    bundle = node / "etc/ssl/certs/ca-certificates.crt"
    assert bundle.read_text() == "HOST CAS\n"
    assert os.readlink(node / "etc/ssl/certs/one.pem") == "/usr/share/ca-certificates/one.crt"
    bundle.write_text("HOST CAS\nNODE CA\n")  # what machine.files appended on the node
    machine.prepare(node, host_root=host)
    assert bundle.read_text() == "HOST CAS\nNODE CA\n"
    assert (host / "etc/ssl/certs/ca-certificates.crt").read_text() == "HOST CAS\n"


def test_every_node_has_its_own_lasting_machine_id(tmp_path: Path) -> None:
    first, second = machine.machine_id(tmp_path / "a"), machine.machine_id(tmp_path / "b")
    assert len(first) == 32 and int(first, 16) >= 0
    assert first != second
    assert machine.machine_id(tmp_path / "a") == first
    # The kubelet cgroup root is named from it, so nodes never share one.
    assert agent_services.NodeServices.cgroup_name(tmp_path / "a") == (
        agent_services.NodeServices.cgroup_name_of(first)
    )
    assert agent_services.NodeServices.cgroup_name(tmp_path / "a") != (
        agent_services.NodeServices.cgroup_name(tmp_path / "b")
    )


def test_a_file_where_a_mount_point_belongs_is_named(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "etc/machine-id").write_text("0" * 32 + "\n")
    (host / "etc/kubernetes").write_text("not a directory")
    with pytest.raises(machine.MachineError, match="etc/kubernetes exists and is not a directory"):
        machine.prepare(tmp_path / "node", host_root=host)


def test_the_agent_runs_at_the_default_root_in_new_mount_and_uts_namespaces(tmp_path: Path) -> None:
    argv = machine.argv(
        node_dir=tmp_path, hostname="cp-1", command=["kubeplaned", "--listen", "10.5.0.2:50000"]
    )
    assert argv[: argv.index("--")] == ["unshare", "--mount", "--uts", "--propagation", "slave"]
    assert argv[-3:] == ["kubeplaned", "--listen", "10.5.0.2:50000"]
    assert "--root" not in argv
    assert argv[argv.index("--hostname") + 1] == "cp-1"


def test_destroy_removes_the_mount_points_it_made_once_nothing_mounts_on_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unused, busy, filled = tmp_path / "etc/kubernetes", tmp_path / "var/lib/kubelet", tmp_path / "system"
    for path in (unused, busy, filled):
        path.mkdir(parents=True)
    (filled / "someone-elses-file").write_text("kept")
    # Another cluster's node still has its bind mount on this one.
    monkeypatch.setattr(machine, "_mounted_anywhere", lambda: {str(busy)})
    kept = machine.remove_host_dirs([unused, busy, filled])
    assert kept == [busy]
    assert not unused.exists()
    assert busy.is_dir()
    assert (filled / "someone-elses-file").read_text() == "kept"


def test_this_namespaces_mounts_are_seen() -> None:
    assert "/" in machine._mounted_anywhere()


def test_mount_points_still_in_use_are_handed_to_a_cluster_that_remains(tmp_path: Path) -> None:
    from kubeplane.provision import state, teardown

    for name in ("alpha", "beta"):
        state.ClusterState(name=name, directory=state.cluster_dir(name, root=tmp_path)).save()
    kept = [Path("/var/lib/kubeplane"), Path("/system")]
    assert teardown._hand_over_host_dirs(kept, leaving="alpha", state_root=tmp_path) == "beta"
    assert state.ClusterState.load("beta", root=tmp_path).host_dirs == ["/var/lib/kubeplane", "/system"]
    # Handed over twice, recorded once; with no other cluster left there is nobody to hand them to.
    teardown._hand_over_host_dirs(kept, leaving="alpha", state_root=tmp_path)
    assert state.ClusterState.load("beta", root=tmp_path).host_dirs == ["/var/lib/kubeplane", "/system"]
    assert teardown._hand_over_host_dirs(kept, leaving="beta", state_root=tmp_path) == "alpha"
    (state.cluster_dir("alpha", root=tmp_path) / state.STATE_FILE).unlink()
    assert teardown._hand_over_host_dirs(kept, leaving="beta", state_root=tmp_path) is None
