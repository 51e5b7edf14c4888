"""Host processes of a local cluster: start one detached, stop it again by PID, safely.

A local cluster's long-running processes (haproxy, docker-registry, later each node's agent)
outlive the ``kubeplane`` command that started them, so they cannot be tracked as child
objects: each one is started in its own session (its PID is also its process group ID), with
stdout and stderr appended to a log file, its PID written to a pidfile, and described by a
:class:`ProcessRecord` that the cluster state file stores.

A PID alone is not an identity: after a reboot or a long time the number can belong to someone
else. The record therefore also keeps the process start time (``/proc/PID/stat`` field 22,
clock ticks since boot), which survives ``exec`` (so ``nsenter ... CMD`` keeps the identity of
the ``nsenter`` it was started as) and never repeats for another process with the same PID.
:func:`stop` only signals a process whose PID *and* start time still match.

Errors: :class:`HostProcessError` (a process could not be started, or refused to die).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubeplane import fileio, retry


class HostProcessError(Exception):
    """A host process could not be started or stopped; the message names it and its log."""


@dataclasses.dataclass(frozen=True)
class ProcessRecord:
    """What identifies a started process: PID (= process group), start time, argv, files."""

    name: str
    pid: int
    start_time: int
    argv: tuple[str, ...]
    log: str
    pidfile: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "argv": list(self.argv)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            start_time=int(data["start_time"]),
            argv=tuple(str(arg) for arg in data["argv"]),
            log=str(data["log"]),
            pidfile=None if data.get("pidfile") is None else str(data["pidfile"]),
        )


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (which may contain spaces), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time_of(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None if there is no such process."""
    fields = _stat_fields(pid)
    # Field 22 of stat; the list starts at field 3 (state).
    return None if fields is None else int(fields[19])


def _alive(pid: int, start_time: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == start_time


def _reap(pid: int) -> None:
    # Only a process we forked ourselves can be reaped; for others this is a no-op.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def is_running(record: ProcessRecord) -> bool:
    """True if the process of ``record`` (same PID *and* start time) is alive and not a zombie."""
    _reap(record.pid)
    return _alive(record.pid, record.start_time)


def group_members(pgid: int, *, since: int) -> list[int]:
    """PIDs in process group ``pgid`` that started at or after tick ``since`` (our descendants)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # fields[2] is the process group, fields[19] the start time; zombies need no signal.
        if fields and fields[0] != "Z" and int(fields[2]) == pgid and int(fields[19]) >= since:
            members.append(int(entry.name))
    return members


def nsenter_argv(netns: str) -> list[str]:
    """The argv prefix that runs a command in network namespace ``netns`` and nothing else.

    Not ``ip netns exec``: that also unshares the mount namespace and remounts ``/sys``, which
    hides the cgroup mounts kubelet needs (ENVIRONMENT.md).
    """
    return ["nsenter", f"--net=/run/netns/{netns}", "--"]


def start(
    argv: Sequence[str | Path],
    *,
    name: str,
    log: Path,
    pidfile: Path | None = None,
    netns: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessRecord:
    """Start ``argv`` in a new session (inside ``netns`` if given), logging to ``log``.

    The caller stores the returned record (in the cluster state) before doing anything else.
    """
    command = [str(arg) for arg in argv]
    if netns is not None:
        command = [*nsenter_argv(netns), *command]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        try:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                cwd=cwd,
            )
        except OSError as exc:
            raise HostProcessError(f"cannot start {name} ({command[0]}): {exc}") from exc
    started = start_time_of(process.pid)
    if started is None:
        # It died before we could look at it; the log says why.
        process.wait()
        raise HostProcessError(
            f"{name} exited immediately with code {process.returncode}; see {log}:\n{tail(log)}"
        )
    if pidfile is not None:
        write_pidfile(pidfile, process.pid)
    return ProcessRecord(
        name=name,
        pid=process.pid,
        start_time=started,
        argv=tuple(command),
        log=str(log),
        pidfile=None if pidfile is None else str(pidfile),
    )


def write_pidfile(path: Path, pid: int) -> None:
    """Write ``pid`` to ``path`` atomically (a reader never sees a half-written number)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_atomic(path, f"{pid}\n", mode=fileio.PUBLIC_MODE)


def _wait_gone(record: ProcessRecord, timeout: float) -> bool:
    try:
        return retry.Wait(what=f"{record.name} to exit", timeout=timeout, backoff=retry.fixed(0.05)).poll(
            lambda: not is_running(record)
        )
    except retry.WaitTimeout:
        return False


def _signal_group(record: ProcessRecord, sig: signal.Signals) -> None:
    if is_running(record):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, sig)
    # Members that outlived the leader: by PID, and only those started after it.
    for pid in group_members(record.pid, since=record.start_time):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop(record: ProcessRecord, *, timeout: float = 10.0) -> bool:
    """Stop the process group of ``record``: SIGTERM, then SIGKILL after ``timeout`` seconds.

    Returns False if the process was already gone (safe to call twice). A PID that now belongs
    to another process (different start time) is never signalled. Removes the pidfile.
    """
    was_running = is_running(record)
    if was_running or group_members(record.pid, since=record.start_time):
        _signal_group(record, signal.SIGTERM)
        if not _wait_gone(record, timeout):
            _signal_group(record, signal.SIGKILL)
            if not _wait_gone(record, 5.0):
                raise HostProcessError(
                    f"{record.name} (pid {record.pid}) survived SIGKILL; "
                    f"check `ps -o pid,stat,cmd -g {record.pid}`"
                )

        # The leader is gone; make sure nothing it forked lingers in its group.
        def group_gone() -> bool:
            if not group_members(record.pid, since=record.start_time):
                return True
            _signal_group(record, signal.SIGKILL)
            return False

        with contextlib.suppress(retry.WaitTimeout):
            retry.Wait(
                what=f"the process group of {record.name} to be gone",
                timeout=timeout,
                backoff=retry.fixed(0.05),
            ).poll(group_gone)
    if record.pidfile is not None:
        with contextlib.suppress(FileNotFoundError):
            Path(record.pidfile).unlink()
    return was_running


def tail(path: Path | str, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file (empty if it does not exist)."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
