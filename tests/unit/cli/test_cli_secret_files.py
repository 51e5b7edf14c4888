"""`kubeconfig` and `etcd snapshot` write their files 0600 from the first byte, atomically.

Runs against a real node API server with a fake node; the ``file_watch`` fixture (tests/unit/
conftest.py) runs with umask 0 and looks at every file around each ``os`` call of the write.
"""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from kubeplane import api

if TYPE_CHECKING:  # fixtures' types, defined in conftest.py files
    from conftest import Cluster, FileWatch

pytestmark = pytest.mark.unit

KUBECONFIG = yaml.safe_dump(
    {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "demo", "cluster": {"server": "https://10.5.0.1:6443"}}],
        "users": [{"name": "admin@demo", "user": {"client-key-data": "c2VjcmV0"}}],
        "contexts": [{"name": "admin@demo", "context": {"cluster": "demo", "user": "admin@demo"}}],
        "current-context": "admin@demo",
    },
    sort_keys=False,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def serve_kubeconfig(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    async def kubeconfig() -> dict[str, Any]:
        return {"kubeconfig": KUBECONFIG}

    monkeypatch.setattr(cluster.nodes[0], "kubeconfig", kubeconfig, raising=False)


def serve_snapshot(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, *, fail: bool = False) -> bytes:
    chunks = [b"etcd-snapshot-" + bytes([n]) * 1000 for n in range(5)]

    async def etcd_snapshot() -> AsyncIterator[bytes]:
        for n, chunk in enumerate(chunks):
            if fail and n == 3:
                raise api.UnavailableError("etcd went away")
            yield chunk

    monkeypatch.setattr(cluster.nodes[0], "etcd_snapshot", etcd_snapshot, raising=False)
    return b"".join(chunks)


def assert_written_privately(watch: FileWatch, path: Path) -> None:
    assert watch.looks > 0
    assert watch.leaks == []
    assert mode(path) == 0o600
    assert watch.temporaries(), "the file was not written through a temporary sibling"
    assert not list(path.parent.glob(".*.tmp"))


@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwritten-0644"])
def test_kubeconfig_is_0600_from_the_first_byte(
    cluster: Cluster, file_watch: FileWatch, monkeypatch: pytest.MonkeyPatch, existing: bool
) -> None:
    serve_kubeconfig(cluster, monkeypatch)
    target = file_watch.root / "out" / "kubeconfig"
    if existing:
        target.parent.mkdir()
        target.write_text("old: true\n")
        target.chmod(0o644)
    file_watch.start()
    result = cluster.run("kubeconfig", str(target), *(["--force"] if existing else []))
    assert result.exit_code == 0, result.output
    assert target.read_text() == KUBECONFIG
    assert_written_privately(file_watch, target)
    if not existing:
        assert mode(target.parent) == 0o700


def test_kubeconfig_merge_through_a_symlink_keeps_the_link(
    cluster: Cluster, file_watch: FileWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_kubeconfig(cluster, monkeypatch)
    real = file_watch.root / "dotfiles" / "kubeconfig"
    real.parent.mkdir()
    real.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [{"name": "other"}]}))
    real.chmod(0o644)
    link = file_watch.root / "config"
    link.symlink_to(real)
    file_watch.start()
    result = cluster.run("kubeconfig", str(link), "--merge")
    assert result.exit_code == 0, result.output
    assert link.is_symlink()
    merged = yaml.safe_load(real.read_text())
    assert [c["name"] for c in merged["clusters"]] == ["other", "demo"]
    assert_written_privately(file_watch, real)


def test_etcd_snapshot_is_0600_from_the_first_byte(
    cluster: Cluster, file_watch: FileWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = serve_snapshot(cluster, monkeypatch)
    target = file_watch.root / "etcd.snapshot"
    target.write_bytes(b"old snapshot")
    target.chmod(0o644)
    file_watch.start()
    result = cluster.run("etcd", "snapshot", str(target))
    assert result.exit_code == 0, result.output
    assert target.read_bytes() == expected
    assert_written_privately(file_watch, target)


def test_a_failed_etcd_snapshot_leaves_the_old_file_and_no_partial_one(
    cluster: Cluster, file_watch: FileWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_snapshot(cluster, monkeypatch, fail=True)
    target = file_watch.root / "etcd.snapshot"
    target.write_bytes(b"old snapshot")
    file_watch.start()
    result = cluster.run("etcd", "snapshot", str(target))
    assert result.exit_code != 0
    assert "etcd went away" in result.output
    assert target.read_bytes() == b"old snapshot"
    assert file_watch.leaks == []
    assert sorted(p.name for p in file_watch.root.iterdir() if p.name.startswith(".")) == []
