"""WireGuard devices, I/O: the ``wireguard-go`` processes behind them and their UAPI sockets.

Without a kernel module a device is the TUN interface of a userspace ``wireguard-go``, run in the
foreground (``wireguard-go -f <name>``) as a child of the agent, so it can be supervised and
stopped: :class:`Daemons` starts one per configured device (its output in the node's log
``wireguard-<name>``), starts it again if it exited (the controller's next reconcile, within its
resync interval), and stops it, by the PID it got from spawning it
(:class:`kubeplane.services.process.Process`, the same process handling the supervisor uses),
when the device leaves the config or the node stops. The TUN device goes away with its process,
so nothing of a removed device is left behind. A device whose socket another process already
serves (one this agent did not start) is an error, never taken over: kubeplane addresses
processes only by the PIDs it got from spawning them.

The device is configured through its UAPI socket (:func:`configure`; the protocol, and why it
rather than ``wg setconf``, is in :mod:`kubeplane.services.wireguard`). Its addresses, MTU and up
state stay with the netlink path of :mod:`kubeplane.services.machinenet_io`, like any link's.
:func:`get` and :func:`configure` block: callers run them in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kubeplane.services import logs, process, wireguard

#: The userspace WireGuard implementation (Debian package ``wireguard-go``).
BINARY = "wireguard-go"
_STOP_TIMEOUT = 5.0
_UAPI_TIMEOUT = 5.0


class WireguardError(Exception):
    """A device could not be started or configured; the message says which and why."""


def resolve_endpoint(endpoint: str) -> str:
    """``HOST:PORT`` as ``IP:PORT`` (the UAPI takes addresses; a name is looked up, first answer)."""
    host, port = wireguard.split_endpoint(endpoint)
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise WireguardError(f"cannot resolve the peer endpoint {endpoint}: {exc}") from exc
    return wireguard.join_endpoint(str(answers[0][4][0]), port)


def uapi(name: str, request: str, *, socket_dir: Path = Path(wireguard.SOCKET_DIR)) -> str:
    """Send one UAPI request to device ``name`` and return the response; raises for ``errno`` != 0."""
    path = socket_dir / f"{name}.sock"
    response = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(_UAPI_TIMEOUT)
            sock.connect(str(path))
            sock.sendall(request.encode())
            while not response.endswith(b"\n\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                response += chunk
    except OSError as exc:
        raise WireguardError(f"cannot talk to {name} on {path}: {exc}") from exc
    text = response.decode()
    errno = next((line[6:] for line in text.splitlines() if line.startswith("errno=")), None)
    if errno != "0":
        raise WireguardError(f"{name} refused the request (errno={errno})")
    return text


def get(name: str) -> wireguard.DeviceState:
    """What device ``name`` reports about itself and its peers."""
    return wireguard.parse_get(uapi(name, "get=1\n\n"))


def configure(device: wireguard.Device, resolve: Callable[[str], str] = resolve_endpoint) -> bool:
    """Give ``device`` its configured keys, port and peers unless it has them; True when it changed."""
    if wireguard.matches(device, get(device.name), resolve):
        return False
    try:
        uapi(device.name, wireguard.set_request(device, resolve))
    except WireguardError as exc:
        raise WireguardError(f"{device.field}: cannot configure {device.name}: {exc}") from exc
    return True


class Daemons:
    """The node's ``wireguard-go`` processes, one per device name (see the module docstring)."""

    def __init__(
        self,
        *,
        log_dir: Path,
        binary: str = BINARY,
        socket_dir: Path = Path(wireguard.SOCKET_DIR),
        start_timeout: float = 10.0,
    ) -> None:
        self.log_dir = log_dir
        self.binary = binary
        self.socket_dir = socket_dir
        self.start_timeout = start_timeout
        self._running: dict[str, tuple[process.Process, logs.RotatingLogWriter]] = {}
        self._lock = asyncio.Lock()

    def pid(self, name: str) -> int | None:
        """The PID of the process behind device ``name`` while it runs."""
        entry = self._running.get(name)
        return entry[0].pid if entry is not None and entry[0].exit is None else None

    async def converge(self, names: Iterable[str]) -> list[str]:
        """Run a process for exactly the devices ``names``: stop the others, start the missing
        (or exited) ones; the names started now. Raises :class:`WireguardError` naming the device."""
        wanted = set(names)
        async with self._lock:
            for name in [name for name in self._running if name not in wanted]:
                await self._stop(name)
            started = []
            for name in sorted(wanted):
                if self.pid(name) is None:
                    await self._start(name)
                    started.append(name)
            return started

    async def stop_all(self) -> None:
        """Stop every device's process (the node stops)."""
        async with self._lock:
            for name in list(self._running):
                await self._stop(name)

    async def _start(self, name: str) -> None:
        if name in self._running:
            await self._stop(name)  # exited: collect it before starting again
        binary = shutil.which(self.binary)
        if binary is None:
            raise WireguardError(
                f"{self.binary} is not installed: WireGuard device {name} needs the userspace "
                f"implementation (this kernel has no wireguard module; apt-get install {BINARY})"
            )
        socket_path = self.socket_dir / f"{name}.sock"
        if _answers(socket_path):
            raise WireguardError(
                f"{name} is already run by a process this agent did not start ({socket_path} answers); "
                "stop that process, then the agent starts its own"
            )
        log = logs.RotatingLogWriter(self.log_dir / f"wireguard-{name}.log")
        # WG_PROCESS_FOREGROUND is what wireguard-go sets for its own daemonised child: with it,
        # it skips the banner that recommends the kernel module this kernel does not have.
        command = process.Command(argv=[binary, "-f", name], env={**os.environ, "WG_PROCESS_FOREGROUND": "1"})
        try:
            spawned = await process.Process.spawn(command, log=log)
        except OSError as exc:
            log.close()
            raise WireguardError(f"cannot start {self.binary} for {name}: {exc}") from exc
        self._running[name] = (spawned, log)
        deadline = time.monotonic() + self.start_timeout
        while not socket_path.exists():
            if spawned.exit is not None or time.monotonic() > deadline:
                await self._stop(name)
                tail = " | ".join(await asyncio.to_thread(logs.tail, log.path, 3))
                raise WireguardError(
                    f"{self.binary} did not bring up {name} (no {socket_path} after "
                    f"{self.start_timeout:.0f}s): {tail or 'no output'}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(spawned.wait(), 0.05)

    async def _stop(self, name: str) -> None:
        spawned, log = self._running.pop(name)
        try:
            await spawned.stop(timeout=_STOP_TIMEOUT)
        finally:
            log.close()


def _answers(path: Path) -> bool:
    """Whether a process serves the UAPI socket ``path``. A socket nobody answers on, left by a
    killed ``wireguard-go``, is removed, so the wait for the new process's socket does not end at
    the old one."""
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except ConnectionRefusedError:
            path.unlink(missing_ok=True)
            return False
        except OSError:
            return False
    return True
