"""The node's time sync from ``machine.time``, pure: what the config asks for, the ``chronyd``
configuration that does it, and what ``chronyc`` reports about it.

The original runs its own time service (``timed``) and shows the outcome in a ``TimeStatus``
resource; its kubelet and etcd wait for the time to be in sync before they start (at most
``bootTimeout``). kubeplane runs Debian's ``chrony`` instead of an NTP client of its own: a real,
maintained NTP implementation that speaks to any server. A node of a local cluster is a network
namespace on a host whose clock it shares, so a node must never set the clock: ``chronyd`` runs
with ``-x`` (:data:`DAEMON_FLAGS`), which still polls the servers, selects a source and measures
the offset, and leaves the system clock alone. Everything it keeps (config, pid file, drift file,
command socket) is in a directory of the node's own (:func:`files`), never the host's
``/etc/chrony`` or ``/run/chrony``; it serves no NTP (``port 0``) and takes commands only on its
Unix socket (``cmdport 0``), where ``chronyc -h <socket>`` asks it.

A server is ``HOST`` or ``HOST:PORT`` (``[V6]:PORT`` for an IPv6 address with a port); a name is
resolved by ``chronyd`` itself, and again while it is unreachable.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kubeplane.config import models
from kubeplane.config.scalars import duration_seconds, parse_host_port

#: How long kubelet and etcd wait at boot for the time to be in sync when ``bootTimeout`` is unset.
DEFAULT_BOOT_TIMEOUT = 120.0
#: ``chronyd`` stays in the foreground logging to stderr (``-d``) and never adjusts the clock (``-x``).
DAEMON_FLAGS = ("-d", "-x")
#: The user ``chronyd`` drops its root privileges to (the Debian package creates it).
USER = "_chrony"
#: What ``chronyc`` reports as the leap status of a daemon that has no source in sync.
UNSYNCHRONISED = "Not synchronised"


@dataclasses.dataclass(frozen=True)
class Server:
    """One NTP server: ``host`` (a name or an address) and its UDP ``port`` (None: 123)."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        if self.port is None:
            return self.host
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class Desired:
    """What ``machine.time`` asks for: ``servers`` to sync with (empty: no sync runs), whether it
    is ``disabled``, how long the boot waits for sync, and the config's ``errors`` (field: why)."""

    servers: tuple[Server, ...] = ()
    disabled: bool = False
    boot_timeout: float = DEFAULT_BOOT_TIMEOUT
    errors: tuple[str, ...] = ()

    @property
    def runs(self) -> bool:
        """Whether a time sync daemon should run."""
        return bool(self.servers) and not self.disabled and not self.errors


@dataclasses.dataclass(frozen=True)
class Files:
    """Where the node's ``chronyd`` keeps everything: one directory the daemon's user owns."""

    directory: Path

    @property
    def config(self) -> Path:
        return self.directory / "chrony.conf"

    @property
    def pidfile(self) -> Path:
        return self.directory / "chronyd.pid"

    @property
    def driftfile(self) -> Path:
        return self.directory / "chrony.drift"

    @property
    def socket(self) -> Path:
        return self.directory / "chronyd.sock"


@dataclasses.dataclass(frozen=True)
class Tracking:
    """What ``chronyc -c tracking`` says: the selected ``source`` (an address; empty with none),
    its ``stratum`` plus one, the ``offset`` of the node's clock from NTP time in seconds
    (positive: ahead) and the ``leap_status`` (:data:`UNSYNCHRONISED` until a source is selected)."""

    source: str
    stratum: int
    offset: float
    leap_status: str

    @property
    def synced(self) -> bool:
        return self.leap_status != UNSYNCHRONISED and 0 < self.stratum < 16 and bool(self.source)


def files(root: Path) -> Files:
    """The time sync files of the node at ``root`` (``/var/lib/kubeplane/chrony`` below it)."""
    return Files(root / "var" / "lib" / "kubeplane" / "chrony")


def parse_server(value: str) -> Server:
    """``HOST``, ``HOST:PORT``, ``V6`` or ``[V6]:PORT`` as a :class:`Server`; ValueError says why."""
    return Server(*parse_host_port(value))


def desired(time: models.Time | None) -> Desired:
    """What ``machine.time`` asks for (no ``time`` section: nothing runs, the boot does not wait)."""
    if time is None:
        return Desired()
    servers, errors = [], []
    for index, value in enumerate(time.servers or ()):
        try:
            servers.append(parse_server(value))
        except ValueError as exc:
            errors.append(f"machine.time.servers[{index}]: {exc}")
    timeout = duration_seconds(time.boot_timeout) if time.boot_timeout is not None else DEFAULT_BOOT_TIMEOUT
    return Desired(
        servers=tuple(dict.fromkeys(servers)),
        disabled=bool(time.disabled),
        boot_timeout=timeout,
        errors=tuple(errors),
    )


def render_config(servers: tuple[Server, ...], where: Files) -> str:
    """The ``chrony.conf`` that syncs with ``servers`` and keeps its files in ``where``.

    ``iburst`` sends the first requests two seconds apart, so a reachable server is selected
    within seconds of the start rather than minutes.
    """
    lines = ["# Written by kubeplane from machine.time; chronyd runs with -x: it never sets the clock."]
    for server in servers:
        port = f" port {server.port}" if server.port is not None else ""
        lines.append(f"server {server.host}{port} iburst")
    lines += [
        "# No NTP service and no UDP command port: only this node's command socket.",
        "port 0",
        "cmdport 0",
        f"bindcmdaddress {where.socket}",
        f"pidfile {where.pidfile}",
        f"driftfile {where.driftfile}",
    ]
    return "\n".join(lines) + "\n"


def parse_tracking(output: str) -> Tracking:
    """The first line of ``chronyc -n -c tracking`` (comma-separated; ValueError when it is not)."""
    fields = output.strip().splitlines()[0].split(",") if output.strip() else []
    if len(fields) < 14:
        raise ValueError(f"unexpected chronyc tracking output: {output.strip()[:200]!r}")
    reference_id, source, stratum, system_time, leap_status = (
        fields[0],
        fields[1],
        fields[2],
        fields[4],
        fields[13],
    )
    # The reference ID is all zeros, and the "source" its hex form, while nothing is selected.
    if int(reference_id, 16) == 0:
        source = ""
    # chronyc's "System time" is how far NTP time is ahead of the clock (negative: the clock is fast).
    offset = 0.0 - float(system_time)
    return Tracking(source=source, stratum=int(stratum), offset=offset, leap_status=leap_status)
