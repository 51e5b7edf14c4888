"""Request/response encoding of the etcd gateway client and its error classification."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import io
import json
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from kubeplane import pki
from kubeplane.clients import errors
from kubeplane.clients import etcd as etcd_client

pytestmark = pytest.mark.unit


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


Handler = Callable[[str, dict[str, Any]], httpx.Response]


def call(
    handler: Handler, action: Callable[[etcd_client.EtcdClient], Any]
) -> tuple[Any, list[tuple[str, Any]]]:
    """Run ``action`` against a client whose transport answers with ``handler``; return its
    result and the (path, JSON body) of every request sent."""
    sent: list[tuple[str, Any]] = []

    def respond(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append((request.url.path, body))
        return handler(request.url.path, body)

    async def scenario() -> Any:
        transport = httpx.MockTransport(respond)
        async with etcd_client.EtcdClient(["http://etcd:2379"], transport=transport) as etcd:
            return await action(etcd)

    return asyncio.run(scenario()), sent


def answer(data: dict[str, Any], status: int = 200) -> Handler:
    return lambda path, body: httpx.Response(status, json=data)


HEADER = {"cluster_id": "1", "member_id": "2", "revision": "7", "raft_term": "3"}


@pytest.mark.parametrize(
    ("prefix", "end"),
    [(b"/a/", b"/a0"), (b"a\xff", b"b"), (b"\xff\xff", b"\x00"), (b"", b"\x00"), (b"ab\xff\xff", b"ac")],
)
def test_prefix_range_end(prefix: bytes, end: bytes) -> None:
    assert etcd_client.prefix_range_end(prefix) == end


def test_get_prefix_encodes_base64_and_decodes_int64_strings() -> None:
    response = {
        "header": HEADER,
        "kvs": [
            {
                "key": b64(b"/p/a"),
                "value": b64(b"\x00bin"),
                "create_revision": "5",
                "mod_revision": "6",
                "version": "2",
                "lease": "99",
            }
        ],
        "count": "1",
    }
    result, sent = call(answer(response), lambda etcd: etcd.get(b"/p/", prefix=True, limit=10))
    assert sent == [("/v3/kv/range", {"key": b64(b"/p/"), "range_end": b64(b"/p0"), "limit": "10"})]
    assert result.revision == 7 and result.count == 1 and not result.more
    assert result.kvs == [etcd_client.KeyValue(b"/p/a", b"\x00bin", 5, 6, 2, 99)]


def test_get_missing_key_tolerates_omitted_zero_fields() -> None:
    # The gateway leaves out zero values: no kvs, no count.
    result, _ = call(answer({"header": HEADER}), lambda etcd: etcd.get(b"/none"))
    assert result.kvs == [] and result.count == 0


def test_put_with_lease_sends_lease_as_string() -> None:
    result, sent = call(answer({"header": HEADER}), lambda etcd: etcd.put(b"k", b"v", lease=12))
    assert sent == [("/v3/kv/put", {"key": b64(b"k"), "value": b64(b"v"), "lease": "12"})]
    assert result.revision == 7


def test_lease_lock_member_field_names() -> None:
    responses = {
        "/v3/lease/grant": {"header": HEADER, "ID": "4660", "TTL": "5"},
        "/v3/lock/lock": {"header": HEADER, "key": b64(b"L/1234")},
        "/v3/cluster/member/add": {
            "header": HEADER,
            "member": {"ID": "77", "peerURLs": ["https://p:2380"], "isLearner": True},
        },
    }

    async def action(etcd: etcd_client.EtcdClient) -> Any:
        lease = await etcd.lease_grant(5)
        key = await etcd.lock_acquire(b"L", lease=lease.id)
        member = await etcd.member_add(["https://p:2380"], learner=True)
        return lease, key, member

    (lease, key, member), sent = call(
        lambda path, body: httpx.Response(200, json=responses.get(path, {"header": HEADER})), action
    )
    assert lease == etcd_client.Lease(id=4660, ttl=5)
    assert key == b"L/1234"
    assert member == etcd_client.Member(
        id=77, name="", peer_urls=["https://p:2380"], client_urls=[], is_learner=True
    )
    assert sent == [
        ("/v3/lease/grant", {"TTL": "5"}),
        ("/v3/lock/lock", {"name": b64(b"L"), "lease": "4660"}),
        ("/v3/cluster/member/add", {"peerURLs": ["https://p:2380"], "isLearner": True}),
    ]


def test_keepalive_stream_result_and_expired_lease() -> None:
    ttl, _ = call(
        lambda path, body: httpx.Response(200, content=b'{"result":{"header":{},"ID":"1","TTL":"9"}}\n'),
        lambda etcd: etcd.lease_keepalive(1),
    )
    assert ttl == 9
    with pytest.raises(errors.EtcdNotFound, match="expired"):
        call(
            lambda path, body: httpx.Response(200, content=b'{"result":{"ID":"1"}}\n'),
            lambda etcd: etcd.lease_keepalive(1),
        )


def test_status_and_leader() -> None:
    status_json = {
        "header": {"member_id": "5"},
        "version": "3.4.23",
        "dbSize": "24576",
        "leader": "5",
        "raftIndex": "10",
        "raftTerm": "2",
        "raftAppliedIndex": "10",
        "dbSizeInUse": "16384",
    }
    status, _ = call(answer(status_json), lambda etcd: etcd.status())
    assert status.is_leader and status.db_size == 24576 and status.raft_index == 10
    assert status.endpoint == "http://etcd:2379"


def test_snapshot_concatenates_stream_blobs() -> None:
    stream = b"".join(
        json.dumps({"result": {"remaining_bytes": str(r), "blob": b64(chunk)}}).encode() + b"\n"
        for r, chunk in ((3, b"abc"), (0, b"def"))
    )
    out = io.BytesIO()
    size, _ = call(lambda path, body: httpx.Response(200, content=stream), lambda etcd: etcd.snapshot(out))
    assert size == 6 and out.getvalue() == b"abcdef"


def test_stream_error_in_band_is_raised() -> None:
    stream = b'{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader"}}\n'
    with pytest.raises(errors.EtcdUnavailable, match="no leader"):
        call(lambda path, body: httpx.Response(200, content=stream), lambda etcd: etcd.snapshot(io.BytesIO()))


@pytest.mark.parametrize(
    ("code", "message", "kind", "retryable"),
    [
        (14, "etcdserver: leader changed", errors.EtcdUnavailable, True),
        (4, "context deadline exceeded", errors.EtcdUnavailable, True),
        (8, "etcdserver: too many requests", errors.EtcdUnavailable, True),
        (5, "etcdserver: requested lease not found", errors.EtcdNotFound, False),
        (9, "etcdserver: Peer URLs already exists", errors.EtcdConflict, False),
        (
            9,
            "etcdserver: re-configuration failed due to not enough started members",
            errors.EtcdConflict,
            True,
        ),
        (
            9,
            "etcdserver: can only promote a learner member which is in sync with leader",
            errors.EtcdLearnerNotReady,
            True,
        ),
        (
            9,
            "etcdserver: too many learner members in cluster",
            errors.EtcdConflict,
            True,
        ),
        (11, "etcdserver: mvcc: required revision has been compacted", errors.EtcdCompacted, False),
        (3, "etcdserver: key is not provided", errors.EtcdInvalidRequest, False),
        (7, "etcdserver: permission denied", errors.EtcdPermissionDenied, False),
        (12, "something new", errors.EtcdError, False),
    ],
)
def test_error_classification(code: int, message: str, kind: type[errors.EtcdError], retryable: bool) -> None:
    body = json.dumps({"error": message, "message": message, "code": code}).encode()
    error = etcd_client.error_from_response(status=500, body=body, endpoint="https://e:2379")
    assert type(error) is kind
    assert error.retryable is retryable
    assert error.code == code
    assert message in str(error) and "https://e:2379" in str(error)


def test_non_grpc_answers() -> None:
    not_found = etcd_client.error_from_response(status=404, body=b"Not Found\n", endpoint="e")
    assert isinstance(not_found, errors.EtcdInvalidRequest) and "HTTP 404" in str(not_found)
    bad_gateway = etcd_client.error_from_response(status=502, body=b"<html>", endpoint="e")
    assert isinstance(bad_gateway, errors.EtcdUnavailable) and bad_gateway.retryable


def test_failover_skips_endpoints_that_refuse_connections_and_remembers_the_good_one() -> None:
    hosts: list[str] = []

    def respond(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        if request.url.host == "down":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"header": HEADER})

    async def scenario() -> None:
        transport = httpx.MockTransport(respond)
        async with etcd_client.EtcdClient(["http://down:1", "http://up:2"], transport=transport) as etcd:
            await etcd.put(b"a", b"1")
            await etcd.put(b"b", b"2")

    asyncio.run(scenario())
    assert hosts == ["down", "up", "up"]


def test_all_endpoints_down_is_retryable_and_lists_them() -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async def scenario() -> None:
        transport = httpx.MockTransport(respond)
        async with etcd_client.EtcdClient(["http://a:1", "http://b:2"], transport=transport) as etcd:
            await etcd.get(b"x")

    with pytest.raises(errors.EtcdUnavailable, match=r"http://a:1: connection refused; http://b:2") as caught:
        asyncio.run(scenario())
    assert caught.value.retryable


def test_read_error_after_sending_is_not_resent_elsewhere() -> None:
    hosts: list[str] = []

    def respond(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        raise httpx.ReadError("", request=request)

    async def scenario() -> None:
        transport = httpx.MockTransport(respond)
        async with etcd_client.EtcdClient(["http://a:1", "http://b:2"], transport=transport) as etcd:
            await etcd.put(b"x", b"1")

    with pytest.raises(errors.EtcdUnavailable, match="client certificate"):
        asyncio.run(scenario())
    assert hosts == ["a"]


def test_tls_alert_after_handshake_is_a_mapped_error_naming_the_certificate() -> None:
    """httpx lets a TLS 1.3 alert (a refused client certificate) through as a bare ``ssl.SSLError``."""

    def respond(request: httpx.Request) -> httpx.Response:
        alert = ssl.SSLError(1, "[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate")
        alert.reason = "SSLV3_ALERT_BAD_CERTIFICATE"
        raise alert

    async def scenario() -> None:
        transport = httpx.MockTransport(respond)
        async with etcd_client.EtcdClient(["http://a:1"], transport=transport) as etcd:
            await etcd.get(b"x")

    with pytest.raises(errors.EtcdUnavailable, match="etcd refused the client certificate"):
        asyncio.run(scenario())


def test_client_needs_an_endpoint() -> None:
    with pytest.raises(ValueError, match="at least one endpoint"):
        etcd_client.EtcdClient([])


@pytest.mark.parametrize(
    ("message", "kind", "retryable"),
    [
        (
            "etcdserver: can only promote a learner member which is in sync with leader",
            errors.EtcdLearnerNotReady,
            True,
        ),
        ("etcdserver: can only promote a learner member", errors.EtcdMemberNotLearner, False),
    ],
)
def test_promotion_refusals_are_typed(message: str, kind: type[errors.EtcdError], retryable: bool) -> None:
    failure = {"error": message, "message": message, "code": 9}
    with pytest.raises(kind) as caught:
        call(answer(failure, status=400), lambda etcd: etcd.member_promote(0x1234))
    assert type(caught.value) is kind and caught.value.retryable is retryable
    # Both are conflicts, as before: callers that only knew EtcdConflict still catch them.
    assert isinstance(caught.value, errors.EtcdConflict)


def test_compacted_revision_is_typed() -> None:
    message = "etcdserver: mvcc: required revision has been compacted"
    error = etcd_client.error_from_response(
        status=400, body=json.dumps({"message": message, "code": 11}).encode(), endpoint="e"
    )
    assert type(error) is errors.EtcdCompacted and not error.retryable


def lines(*items: dict[str, Any]) -> bytes:
    return b"".join(json.dumps({"result": item}).encode() + b"\n" for item in items)


def test_watch_relists_after_compaction_and_resumes_after_the_read() -> None:
    created = {"header": HEADER, "created": True}
    compacted = {"header": HEADER, "canceled": True, "compact_revision": "5"}
    current = {
        "header": {"revision": "9"},
        "kvs": [{"key": b64(b"k"), "value": b64(b"now"), "mod_revision": "8"}],
    }
    change = {
        "header": HEADER,
        "events": [{"kv": {"key": b64(b"k"), "value": b64(b"next"), "mod_revision": "10"}}],
    }
    watches: list[dict[str, Any]] = []

    def handler(path: str, body: dict[str, Any]) -> httpx.Response:
        if path == "/v3/kv/range":
            return httpx.Response(200, json=current)
        watches.append(body["create_request"])
        if len(watches) == 1:
            return httpx.Response(200, content=lines(created, compacted))
        return httpx.Response(200, content=lines(created, change))

    async def action(etcd: etcd_client.EtcdClient) -> list[list[etcd_client.KeyValue]]:
        batches = []
        async with contextlib.aclosing(etcd.watch(b"k", start_revision=3)) as watch:
            async for batch in watch:
                batches.append(batch)
                if len(batches) == 2:
                    break
        return batches

    batches, sent = call(handler, action)
    relist, changed = batches
    assert isinstance(relist, etcd_client.Relist)
    assert [kv.value for kv in relist] == [b"now"]
    assert (relist.revision, relist.compact_revision) == (9, 5)
    assert not isinstance(changed, etcd_client.Relist) and [kv.value for kv in changed] == [b"next"]
    assert watches == [{"key": b64(b"k"), "start_revision": "3"}, {"key": b64(b"k"), "start_revision": "10"}]
    assert [path for path, _ in sent] == ["/v3/watch", "/v3/kv/range", "/v3/watch"]


def test_watch_resumes_after_the_last_event_and_relists_a_prefix() -> None:
    events = {
        "header": HEADER,
        "events": [
            {"kv": {"key": b64(b"p/a"), "value": b64(b"1"), "mod_revision": "6"}},
            {"type": "DELETE", "kv": {"key": b64(b"p/b"), "mod_revision": "7"}},
        ],
    }
    compacted = {"header": HEADER, "canceled": True, "compact_revision": "12"}
    watches: list[dict[str, Any]] = []
    ranges: list[dict[str, Any]] = []

    def handler(path: str, body: dict[str, Any]) -> httpx.Response:
        if path == "/v3/kv/range":
            ranges.append(body)
            return httpx.Response(200, json={"header": {"revision": "20"}})
        watches.append(body["create_request"])
        return httpx.Response(200, content=lines(events, compacted))

    async def action(etcd: etcd_client.EtcdClient) -> list[list[etcd_client.KeyValue]]:
        watch = etcd.watch(b"p/", prefix=True)
        async with contextlib.aclosing(watch):
            return [await anext(watch), await anext(watch)]

    (first, relist), _ = call(handler, action)
    assert [(kv.key, kv.value) for kv in first] == [(b"p/a", b"1"), (b"p/b", b"")]
    # Nothing left under the prefix: an empty re-list, which still says "this is all there is".
    assert isinstance(relist, etcd_client.Relist) and relist == [] and relist.revision == 20
    assert ranges == [{"key": b64(b"p/"), "range_end": b64(b"p0")}]
    assert watches == [{"key": b64(b"p/"), "range_end": b64(b"p0")}]


def test_watch_cancelled_for_another_reason_or_closed_raises() -> None:
    cancelled = {"header": HEADER, "canceled": True, "cancel_reason": "permission denied"}
    with pytest.raises(errors.EtcdError, match="cancelled the watch on b'k': permission denied"):
        call(
            lambda path, body: httpx.Response(200, content=lines({"created": True}, cancelled)),
            lambda etcd: anext(etcd.watch(b"k")),
        )
    with pytest.raises(errors.EtcdUnavailable, match="closed the watch"):
        call(
            lambda path, body: httpx.Response(200, content=lines({"created": True})),
            lambda etcd: anext(etcd.watch(b"k")),
        )


GRANT = {"header": HEADER, "ID": "4660", "TTL": "1"}


def lease_handler(keepalive: Callable[[], httpx.Response]) -> Handler:
    def handler(path: str, body: dict[str, Any]) -> httpx.Response:
        if path == "/v3/lease/grant":
            return httpx.Response(200, json=GRANT)
        if path == "/v3/lock/lock":
            return httpx.Response(200, json={"header": HEADER, "key": b64(b"L/1234")})
        if path == "/v3/lease/keepalive":
            return keepalive()
        return httpx.Response(200, json={"header": HEADER})

    return handler


async def hold_lock_forever(etcd: etcd_client.EtcdClient, progress: list[str]) -> None:
    """Take the lock and wait inside it, for at most 10 s (a deadline, not an expected delay)."""
    async with asyncio.timeout(10), etcd.lock(b"L", ttl=1):
        progress.append("in")
        await asyncio.Event().wait()
    progress.append("out")


def test_lock_body_is_stopped_when_etcd_says_the_lease_expired() -> None:
    progress: list[str] = []
    expired = lease_handler(lambda: httpx.Response(200, content=lines({"header": HEADER, "ID": "4660"})))
    with pytest.raises(errors.EtcdLeaseLost, match=r"lease 1234 is lost: .*expired") as caught:
        call(expired, lambda etcd: hold_lock_forever(etcd, progress))
    assert progress == ["in"]
    assert caught.value.retryable
    assert isinstance(caught.value.__cause__, errors.EtcdNotFound)


def test_lock_body_is_stopped_when_keepalives_fail_for_the_whole_ttl() -> None:
    progress: list[str] = []
    sent: list[str] = []

    def respond(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if request.url.path == "/v3/lease/keepalive":
            raise httpx.ConnectError("connection refused", request=request)
        return lease_handler(lambda: httpx.Response(500))(request.url.path, {})

    async def scenario() -> float:
        transport = httpx.MockTransport(respond)
        async with etcd_client.EtcdClient(["http://etcd:2379"], transport=transport) as etcd:
            started = time.monotonic()
            try:
                await hold_lock_forever(etcd, progress)
            finally:
                elapsed = time.monotonic() - started
        return elapsed

    with pytest.raises(errors.EtcdLeaseLost, match=r"no keep-alive got through within its 1s TTL") as caught:
        asyncio.run(scenario())
    assert progress == ["in"]
    assert isinstance(caught.value.__cause__, errors.EtcdUnavailable)
    # Retried until the lease's deadline, then given up: no unlock (the lock went with the
    # lease), a revoke attempt for good measure.
    assert sent.count("/v3/lease/keepalive") >= 2
    assert "/v3/lock/unlock" not in sent and sent[-1] == "/v3/lease/revoke"


def test_a_cancelled_lock_holder_stays_cancelled_and_releases() -> None:
    sent: list[str] = []
    alive = lease_handler(
        lambda: httpx.Response(200, content=lines({"header": HEADER, "ID": "4660", "TTL": "1"}))
    )

    def respond(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return alive(request.url.path, {})

    async def scenario() -> None:
        progress: list[str] = []
        transport = httpx.MockTransport(respond)
        async with etcd_client.EtcdClient(["http://etcd:2379"], transport=transport) as etcd:
            holder = asyncio.create_task(hold_lock_forever(etcd, progress))
            async with asyncio.timeout(10):
                # Two keep-alives in: the lease is healthy, and the holder must not be disturbed.
                while sent.count("/v3/lease/keepalive") < 2:
                    await asyncio.sleep(0.05)
            assert progress == ["in"] and not holder.done()
            holder.cancel()
            with pytest.raises(asyncio.CancelledError):
                await holder

    asyncio.run(scenario())
    assert sent[-2:] == ["/v3/lock/unlock", "/v3/lease/revoke"]


def test_a_lease_block_that_ends_normally_keeps_no_refresher() -> None:
    async def action(etcd: etcd_client.EtcdClient) -> int:
        async with etcd.lease(1) as granted:
            pass
        # Nothing is left running: no task but this one.
        assert asyncio.all_tasks() == {asyncio.current_task()}
        return granted.id

    lease_id, sent = call(lease_handler(lambda: httpx.Response(500)), action)
    assert lease_id == 4660
    assert [path for path, _ in sent] == ["/v3/lease/grant", "/v3/lease/revoke"]


def test_tls_context_loads_the_pair_without_a_file_or_a_leaked_descriptor() -> None:
    # The pair goes through anonymous memory files: a process killed meanwhile leaves no private
    # key behind in the temporary directory (a temporary directory did).
    ca = pki.new_ca("etcd-ca")
    pair = pki.issue(ca=ca, common_name="client", usages=("client",))
    temporary = set(os.listdir(tempfile.gettempdir()))
    descriptors = set(os.listdir("/proc/self/fd"))
    context = etcd_client.tls_context(ca=ca.cert, cert=pair.cert, key=pair.key)
    assert isinstance(context, ssl.SSLContext)
    assert set(os.listdir(tempfile.gettempdir())) == temporary
    assert set(os.listdir("/proc/self/fd")) == descriptors
    with pytest.raises(ssl.SSLError):
        etcd_client.tls_context(ca=ca.cert, cert=pair.cert, key=pki.issue(ca=ca, common_name="x").key)
    assert set(os.listdir("/proc/self/fd")) == descriptors


def test_a_proxy_in_the_environment_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # etcd is the node's own member or a peer on the cluster network: an agent started with a
    # corporate proxy in its environment (a systemd unit's, /etc/environment) must not send its
    # etcd traffic through it. A real server on loopback, since httpx ignores the environment
    # whenever a transport is given.
    body = json.dumps({"header": HEADER, "kvs": [], "count": "0"}).encode()

    class Etcd(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Etcd) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:

            async def scenario() -> etcd_client.RangeResult:
                async with etcd_client.EtcdClient([f"http://127.0.0.1:{server.server_port}"]) as etcd:
                    return await etcd.get(b"k")

            assert asyncio.run(scenario()).kvs == []
        finally:
            server.shutdown()
