"""Checkpoints on disk: the stored copies in the state directory, the active ones in the kubelet's.

Layout (``<stem>`` is ``<namespace>-<parent name>``)::

    <state dir>/checkpoints/<stem>.json      stored checkpoint (the static pod, JSON)
    <state dir>/files/<stem>/<volume>/...    Secret/ConfigMap data its host path volumes mount
    <manifest dir>/<stem>.json               the same pod while the checkpoint is active

Every file is written to a hidden temporary name and renamed into place (the kubelet ignores
hidden files), and only when its bytes change, so the kubelet never sees a half-written manifest
and an unchanged checkpoint does not restart its pod. Directories holding secret data are 0700.
Active checkpoints are recognised by their checkpoint-of annotation, never by name alone, so
other files in the manifest directory (the agent's static pods) are never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kubeplane.checkpointer import logic

__all__ = ["CheckpointStore"]


def _write_if_changed(path: Path, data: bytes, mode: int) -> bool:
    try:
        if path.read_bytes() == data and (path.stat().st_mode & 0o7777) == mode:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def _pod_bytes(pod: dict[str, Any]) -> bytes:
    return (json.dumps(pod, indent=2, sort_keys=True) + "\n").encode()


def _read_pod(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class CheckpointStore:
    """Reads and changes the checkpoints of one node.

    `host_state_dir` is where the kubelet (on the host) finds `state_dir`: the same directory
    seen from outside the checkpointer's container; host path volumes must use that path.
    """

    def __init__(self, *, manifest_dir: Path, state_dir: Path, host_state_dir: Path | None = None) -> None:
        self.manifest_dir = manifest_dir
        self.state_dir = state_dir
        self.host_state_dir = host_state_dir if host_state_dir is not None else state_dir

    def _stored_path(self, parent_id: str) -> Path:
        return self.state_dir / "checkpoints" / f"{logic.checkpoint_name(parent_id)}.json"

    def _active_path(self, parent_id: str) -> Path:
        return self.manifest_dir / f"{logic.checkpoint_name(parent_id)}.json"

    def _files_dir(self, parent_id: str) -> Path:
        return self.state_dir / "files" / logic.checkpoint_name(parent_id)

    def host_files_dir(self, parent_id: str) -> str:
        """The node path of a checkpoint's files directory (for its host path volumes)."""
        return str(self.host_state_dir / "files" / logic.checkpoint_name(parent_id))

    def stored(self) -> frozenset[str]:
        """Parent ids of the stored checkpoints."""
        return self._ids(self.state_dir / "checkpoints")

    def active(self) -> frozenset[str]:
        """Parent ids of the checkpoints in the kubelet's manifest directory."""
        return self._ids(self.manifest_dir)

    @staticmethod
    def _ids(directory: Path) -> frozenset[str]:
        found = set()
        for path in directory.glob("*.json") if directory.is_dir() else ():
            pod = _read_pod(path)
            if pod is not None and logic.is_checkpoint(pod):
                found.add(logic.pod_id(pod))
        return frozenset(found)

    def write(self, checkpoint: logic.Checkpoint) -> bool:
        """Store `checkpoint` (and refresh its active copy); True if anything changed."""
        files_dir = self._files_dir(checkpoint.parent_id)
        changed = False
        if checkpoint.files:
            files_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        wanted = {files_dir / rel for rel in checkpoint.files}
        for rel, (content, mode) in checkpoint.files.items():
            changed |= _write_if_changed(files_dir / rel, content, mode)
        if files_dir.is_dir():
            for path in sorted(files_dir.rglob("*"), reverse=True):
                if path.is_file() and path not in wanted:
                    path.unlink()
                    changed = True
        data = _pod_bytes(checkpoint.pod)
        changed |= _write_if_changed(self._stored_path(checkpoint.parent_id), data, 0o600)
        active = self._active_path(checkpoint.parent_id)
        if active.exists():
            changed |= _write_if_changed(active, data, 0o600)
        return changed

    def activate(self, parent_id: str) -> None:
        """Hand the stored checkpoint to the kubelet."""
        _write_if_changed(self._active_path(parent_id), self._stored_path(parent_id).read_bytes(), 0o600)

    def deactivate(self, parent_id: str) -> None:
        """Take the checkpoint away from the kubelet; the stored copy stays."""
        self._active_path(parent_id).unlink(missing_ok=True)

    def remove(self, parent_id: str) -> None:
        """Delete every trace of the checkpoint, the active copy first."""
        self.deactivate(parent_id)
        self._stored_path(parent_id).unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self._files_dir(parent_id))
