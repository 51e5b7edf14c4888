"""The node API server: serves :data:`~kubeplane.api.wire.CALLS` from a NodeBackend, checks
roles, and forwards calls that name other nodes (see :mod:`kubeplane.api` for the model).

Every call goes through the same steps: decode and validate the request, establish the caller's
role, check the call table's access rule, then either serve locally (checking resource
sensitivity for readers first) or fan out to the nodes in the ``nodes`` metadata. A failure on
this node is a gRPC status; a failure of one forwarded node is an in-band error labelled with the
node, so one dead node never hides the others' answers.

The calls are served twice, by the same handlers: as the typed ``kubeplane.node.v1.Machine``
(:mod:`kubeplane.api.schema`) and as the JSON ``kubeplane.machine.Machine`` of clients older than
the schema. gRPC server reflection (``grpc.reflection.v1alpha``) lists the typed service and
serves its descriptors, so generic clients such as grpcurl can call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
from grpc_reflection.v1alpha import reflection

from kubeplane import metrics, pki
from kubeplane.api import auth, errors, schema, transport, wire
from kubeplane.api.backend import NodeBackend

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Deadline for a forwarded unary call when the caller set none.
FORWARD_TIMEOUT = 30.0
#: Messages buffered per proxied stream before a slow caller pushes back on the nodes.
_STREAM_BUFFER = 256


class _Failure(Exception):
    def __init__(self, code: str, message: str, fields: tuple[errors.FieldError, ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fields = fields

    def document(self) -> wire.Document:
        return wire.error_document(self.code, self.message, self.fields)


def _failure(exc: BaseException, *, node: str, call: wire.Call) -> _Failure:
    """Classify anything a call raised; unexpected exceptions are logged and become INTERNAL."""
    if isinstance(exc, _Failure):
        return exc
    if isinstance(exc, errors.InvalidArgumentError):
        return _Failure(exc.code, exc.message, exc.fields)
    if isinstance(exc, errors.BackendError):
        return _Failure(exc.code, exc.message)
    if isinstance(exc, errors.CallError):
        return _Failure(exc.code, exc.message, exc.fields)
    if isinstance(exc, transport.Unreachable):
        return _Failure("UNAVAILABLE", f"unreachable at {exc.endpoint}: {exc.reason}")
    log.error("%s failed on node %s", call.name, node, exc_info=exc)
    return _Failure("INTERNAL", f"internal error on node {node} in {call.name}: {type(exc).__name__}: {exc}")


@contextlib.asynccontextmanager
async def closing(items: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Close an async generator (running its ``finally``) when the block exits, even on cancellation."""
    try:
        yield items
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


def _parse_nodes(metadata: Sequence[tuple[str, Any]]) -> list[str] | None:
    for key, value in metadata:
        if key == wire.MD_NODES:
            nodes = [node.strip() for node in str(value).split(",") if node.strip()]
            return list(dict.fromkeys(nodes)) or None
    return None


