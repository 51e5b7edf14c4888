"""An asyncio etcd v3 client over etcd's JSON gateway, with mutual TLS and endpoint failover.

etcd 3.4 serves a JSON translation of its gRPC API under ``/v3/...`` on the client port itself.
Going through it (with :mod:`httpx`) instead of gRPC keeps the client small: no generated stubs,
and TLS is plain HTTPS with a client certificate. The gateway's conventions, which this module
hides from callers:

- every request is a ``POST`` of a JSON object; fields use the proto names (``range_end``,
  ``create_revision`` but ``peerURLs``, ``dbSize``, ``TTL``, ``ID``);
- ``bytes`` fields (keys, values, lock names) are base64, int64 fields are JSON
  strings, and fields equal to their zero value are left out of responses;
- failures come back as ``{"error", "message", "code"}`` with a gRPC status code, mapped here to
  the :mod:`kubeplane.clients.errors` tree with a ``retryable`` flag;
- streaming calls (lease keepalive, watch, snapshot) answer with one
  ``{"result": ...}`` JSON object per line.

Two guarantees beyond the gateway's: a block run under :meth:`EtcdClient.lease` or
:meth:`EtcdClient.lock` is cancelled (``EtcdLeaseLost``) as soon as its lease is lost, and a
watch whose history was compacted away reads the current state again (:class:`Relist`) and
carries on, instead of falling silent on etcd's cancelled watch.

Endpoints are tried in order starting from the last one that answered; only a failure to
connect moves on to the next endpoint, because a request that reached a server may have been
applied, and resending a non-idempotent write elsewhere could apply it twice.

Rejected alternative: the PyPI clients (``etcd3``, ``aetcd``...) either lack TLS client
certificates, member management or asyncio, or pin old protobuf releases.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Sequence
from typing import IO, TYPE_CHECKING, Any, Literal

from kubeplane import guard
from kubeplane.clients import errors

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

#: Seconds a unary request may take unless the caller says otherwise.
DEFAULT_TIMEOUT = 10.0


# gRPC status codes (google.golang.org/grpc/codes) that etcd's gateway reports.
_INVALID_ARGUMENT = 3
_DEADLINE_EXCEEDED = 4
_NOT_FOUND = 5
_ALREADY_EXISTS = 6
_PERMISSION_DENIED = 7
_RESOURCE_EXHAUSTED = 8
_FAILED_PRECONDITION = 9
_ABORTED = 10
_OUT_OF_RANGE = 11
_UNAVAILABLE = 14
_UNAUTHENTICATED = 16

_ERRORS_BY_CODE: dict[int, type[errors.EtcdError]] = {
    _INVALID_ARGUMENT: errors.EtcdInvalidRequest,
    _DEADLINE_EXCEEDED: errors.EtcdUnavailable,
    _NOT_FOUND: errors.EtcdNotFound,
    _ALREADY_EXISTS: errors.EtcdConflict,
    _PERMISSION_DENIED: errors.EtcdPermissionDenied,
    _RESOURCE_EXHAUSTED: errors.EtcdUnavailable,
    _FAILED_PRECONDITION: errors.EtcdConflict,
    _ABORTED: errors.EtcdUnavailable,
    _OUT_OF_RANGE: errors.EtcdInvalidRequest,
    _UNAVAILABLE: errors.EtcdUnavailable,
    _UNAUTHENTICATED: errors.EtcdPermissionDenied,
}

# etcd's own errors (its rpctypes) share gRPC codes; like etcd's Go client, tell the ones callers
# act on apart by their exact message. The longer promotion message must not be taken for the
# shorter one, hence whole-message keys rather than fragments.
_ERRORS_BY_MESSAGE: dict[str, type[errors.EtcdError]] = {
    "etcdserver: can only promote a learner member which is in sync with leader": errors.EtcdLearnerNotReady,
    "etcdserver: can only promote a learner member": errors.EtcdMemberNotLearner,
    "etcdserver: mvcc: required revision has been compacted": errors.EtcdCompacted,
    "etcdserver: rpc not supported for learner": errors.EtcdLearnerRefused,
}

# Failed-precondition answers that clear up by themselves once the cluster settles (a member
# that just joined is not started yet, a second learner waits for the first to be promoted).
_TRANSIENT_MESSAGES = (
    "not enough started members",
    "too many learner members",
    "unhealthy cluster",
)


def tls_context(*, ca: bytes, cert: bytes, key: bytes) -> ssl.SSLContext:
    """An SSL context that trusts ``ca`` and presents ``cert``/``key`` (all PEM bytes).

    :mod:`ssl` loads client certificates only from files, so the pair goes through two anonymous
    memory files (``memfd_create``), read through ``/proc/self/fd``: nothing reaches a file
    system, and nothing is left behind even when the process is killed meanwhile (a temporary
    directory was, with the private key in it).
    """
    context = ssl.create_default_context(cadata=ca.decode())
    descriptors = []
    try:
        for name, data in (("etcd-client.crt", cert), ("etcd-client.key", key)):
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            descriptors.append(fd)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        cert_fd, key_fd = descriptors
        context.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}")
    finally:
        for fd in descriptors:
            os.close(fd)
    return context


def prefix_range_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    trimmed = bytearray(prefix)
    while trimmed and trimmed[-1] == 0xFF:
        trimmed.pop()
    if not trimmed:
        # Every byte was 0xff (or the prefix is empty): "\0" means "to the end of the keyspace".
        return b"\x00"
    trimmed[-1] += 1
    return bytes(trimmed)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


@dataclasses.dataclass(frozen=True)
class KeyValue:
    """One key as etcd stores it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeyValue:
        return cls(
            key=_unb64(data.get("key")),
            value=_unb64(data.get("value")),
            create_revision=_int(data.get("create_revision")),
            mod_revision=_int(data.get("mod_revision")),
            version=_int(data.get("version")),
            lease=_int(data.get("lease")),
        )


