"""The reflectors: list then watch Services and EndpointSlices into the records table; relist on
410, back off and resume on a broken stream, ready only after both lists (``httpx.MockTransport``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import dns.name
import httpx
import pytest
from dns_objects import endpoint, endpoint_slice, service

from kubeplane import pki, retry
from kubeplane.clients.kube import KubeClient
from kubeplane.dns import watch

pytestmark = pytest.mark.unit

CA = pki.new_ca("kubernetes")
KUBECONFIG = pki.kubeconfig(
    cluster_name="c1",
    server="https://10.5.0.1:6443",
    ca_cert=CA.cert,
    user="admin",
    client=pki.issue(ca=CA, common_name="admin", organizations=["system:masters"], usages=("client",)),
)
FAST = retry.Backoff(initial=0.01, factor=2.0, maximum=0.05)
SLICES_V1BETA1 = "/apis/discovery.k8s.io/v1beta1/endpointslices"


def discovery() -> dict[str, Any]:
    return {"resources": [{"name": "endpointslices", "kind": "EndpointSlice", "namespaced": True}]}


def versioned(obj: dict[str, Any], version: str) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = version
    return obj


def lines(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(json.dumps({"type": t, "object": o}).encode() + b"\n" for t, o in events)


class Idle(httpx.AsyncByteStream):
    """A watch stream that stays open without events until the test ends."""

    async def __aiter__(self) -> Any:
        await asyncio.Event().wait()
        yield b""


class Broken(httpx.AsyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self) -> Any:
        yield self.body
        raise httpx.ReadError("connection reset")


Answer = httpx.Response | Callable[[], httpx.Response]


class FakeAPI:
    """Scripted answers per path: lists and watches are taken in order; then watches idle."""

    def __init__(self, *, v1: bool = False) -> None:
        self.v1 = v1
        self.lists: dict[str, list[Answer]] = {}
        self.watches: dict[str, list[Answer]] = {}
        self.seen: list[httpx.Request] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        path = request.url.path
        if path == "/apis/discovery.k8s.io/v1":
            return httpx.Response(200, json=discovery()) if self.v1 else httpx.Response(404, json={})
        if path == "/apis/discovery.k8s.io/v1beta1":
            return httpx.Response(200, json=discovery())
        queue = (self.watches if request.url.params.get("watch") else self.lists).get(path) or []
        if not queue:
            return httpx.Response(200, stream=Idle())
        answer = queue.pop(0)
        return answer() if callable(answer) else answer

    def watched_versions(self, path: str) -> list[str]:
        return [
            r.url.params["resourceVersion"]
            for r in self.seen
            if r.url.path == path and r.url.params.get("watch")
        ]


def listing(version: str, *items: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json={"metadata": {"resourceVersion": version}, "items": list(items)})


def exists(mirror: watch.Mirror, name: str) -> bool:
    return mirror.table.lookup(dns.name.from_text(name, origin=None)) is not None


async def until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def scenario(api: FakeAPI, body: Callable[[watch.Mirror], Any]) -> list[Any]:
    """Run the reflectors against ``api`` while ``body(mirror)`` runs; return the tables published."""
    published: list[Any] = []

    async def main() -> None:
        mirror = watch.Mirror(on_change=published.append)
        async with KubeClient(KUBECONFIG, transport=httpx.MockTransport(api.handler)) as client:
            task = asyncio.create_task(watch.run(client, mirror, backoff=FAST))
            try:
                await body(mirror)
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

    asyncio.run(main())
    return published


def test_events_update_the_table_per_service_and_bookmarks_move_the_resume_version() -> None:
    api = FakeAPI()
    api.lists[watch.SERVICES] = [listing("10", versioned(service("web"), "9"))]
    api.lists[SLICES_V1BETA1] = [listing("10")]
    headless = versioned(service("db", cluster_ip="None"), "11")
    db_slice = versioned(endpoint_slice("db", [endpoint("10.244.1.5")]), "12")
    api.watches[watch.SERVICES] = [
        httpx.Response(
            200,
            content=lines(
                ("ADDED", headless),
                ("MODIFIED", versioned(service("web", cluster_ip="10.96.0.77"), "13")),
                ("BOOKMARK", {"kind": "Service", "metadata": {"resourceVersion": "20"}}),
            ),
        ),
        httpx.Response(200, content=lines(("DELETED", versioned(service("web"), "21")))),
    ]
    api.watches[SLICES_V1BETA1] = [httpx.Response(200, content=lines(("ADDED", db_slice)))]

    async def body(mirror: watch.Mirror) -> None:
        await until(lambda: mirror.ready)
        await until(lambda: not exists(mirror, "web.default.svc") and exists(mirror, "db.default.svc"))
        records = mirror.table.lookup(dns.name.from_text("db.default.svc", origin=None))
        assert records is not None
        assert "10.244.1.5" in str(records)
        # The first watch ended cleanly: the next one resumed from the bookmark's version at once.
        assert api.watched_versions(watch.SERVICES)[:2] == ["10", "20"]

    published = scenario(api, body)
    assert len(published) >= 5  # two lists, then one table per event


def test_not_ready_until_both_lists_are_applied() -> None:
    api = FakeAPI()
    slices_listed = asyncio.Event()

    def slices_list() -> httpx.Response:
        slices_listed.set()
        return listing("3")

    api.lists[watch.SERVICES] = [listing("3", service("web"))]
    api.lists[SLICES_V1BETA1] = [httpx.Response(503, json={"message": "overloaded"}), slices_list]

    async def body(mirror: watch.Mirror) -> None:
        await until(lambda: exists(mirror, "web.default.svc"))
        assert not mirror.ready  # Services listed, the first EndpointSlice list failed
        await until(lambda: mirror.ready)
        assert slices_listed.is_set()

    scenario(api, body)


def test_410_on_the_watch_lists_again_and_replaces_the_set() -> None:
    api = FakeAPI()
    gone = {"kind": "Status", "code": 410, "message": "too old resource version"}
    api.lists[watch.SERVICES] = [
        listing("5", service("old")),
        listing("6", service("old")),
        listing("50", service("new")),
    ]
    api.lists[SLICES_V1BETA1] = [listing("5")]
    api.watches[watch.SERVICES] = [
        httpx.Response(410, json=gone),
        httpx.Response(200, content=lines(("ERROR", gone))),
    ]

    async def body(mirror: watch.Mirror) -> None:
        await until(lambda: exists(mirror, "new.default.svc"))
        assert not exists(mirror, "old.default.svc")

    scenario(api, body)
    # A 410 answer, then an ERROR event: listed three times, watched from each list's version.
    assert api.watched_versions(watch.SERVICES)[:3] == ["5", "6", "50"]


def test_a_broken_stream_backs_off_and_resumes_from_the_last_version_seen() -> None:
    api = FakeAPI(v1=True)
    slices = "/apis/discovery.k8s.io/v1/endpointslices"
    api.lists[watch.SERVICES] = [listing("5")]
    api.lists[slices] = [listing("5")]
    added = versioned(service("web"), "8")
    api.watches[watch.SERVICES] = [
        httpx.Response(200, stream=Broken(lines(("ADDED", added)))),
        httpx.Response(503, json={"message": "restarting"}),
    ]

    async def body(mirror: watch.Mirror) -> None:
        await until(lambda: exists(mirror, "web.default.svc"))
        await until(lambda: len(api.watched_versions(watch.SERVICES)) >= 3)

    scenario(api, body)
    # discovery.k8s.io/v1 served: slices come from there; no relist after a broken stream.
    assert api.watched_versions(slices)[:1] == ["5"]
    assert api.watched_versions(watch.SERVICES)[:3] == ["5", "8", "8"]
    assert sum(1 for r in api.seen if r.url.path == watch.SERVICES and not r.url.params) == 1


def test_a_non_retryable_error_ends_the_reflectors() -> None:
    api = FakeAPI()
    api.lists[watch.SERVICES] = [httpx.Response(403, json={"message": "forbidden"})]

    async def main() -> None:
        async with KubeClient(KUBECONFIG, transport=httpx.MockTransport(api.handler)) as client:
            await watch.run(client, watch.Mirror(), backoff=FAST)

    with pytest.raises(ExceptionGroup) as caught:
        asyncio.run(asyncio.wait_for(main(), 5))
    assert "forbidden" in str(caught.value.exceptions[0])


def test_forbidden_endpointslices_fall_back_to_endpoints() -> None:
    # kubeadm v1.20 gives its CoreDNS (1.7) the right to list Endpoints, not EndpointSlices.
    api = FakeAPI()
    api.lists[watch.SERVICES] = [listing("10", versioned(service("web", cluster_ip="None"), "9"))]
    api.lists[SLICES_V1BETA1] = [httpx.Response(403, json={"message": "endpointslices is forbidden"})]
    ready_web = {
        "metadata": {"namespace": "default", "name": "web", "resourceVersion": "11"},
        "subsets": [
            {
                "addresses": [{"ip": "10.244.1.5", "hostname": "web-0"}],
                "notReadyAddresses": [{"ip": "10.244.2.6"}],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
            }
        ],
    }
    api.lists[watch.ENDPOINTS] = [listing("11", ready_web)]
    gone = {"metadata": {"namespace": "default", "name": "web", "resourceVersion": "12"}}
    api.watches[watch.ENDPOINTS] = [httpx.Response(200, content=lines(("DELETED", gone)))]

    async def body(mirror: watch.Mirror) -> None:
        await until(
            lambda: mirror.ready and mirror.table.generation > 0 and api.watched_versions(watch.ENDPOINTS)
        )
        await until(lambda: not exists(mirror, "web-0.web.default.svc"))

    published = scenario(api, body)
    lookup = [t.lookup(dns.name.from_text(n, origin=None)) is not None for t in published
              for n in ("web-0.web.default.svc", "10-244-2-6.web.default.svc")]  # fmt: skip
    # web-0 answered once Endpoints were listed (the not-ready address never did), then went.
    assert any(lookup[0::2]) and not any(lookup[1::2])


def test_endpoints_become_one_slice_per_subset_and_family() -> None:
    endpoints = {
        "metadata": {"namespace": "ns", "name": "db"},
        "subsets": [
            {"addresses": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}], "ports": [{"port": 5432}]},
            {"notReadyAddresses": [{"ip": "10.0.0.2", "nodeName": "n1"}]},
        ],
    }
    slices = watch.slices_of_endpoints(endpoints)
    assert [(s["metadata"]["name"], s["addressType"]) for s in slices] == [
        ("db-0-ipv4", "IPv4"),
        ("db-0-ipv6", "IPv6"),
        ("db-1-ipv4", "IPv4"),
    ]
    assert all(s["metadata"]["labels"] == {"kubernetes.io/service-name": "db"} for s in slices)
    assert slices[2]["endpoints"] == [
        {"addresses": ["10.0.0.2"], "conditions": {"ready": False}, "nodeName": "n1"}
    ]
    assert watch.slices_of_endpoints({"metadata": {"namespace": "ns", "name": "x"}}) == []