class NodeAPIServer:
    """A running node API; create it with :func:`serve` or :func:`serve_maintenance`."""

    def __init__(
        self,
        *,
        backend: NodeBackend,
        node: str,
        maintenance: bool,
        local_names: Collection[str] = (),
        proxy_credentials: auth.Credentials | None = None,
        proxy_port: int = wire.DEFAULT_PORT,
    ) -> None:
        self.node = node
        self.maintenance = maintenance
        self.port = 0
        self._backend = backend
        self._local_names = {node, *local_names}
        self._proxy_credentials = proxy_credentials
        self._proxy_port = proxy_port
        self._peers: dict[str, transport.Connection] = {}
        self._server: Any = None

    async def _start(self, *, listen: str, credentials: Any) -> None:
        server = grpc.aio.server(
            options=(
                ("grpc.max_send_message_length", transport.MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", transport.MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            )
        )
        server.add_generic_rpc_handlers(
            (self._generic_handler(wire.SERVICE, typed=True), self._generic_handler(wire.LEGACY_SERVICE))
        )
        reflection.enable_server_reflection((wire.SERVICE, reflection.SERVICE_NAME), server)
        try:
            self.port = server.add_secure_port(listen, credentials)
        except RuntimeError as exc:
            raise errors.ListenError(
                f"node API cannot listen on {listen}: {exc}; is another kubeplaned using the port?"
            ) from exc
        await server.start()
        self._server = server
        log.info("node API listening on %s (node %s, maintenance=%s)", listen, self.node, self.maintenance)

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop accepting calls, give running ones ``grace`` seconds, then cancel them."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        peers, self._peers = self._peers, {}
        for peer in peers.values():
            await peer.close()

    async def wait_closed(self) -> None:
        """Return when the server has stopped."""
        if self._server is not None:
            await self._server.wait_for_termination()

    # -- gRPC plumbing -------------------------------------------------------------------------

    def _generic_handler(self, service: str, *, typed: bool = False) -> Any:
        """Every call of the table on ``service``: protobuf messages when ``typed``, else JSON."""
        handlers = {}
        for call in wire.CALLS:
            decode: Callable[[bytes], wire.Document | wire.BadRequest] = wire.decode_request
            encode: Callable[[Any], bytes] = wire.encode
            if typed:
                decode = schema.request_decoder(call)
                encode = schema.encode_stream_reply if call.stream else schema.encode_replies
            if call.stream:
                handlers[call.name] = grpc.unary_stream_rpc_method_handler(
                    self._stream_handler(call), request_deserializer=decode, response_serializer=encode
                )
            else:
                handlers[call.name] = grpc.unary_unary_rpc_method_handler(
                    self._unary_handler(call), request_deserializer=decode, response_serializer=encode
                )
        return grpc.method_handlers_generic_handler(service, handlers)

    def _unary_handler(self, call: wire.Call) -> Callable[[Any, Any], Awaitable[wire.Document]]:
        async def handle(request: wire.Document | wire.BadRequest, context: Any) -> wire.Document:
            started = time.monotonic()
            try:
                kwargs, role, nodes = self._prepare(call, request, context)
                if nodes is None:
                    result = await self._local_unary(call, kwargs, role)
                    metrics.observe_api_call(call.name, "OK", time.monotonic() - started)
                    return {"replies": [{"node": self.node, "result": result}]}
                timeout = context.time_remaining() or FORWARD_TIMEOUT
                replies = await asyncio.gather(
                    *(
                        self._node_unary(call, request, kwargs, role=role, node=node, timeout=timeout)
                        for node in nodes
                    )
                )
                metrics.observe_api_call(call.name, "OK", time.monotonic() - started)
                return {"replies": list(replies)}
            except Exception as exc:
                failure = _failure(exc, node=self.node, call=call)
            metrics.observe_api_call(call.name, failure.code, time.monotonic() - started)
            await self._abort(context, failure)
            raise AssertionError("unreachable: abort raises")

        return handle

    def _stream_handler(self, call: wire.Call) -> Callable[[Any, Any], AsyncIterator[wire.Document]]:
        async def handle(
            request: wire.Document | wire.BadRequest, context: Any
        ) -> AsyncIterator[wire.Document]:
            # Until the stream ends or fails, it is one whose caller went away (or was cancelled).
            code = "CANCELLED"
            try:
                kwargs, role, nodes = self._prepare(call, request, context)
                if nodes is None:
                    async with closing(self._local_stream(call, kwargs, role)) as items:
                        async for item in items:
                            yield {"node": self.node, "result": item}
                    code = "OK"
                    return
                streams = [
                    self._node_stream(
                        call, request, kwargs, role=role, node=node, timeout=context.time_remaining()
                    )
                    for node in nodes
                ]
                async with closing(_merge(streams)) as merged:
                    async for message in merged:
                        yield message
                code = "OK"
                return
            except Exception as exc:
                failure = _failure(exc, node=self.node, call=call)
                code = failure.code
            finally:
                metrics.observe_api_call(call.name, code, None)
            await self._abort(context, failure)

        return handle

    @staticmethod
    async def _abort(context: Any, failure: _Failure) -> None:
        # Messages and fields repeat what the caller sent (names, ids, paths): bounded and
        # escaped, so grpc can send them and the caller receives them (see wire.status_message).
        trailing: list[tuple[str, str]] = [(wire.MD_ORIGIN, "node")]
        if failure.fields:
            trailing.append((wire.MD_FIELDS, wire.status_fields(failure.fields)))
        code = getattr(grpc.StatusCode, failure.code)
        await context.abort(code, wire.status_message(failure.message), tuple(trailing))

    # -- the steps of every call ---------------------------------------------------------------

    def _prepare(
        self, call: wire.Call, request: wire.Document | wire.BadRequest, context: Any
    ) -> tuple[dict[str, object], str, list[str] | None]:
        """Authenticate, authorise and validate; returns backend kwargs, role and nodes to forward to.

        Who may make the call is settled before what it asks is read: a caller refused the call
        is refused whatever the request holds.
        """
        metadata = tuple(context.invocation_metadata() or ())
        caller = self._caller(context, metadata)
        auth.check_access(call, caller.role)
        if isinstance(request, wire.BadRequest):
            raise errors.InvalidArgumentError(f"invalid {call.name} request: {request.reason}")
        kwargs = wire.validate(call, request)
        # A call from a proxy is the end of a forwarding hop: it never fans out again, so no loops.
        return kwargs, caller.role, None if caller.forwarded else _parse_nodes(metadata)

    def _caller(self, context: Any, metadata: Sequence[tuple[str, Any]]) -> auth.Caller:
        """The caller's effective role, and whether a forwarding node sent the call."""
        if self.maintenance:
            return auth.Caller(auth.ROLE_MAINTENANCE)
        certificates = (context.auth_context() or {}).get("x509_pem_cert") or []
        if not certificates:
            # require_client_auth makes this unreachable unless grpc's TLS setup changes.
            raise errors.PermissionDeniedError("no client certificate presented")
        identity = auth.identity_from_pem(bytes(certificates[0]))
        # Every value, so a proxy stating two different roles is refused rather than half-believed.
        claimed = [str(value) for key, value in metadata if key == wire.MD_ROLE]
        return auth.caller(identity, claimed)

    async def _check_sensitive(self, call: wire.Call, kwargs: dict[str, object], role: str) -> None:
        if call.resource_type_param is None or role == auth.ROLE_ADMIN:
            return
        resource_type = str(kwargs[call.resource_type_param])
        if await self._backend.resource_sensitive(type=resource_type):
            raise errors.PermissionDeniedError(
                f"role {role} may not call {call.name} on {resource_type}: these resources hold secrets; "
                f"use a client certificate with O={auth.ROLE_ADMIN}"
            )

    async def _local_unary(self, call: wire.Call, kwargs: dict[str, object], role: str) -> Any:
        await self._check_sensitive(call, kwargs, role)
        result = await getattr(self._backend, call.backend_method)(**kwargs)
        return call.to_wire(result) if call.to_wire else result

    async def _local_stream(
        self, call: wire.Call, kwargs: dict[str, object], role: str
    ) -> AsyncIterator[Any]:
        await self._check_sensitive(call, kwargs, role)
        async with closing(getattr(self._backend, call.backend_method)(**kwargs)) as items:
            async for item in items:
                yield call.to_wire(item) if call.to_wire else item

    # -- proxying ------------------------------------------------------------------------------

    def _peer(self, node: str) -> transport.Connection:
        if self._proxy_credentials is None:
            raise _Failure(
                "FAILED_PRECONDITION",
                f"node {self.node} cannot forward calls to {node}: it has no proxy certificate"
                + (" (maintenance mode)" if self.maintenance else ""),
            )
        target = transport.with_port(node, self._proxy_port)
        if target not in self._peers:
            self._peers[target] = transport.Connection.open(target, self._proxy_credentials)
        return self._peers[target]

    async def _node_unary(
        self,
        call: wire.Call,
        request: Any,
        kwargs: dict[str, object],
        *,
        role: str,
        node: str,
        timeout: float,
    ) -> wire.Document:
        try:
            if node in self._local_names:
                return {"node": node, "result": await self._local_unary(call, kwargs, role)}
            answer = await self._peer(node).unary(
                call, request, metadata=((wire.MD_ROLE, role),), timeout=timeout
            )
            return {"node": node, "result": answer["replies"][0]["result"]}
        except Exception as exc:
            return {"node": node, "error": _failure(exc, node=node, call=call).document()}

    async def _node_stream(
        self,
        call: wire.Call,
        request: Any,
        kwargs: dict[str, object],
        *,
        role: str,
        node: str,
        timeout: float | None,
    ) -> AsyncIterator[wire.Document]:
        try:
            if node in self._local_names:
                async with closing(self._local_stream(call, kwargs, role)) as items:
                    async for item in items:
                        yield {"node": node, "result": item}
                return
            remote = self._peer(node).stream(call, request, metadata=((wire.MD_ROLE, role),), timeout=timeout)
            async with closing(remote) as messages:
                async for message in messages:
                    yield {"node": node, "result": message["result"]}
        except Exception as exc:
            yield {"node": node, "error": _failure(exc, node=node, call=call).document()}


async def _merge(streams: Sequence[AsyncIterator[wire.Document]]) -> AsyncIterator[wire.Document]:
    """Interleave streams as messages arrive; closing the result closes every stream."""
    queue: asyncio.Queue[wire.Document | None] = asyncio.Queue(_STREAM_BUFFER)

    async def pump(stream: AsyncIterator[wire.Document]) -> None:
        # Each stream reports its own failures as messages, so it always ends with the marker,
        # unless the consumer went away and cancelled it (then nobody reads the marker).
        async with closing(stream) as items:
            async for item in items:
                await queue.put(item)
        await queue.put(None)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def serve(
    *,
    backend: NodeBackend,
    node: str,
    credentials: auth.Credentials,
    proxy_credentials: auth.Credentials | None = None,
    listen: str = f"0.0.0.0:{wire.DEFAULT_PORT}",
    local_names: Collection[str] = (),
    proxy_port: int = wire.DEFAULT_PORT,
) -> NodeAPIServer:
    """Start the secure node API (mutual TLS; clients must present certificates signed by ``credentials.ca``).

    ``node`` labels replies and, with ``local_names`` (the node's addresses), says which entries
    of a ``nodes`` list are served locally; ``proxy_credentials`` (a ``kubeplane:proxy`` client
    certificate) enables forwarding to other nodes on ``proxy_port``. Raises ListenError.
    """
    server = NodeAPIServer(
        backend=backend,
        node=node,
        maintenance=False,
        local_names=local_names,
        proxy_credentials=proxy_credentials,
        proxy_port=proxy_port,
    )
    await server._start(
        listen=listen,
        credentials=grpc.ssl_server_credentials(
            [(credentials.key, credentials.cert)],
            root_certificates=credentials.ca,
            require_client_auth=True,
        ),
    )
    return server


async def serve_maintenance(
    *,
    backend: NodeBackend,
    node: str,
    listen: str = f"0.0.0.0:{wire.DEFAULT_PORT}",
    certificate: pki.CertKey | None = None,
) -> NodeAPIServer:
    """Start the maintenance-mode API: TLS without client certificates, only Version and
    ApplyConfiguration; ``certificate`` defaults to a fresh self-signed one. Raises ListenError.
    """
    server = NodeAPIServer(backend=backend, node=node, maintenance=True)
    certificate = certificate or auth.maintenance_certificate()
    await server._start(
        listen=listen,
        credentials=grpc.ssl_server_credentials([(certificate.key, certificate.cert)]),
    )
    return server