@dataclasses.dataclass(frozen=True)
class RangeResult:
    """The answer to a get: the keys found, how many matched in all, and the store revision."""

    kvs: list[KeyValue]
    count: int
    more: bool
    revision: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RangeResult:
        return cls(
            kvs=[KeyValue.from_json(kv) for kv in data.get("kvs", [])],
            count=_int(data.get("count")),
            more=bool(data.get("more", False)),
            revision=_int(data.get("header", {}).get("revision")),
        )


class Relist(list[KeyValue]):
    """A watch batch holding the whole current state of the watched key or range, not changes.

    A watch yields one after its history was compacted away (``compact_revision``): the changes
    it missed are gone, so it read the range again at ``revision``. Keys absent from the batch
    do not exist (any more).
    """

    def __init__(self, kvs: Sequence[KeyValue], *, revision: int, compact_revision: int) -> None:
        super().__init__(kvs)
        self.revision = revision
        self.compact_revision = compact_revision


@dataclasses.dataclass(frozen=True)
class PutResult:
    """The revision a put created, and the previous key if ``prev_kv`` was asked for."""

    revision: int
    prev_kv: KeyValue | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PutResult:
        prev = data.get("prev_kv")
        return cls(
            revision=_int(data.get("header", {}).get("revision")),
            prev_kv=KeyValue.from_json(prev) if prev else None,
        )


@dataclasses.dataclass(frozen=True)
class DeleteResult:
    """How many keys a delete removed, and the revision afterwards."""

    deleted: int
    revision: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeleteResult:
        return cls(deleted=_int(data.get("deleted")), revision=_int(data.get("header", {}).get("revision")))


@dataclasses.dataclass(frozen=True)
class CreateResult:
    """The answer to :meth:`EtcdClient.create`: whether the key was created, the store revision,
    and the key as it is when it existed already (``current``)."""

    created: bool
    revision: int
    current: KeyValue | None = None


