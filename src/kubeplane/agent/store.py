"""Persistence of the machine config: the applied config and the staged one.

Writes are atomic (temporary file, fsync, rename, fsync of the directory), so a node killed with
SIGKILL at any instant finds either the old or the new file on restart, never a torn one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from kubeplane import config
from kubeplane.config.paths import NodePaths


def write_atomic(path: Path, data: str, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new content, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class ConfigStore:
    """The node's applied and staged machine configs on disk."""

    def __init__(self, paths: NodePaths) -> None:
        self._paths = paths

    def current(self) -> config.MachineConfig | None:
        """The applied config, or None on a node that was never configured (maintenance mode)."""
        return self._load(self._paths.config)

    def staged(self) -> config.MachineConfig | None:
        return self._load(self._paths.staged_config)

    def save(self, document: config.MachineConfig) -> None:
        write_atomic(self._paths.config, document.to_yaml())

    def stage(self, document: config.MachineConfig) -> None:
        write_atomic(self._paths.staged_config, document.to_yaml())

    def promote_staged(self) -> bool:
        """Make the staged config the applied one (at reboot); False when nothing was staged."""
        staged = self._paths.staged_config
        if not staged.exists():
            return False
        os.replace(staged, self._paths.config)
        return True

    def discard_staged(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._paths.staged_config.unlink()

    @staticmethod
    def _load(path: Path) -> config.MachineConfig | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        # A file on disk was validated when it was written; failing here means it was edited by hand
        # or the schema changed, and the error (with field paths) is the right thing to show.
        return config.load(text)
