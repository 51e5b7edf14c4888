"""Writing secret files: atomically, with exact modes, and only when their bytes change.

A reader (kube-apiserver restarting, etcd starting) must never see a half-written key, so every
file is written to a temporary sibling and renamed over the old one. Unchanged files are left
alone — their modification time then tells an operator when the secrets last really changed, and
the callers derive the secrets version from whether anything was rewritten.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

#: Mode of every secrets directory: only the owner (root, which runs the components) may list it.
DIR_MODE = 0o700


def ensure_dir(path: Path) -> None:
    """Create ``path`` (and parents) and give it :data:`DIR_MODE`."""
    path.mkdir(parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) != DIR_MODE:
        path.chmod(DIR_MODE)


def write_file(path: Path, content: bytes, *, mode: int) -> bool:
    """Make ``path`` hold ``content`` with ``mode``; True when the content had to change."""
    try:
        current: bytes | None = path.read_bytes()
    except FileNotFoundError:
        current = None
    if current == content:
        if stat.S_IMODE(path.stat().st_mode) != mode:
            path.chmod(mode)
        return False
    temporary = path.with_name(f".{path.name}.tmp")
    # A leftover from an interrupted write may be read-only; opening it for writing would fail.
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        # The umask may have masked bits off at creation.
        temporary.chmod(mode)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return True


def write_files(directory: Path, contents: Mapping[str, tuple[bytes, int]]) -> bool:
    """Write every ``name → (content, mode)`` into ``directory`` (created 0700); True when any changed."""
    ensure_dir(directory)
    changed = False
    for name, (content, mode) in contents.items():
        changed = write_file(directory / name, content, mode=mode) or changed
    return changed
