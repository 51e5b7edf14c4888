"""SSH to a machine, as an operator reaches a kubeadm node: run commands, read and write files.

A thin layer over asyncssh (no ``ssh`` subprocesses): :func:`connect` opens one connection to a
:class:`Target` with a private key and a known-hosts file (the host key is always checked; there
is no "accept any host key"), and the :class:`Session` it yields runs commands with
:meth:`Session.run` (exit status, output, optional input, each output line to a callback as it
comes, a deadline) and moves files over SFTP with :meth:`Session.read` / :meth:`Session.write`
(written to a temporary name and renamed, with the mode set before any byte is written).

Errors are :class:`SSHError` (cannot connect, host key refused, authentication failed) and its
subclass :class:`CommandFailed` (a command exited non-zero under ``check=True``: the message
names the machine, the command and the last lines of its output).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import shlex
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncssh

#: How long connecting (TCP, key exchange, authentication) may take.
CONNECT_TIMEOUT = 15.0


class SSHError(Exception):
    """A machine cannot be reached or used over SSH."""


class CommandFailed(SSHError):
    """A command exited non-zero (``check=True``)."""

    def __init__(self, target: Target, command: str, result: Result) -> None:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        super().__init__(f"{target}: `{command}` exited with {result.code}" + (f":\n{tail}" if tail else ""))
        self.target = target
        self.command = command
        self.result = result


@dataclasses.dataclass(frozen=True)
class Target:
    """A machine to reach: ``user@host:port``; ``name`` is how messages call it."""

    host: str
    port: int = 22
    user: str = "root"
    name: str = ""

    def __str__(self) -> str:
        where = f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")
        return f"{self.name} ({where})" if self.name else where

    @classmethod
    def parse(cls, text: str, *, name: str = "") -> Target:
        """``[user@]host[:port]`` (an IPv6 host in brackets)."""
        user, _, rest = text.rpartition("@")
        host, port = rest, 22
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
            if tail.startswith(":"):
                port = int(tail[1:])
        elif rest.count(":") == 1:
            host, _, number = rest.partition(":")
            port = int(number)
        if not host or not 0 < port < 65536:
            raise ValueError(f"{text!r}: expected [user@]host[:port]")
        return cls(host=host, port=port, user=user or "root", name=name)


@dataclasses.dataclass(frozen=True)
class Credentials:
    """The client's private key and the known-hosts file that pins each machine's host key."""

    key: Path
    known_hosts: Path


@dataclasses.dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str


def generate_key() -> asyncssh.SSHKey:
    """A new Ed25519 key (client or host key)."""
    return asyncssh.generate_private_key("ssh-ed25519")


def private_key_text(key: asyncssh.SSHKey) -> bytes:
    return bytes(key.export_private_key("openssh"))


def public_key_line(key: asyncssh.SSHKey, comment: str = "") -> str:
    line = key.export_public_key("openssh").decode().strip()
    return f"{line} {comment}".rstrip() + "\n"


def known_hosts_line(hosts: list[str], host_key_public: str) -> str:
    """A known-hosts line for ``hosts`` (``10.5.0.2`` or ``[10.5.0.2]:2222``) and a public key line."""
    key_type, key_data = host_key_public.split()[:2]
    return f"{','.join(hosts)} {key_type} {key_data}\n"


class Session:
    """One SSH connection to one machine."""

    def __init__(self, target: Target, connection: asyncssh.SSHClientConnection) -> None:
        self.target = target
        self._connection = connection

    async def run(
        self,
        command: str,
        *,
        check: bool = True,
        input: str | bytes | None = None,
        timeout: float | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> Result:
        """Run ``command`` (a shell command line) and wait for it; ``on_line`` gets each line of
        its output (stdout and stderr) as it comes. ``timeout`` ends it (SSHError) when passed."""
        try:
            if on_line is None:
                completed = await asyncio.wait_for(
                    self._connection.run(command, input=input, check=False), timeout=timeout
                )
                result = Result(
                    code=completed.exit_status if completed.exit_status is not None else 255,
                    stdout=_text(completed.stdout),
                    stderr=_text(completed.stderr),
                )
            else:
                result = await asyncio.wait_for(self._stream(command, input, on_line), timeout=timeout)
        except TimeoutError as exc:
            raise SSHError(f"{self.target}: `{command}` did not finish within {timeout:.0f}s") from exc
        except (OSError, asyncssh.Error) as exc:
            raise SSHError(f"{self.target}: `{command}`: {exc}") from exc
        if check and result.code != 0:
            raise CommandFailed(self.target, command, result)
        return result

    async def _stream(
        self, command: str, input: str | bytes | None, on_line: Callable[[str], None]
    ) -> Result:
        process = await self._connection.create_process(command, stderr=asyncssh.STDOUT)
        if input is not None:
            process.stdin.write(input if isinstance(input, str) else input.decode())
        process.stdin.write_eof()
        lines = []
        async for line in process.stdout:
            text = _text(line).rstrip("\n")
            lines.append(text)
            on_line(text)
        completed = await process.wait(check=False)
        code = completed.exit_status if completed.exit_status is not None else 255
        return Result(code=code, stdout="\n".join(lines) + ("\n" if lines else ""), stderr="")

    async def read(self, path: str) -> bytes:
        """The contents of ``path`` on the machine."""
        try:
            async with self._connection.start_sftp_client() as sftp, sftp.open(path, "rb") as handle:
                data = await handle.read()
        except (OSError, asyncssh.Error) as exc:
            raise SSHError(f"{self.target}: cannot read {path}: {exc}") from exc
        return data if isinstance(data, bytes) else data.encode()

    async def exists(self, path: str) -> bool:
        try:
            async with self._connection.start_sftp_client() as sftp:
                return bool(await sftp.exists(path))
        except (OSError, asyncssh.Error) as exc:
            raise SSHError(f"{self.target}: cannot look at {path}: {exc}") from exc

    async def write(self, path: str, data: bytes | str, *, mode: int = 0o600) -> None:
        """Write ``path`` whole: a temporary file in the same directory with ``mode`` from the
        start, renamed over ``path``, so a reader never sees half of it."""
        payload = data.encode() if isinstance(data, str) else data
        directory = path.rsplit("/", 1)[0] or "/"
        temporary = f"{directory}/.{path.rsplit('/', 1)[-1]}.{secrets.token_hex(4)}"
        try:
            await self.run(f"mkdir -p {shlex.quote(directory)}")
            async with self._connection.start_sftp_client() as sftp:
                attrs = asyncssh.SFTPAttrs(permissions=mode)
                async with sftp.open(temporary, "wb", attrs) as handle:
                    await handle.write(payload)
                await sftp.chmod(temporary, mode)
                await sftp.posix_rename(temporary, path)
        except (OSError, asyncssh.Error) as exc:
            with contextlib.suppress(SSHError):
                await self.run(f"rm -f {shlex.quote(temporary)}", check=False)
            raise SSHError(f"{self.target}: cannot write {path}: {exc}") from exc


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


@contextlib.asynccontextmanager
async def connect(
    target: Target, credentials: Credentials, *, timeout: float = CONNECT_TIMEOUT
) -> AsyncIterator[Session]:
    """An SSH session to ``target``; the host key must be in the credentials' known-hosts file."""
    try:
        connection = await asyncssh.connect(
            target.host,
            port=target.port,
            username=target.user,
            client_keys=[str(credentials.key)],
            known_hosts=str(credentials.known_hosts),
            agent_path=None,
            config=[],
            connect_timeout=timeout,
            login_timeout=timeout,
        )
    except asyncssh.HostKeyNotVerifiable as exc:
        raise SSHError(
            f"{target}: its host key is not the one {credentials.known_hosts} pins ({exc}); "
            "if the machine was rebuilt, remove its old line there first"
        ) from exc
    except asyncssh.PermissionDenied as exc:
        raise SSHError(f"{target}: authentication with {credentials.key} refused ({exc})") from exc
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        raise SSHError(f"{target}: cannot connect: {exc or type(exc).__name__}") from exc
    try:
        yield Session(target, connection)
    finally:
        connection.close()
        with contextlib.suppress(Exception):
            await connection.wait_closed()
