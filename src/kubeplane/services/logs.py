"""Per-stream log files: a size-capped rotating writer, ``tail`` and an async ``follow``.

This module owns the on-disk shape of a log stream: the live file ``<name>.log`` plus rotated
generations ``<name>.log.1`` (newest) … ``<name>.log.N`` (oldest). It knows nothing about services:
the supervisor writes each service's stdout/stderr through :class:`RotatingLogWriter`, the agent may
use the same writer for its own streams (``controller-runtime``), and ``kubeplane logs SERVICE
[-f] [--tail N]`` reads any of them with :func:`tail` and :func:`follow`.

Rotation happens when a write would grow the live file past ``max_bytes``; it renames the
generations (rename is atomic, so a reader never sees a half-rotated stream) and starts a new live
file. :func:`follow` notices rotation by the inode of the path changing or the file shrinking, and
then continues from the start of the new file, so a follower never loses the lines written after
the rotation (lines written between its last poll and the rotation are read from the old file
handle it still holds before switching).
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
DEFAULT_BACKUPS = 2
_READ_CHUNK = 64 * 1024


def service_log_path(root: Path, service_id: str) -> Path:
    """Where the log of ``service_id`` lives below a node ``root``: ``var/log/kubeplane/<id>.log``."""
    return root / "var" / "log" / "kubeplane" / f"{service_id}.log"


def rotated_path(path: Path, generation: int) -> Path:
    """The rotated generation ``generation`` (1 = newest) of the log at ``path``."""
    return path.with_name(f"{path.name}.{generation}")


class RotatingLogWriter:
    """Appends bytes to a log file, rotating it once it would exceed ``max_bytes``.

    Writes are unbuffered at the Python level so that a follower (another task or the CLI through
    the node API) sees output as soon as the process printed it. Writes are done in the caller's
    thread: they are small appends to a local file, cheaper than a thread hop per chunk.
    """

    def __init__(
        self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes for log {path} must be positive, got {max_bytes}")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = path.open("ab", buffering=0)
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        """Append ``data``, rotating so that no generation exceeds ``max_bytes``.

        Rotation cuts at the last newline that fits, so lines stay whole; only a single line
        longer than the cap is split.
        """
        while data:
            room = self.max_bytes - self._size
            if len(data) <= room:
                cut = len(data)
            else:
                cut = data.rfind(b"\n", 0, room) + 1
                if cut == 0 and self._size == 0:
                    cut = room
            if cut:
                self._file.write(data[:cut])
                self._size += cut
                data = data[cut:]
            if data:
                self._rotate()

    def close(self) -> None:
        self._file.close()

    def _rotate(self) -> None:
        self._file.close()
        if self.backups > 0:
            for generation in range(self.backups - 1, 0, -1):
                older = rotated_path(self.path, generation)
                if older.exists():
                    older.replace(rotated_path(self.path, generation + 1))
            self.path.replace(rotated_path(self.path, 1))
        else:
            self.path.unlink(missing_ok=True)
        self._file = self.path.open("ab", buffering=0)
        self._size = 0


def _decode(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").rstrip("\r\n")


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of the stream at ``path`` (reaching into ``<path>.1`` if needed).

    A missing log reads as empty: a service that never started has printed nothing. ``lines < 0``
    means the whole live file (``kubeplane logs`` without ``--tail``).
    """
    if lines == 0:
        return []
    sources = [rotated_path(path, 1), path]
    kept: deque[bytes] = deque(maxlen=lines if lines > 0 else None)
    if lines < 0:
        sources = [path]
    for source in sources:
        try:
            with source.open("rb") as handle:
                kept.extend(handle.read().splitlines())
        except FileNotFoundError:
            continue
    return [_decode(line) for line in kept]


async def follow(path: Path, *, lines: int = 10, poll_interval: float = 0.2) -> AsyncIterator[str]:
    """Yield the last ``lines`` lines of ``path``, then every new line as it is written, forever.

    Survives rotation and a log that does not exist yet. A partial line (no newline yet) is held
    back until it is complete. Stop by breaking out of the ``async for`` (or cancelling the task).
    Reads run in a worker thread so a slow disk never stalls the event loop.
    """
    for line in await asyncio.to_thread(tail, path, lines):
        yield line
    handle, inode = await asyncio.to_thread(_open_at_end, path)
    pending = b""
    try:
        while True:
            chunk = await asyncio.to_thread(handle.read, _READ_CHUNK) if handle else b""
            if chunk:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    yield _decode(raw)
                continue
            reopened = await asyncio.to_thread(_reopen_if_rotated, path, handle, inode)
            if reopened is not None:
                if handle is not None:
                    handle.close()
                handle, inode = reopened
                continue
            await asyncio.sleep(poll_interval)
    finally:
        if handle is not None:
            handle.close()


def _open_at_end(path: Path) -> tuple[BinaryIO | None, int]:
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return None, 0
    handle.seek(0, os.SEEK_END)
    return handle, os.fstat(handle.fileno()).st_ino


def _reopen_if_rotated(path: Path, handle: BinaryIO | None, inode: int) -> tuple[BinaryIO, int] | None:
    """A fresh handle at the start of ``path`` if it was rotated, truncated or created; else None."""
    try:
        current = path.stat()
    except FileNotFoundError:
        return None
    if handle is not None and current.st_ino == inode and current.st_size >= handle.tell():
        return None
    fresh = path.open("rb")
    return fresh, os.fstat(fresh.fileno()).st_ino
