"""Writing ``machine.files`` on the node, before the services that read them start.

The agent calls :func:`apply` (blocking I/O: in a thread) before containerd starts, so at every
boot and after every apply of a changed config (which reboots the node's services); the kubelet
starts after containerd. Paths are below the agent's root and were checked at validation
(:mod:`kubeplane.config.machine_files`). The ops:

- ``create``: writes the file when it does not exist. A file that exists and that machine.files
  did not create is never replaced (it is reported and left as it is); one it created is brought
  back to the configured content, so a changed entry takes effect.
- ``overwrite``: replaces the file (or creates it) with the content.
- ``append``: the file is its *base* plus the contents of every append entry of that path, in
  config order (with a newline between when the base does not end with one).

Idempotency: what the agent wrote is recorded in the node's own state directory
(:attr:`NodePaths.machine_files_record <kubeplane.config.paths.NodePaths.machine_files_record>`,
a JSON file): per path the op, whether the agent created the file, the hash of what it wrote and,
for appends, the exact bytes appended. The base of an append is the current file without that
recorded suffix when it still ends with it; otherwise (first apply, or something such as
``update-ca-certificates`` regenerated the file) the current file. So a restart or a re-apply
never appends twice, a changed append replaces the old one, and an entry removed from the config
is undone: its suffix is stripped, a file it created is removed (if unchanged since). An
``overwrite`` of a file that existed is not undone: its old content was not kept. The record is
saved before each write, so a crash between the two is repaired by the next apply.

Safety: every directory from the root down is opened with ``O_NOFOLLOW`` (missing ones are
created, mode 0755) and the file is read, replaced (a temporary sibling renamed over it, with
its final mode, fsynced) or removed relative to that directory's descriptor. A symlink anywhere
on the path, the file itself included, is refused: a write never lands outside the allowed place.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubeplane import fileio
from kubeplane.config.machine_files import DEFAULT_PERMISSIONS
from kubeplane.config.models import File

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY_MODE = 0o755
_RECORD_VERSION = 1


class UnsafePathError(OSError):
    """A machine.files path goes through a symlink or a non-directory: nothing was written."""


@dataclasses.dataclass
class Result:
    """What one :func:`apply` did: ``changed`` files (written, undone) and ``skipped`` ones."""

    changed: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)


def apply(root: Path, files: Sequence[File], record_path: Path) -> Result:
    """Bring the node at ``root`` to ``files`` (see the module docstring)."""
    writer = _Writer(root, record_path)
    wanted: dict[str, list[File]] = {}
    for file in files:
        wanted.setdefault(file.path, []).append(file)
    for path, entries in wanted.items():
        writer.apply_path(path, entries)
    for path in [path for path in writer.record if path not in wanted]:
        writer.undo(path)
    return writer.result


class _Writer:
    """One apply: the record as loaded and updated, and what was done."""

    def __init__(self, root: Path, record_path: Path) -> None:
        self.root = root
        self.record_path = record_path
        self.record = _load(record_path)
        self.result = Result()

    def _save(self) -> None:
        self.record_path.parent.mkdir(mode=fileio.PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        document = {"version": _RECORD_VERSION, "files": self.record}
        fileio.write_atomic(self.record_path, json.dumps(document, indent=2, sort_keys=True) + "\n")

    def apply_path(self, path: str, entries: list[File]) -> None:
        op = entries[0].op
        previous = self.record.get(path)
        if previous is not None and previous["op"] != op:
            self.undo(path)  # another op now: start from the base again
            previous = None
        directory = _open_parent(self.root, path, create=True)
        assert directory is not None
        try:
            name = path.rsplit("/", 1)[1]
            current = _read(directory, name, path)
            created = current is None or (previous is not None and bool(previous["created"]))
            if op == "create" and not created:
                self.result.skipped.append(
                    f"{path}: exists and machine.files did not create it; op create leaves it as it is"
                )
                return
            entry: dict[str, Any] = {"op": op, "created": created}
            if op == "append":
                base = current[0] if current is not None else b""
                before = base64.b64decode(previous["appended"]) if previous is not None else b""
                if before and base.endswith(before):
                    base = base[: -len(before)]
                suffix = b"".join(e.content.encode() for e in entries)
                if base and not base.endswith(b"\n"):
                    suffix = b"\n" + suffix
                content = base + suffix
                entry["appended"] = base64.b64encode(suffix).decode()
                default_mode = current[1] if current is not None else DEFAULT_PERMISSIONS
            else:
                content = entries[0].content.encode()
                default_mode = DEFAULT_PERMISSIONS
            permissions = next((e.permissions for e in entries if e.permissions is not None), None)
            mode = permissions if permissions is not None else default_mode
            entry["sha256"] = hashlib.sha256(content).hexdigest()
            if current == (content, mode) and previous == entry:
                return
            self.record[path] = entry
            self._save()  # before the write: a crash between the two is repaired next time
            if current != (content, mode):
                _replace(directory, name, content, mode)
                self.result.changed.append(f"{path}: {op} ({len(content)} bytes, mode {mode:04o})")
        finally:
            os.close(directory)

    def undo(self, path: str) -> None:
        """Take back what the agent wrote at ``path`` for an entry no longer in the config."""
        previous = self.record[path]
        directory = _open_parent(self.root, path, create=False)
        if directory is not None:
            try:
                self._undo_in(directory, path, previous)
            finally:
                os.close(directory)
        del self.record[path]
        self._save()

    def _undo_in(self, directory: int, path: str, previous: dict[str, Any]) -> None:
        name = path.rsplit("/", 1)[1]
        current = _read(directory, name, path)
        if current is None:
            return
        content, mode = current
        if previous["op"] == "append":
            appended = base64.b64decode(previous["appended"])
            if not content.endswith(appended):
                return  # replaced since (e.g. a regenerated CA bundle): nothing of ours is left
            base = content[: -len(appended)]
            if previous["created"] and not base:
                os.unlink(name, dir_fd=directory)
            else:
                _replace(directory, name, base, mode)
            self.result.changed.append(f"{path}: removed what machine.files appended")
        elif previous["created"] and hashlib.sha256(content).hexdigest() == previous["sha256"]:
            os.unlink(name, dir_fd=directory)
            self.result.changed.append(f"{path}: removed (created by machine.files, no longer configured)")


def _open_parent(root: Path, path: str, *, create: bool) -> int | None:
    """A descriptor of the directory holding ``path`` below ``root``, walked without following
    symlinks; None when a directory is missing and ``create`` is false."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    walked = ""
    try:
        for part in path.strip("/").split("/")[:-1]:
            walked += "/" + part
            made = False
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, _DIRECTORY_MODE, dir_fd=fd)
                    made = True
            try:
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                if create:
                    raise
                os.close(fd)
                return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePathError(
                        exc.errno,
                        f"{path}: {walked} is a symlink or not a directory; machine.files never writes "
                        "through a symlink",
                    ) from exc
                raise
            if made:
                os.fchmod(child, _DIRECTORY_MODE)  # the umask may have removed bits
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(directory: int, name: str, path: str) -> tuple[bytes, int] | None:
    """``(content, mode)`` of the regular file ``name``; None when missing. A symlink, FIFO or
    directory there is refused (O_NONBLOCK: opening a FIFO must not wait for a writer)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            message = f"{path} is a symlink; machine.files never writes through one"
            raise UnsafePathError(exc.errno, message) from exc
        raise
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise UnsafePathError(errno.EINVAL, f"{path} exists and is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        return handle.read(), stat.S_IMODE(status.st_mode)


def _replace(directory: int, name: str, content: bytes, mode: int) -> None:
    """Replace ``name`` atomically: a new temporary sibling with exactly ``mode``, fsynced, renamed."""
    temporary = f".{name}.{os.urandom(4).hex()}.tmp"
    fd = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # the umask may have removed bits
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=directory)
        raise
    os.fsync(directory)


def _load(record_path: Path) -> dict[str, Any]:
    try:
        data = json.loads(record_path.read_text())
    except FileNotFoundError:
        return {}
    files: dict[str, Any] = data["files"]
    return files
