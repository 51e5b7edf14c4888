"""The node's time sync, I/O: the ``chronyd`` process and ``chronyc`` queries.

:func:`run` is the whole life of one ``chronyd``: it prepares the node's chrony directory, spawns
the daemon as a child of the agent (so it runs in the node's network namespace and sees the
node's files) in its own process group (:class:`kubeplane.services.process.Process`, the process
handling the supervisor uses), pumps its output into the node's log ``timed``, and stops it, by
the PID it got from spawning it, when it is cancelled. It returns only by raising: the daemon
exited. The caller (the time sync controller) runs it as a background task and cancels it to
stop or replace the daemon.

``chronyd`` starts as root, binds its command socket, and drops to the ``_chrony`` user: the
directory is that user's, mode 0700, which is what ``chronyd`` requires of its socket's directory.
With ``-x`` it needs no capability to set the clock, and with ``port 0`` none to bind port 123.

:func:`tracking` blocks (``chronyc`` is a subprocess): callers run it in a thread.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from kubeplane import fileio
from kubeplane.config.paths import MAX_UNIX_SOCKET_PATH
from kubeplane.services import logs, process, timesync

#: The daemon and its client (Debian package ``chrony``).
DAEMON = "chronyd"
CLIENT = "chronyc"
_STOP_TIMEOUT = 5.0
_QUERY_TIMEOUT = 5.0
#: Where Debian installs ``chronyd``, for an agent whose PATH lacks ``/usr/sbin``.
_SBIN = Path("/usr/sbin")


class TimeSyncError(Exception):
    """The daemon could not be started or asked, or it exited; the message says why."""


def binary(name: str) -> str:
    """The path of ``chronyd`` or ``chronyc``; TimeSyncError naming the package when missing."""
    found = shutil.which(name) or shutil.which(name, path=str(_SBIN))
    if found is None:
        raise TimeSyncError(
            f"{name} is not installed: machine.time.servers needs it (apt-get install chrony)"
        )
    return found


def prepare(where: timesync.Files, config: str) -> None:
    """The chrony directory, owned by the daemon's user and closed to others, with ``config``
    written in it and no pid file or socket left by an earlier daemon (blocking)."""
    try:
        user = pwd.getpwnam(timesync.USER)
    except KeyError:
        raise TimeSyncError(
            f"no user {timesync.USER}: chronyd drops its privileges to it (the chrony package creates it)"
        ) from None
    # chronyc binds its own socket next to the daemon's: chronyc.<pid>.sock, a PID of 7 digits.
    longest = where.socket.parent / "chronyc.4194304.sock"
    if len(str(longest)) > MAX_UNIX_SOCKET_PATH:
        raise TimeSyncError(
            f"{longest} would be over {MAX_UNIX_SOCKET_PATH} characters, too long for a unix socket: "
            "run the agent with a shorter --root"
        )
    where.directory.mkdir(parents=True, exist_ok=True)
    os.chown(where.directory, user.pw_uid, user.pw_gid)
    where.directory.chmod(0o700)
    # Only this agent starts a daemon here, and it stops the last one before the next: what is
    # left is from a daemon that was killed, and would make the new one refuse to start.
    where.pidfile.unlink(missing_ok=True)
    where.socket.unlink(missing_ok=True)
    fileio.write_if_changed(where.config, config, mode=0o644)


async def run(servers: tuple[timesync.Server, ...], where: timesync.Files, log: Path) -> None:
    """Run ``chronyd`` for ``servers`` until cancelled (then stop it); raises TimeSyncError when
    it cannot start or exits by itself, with the end of its log."""
    daemon = binary(DAEMON)
    await asyncio.to_thread(prepare, where, timesync.render_config(servers, where))
    writer = logs.RotatingLogWriter(log)
    try:
        command = process.Command(
            [daemon, *timesync.DAEMON_FLAGS, "-u", timesync.USER, "-f", str(where.config)]
        )
        try:
            spawned = await process.Process.spawn(command, log=writer)
        except OSError as exc:
            raise TimeSyncError(f"cannot start {daemon}: {exc}") from exc
        try:
            exited = await spawned.wait()
        finally:
            if spawned.exit is None:
                # Shielded: the daemon is stopped even when the stop itself is cancelled.
                await asyncio.shield(spawned.stop(timeout=_STOP_TIMEOUT))
        tail = " | ".join(await asyncio.to_thread(logs.tail, log, 3))
        raise TimeSyncError(f"{DAEMON} exited {exited.describe()}: {tail or 'no output'}")
    finally:
        writer.close()


def tracking(where: timesync.Files) -> timesync.Tracking:
    """What the node's ``chronyd`` says about its sync (blocking); TimeSyncError when it does not answer."""
    command = [binary(CLIENT), "-h", str(where.socket), "-n", "-c", "tracking"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_QUERY_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise TimeSyncError(f"{CLIENT} tracking did not answer within {_QUERY_TIMEOUT:g}s") from None
    if result.returncode != 0:
        message = result.stderr.strip() or result.stdout.strip() or f"exit code {result.returncode}"
        raise TimeSyncError(f"{CLIENT} tracking: {message}")
    try:
        return timesync.parse_tracking(result.stdout)
    except ValueError as exc:
        raise TimeSyncError(str(exc)) from exc
