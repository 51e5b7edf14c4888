"""Writing secret files: atomically, with exact modes, and only when their bytes change.

A reader (kube-apiserver restarting, etcd starting) must never see a half-written key, and a key
must never be readable by others, not even for an instant: every file goes through
:func:`kubeplane.fileio.write_if_changed`. Unchanged files are left alone — their modification time
then tells an operator when the secrets last really changed, and the callers derive the secrets
version from whether anything was rewritten.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from pathlib import Path

from kubeplane import fileio

#: Mode of every secrets directory: only the owner (root, which runs the components) may list it.
DIR_MODE = fileio.PRIVATE_DIR_MODE


def ensure_dir(path: Path) -> None:
    """Create ``path`` (and parents) and give it :data:`DIR_MODE`."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) != DIR_MODE:
        path.chmod(DIR_MODE)


def write_files(directory: Path, contents: Mapping[str, tuple[bytes, int]]) -> bool:
    """Write every ``name → (content, mode)`` into ``directory`` (created 0700); True when any changed."""
    ensure_dir(directory)
    changed = False
    for name, (content, mode) in contents.items():
        changed = fileio.write_if_changed(directory / name, content, mode=mode) or changed
    return changed
