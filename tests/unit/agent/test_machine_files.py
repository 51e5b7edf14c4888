"""machine.files on a node root (a temporary directory): the ops, idempotency, modes, symlinks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kubeplane.agent import machine_files
from kubeplane.config.models import File
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit

BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
ORIGINAL = b"-----BEGIN CERTIFICATE-----\nHOST\n-----END CERTIFICATE-----\n"
EXTRA = "-----BEGIN CERTIFICATE-----\nEXTRA\n-----END CERTIFICATE-----\n"
METRICS = '[metrics]\n  address = "0.0.0.0:11234"\n'


def entry(path: str, content: str, op: str, permissions: int | None = None) -> File:
    data: dict[str, object] = {"path": path, "content": content, "op": op}
    if permissions is not None:
        data["permissions"] = permissions
    return File.model_validate(data)


def apply(root: Path, *files: File) -> machine_files.Result:
    return machine_files.apply(root, files, NodePaths(root).machine_files_record)


def at(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    node = tmp_path / "node"
    at(node, BUNDLE).parent.mkdir(parents=True)
    at(node, BUNDLE).write_bytes(ORIGINAL)
    at(node, BUNDLE).chmod(0o644)
    return node


def test_create_writes_the_file_with_default_permissions_before_anything_reads_it(root: Path) -> None:
    old_umask = os.umask(0o077)  # a restrictive umask must not make the file unreadable
    try:
        result = apply(root, entry("/var/cri/conf.d/metrics.toml", METRICS, "create"))
    finally:
        os.umask(old_umask)
    written = at(root, "/var/cri/conf.d/metrics.toml")
    assert written.read_text() == METRICS
    assert mode_of(written) == 0o644
    assert mode_of(written.parent) == mode_of(written.parent.parent) == 0o755
    assert result.changed == [f"/var/cri/conf.d/metrics.toml: create ({len(METRICS)} bytes, mode 0644)"]
    assert mode_of(NodePaths(root).machine_files_record) == 0o600


def test_append_is_appended_once_across_repeated_applies(root: Path) -> None:
    files = [entry(BUNDLE, EXTRA, "append")]
    first = machine_files.apply(root, files, NodePaths(root).machine_files_record)
    for _ in range(3):  # restarts and re-applies
        again = machine_files.apply(root, files, NodePaths(root).machine_files_record)
        assert again.changed == [] and again.skipped == []
    assert at(root, BUNDLE).read_bytes() == ORIGINAL + EXTRA.encode()
    assert first.changed and mode_of(at(root, BUNDLE)) == 0o644


def test_several_appends_to_one_path_keep_config_order_and_a_changed_one_replaces_the_old(root: Path) -> None:
    apply(root, entry(BUNDLE, "A\n", "append"), entry(BUNDLE, "B\n", "append"))
    assert at(root, BUNDLE).read_bytes() == ORIGINAL + b"A\nB\n"
    apply(root, entry(BUNDLE, "C\n", "append"))
    assert at(root, BUNDLE).read_bytes() == ORIGINAL + b"C\n"


def test_removing_an_append_restores_the_original_bytes(root: Path) -> None:
    at(root, BUNDLE).write_bytes(b"no trailing newline")
    apply(root, entry(BUNDLE, EXTRA, "append"))
    assert at(root, BUNDLE).read_bytes() == b"no trailing newline\n" + EXTRA.encode()
    result = apply(root)
    assert at(root, BUNDLE).read_bytes() == b"no trailing newline"
    assert result.changed == [f"{BUNDLE}: removed what machine.files appended"]
    assert apply(root).changed == []


def test_a_regenerated_file_gets_the_append_once_on_its_new_content(root: Path) -> None:
    apply(root, entry(BUNDLE, EXTRA, "append"))
    at(root, BUNDLE).write_bytes(b"REGENERATED\n")  # e.g. update-ca-certificates
    apply(root, entry(BUNDLE, EXTRA, "append"))
    apply(root, entry(BUNDLE, EXTRA, "append"))
    assert at(root, BUNDLE).read_bytes() == b"REGENERATED\n" + EXTRA.encode()


def test_append_sets_the_given_permissions_and_keeps_the_files_mode_otherwise(root: Path) -> None:
    at(root, BUNDLE).chmod(0o640)
    apply(root, entry(BUNDLE, EXTRA, "append"))
    assert mode_of(at(root, BUNDLE)) == 0o640
    apply(root, entry(BUNDLE, EXTRA, "append", permissions=0o644))
    assert mode_of(at(root, BUNDLE)) == 0o644
    assert at(root, BUNDLE).read_bytes() == ORIGINAL + EXTRA.encode()


def test_a_crash_between_record_and_write_does_not_append_twice(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = machine_files._replace

    def crash(*args: object) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(machine_files, "_replace", crash)
    with pytest.raises(OSError, match="power cut"):
        apply(root, entry(BUNDLE, EXTRA, "append"))
    monkeypatch.setattr(machine_files, "_replace", real)
    apply(root, entry(BUNDLE, EXTRA, "append"))
    assert at(root, BUNDLE).read_bytes() == ORIGINAL + EXTRA.encode()


def test_create_never_replaces_a_file_it_did_not_create(root: Path) -> None:
    result = apply(root, entry(BUNDLE, "mine", "create"))
    assert at(root, BUNDLE).read_bytes() == ORIGINAL
    assert result.skipped == [
        f"{BUNDLE}: exists and machine.files did not create it; op create leaves it as it is"
    ]
    assert not NodePaths(root).machine_files_record.exists() or BUNDLE not in (
        NodePaths(root).machine_files_record.read_text()
    )


def test_a_created_file_follows_the_config_and_goes_with_its_entry(root: Path) -> None:
    path = "/var/local/app/settings"
    apply(root, entry(path, "one", "create"))
    assert apply(root, entry(path, "one", "create")).changed == []
    apply(root, entry(path, "two", "create", permissions=0o600))
    assert at(root, path).read_text() == "two" and mode_of(at(root, path)) == 0o600
    apply(root)
    assert not at(root, path).exists()


def test_a_created_file_edited_since_is_left_when_its_entry_goes(root: Path) -> None:
    path = "/var/local/notes"
    apply(root, entry(path, "one", "create"))
    at(root, path).write_text("edited by hand")
    assert apply(root).changed == []
    assert at(root, path).read_text() == "edited by hand"


def test_overwrite_replaces_atomically_with_the_given_permissions(root: Path) -> None:
    inode = at(root, BUNDLE).stat().st_ino
    apply(root, entry(BUNDLE, "replaced\n", "overwrite", permissions=0o600))
    assert at(root, BUNDLE).read_bytes() == b"replaced\n"
    assert mode_of(at(root, BUNDLE)) == 0o600
    assert at(root, BUNDLE).stat().st_ino != inode  # a new file renamed over the old one
    assert [p.name for p in at(root, BUNDLE).parent.iterdir()] == ["ca-certificates.crt"]


def test_changing_an_append_to_an_overwrite_starts_from_the_original(root: Path) -> None:
    apply(root, entry(BUNDLE, EXTRA, "append"))
    apply(root, entry(BUNDLE, "whole\n", "overwrite"))
    assert at(root, BUNDLE).read_bytes() == b"whole\n"


def test_a_symlinked_directory_on_the_path_is_refused_and_nothing_lands_outside(
    root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    at(root, "/var").mkdir(parents=True)
    at(root, "/var/cri").symlink_to(outside)
    with pytest.raises(machine_files.UnsafePathError, match="/var/cri is a symlink or not a directory"):
        apply(root, entry("/var/cri/conf.d/metrics.toml", METRICS, "create"))
    assert list(outside.iterdir()) == []


def test_a_symlink_at_the_file_is_refused_and_its_target_untouched(root: Path, tmp_path: Path) -> None:
    target = tmp_path / "host-shadow"
    target.write_text("secret")
    at(root, BUNDLE).unlink()
    at(root, BUNDLE).symlink_to(target)
    for op in ("append", "overwrite", "create"):
        with pytest.raises(machine_files.UnsafePathError, match="is a symlink"):
            apply(root, entry(BUNDLE, "x", op))
    assert target.read_text() == "secret"
    assert at(root, BUNDLE).is_symlink()


def test_a_directory_where_the_file_belongs_is_refused(root: Path) -> None:
    at(root, "/var/local/dir").mkdir(parents=True)
    with pytest.raises(machine_files.UnsafePathError, match="is not a regular file"):
        apply(root, entry("/var/local/dir", "x", "overwrite"))