@dataclasses.dataclass(frozen=True)
class Lease:
    """A granted lease: its ID and the TTL (seconds) the server granted."""

    id: int
    ttl: int


@dataclasses.dataclass(frozen=True)
class Member:
    """One etcd cluster member. ``name`` is empty and ``client_urls`` too until it has started."""

    id: int
    name: str
    peer_urls: list[str]
    client_urls: list[str]
    is_learner: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Member:
        return cls(
            id=_int(data.get("ID")),
            name=data.get("name", ""),
            peer_urls=list(data.get("peerURLs", [])),
            client_urls=list(data.get("clientURLs", [])),
            is_learner=bool(data.get("isLearner", False)),
        )


@dataclasses.dataclass(frozen=True)
class Status:
    """What one member says about itself and the cluster (``etcdctl endpoint status``)."""

    endpoint: str
    member_id: int
    leader: int
    version: str
    db_size: int
    db_size_in_use: int
    raft_index: int
    raft_term: int
    raft_applied_index: int
    is_learner: bool
    errors: list[str]

    @classmethod
    def from_json(cls, data: dict[str, Any], *, endpoint: str) -> Status:
        return cls(
            endpoint=endpoint,
            member_id=_int(data.get("header", {}).get("member_id")),
            leader=_int(data.get("leader")),
            version=data.get("version", ""),
            db_size=_int(data.get("dbSize")),
            db_size_in_use=_int(data.get("dbSizeInUse")),
            raft_index=_int(data.get("raftIndex")),
            raft_term=_int(data.get("raftTerm")),
            raft_applied_index=_int(data.get("raftAppliedIndex")),
            is_learner=bool(data.get("isLearner", False)),
            errors=list(data.get("errors", [])),
        )

    @property
    def is_leader(self) -> bool:
        return self.leader != 0 and self.leader == self.member_id


def _range_body(key: bytes, *, prefix: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key)}
    if prefix:
        body["range_end"] = _b64(prefix_range_end(key))
    return body


def _put_body(key: bytes, value: bytes, *, lease: int) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return body


def error_from_response(*, status: int, body: bytes, endpoint: str) -> errors.EtcdError:
    """Turn a failed gateway answer into the matching :class:`~kubeplane.clients.errors.EtcdError`."""
    try:
        data = json.loads(body)
        message = str(data.get("message") or data.get("error") or "")
        code: int | None = int(data["code"]) if "code" in data else None
    except (ValueError, AttributeError, TypeError):
        message, code = body.decode(errors="replace").strip(), None
    message = message or f"HTTP {status}"
    if code is None:
        # Not a gRPC answer at all (a proxy, a wrong port, a 404 for an unknown path).
        kind: type[errors.EtcdError] = errors.EtcdUnavailable if status >= 500 else errors.EtcdInvalidRequest
        return kind(f"etcd gateway answered HTTP {status}: {message}", endpoint=endpoint)
    kind = _ERRORS_BY_MESSAGE.get(message) or _ERRORS_BY_CODE.get(code, errors.EtcdError)
    transient = any(fragment in message for fragment in _TRANSIENT_MESSAGES)
    return kind(message, code=code, endpoint=endpoint, retryable=True if transient else None)


