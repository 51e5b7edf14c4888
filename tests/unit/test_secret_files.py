"""Secret files are created with their final mode: never a moment with a looser one, no torn file.

Every writer of keys, ``secrets.yaml``, machine configs, client configs and kubeconfigs goes through
:mod:`kubeplane.fileio`. These tests run with umask 0 (so nothing but the code sets a mode) under a
:class:`FileWatch` that looks at every file around each ``os`` call of the write.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import click
import pytest
from click.testing import CliRunner

from kubeplane import config, fileio
from kubeplane.agent.store import ConfigStore
from kubeplane.cli import gen as gen_cli
from kubeplane.config import client
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.secrets import disk
from kubeplane.provision import cluster as cluster_mod
from kubeplane.provision import toolchain

if TYPE_CHECKING:
    from conftest import FileWatch  # tests/unit/conftest.py; pytest provides it as ``file_watch``

pytestmark = pytest.mark.unit

SECRET = b"-----BEGIN PRIVATE KEY-----\nnew\n-----END PRIVATE KEY-----\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def old_public_file(path: Path, content: bytes = b"old\n") -> int:
    """An existing file with mode 0644 (as an older kubeplane left it); returns its inode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(0o644)
    return path.stat().st_ino


def assert_private(watch: FileWatch, *paths: Path, allowed: int = 0o600) -> None:
    assert watch.looks > 0, "the watch never looked: the write did not go through os calls"
    assert watch.leaks == []
    for path in paths:
        assert mode(path) == allowed, path
    # Each file was written to a temporary sibling that was renamed over it, and none is left.
    assert watch.temporaries(), "no temporary file was seen"
    assert all(Path(name).name.startswith(".") for name in watch.temporaries())
    assert not [p for p in watch.root.rglob(".*.tmp")], "a temporary file was left behind"


# --- the watch itself can fail ------------------------------------------------------------------


def test_the_watch_sees_a_write_then_chmod_window(file_watch: FileWatch) -> None:
    target = file_watch.root / "key"
    file_watch.start()
    target.write_bytes(SECRET)
    target.chmod(0o600)
    assert file_watch.leaks == ["before os.chmod: key has mode 666"]


def test_the_watch_sees_an_in_place_rewrite_that_keeps_a_loose_mode(file_watch: FileWatch) -> None:
    target = file_watch.root / "key"
    old_public_file(target)
    file_watch.start()
    fd = os.open(target, os.O_WRONLY | os.O_TRUNC | os.O_CREAT, 0o600)
    os.write(fd, SECRET)
    os.fsync(fd)
    os.close(fd)
    assert "before os.fsync: key has mode 644" in file_watch.leaks


# --- the helper ---------------------------------------------------------------------------------


def test_a_new_secret_is_0600_from_the_first_byte(file_watch: FileWatch) -> None:
    target = file_watch.root / "key"
    file_watch.start()
    fileio.write_atomic(target, SECRET)
    assert target.read_bytes() == SECRET
    assert_private(file_watch, target)


def test_a_0644_target_becomes_0600_by_rename_never_by_rewriting_it(file_watch: FileWatch) -> None:
    target = file_watch.root / "key"
    inode = old_public_file(target)
    file_watch.start()
    fileio.write_atomic(target, SECRET.decode(), mode=fileio.SECRET_MODE)
    assert target.read_bytes() == SECRET
    assert target.stat().st_ino != inode
    assert_private(file_watch, target)


