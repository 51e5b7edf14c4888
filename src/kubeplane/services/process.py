"""One supervised OS process: spawn in its own process group, pump its output, stop the whole group.

This module owns how a service's process is started and ended; the supervisor owns when.

- Every process starts in a new session (``start_new_session``), so its PID is also the ID of a
  process group holding everything it forks. Stopping signals the *group*: grandchildren (a
  shell's children, containerd shims started without their own session) go with it.
- A process is only ever addressed by the PID we got from spawning it, never by name.
- stdout and stderr are merged into one pipe, pumped into a :class:`~kubeplane.services.logs.
  RotatingLogWriter`; a pipe (rather than handing the child the file) is what lets the log rotate
  under a running process.
- After the leader exits, for whatever reason, the rest of its group is killed with SIGKILL and
  we wait until no live member is left, so a crash never leaves orphans behind. Zombies do not
  count as live: once reparented, reaping them is the job of whoever is PID 1.

Linux does not hand out a PID while it is still in use as a process group ID, so signalling the
group after its leader was reaped cannot hit an unrelated process as long as a member remains.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kubeplane.services import logs

_GROUP_GONE_TIMEOUT = 5.0
_PIPE_DRAIN_TIMEOUT = 1.0


@dataclasses.dataclass(frozen=True)
class Command:
    """What to execute: ``argv``, the complete environment (``None`` inherits ours) and a cwd."""

    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    cwd: Path | None = None

    def with_prefix(self, prefix: Sequence[str]) -> Command:
        """This command run through ``prefix`` (e.g. ``nsenter --net=<netns path>``)."""
        return dataclasses.replace(self, argv=[*prefix, *self.argv])


@dataclasses.dataclass(frozen=True)
class Exit:
    """How a process ended: ``code`` for a normal exit, ``signal`` when a signal killed it."""

    code: int | None
    signal: int | None

    @classmethod
    def from_returncode(cls, returncode: int) -> Exit:
        if returncode < 0:
            return cls(code=None, signal=-returncode)
        return cls(code=returncode, signal=None)

    @property
    def success(self) -> bool:
        return self.code == 0

    def describe(self) -> str:
        """``with code 3`` or ``with signal SIGKILL (9)``: the tail of the supervisor's exit event."""
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = "unknown"
            return f"with signal {name} ({self.signal})"
        return f"with code {self.code}"


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (non-zombie) processes in process group ``pgid``, read from ``/proc``."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses; fields after the last ")" are fixed.
        fields = stat[stat.rindex(b")") + 2 :].split()
        state, process_group = fields[0], int(fields[2])
        if process_group == pgid and state not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to the group; False when the group no longer exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


class Process:
    """A running (or finished) process group whose output goes to a log writer.

    Create with :meth:`spawn`. ``pid`` is also the process group ID.
    """

    def __init__(self, popen: subprocess.Popen[bytes], pump: asyncio.Task[None]) -> None:
        self._popen = popen
        self._pump = pump
        self.pid = popen.pid
        self.started_at = time.monotonic()
        self._exit: Exit | None = None
        self._waiter: asyncio.Task[Exit] | None = None

    @classmethod
    async def spawn(cls, command: Command, *, log: logs.RotatingLogWriter) -> Process:
        """Start ``command`` in a new session with merged stdout/stderr pumped into ``log``.

        Raises ``OSError`` (e.g. ``FileNotFoundError`` for a missing binary) as the spawn does.
        """
        loop = asyncio.get_running_loop()
        read_end, write_end = os.pipe()
        try:
            popen = subprocess.Popen(
                list(command.argv),
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                env=dict(command.env) if command.env is not None else None,
                cwd=command.cwd,
                start_new_session=True,
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        reader = asyncio.StreamReader()
        try:
            await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_end, "rb")
            )
        except BaseException:
            _signal_group(popen.pid, signal.SIGKILL)
            await asyncio.to_thread(popen.wait)
            raise
        pump = asyncio.create_task(_pump(reader, log), name=f"log pump {popen.pid}")
        spawned = cls(popen, pump)
        # Watched from the start, so `exit` says the process ended even when nobody awaits
        # wait(): wireguard_io read it without waiting, and a daemon that died (a zombie) still
        # counted as running.
        spawned._watch()
        return spawned

    @property
    def exit(self) -> Exit | None:
        """How the process ended, once it ended (and its group and output were cleared out)."""
        return self._exit

    def _watch(self) -> asyncio.Task[Exit]:
        if self._waiter is None:
            self._waiter = asyncio.create_task(self._wait_once(), name=f"wait {self.pid}")
        return self._waiter

    async def wait(self) -> Exit:
        """Wait for the leader to exit, then clear out the rest of its group and drain its output.

        Any number of tasks may wait at once; cancelling one of them does not disturb the others.
        """
        return await asyncio.shield(self._watch())

    async def _wait_once(self) -> Exit:
        # A pidfd turns readable when the leader exits, independent of who still holds the output
        # pipe (asyncio's own subprocess wait() also waits for the pipe, which a grandchild can
        # keep open forever).
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def on_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        pidfd = os.pidfd_open(self.pid)
        loop.add_reader(pidfd, on_exit)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        returncode = self._popen.wait()
        await self._kill_leftovers()
        self._exit = Exit.from_returncode(returncode)
        return self._exit

    async def stop(self, *, timeout: float, on_escalate: Callable[[], None] | None = None) -> Exit:
        """SIGTERM the group, SIGKILL it after ``timeout`` seconds, and wait until it is gone.

        ``on_escalate`` is called just before the SIGKILL, so the caller can record that it had to.
        """
        if self._exit is not None:
            return self._exit
        _signal_group(self.pid, signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.wait(), timeout)
        except TimeoutError:
            if on_escalate is not None:
                on_escalate()
            _signal_group(self.pid, signal.SIGKILL)
            return await self.wait()

    async def _kill_leftovers(self) -> None:
        deadline = time.monotonic() + _GROUP_GONE_TIMEOUT
        while await asyncio.to_thread(group_members, self.pid):
            _signal_group(self.pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                # Stuck in uninterruptible sleep (D state); nothing more a signal can do.
                break
            await asyncio.sleep(0.02)
        # With the whole group dead nobody holds the pipe open any more; the pump sees EOF.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._pump), _PIPE_DRAIN_TIMEOUT)
        if not self._pump.done():
            self._pump.cancel()


async def _pump(stream: asyncio.StreamReader, log: logs.RotatingLogWriter) -> None:
    while chunk := await stream.read(64 * 1024):
        log.write(chunk)
