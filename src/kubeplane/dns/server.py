"""The listeners: DNS over UDP and TCP, and HTTP ``/health`` and ``/ready``, on one event loop.

- UDP: a datagram is answered through the :class:`~kubeplane.dns.wirecache.WireCache` (a dict
  lookup for a repeated question) and else :func:`~kubeplane.dns.answer.respond`; a name to
  forward goes to the :class:`~kubeplane.dns.forward.Forwarder` in its own task, so a slow
  upstream never holds up the cluster's names.
- TCP: length-prefixed queries (RFC 1035 4.2.2, several per connection, RFC 7766) answered by
  ``respond(..., tcp=True)`` without the UDP size limit; an idle connection is closed after
  :data:`TCP_IDLE` seconds.
- HTTP on the Corefile's ``health`` and ``ready`` ports (asyncio streams, HTTP/1.0 style: one
  request, then close): ``/health`` is 200 while the process runs; ``/ready`` is 200 once both
  initial lists are applied (:attr:`~kubeplane.dns.watch.Mirror.ready`), 503 before. Any other
  path is 404. ``prometheus`` is read from the Corefile but not served yet.

Every query reads :attr:`Mirror.table` once, so it is answered from one consistent snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterable
from typing import Any, cast

from kubeplane.dns.answer import Forward, Reply, respond
from kubeplane.dns.corefile import Config
from kubeplane.dns.forward import ALL_ADDRESSES, Forwarder
from kubeplane.dns.watch import Mirror
from kubeplane.dns.wirecache import WireCache

__all__ = ["TCP_IDLE", "Server"]

log = logging.getLogger(__name__)

#: Seconds a TCP connection may stay without a query before it is closed.
TCP_IDLE = 10.0


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The selector loop's datagram transport does not subclass DatagramTransport in 3.11.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        result = self.server.cache.reply(self.server.mirror.table, self.server.config, data)
        if isinstance(result, bytes):
            self.transport.sendto(result, addr)
        elif isinstance(result, Forward):
            self.server.spawn(self._forward(result, addr))

    async def _forward(self, forward: Forward, addr: tuple[str, int]) -> None:
        wire = await self.server.forwarder.resolve(forward.query)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(wire, addr)


class Server:
    """The add-on's listeners over one :class:`Mirror` (kept current by the reflectors)."""

    def __init__(
        self, config: Config, mirror: Mirror, forwarder: Forwarder, *, address: str = ALL_ADDRESSES
    ) -> None:
        self.config = config
        self.mirror = mirror
        self.forwarder = forwarder
        self.address = address
        self.cache = WireCache()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closers: list[asyncio.BaseTransport | asyncio.Server] = []

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a forwarding coroutine in the background, keeping a reference until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def http_ports(self) -> list[tuple[str, int]]:
        """The (host, port) pairs of the ``health`` and ``ready`` listeners, each once."""
        listens = [listen for listen in (self.config.health, self.config.ready) if listen is not None]
        return list(dict.fromkeys((listen.host or self.address, listen.port) for listen in listens))

    async def start(self) -> None:
        """Bind every listener (raises ``OSError`` when a port is taken)."""
        loop = asyncio.get_running_loop()
        udp, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=(self.address, self.config.dns_port)
        )
        self._closers.append(udp)
        self._closers.append(await asyncio.start_server(self._tcp, self.address, self.config.dns_port))
        for host, port in self.http_ports():
            self._closers.append(await asyncio.start_server(self._http, host, port))
        log.info(
            "serving DNS on %s:%d (UDP, TCP), HTTP on %s",
            self.address,
            self.config.dns_port,
            ", ".join(f"{host}:{port}" for host, port in self.http_ports()) or "no port",
        )

    async def close(self) -> None:
        for closer in self._closers:
            closer.close()
        for task in list(self._tasks):
            task.cancel()

    async def _tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), TCP_IDLE), "big")
                data = await asyncio.wait_for(reader.readexactly(size), TCP_IDLE)
                result = respond(self.mirror.table, self.config, data, tcp=True)
                if isinstance(result, Reply):
                    wire = result.wire
                elif isinstance(result, Forward):
                    wire = await self.forwarder.resolve(result.query, tcp=True)
                else:
                    continue
                writer.write(len(wire).to_bytes(2, "big") + wire)
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TCP_IDLE)
            words = request.split(b"\r\n", 1)[0].split()
            path = words[1].decode(errors="replace").partition("?")[0] if len(words) >= 2 else ""
            status, body = self._status(path)
            writer.write(_http_response(status, body))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _status(self, path: str) -> tuple[str, str]:
        if path == "/health":
            return "200 OK", "OK"
        if path == "/ready":
            return ("200 OK", "OK") if self.mirror.ready else ("503 Service Unavailable", "not listed yet")
        return "404 Not Found", "not found"


def _http_response(status: str, body: str) -> bytes:
    lines: Iterable[str] = (
        f"HTTP/1.1 {status}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body.encode())}",
        "Connection: close",
        "",
        body,
    )
    return "\r\n".join(lines).encode()
