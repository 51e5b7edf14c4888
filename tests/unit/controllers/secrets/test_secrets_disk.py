"""Secret file writes: exact modes, no rewrite of unchanged bytes, no temporary files left behind."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kubeplane.controllers.secrets import disk

pytestmark = pytest.mark.unit


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_unchanged_bytes_are_not_rewritten_but_a_wrong_mode_is_fixed(tmp_path: Path) -> None:
    target = tmp_path / "secrets" / "key"
    assert disk.write_files(target.parent, {"key": (b"one", 0o400)})
    assert mode(target.parent) == 0o700 and mode(target) == 0o400
    inode = target.stat().st_ino

    target.chmod(0o644)
    assert not disk.write_files(target.parent, {"key": (b"one", 0o400)})
    assert (target.stat().st_ino, mode(target)) == (inode, 0o400)

    assert disk.write_files(target.parent, {"key": (b"two", 0o400)})
    assert target.read_bytes() == b"two"
    # Replaced by rename, never rewritten in place: a reader holding the old file keeps old bytes.
    assert target.stat().st_ino != inode
    assert sorted(p.name for p in target.parent.iterdir()) == ["key"]


def test_a_read_only_leftover_from_an_interrupted_write_does_not_block(tmp_path: Path) -> None:
    # Older versions used one fixed temporary name; temporary names are unique now.
    leftover = tmp_path / ".key.tmp"
    leftover.write_bytes(b"half")
    leftover.chmod(0o400)
    assert disk.write_files(tmp_path, {"key": (b"whole", 0o400)})
    assert (tmp_path / "key").read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".key.tmp", "key"]


def test_a_loose_directory_mode_is_tightened(tmp_path: Path) -> None:
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o755)
    disk.ensure_dir(directory)
    assert mode(directory) == 0o700
