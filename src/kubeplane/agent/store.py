"""Persistence of the machine config: the applied config and the staged one.

Writes go through :func:`kubeplane.fileio.write_atomic` (mode 0600: configs hold private keys), so
a node killed with SIGKILL at any instant finds either the old or the new file on restart, never a
torn one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from kubeplane import config, fileio
from kubeplane.config.paths import NodePaths


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
        self._write(self._paths.config, document)

    def stage(self, document: config.MachineConfig) -> None:
        self._write(self._paths.staged_config, document)

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
    def _write(path: Path, document: config.MachineConfig) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fileio.write_atomic(path, document.to_yaml(), mode=fileio.SECRET_MODE)

    @staticmethod
    def _load(path: Path) -> config.MachineConfig | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        # A file on disk was validated when it was written; failing here means it was edited by hand
        # or the schema changed, and the error (with field paths) is the right thing to show.
        return config.load(text)