def test_the_temporary_file_has_the_final_mode_just_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask0: None
) -> None:
    renames: list[tuple[str, int, bytes]] = []
    real_replace = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        renames.append((Path(src).name, mode(Path(src)), Path(src).read_bytes()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    fileio.write_atomic(tmp_path / "key", SECRET, mode=0o400)
    [(name, temporary_mode, content)] = renames
    assert name.startswith(".key.") and name.endswith(".tmp")
    assert (temporary_mode, content) == (0o400, SECRET)
    assert mode(tmp_path / "key") == 0o400


@pytest.mark.parametrize("final", [fileio.PUBLIC_MODE, fileio.EXECUTABLE_MODE, fileio.SECRET_MODE])
def test_the_mode_is_exact_under_a_restrictive_umask(tmp_path: Path, final: int) -> None:
    old = os.umask(0o077)
    try:
        fileio.write_atomic(tmp_path / "file", b"x", mode=final)
    finally:
        os.umask(old)
    assert mode(tmp_path / "file") == final


def test_a_failed_rename_leaves_the_old_target_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "key"
    inode = old_public_file(target)

    def replace(src: str | Path, dst: str | Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="No space left"):
        fileio.write_atomic(target, SECRET)
    assert (target.read_bytes(), mode(target), target.stat().st_ino) == (b"old\n", 0o644, inode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]


def test_a_stream_that_fails_midway_leaves_the_old_target_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "snapshot"
    old_public_file(target)
    with pytest.raises(RuntimeError), fileio.atomic_open(target) as out:
        out.write(b"half")
        raise RuntimeError("connection lost")
    assert target.read_bytes() == b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot"]


def test_a_read_only_leftover_with_the_same_temporary_name_does_not_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leftover = tmp_path / ".key.00000000.tmp"
    leftover.write_bytes(b"half")
    leftover.chmod(0o400)
    tokens = iter([b"\0\0\0\0", b"\0\0\0\1"])
    monkeypatch.setattr(os, "urandom", lambda n: next(tokens))
    fileio.write_atomic(tmp_path / "key", b"whole", mode=0o400)
    assert (tmp_path / "key").read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".key.00000000.tmp", "key"]


def test_write_if_changed_fixes_the_mode_of_unchanged_bytes_and_rewrites_changed_ones(
    file_watch: FileWatch,
) -> None:
    target = file_watch.root / "key"
    inode = old_public_file(target, SECRET)
    assert not fileio.write_if_changed(target, SECRET)
    assert (target.stat().st_ino, mode(target)) == (inode, 0o600)
    target.chmod(0o644)
    file_watch.start()
    assert fileio.write_if_changed(target, b"other")
    assert target.read_bytes() == b"other"
    assert_private(file_watch, target)


# --- the callers ----------------------------------------------------------------------------------


def run_gen(*args: str) -> None:
    root = click.Group()
    gen_cli.register(root)
    result = CliRunner().invoke(root, ["gen", *args])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwritten-0644"])
def test_gen_secrets_and_gen_config_outputs(file_watch: FileWatch, existing: bool) -> None:
    out = file_watch.root / "out"
    names = ("secrets.yaml", "controlplane.yaml", "worker.yaml", "init.yaml", "kubeplaneconfig")
    if existing:
        for name in names:
            old_public_file(out / name)
    file_watch.start()
    run_gen("secrets", "-o", str(out / "secrets.yaml"), "--force")
    run_gen(
        "config",
        "demo",
        "https://10.5.0.2:6443",
        "-o",
        str(out),
        "--with-init",
        "--from-secrets",
        str(out / "secrets.yaml"),
        "--force",
    )
    assert_private(file_watch, *(out / name for name in names))
    assert client.load(out / "kubeplaneconfig").context == "demo"


def test_gen_creates_a_missing_output_directory_0700(file_watch: FileWatch) -> None:
    file_watch.start()
    run_gen("secrets", "-o", str(file_watch.root / "new" / "secrets.yaml"))
    assert mode(file_watch.root / "new") == 0o700
    assert_private(file_watch, file_watch.root / "new" / "secrets.yaml")


def test_gen_key_is_private_and_gen_csr_public(
    file_watch: FileWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(file_watch.root)
    file_watch.start()
    run_gen("key", "--name", "admin")
    assert_private(file_watch, file_watch.root / "admin.key")
    file_watch.start(allowed=0o644)
    run_gen("csr", "--key", "admin.key", "--ip", "127.0.0.1")
    assert_private(file_watch, file_watch.root / "admin.csr", allowed=0o644)


def test_the_provisioner_writes_secrets_yaml_and_the_kubeconfig_0600(file_watch: FileWatch) -> None:
    directory = file_watch.root
    old_public_file(directory / "kubeconfig")
    file_watch.start()
    path = cluster_mod.write_secrets_bundle(directory, gen.new_secrets())
    cluster_mod.write_kubeconfig(directory / "kubeconfig", "apiVersion: v1\nkind: Config\n")
    assert path == directory / "secrets.yaml"
    assert gen.load_secrets(path.read_text(), source=str(path)) is not None
    assert (directory / "kubeconfig").read_text() == "apiVersion: v1\nkind: Config\n"
    assert_private(file_watch, path, directory / "kubeconfig")


def test_the_cluster_meta_is_public_even_under_a_restrictive_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        cluster_mod.ClusterMeta(endpoint="https://10.5.0.1:6443", kubernetes_version="v1.20.2").save(tmp_path)
    finally:
        os.umask(old)
    assert mode(tmp_path / cluster_mod.META_FILE) == 0o644
    assert cluster_mod.ClusterMeta.load(tmp_path) is not None


def test_the_client_config_save(file_watch: FileWatch) -> None:
    bundle = gen.new_secrets()
    generated = gen.generate(gen.GenOptions(cluster_name="demo", endpoint="https://10.5.0.2:6443"), bundle)
    path = file_watch.root / "config"
    old_public_file(path)
    file_watch.start()
    client.save(generated.client_config, path)
    assert client.load(path) == generated.client_config
    assert_private(file_watch, path)


def test_the_client_config_directory_is_created_0700(file_watch: FileWatch) -> None:
    file_watch.start()
    client.save(client.ClientConfig(), file_watch.root / "home" / ".kubeplane" / "config")
    assert mode(file_watch.root / "home" / ".kubeplane") == 0o700
    assert_private(file_watch, file_watch.root / "home" / ".kubeplane" / "config")


def test_the_node_config_store(file_watch: FileWatch) -> None:
    bundle = gen.new_secrets()
    generated = gen.generate(gen.GenOptions(cluster_name="demo", endpoint="https://10.5.0.2:6443"), bundle)
    document = config.load(gen.dump_yaml(generated.documents["controlplane"]))
    paths = NodePaths(root=file_watch.root)
    old_public_file(paths.config)
    file_watch.start()
    store = ConfigStore(paths)
    store.save(document)
    store.stage(document)
    assert store.current() is not None and store.staged() is not None
    assert_private(file_watch, paths.config, paths.staged_config)


def test_node_secret_files(file_watch: FileWatch) -> None:
    directory = file_watch.root / "secrets"
    old_public_file(directory / "ca.key")
    file_watch.start()
    assert disk.write_files(directory, {"ca.key": (SECRET, 0o400), "ca.crt": (b"cert", 0o600)})
    assert mode(directory) == 0o700
    assert_private(file_watch, directory / "ca.crt")
    assert mode(directory / "ca.key") == 0o400


def test_toolchain_files_are_public_and_binaries_executable(tmp_path: Path) -> None:
    source = tmp_path / "built"
    source.write_bytes(b"\x7fELF" + bytes(range(256)) * 1024)
    old = os.umask(0o077)
    try:
        toolchain.write_public(tmp_path / "cache" / "stamp.json", b"{}\n")
        toolchain.atomic_copy(source, tmp_path / "cache" / "bin" / "kubelet")
    finally:
        os.umask(old)
    assert mode(tmp_path / "cache" / "stamp.json") == 0o644
    assert mode(tmp_path / "cache" / "bin" / "kubelet") == 0o755
    assert (tmp_path / "cache" / "bin" / "kubelet").read_bytes() == source.read_bytes()
    assert sorted(p.name for p in (tmp_path / "cache" / "bin").iterdir()) == ["kubelet"]