class EtcdClient:
    """A connection to an etcd cluster through one or more client URLs.

    Use it as an async context manager (or call :meth:`aclose`) so the HTTP connections close::

        async with EtcdClient(["https://127.0.0.1:2379"], tls=tls_context(...)) as etcd:
            await etcd.put(b"/a", b"1")
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: ssl.SSLContext | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        if not endpoints:
            raise ValueError("EtcdClient needs at least one endpoint URL, e.g. https://127.0.0.1:2379")
        self.endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self.timeout = timeout
        self._preferred = 0
        # Never through a proxy from the environment (see KubeClient): etcd is this node's own
        # member or a peer on the cluster network.
        self._http = httpx.AsyncClient(
            verify=tls if tls is not None else True, transport=transport, trust_env=False
        )

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- transport -------------------------------------------------------------------------

    def _order(self, endpoint: str | None) -> list[str]:
        if endpoint is not None:
            return [endpoint.rstrip("/")]
        return self.endpoints[self._preferred :] + self.endpoints[: self._preferred]

    async def _call(
        self,
        path: str,
        body: dict[str, Any],
        *,
        endpoint: str | None = None,
        timeout: float | Literal["default"] | None = "default",
    ) -> dict[str, Any]:
        """POST ``body`` to ``path`` and return the decoded answer (the first line of a stream).

        The body is read to its end even after that line: a response closed unread closes its
        connection too. The one stream this serves, a lease keep-alive, ends right after its one
        answer (the request's stream has ended), and returning at the answer made every keep-alive
        open a new connection, a TCP and TLS handshake that on a loaded machine came too late.
        """
        limit = self.timeout if timeout == "default" else timeout
        answer: dict[str, Any] | None = None
        async with self._stream(path, body, endpoint=endpoint, timeout=limit) as (url, response):
            async for line in response.aiter_lines():
                if answer is None and line.strip():
                    answer = _stream_item(line, endpoint=url)
        return answer or {}

    @contextlib.asynccontextmanager
    async def _stream(
        self, path: str, body: dict[str, Any], *, endpoint: str | None, timeout: float | None
    ) -> AsyncIterator[tuple[str, httpx.Response]]:
        """Open ``path`` on the first endpoint that accepts a connection; raise mapped errors."""
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        failures: list[str] = []
        for url in self._order(endpoint):
            try:
                request = self._http.build_request(
                    "POST",
                    url + path,
                    json=body,
                    timeout=httpx.Timeout(timeout, connect=min(timeout or 5, 5)),
                )
                response = await self._http.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failures.append(f"{url}: {_describe(exc)}")
                continue
            except (httpx.TransportError, ssl.SSLError) as exc:
                raise errors.EtcdUnavailable(
                    f"etcd request {path} failed: {_describe(exc)}", endpoint=url
                ) from exc
            self._remember(url)
            try:
                if response.status_code != httpx.codes.OK:
                    raise error_from_response(
                        status=response.status_code, body=await response.aread(), endpoint=url
                    )
                try:
                    yield url, response
                except (httpx.TransportError, ssl.SSLError) as exc:
                    raise errors.EtcdUnavailable(
                        f"etcd stream {path} broke: {_describe(exc)}", endpoint=url
                    ) from exc
            finally:
                await response.aclose()
            return
        raise errors.EtcdUnavailable(
            "cannot connect to any etcd endpoint: "
            + "; ".join(failures)
            + " — check that etcd runs and that the URLs and certificates are right"
        )

    def _remember(self, url: str) -> None:
        if url in self.endpoints:
            self._preferred = self.endpoints.index(url)

    # -- KV --------------------------------------------------------------------------------

    async def get(
        self, key: bytes, *, prefix: bool = False, limit: int = 0, keys_only: bool = False
    ) -> RangeResult:
        """Read ``key`` (or every key under it with ``prefix=True``), in key order."""
        body = _range_body(key, prefix=prefix)
        if limit:
            body["limit"] = str(limit)
        if keys_only:
            body["keys_only"] = True
        return RangeResult.from_json(await self._call("/v3/kv/range", body))

    async def get_value(self, key: bytes) -> bytes | None:
        """The value of ``key``, or ``None`` if it does not exist."""
        result = await self.get(key)
        return result.kvs[0].value if result.kvs else None

    async def put(self, key: bytes, value: bytes, *, lease: int = 0, prev_kv: bool = False) -> PutResult:
        """Write ``key``; with ``lease`` the key disappears when the lease expires."""
        body = _put_body(key, value, lease=lease)
        if prev_kv:
            body["prev_kv"] = True
        return PutResult.from_json(await self._call("/v3/kv/put", body))

    async def create(self, key: bytes, value: bytes, *, lease: int = 0) -> CreateResult:
        """Write ``key`` only if it does not exist, in one transaction (an election's campaign:
        of several nodes asking at once exactly one gets ``created``); otherwise read it."""
        body = {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": _put_body(key, value, lease=lease)}],
            "failure": [{"request_range": _range_body(key, prefix=False)}],
        }
        data = await self._call("/v3/kv/txn", body)
        revision = _int(data.get("header", {}).get("revision"))
        if data.get("succeeded"):
            return CreateResult(created=True, revision=revision)
        responses = data.get("responses") or [{}]
        found = RangeResult.from_json(responses[0].get("response_range", {}))
        return CreateResult(created=False, revision=revision, current=found.kvs[0] if found.kvs else None)

    async def delete(self, key: bytes, *, prefix: bool = False) -> DeleteResult:
        """Delete ``key`` (or every key under it); returns how many were deleted."""
        return DeleteResult.from_json(await self._call("/v3/kv/deleterange", _range_body(key, prefix=prefix)))

    async def compact(self, revision: int, *, physical: bool = False) -> None:
        """Drop the history before ``revision``; ``physical`` waits until it is purged from disk."""
        body: dict[str, Any] = {"revision": str(revision)}
        if physical:
            body["physical"] = True
        await self._call("/v3/kv/compaction", body)

    # -- leases ----------------------------------------------------------------------------

    async def lease_grant(self, ttl: int, *, lease_id: int = 0) -> Lease:
        """Grant a lease of ``ttl`` seconds (``lease_id=0`` lets etcd choose the ID)."""
        body: dict[str, Any] = {"TTL": str(ttl)}
        if lease_id:
            body["ID"] = str(lease_id)
        data = await self._call("/v3/lease/grant", body)
        return Lease(id=_int(data.get("ID")), ttl=_int(data.get("TTL")))

    async def lease_keepalive(self, lease_id: int, *, timeout: float | None = None) -> int:
        """Refresh a lease once; returns its new TTL, raises ``EtcdNotFound`` if it expired."""
        limit: float | Literal["default"] = "default" if timeout is None else timeout
        data = await self._call("/v3/lease/keepalive", {"ID": str(lease_id)}, timeout=limit)
        ttl = _int(data.get("TTL"))
        if ttl <= 0:
            raise errors.EtcdNotFound(f"lease {lease_id:x} has expired or was revoked; grant a new one")
        return ttl

    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke a lease; every key attached to it is deleted."""
        await self._call("/v3/lease/revoke", {"ID": str(lease_id)})

    async def lease_ttl(self, lease_id: int) -> int:
        """Seconds the lease has left, or -1 if it does not exist (any more)."""
        data = await self._call("/v3/lease/timetolive", {"ID": str(lease_id)})
        return _int(data.get("TTL"))

    @contextlib.asynccontextmanager
    async def lease(self, ttl: int) -> AsyncIterator[Lease]:
        """A lease kept alive in the background for as long as the block runs, then revoked.

        If the lease is lost meanwhile (etcd says it expired, or no keep-alive got through
        within its TTL) the block is cancelled and :class:`~kubeplane.clients.errors.EtcdLeaseLost`
        raised in its place: whatever the block did under the lease must not carry on without it.
        """
        async with self._kept_lease(ttl) as keeper:
            yield keeper.lease

    @contextlib.asynccontextmanager
    async def _kept_lease(self, ttl: int) -> AsyncIterator[_LeaseKeeper]:
        asked = time.monotonic()
        granted = await self.lease_grant(ttl)
        keeper = _LeaseKeeper(self, granted, granted_at=asked)
        try:
            yield keeper
        except asyncio.CancelledError:
            lost = keeper.guard.release()
            if lost is not None:
                # The cancellation was ours alone: turn it into the error that says why.
                raise lost from lost.__cause__
            raise
        finally:
            # Also when the block swallowed our cancellation: it must not stay pending.
            keeper.stop()
            await keeper.stopped()
            try:
                await self.lease_revoke(granted.id)
            except errors.EtcdNotFound:
                pass
            except errors.EtcdError as exc:
                if keeper.lost is None:
                    raise
                log.info("lease %x: not revoked (it is lost anyway): %s", granted.id, exc)

    # -- locks -----------------------------------------------------------------------------

    async def lock_acquire(self, name: bytes, *, lease: int, timeout: float | None = None) -> bytes:
        """Block until the lock ``name`` is held under ``lease``; returns the lock's key.

        ``timeout=None`` waits for as long as another holder keeps the lock.
        """
        data = await self._call("/v3/lock/lock", {"name": _b64(name), "lease": str(lease)}, timeout=timeout)
        return _unb64(data.get("key"))

    async def lock_release(self, key: bytes) -> None:
        """Release a lock by the key :meth:`lock_acquire` returned."""
        await self._call("/v3/lock/unlock", {"key": _b64(key)})

    @contextlib.asynccontextmanager
    async def lock(self, name: bytes, *, ttl: int = 10, timeout: float | None = None) -> AsyncIterator[bytes]:
        """Hold the distributed lock ``name`` for the duration of the block.

        The lock hangs on a lease kept alive meanwhile, so a holder that dies releases it
        after ``ttl`` seconds. A holder that loses the lease (etcd unreachable for longer than
        ``ttl``, or the lease revoked) no longer holds the lock, since another client may take it: the
        block is then cancelled and :class:`~kubeplane.clients.errors.EtcdLeaseLost` raised in
        its place (retryable: take the lock again).
        """
        async with self._kept_lease(ttl) as keeper:
            key = await self.lock_acquire(name, lease=keeper.lease.id, timeout=timeout)
            try:
                yield key
            finally:
                # A lost lease took the lock key with it (or its revocation will).
                if keeper.lost is None:
                    with contextlib.suppress(errors.EtcdNotFound):
                        await self.lock_release(key)

    # -- watch -----------------------------------------------------------------------------

    async def watch(
        self, key: bytes, *, prefix: bool = False, start_revision: int | None = None
    ) -> AsyncGenerator[list[KeyValue], None]:
        """Yield the changed keys of each watch response for ``key`` (from ``start_revision``).

        Deleted keys come as a :class:`KeyValue` with an empty value. Runs until the caller stops
        iterating; a broken or closed stream raises the mapped
        :class:`~kubeplane.clients.errors.EtcdError`.

        When the revision the watch needs next has been compacted away, etcd cancels the watch
        and the changes in between are gone. The watch then reads the key (range) again, yields
        that current state as one :class:`Relist` batch (whole state, not changes: an absent key
        is simply not in it) and carries on from the revision of that read.
        """
        revision = start_revision
        while True:
            request = _range_body(key, prefix=prefix)
            if revision is not None:
                request["start_revision"] = str(revision)
            compacted = 0
            async with self._stream(
                "/v3/watch", {"create_request": request}, endpoint=None, timeout=None
            ) as (url, response):
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    item = _stream_item(line, endpoint=url)
                    if item.get("events"):
                        changed = [KeyValue.from_json(event.get("kv", {})) for event in item["events"]]
                        revision = max(kv.mod_revision for kv in changed) + 1
                        yield changed
                    if item.get("canceled"):
                        compacted = _int(item.get("compact_revision"))
                        if compacted:
                            break
                        reason = item.get("cancel_reason") or "no reason given"
                        raise errors.EtcdError(f"etcd cancelled the watch on {key!r}: {reason}", endpoint=url)
                else:
                    raise errors.EtcdUnavailable(f"etcd closed the watch on {key!r}", endpoint=url)
            log.info(
                "watch on %r: revision %s was compacted (up to %d); reading the current state",
                key,
                revision,
                compacted,
            )
            current = await self.get(key, prefix=prefix)
            revision = current.revision + 1
            yield Relist(current.kvs, revision=current.revision, compact_revision=compacted)

    # -- cluster ---------------------------------------------------------------------------

    async def member_list(self) -> list[Member]:
        """Every member, started or not, voting or learner."""
        data = await self._call("/v3/cluster/member/list", {})
        return [Member.from_json(item) for item in data.get("members", [])]

    async def member_add(self, peer_urls: Sequence[str], *, learner: bool = False) -> Member:
        """Announce a new member by its peer URLs.

        The member must then be started with ``--initial-cluster-state=existing``; a learner
        does not vote until :meth:`member_promote`.
        """
        body: dict[str, Any] = {"peerURLs": list(peer_urls)}
        if learner:
            body["isLearner"] = True
        data = await self._call("/v3/cluster/member/add", body)
        return Member.from_json(data.get("member", {}))

    async def member_remove(self, member_id: int) -> None:
        """Remove a member from the cluster by ID."""
        await self._call("/v3/cluster/member/remove", {"ID": str(member_id)})

    async def member_promote(self, member_id: int) -> None:
        """Turn a learner that has caught up into a voting member."""
        await self._call("/v3/cluster/member/promote", {"ID": str(member_id)})

    async def move_leader(self, target_id: int, *, endpoint: str) -> None:
        """Hand raft leadership to member ``target_id``; ``endpoint`` must be the leader's (only
        the leader can transfer leadership; etcd refuses it elsewhere)."""
        body = {"targetID": str(target_id)}
        await self._call("/v3/maintenance/transfer-leadership", body, endpoint=endpoint)

    async def hand_over_leadership(self, endpoint: str, *, last: Collection[str] = ()) -> Member | None:
        """If the member behind ``endpoint`` leads, make another voting member the leader.

        Returns the new leader; None when that member does not lead (nothing to do) or no other
        member can take over. Started voters are tried in the order etcd lists them, the members
        named in ``last`` after the others, until one takes it (a member that is down fails the
        transfer after its election timeout).
        """
        status = await self.status(endpoint)
        if not status.is_leader:
            return None
        members = await self.member_list()
        voters = [m for m in members if m.id != status.member_id and not m.is_learner and m.name]
        candidates = sorted(voters, key=lambda member: member.name in last)
        failures: list[str] = []
        for member in candidates:
            try:
                await self.move_leader(member.id, endpoint=status.endpoint)
            except errors.EtcdError as exc:
                failures.append(f"{member.name}: {exc}")
                continue
            return member
        if failures:
            raise errors.EtcdUnavailable("no member took over the leadership: " + "; ".join(failures))
        return None

    async def status(self, endpoint: str | None = None) -> Status:
        """The status of the member behind ``endpoint`` (default: the first that answers)."""
        async with self._stream("/v3/maintenance/status", {}, endpoint=endpoint, timeout=self.timeout) as (
            url,
            response,
        ):
            data = _stream_item((await response.aread()).decode(), endpoint=url)
        return Status.from_json(data, endpoint=url)

    async def snapshot(self, out: IO[bytes], *, endpoint: str | None = None) -> int:
        """Stream a consistent snapshot of the database into ``out``; returns its size in bytes."""
        written = 0
        async with self._stream("/v3/maintenance/snapshot", {}, endpoint=endpoint, timeout=None) as (
            url,
            response,
        ):
            async for line in response.aiter_lines():
                if line.strip():
                    chunk = _unb64(_stream_item(line, endpoint=url).get("blob"))
                    out.write(chunk)
                    written += len(chunk)
        return written


class _LeaseKeeper:
    """Keeps a lease alive from a background task while a block relies on it.

    Refreshes every third of the TTL, retrying failed refreshes until the lease's deadline (the
    send time of the last refresh that got through, plus the TTL it returned: etcd may expire
    the lease from then on). When etcd says the lease is gone or the deadline passes, the lease
    is *lost*: :attr:`lost` holds the error and the block's task is cancelled, as
    :func:`asyncio.timeout` does, so the block stops at its next ``await``.
    """

    def __init__(self, client: EtcdClient, lease: Lease, *, granted_at: float) -> None:
        self.client = client
        self.lease = lease
        self.guard = guard.LossGuard()
        self._deadline = granted_at + lease.ttl
        self._refresher = asyncio.create_task(self._refresh())

    async def _refresh(self) -> None:
        interval = max(self.lease.ttl / 3, 0.5)
        due = time.monotonic() + interval
        failure: errors.EtcdError | None = None
        while True:
            await asyncio.sleep(max(due - time.monotonic(), 0))
            sent = time.monotonic()
            if sent >= self._deadline:
                why = f"no keep-alive got through within its {self.lease.ttl}s TTL"
                self._lose(f"{why} (last error: {failure})" if failure else why, failure)
                return
            try:
                limit = min(self._deadline - sent, self.client.timeout)
                ttl = await self.client.lease_keepalive(self.lease.id, timeout=limit)
            except errors.EtcdError as exc:
                if not exc.retryable:
                    self._lose(str(exc), exc)
                    return
                log.info("retrying error: lease %x keepalive: %s", self.lease.id, exc)
                failure = exc
                due = min(time.monotonic() + min(interval / 2, 1.0), self._deadline)
                continue
            failure = None
            self._deadline = sent + ttl
            due = sent + interval

    def _lose(self, why: str, cause: BaseException | None) -> None:
        lost = errors.EtcdLeaseLost(f"lease {self.lease.id:x} is lost: {why}; the work under it was stopped")
        lost.__cause__ = cause
        log.warning("%s", lost)
        self.guard.lose(lost)

    @property
    def lost(self) -> BaseException | None:
        return self.guard.lost

    def stop(self) -> None:
        """The block is over: a loss from now on cancels nothing. Stops the refresher."""
        self.guard.release()
        self._refresher.cancel()

    async def stopped(self) -> None:
        """Wait for the refresher to finish (without swallowing a cancellation of our own task)."""
        await asyncio.wait([self._refresher])
        if not self._refresher.cancelled() and self._refresher.exception() is not None:
            log.error("lease %x keeper failed", self.lease.id, exc_info=self._refresher.exception())


def _describe(exc: httpx.TransportError | ssl.SSLError) -> str:
    import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

    text = str(exc) or type(exc).__name__
    if isinstance(exc, ssl.SSLError):
        # httpx passes a TLS alert that arrives after the handshake through as it is, and with
        # TLS 1.3 that is how a server refuses a client certificate.
        reason = exc.reason or ""
        if "CERTIFICATE" in reason or "UNKNOWN_CA" in reason:
            text += " (etcd refused the client certificate)"
    elif isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError):
        # With TLS 1.3 a server that refuses our client certificate just closes the connection.
        text += " (connection closed: etcd stopped, or it refused the client certificate)"
    return text


def _stream_item(line: str, *, endpoint: str) -> dict[str, Any]:
    """Decode one line of a gateway answer; streams wrap items in ``result`` or ``error``."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise errors.EtcdUnavailable(
            f"etcd sent a line that is not JSON: {line[:200]!r}", endpoint=endpoint
        ) from exc
    if not isinstance(data, dict):
        raise errors.EtcdUnavailable(f"etcd sent unexpected JSON: {line[:200]!r}", endpoint=endpoint)
    failure = data.get("error")
    if isinstance(failure, dict):
        # Streams report errors in-band as {"error": {"grpc_code", "message", ...}}.
        body = {
            "message": failure.get("message", ""),
            "code": failure.get("grpc_code", failure.get("code", 2)),
        }
        raise error_from_response(status=500, body=json.dumps(body).encode(), endpoint=endpoint)
    result = data.get("result", data)
    return result if isinstance(result, dict) else {}
