"""Fixtures for every unit test directory: watching the modes of files while they are written."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@dataclasses.dataclass
class FileWatch:
    """Looks at every regular file under ``root`` around each file system call of a write.

    Once :meth:`start` has recorded what is there, a file is *new* when its inode was not there or
    its content has changed since. A new file whose mode allows more than ``allowed`` at any look is
    a leak (an old file keeping its old mode is not: its content did not change yet).
    """

    root: Path
    allowed: int = 0o600
    active: bool = False
    baseline: dict[int, bytes | None] = dataclasses.field(default_factory=dict)
    leaks: list[str] = dataclasses.field(default_factory=list)
    #: Names (relative to ``root``) of every new file looked at, temporary files included.
    seen: set[str] = dataclasses.field(default_factory=set)
    looks: int = 0

    def _files(self) -> Iterator[tuple[str, os.stat_result, bytes | None]]:
        for path in sorted(self.root.rglob("*")):
            try:
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode):
                    continue
                content: bytes | None = path.read_bytes()
            except FileNotFoundError:
                continue
            yield str(path.relative_to(self.root)), info, content

    def start(self, *, allowed: int | None = None) -> FileWatch:
        if allowed is not None:
            self.allowed = allowed
        self.baseline = {info.st_ino: content for _, info, content in self._files()}
        self.active = True
        return self

    def stop(self) -> None:
        self.active = False

    def look(self, when: str) -> None:
        if not self.active:
            return
        self.looks += 1
        for name, info, content in self._files():
            if info.st_ino in self.baseline and self.baseline[info.st_ino] == content:
                continue
            self.seen.add(name)
            mode = stat.S_IMODE(info.st_mode)
            if mode & ~self.allowed:
                self.leaks.append(f"{when}: {name} has mode {mode:o}")

    def temporaries(self) -> set[str]:
        """New files seen that are not there any more (the temporary files of atomic writes)."""
        return {name for name in self.seen if not (self.root / name).exists()}


@pytest.fixture
def umask0() -> Iterator[None]:
    """The loosest umask: a mode passed when creating a file is exactly the mode it gets."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def file_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask0: None) -> FileWatch:
    """A :class:`FileWatch` on ``tmp_path`` (call ``start()`` once the old files are in place).

    Runs with umask 0 and looks at the files before and after every ``os`` call a write can make
    (open, fchmod, chmod, fsync, rename, replace), so a moment with a loose mode does not go unseen.
    """
    watch = FileWatch(tmp_path)

    def wrap(name: str) -> None:
        original: Callable[..., Any] = getattr(os, name)

        def watched(*args: Any, **kwargs: Any) -> Any:
            watch.look(f"before os.{name}")
            try:
                return original(*args, **kwargs)
            finally:
                watch.look(f"after os.{name}")

        monkeypatch.setattr(os, name, watched)

    for name in ("open", "fchmod", "chmod", "fsync", "rename", "replace"):
        wrap(name)
    return watch
