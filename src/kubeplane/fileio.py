"""Writing a file atomically with its final mode: the one way kubeplane writes files that matter.

Every write goes to a new temporary sibling of the target, created with ``O_CREAT | O_EXCL`` and
the final mode and then ``fchmod``-ed to exactly that mode (the umask can only have removed bits; a
restrictive umask must not make a public file unreadable either). The content is written and
fsynced, the temporary file is renamed over the target and the directory is fsynced. So:

- a secret is never readable by anyone its final mode does not allow, not even for an instant, and
  a looser mode of the old target does not survive (the rename replaces the inode);
- readers see the old or the new content, never a torn file, even after SIGKILL or a power cut;
- a failed write removes its temporary file and leaves the target as it was.

Temporary names are ``.<name>.<random>.tmp``: hidden (the kubelet ignores dot files in its manifest
directory) and unique, so two writers of one target never share a temporary file. The parent
directory must exist; callers create it with the mode it needs (:data:`PRIVATE_DIR_MODE` for
directories holding secrets). A symlink at the target is replaced, not followed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: Keys, ``secrets.yaml``, machine configs, client configs, kubeconfigs: readable by the owner only.
SECRET_MODE = 0o600
#: Files anyone may read (certificates, stamps, generated sources lists).
PUBLIC_MODE = 0o644
#: Executables anyone may run.
EXECUTABLE_MODE = 0o755
#: Directories holding secrets: only the owner may list or enter them.
PRIVATE_DIR_MODE = 0o700

_ATTEMPTS = 16


def _create_temporary(path: Path, mode: int) -> tuple[int, Path]:
    """A new, empty temporary sibling of ``path`` with exactly ``mode``, open for writing."""
    for _ in range(_ATTEMPTS):
        temporary = path.with_name(f".{path.name}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            temporary.unlink(missing_ok=True)
            raise
        return fd, temporary
    raise FileExistsError(f"no free temporary name next to {path} after {_ATTEMPTS} attempts")


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: Path, *, mode: int = SECRET_MODE) -> Iterator[BinaryIO]:
    """A binary handle whose content replaces ``path`` (with ``mode``) when the block ends normally.

    For content that is streamed (snapshots, copies of large binaries); if the block raises, the
    temporary file is removed and ``path`` is left untouched.
    """
    fd, temporary = _create_temporary(path, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def write_atomic(path: Path, data: bytes | str, *, mode: int = SECRET_MODE) -> None:
    """Replace ``path`` with ``data`` (str is UTF-8 encoded), created with exactly ``mode``."""
    content = data.encode() if isinstance(data, str) else data
    with atomic_open(path, mode=mode) as handle:
        handle.write(content)


def write_if_changed(path: Path, data: bytes | str, *, mode: int = SECRET_MODE) -> bool:
    """Like :func:`write_atomic`, but leave ``path`` alone when it already holds ``data``.

    An unchanged file only gets its mode corrected; returns True when the content was rewritten.
    Readers that restart on changes (the kubelet, the API server) are then not disturbed, and the
    modification time tells when the content last really changed.
    """
    content = data.encode() if isinstance(data, str) else data
    try:
        current: bytes | None = path.read_bytes()
    except FileNotFoundError:
        current = None
    if current == content:
        if stat.S_IMODE(path.stat().st_mode) != mode:
            path.chmod(mode)
        return False
    write_atomic(path, content, mode=mode)
    return True


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``directory/.lock`` (created with the directory if missing).

    One builder at a time per cache directory, across processes; the kernel drops the lock if the
    holder dies, so a killed build never leaves the cache locked.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
