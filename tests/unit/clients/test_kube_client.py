"""The Kubernetes API client: kubeconfig text, error mapping, verbs and content types, discovery,
no hidden retry, and waits that retry by type (every request answered by ``httpx.MockTransport``)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kubeplane import pki, retry
from kubeplane.clients import errors, kube

pytestmark = pytest.mark.unit

CA = pki.new_ca("kubernetes")
ADMIN = pki.issue(ca=CA, common_name="admin", organizations=["system:masters"], usages=("client",))
KUBECONFIG = pki.kubeconfig(
    cluster_name="c1", server="https://10.5.0.1:6443", ca_cert=CA.cert, user="admin", client=ADMIN
)

Handler = Callable[[httpx.Request], httpx.Response]


def token_kubeconfig(**changes: Any) -> str:
    document: dict[str, Any] = {
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": "https://10.5.0.2:6443/",
                    "certificate-authority-data": base64.b64encode(CA.cert).decode(),
                },
            }
        ],
        "users": [{"name": "u", "user": {"token": "abcdef.0123456789abcdef"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    document.update(changes)
    return yaml.safe_dump(document)


def call(handler: Handler, use: Callable[[kube.KubeClient], Any], kubeconfig: str = KUBECONFIG) -> Any:
    async def scenario() -> Any:
        async with kube.KubeClient(kubeconfig, transport=httpx.MockTransport(handler)) as api:
            return await use(api)

    return asyncio.run(scenario())


def status(code: int, message: str) -> Handler:
    return lambda request: httpx.Response(code, json={"kind": "Status", "message": message})


# -- kubeconfig ---------------------------------------------------------------------------------


def test_client_certificate_kubeconfig_text_does_not_touch_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "must-not-be-read"))
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"gitVersion": "v1.20.2"})

    assert call(handler, lambda api: api.get("/version"), KUBECONFIG.encode()) == {"gitVersion": "v1.20.2"}
    assert str(seen[0].url) == "https://10.5.0.1:6443/version"
    assert "Authorization" not in seen[0].headers
    assert list(tmp_path.iterdir()) == []


def test_token_kubeconfig_sends_a_bearer_token() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    call(handler, lambda api: api.get("/api/v1/nodes"), token_kubeconfig())
    assert seen[0].headers["Authorization"] == "Bearer abcdef.0123456789abcdef"
    assert str(seen[0].url) == "https://10.5.0.2:6443/api/v1/nodes"


def test_context_is_chosen_by_name_or_current_context() -> None:
    other = {"name": "other", "context": {"cluster": "missing", "user": "u"}}
    text = token_kubeconfig(contexts=[{"name": "ctx", "context": {"cluster": "c", "user": "u"}}, other])
    assert kube.KubeClient(text).server == "https://10.5.0.2:6443"
    with pytest.raises(errors.KubeconfigError, match="no cluster named 'missing' in clusters"):
        kube.KubeClient(text, context="other")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/etc/kubernetes/admin.conf", "not a path"),
        (token_kubeconfig(users=[{"name": "u", "user": {}}]), "neither client-certificate-data"),
        (token_kubeconfig(**{"current-context": "nope"}), "no context named 'nope'"),
        (
            token_kubeconfig(clusters=[{"name": "c", "cluster": {"server": "https://x:6443"}}]),
            "no certificate-authority-data",
        ),
        (token_kubeconfig(clusters=[{"name": "c", "cluster": {}}]), "has no server"),
    ],
)
def test_kubeconfig_errors_name_the_missing_field(text: str, message: str) -> None:
    with pytest.raises(errors.KubeconfigError, match=message) as caught:
        kube.KubeClient(text)
    assert isinstance(caught.value, ValueError)
    assert not caught.value.retryable


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind", "retryable"),
    [
        (503, errors.KubeUnavailable, True),
        (500, errors.KubeUnavailable, True),
        (429, errors.KubeUnavailable, True),
        (504, errors.KubeUnavailable, True),
        (404, errors.KubeNotFound, False),
        (409, errors.KubeConflict, False),
        (401, errors.KubeForbidden, False),
        (403, errors.KubeForbidden, False),
        (400, errors.KubeInvalid, False),
        (422, errors.KubeInvalid, False),
        (405, errors.KubeError, False),
    ],
)
def test_answers_map_to_typed_errors(code: int, kind: type[errors.KubeError], retryable: bool) -> None:
    with pytest.raises(errors.KubeError) as caught:
        call(status(code, "the server says why"), lambda api: api.get("/api/v1/nodes/n1"))
    assert type(caught.value) is kind
    assert caught.value.retryable is retryable
    assert caught.value.status == code
    assert str(caught.value) == f"GET /api/v1/nodes/n1: {code} the server says why"
    assert caught.value.answer == f"{code} the server says why"


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("[Errno 111] Connection refused"),
        httpx.ReadTimeout("timed out"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("[Errno 104] Connection reset by peer"),
    ],
)
def test_no_answer_is_unavailable_and_sent_once(failure: httpx.TransportError) -> None:
    """No hidden retry: a dropped connection is reported, not silently sent again."""
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        raise failure

    with pytest.raises(
        errors.KubeUnavailable, match=r"POST https://10.5.0.1:6443/api/v1/namespaces"
    ) as caught:
        call(handler, lambda api: api.create("/api/v1/namespaces", {"metadata": {"name": "x"}}))
    assert caught.value.retryable and caught.value.status == 0
    assert len(sent) == 1


def test_a_refused_client_certificate_is_not_retryable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required")

    with pytest.raises(errors.KubeForbidden, match="TLS failed") as caught:
        call(handler, lambda api: api.get("/version"))
    assert not caught.value.retryable


def test_an_untrusted_server_certificate_is_not_retryable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        try:
            raise ssl.SSLCertVerificationError(1, "certificate verify failed")
        except ssl.SSLError as exc:
            raise httpx.ConnectError(str(exc)) from exc

    with pytest.raises(errors.KubeForbidden, match="certificate verify failed"):
        call(handler, lambda api: api.get("/version"))


def test_raw_get_returns_any_answer() -> None:
    answer = call(lambda r: httpx.Response(500, text="[-]etcd failed"), lambda api: api.raw_get("/readyz"))
    assert answer == (500, "[-]etcd failed")


# -- verbs --------------------------------------------------------------------------------------


def recorder(answer: dict[str, Any] | None = None) -> tuple[list[httpx.Request], Handler]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=answer or {})

    return seen, handler


@pytest.mark.parametrize(
    ("patch_type", "content_type"),
    [
        ("merge", "application/merge-patch+json"),
        ("strategic", "application/strategic-merge-patch+json"),
        ("json", "application/json-patch+json"),
    ],
)
def test_patch_content_types(patch_type: kube.PatchType, content_type: str) -> None:
    seen, handler = recorder()
    body = [{"op": "add", "path": "/x", "value": 1}] if patch_type == "json" else {"spec": {"x": 1}}
    call(handler, lambda api: api.patch("/api/v1/nodes/n1", body, patch_type=patch_type))
    assert seen[0].method == "PATCH"
    assert seen[0].headers["Content-Type"] == content_type
    assert json.loads(seen[0].content) == body


def test_server_side_apply_params() -> None:
    seen, handler = recorder()
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m", "namespace": "default"}}
    path = "/api/v1/namespaces/default/configmaps/m"
    call(handler, lambda api: api.apply(path, obj, field_manager="kubeplane", force=True, dry_run=True))
    call(handler, lambda api: api.apply(path, obj, field_manager="kubeplane-upgrade"))
    assert [r.headers["Content-Type"] for r in seen] == ["application/apply-patch+yaml"] * 2
    assert dict(seen[0].url.params) == {"fieldManager": "kubeplane", "force": "true", "dryRun": "All"}
    assert dict(seen[1].url.params) == {"fieldManager": "kubeplane-upgrade"}
    assert json.loads(seen[0].content) == obj


def test_list_with_selectors_and_delete_with_preconditions() -> None:
    seen, handler = recorder({"items": [{"metadata": {"name": "p"}}]})

    async def use(api: kube.KubeClient) -> list[dict[str, Any]]:
        await api.delete("/x/leases/l", resource_version="42")
        await api.delete("/api/v1/namespaces/kube-system/pods/p", grace_period_seconds=0)
        return await api.list("/api/v1/pods", label_selector="k8s-app=a", field_selector="spec.nodeName=n")

    assert call(handler, use) == [{"metadata": {"name": "p"}}]
    first, second, listing = seen
    assert json.loads(first.content)["preconditions"] == {"resourceVersion": "42"}
    assert json.loads(second.content)["gracePeriodSeconds"] == 0
    assert dict(listing.url.params) == {"labelSelector": "k8s-app=a", "fieldSelector": "spec.nodeName=n"}


def test_get_or_none() -> None:
    assert call(status(404, "not found"), lambda api: api.get_or_none("/api/v1/nodes/x")) is None


# -- discovery ----------------------------------------------------------------------------------


def test_discovery_is_cached_and_refreshed_once_on_a_miss() -> None:
    served: list[dict[str, Any]] = [{"kind": "Pod", "name": "pods", "namespaced": True}]
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/apis/example.test/v1":
            return httpx.Response(404, json={"message": "not found"})
        return httpx.Response(200, json={"resources": [*served, {"kind": "Pod", "name": "pods/status"}]})

    async def use(api: kube.KubeClient) -> list[str]:
        pods = await api.resource("v1", "Pod")
        again = await api.resource("v1", "Pod")
        assert pods == again == kube.ApiResource(base="/api/v1", plural="pods", namespaced=True)
        served.append({"kind": "Widget", "name": "widgets", "namespaced": False})  # a CRD meanwhile
        widgets = await api.resource("v1", "Widget")
        with pytest.raises(errors.KubeNotFound, match="does not serve kind Gadget in v1"):
            await api.resource("v1", "Gadget")
        with pytest.raises(errors.KubeNotFound, match=r"does not serve kind Unknown in example\.test/v1"):
            await api.resource("example.test/v1", "Unknown")
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
        return [widgets.path(namespace="x", name="w"), await api.object_path(obj)]

    assert call(handler, use) == ["/api/v1/widgets/w", "/api/v1/namespaces/default/pods/p"]
    # Pod: once; Widget: a miss, refreshed; Gadget: refreshed once more, then reported.
    assert asked.count("/api/v1") == 3


# -- waits --------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def wait(what: str, timeout: float, clock: FakeClock) -> retry.Wait:
    return retry.Wait(
        what=what, timeout=timeout, backoff=retry.fixed(1), retry_on=kube.RETRYABLE, clock=clock
    )


def test_waits_retry_unavailable_answers() -> None:
    clock = FakeClock()
    answers = [httpx.Response(503, json={"message": "etcd not ready"}), httpx.Response(200, json={"ok": 1})]

    def attempt() -> Any:
        return call(lambda request: answers.pop(0), lambda api: api.get("/readyz"))

    assert wait("the API server", 10, clock).poll(attempt, sleep=clock.sleep) == {"ok": 1}
    assert clock.now == 1


def test_waits_raise_non_retryable_errors_at_once() -> None:
    clock = FakeClock()
    with pytest.raises(errors.KubeForbidden):
        wait("x", 10, clock).poll(lambda: call(status(403, "forbidden"), lambda api: api.get("/x")))
    assert clock.now == 0


def test_wait_timeout_names_what_and_last_error() -> None:
    clock = FakeClock()
    with pytest.raises(
        retry.WaitTimeout, match=r"after 3s waiting for node n1 to be Ready \(last error: .*503"
    ):
        wait("node n1 to be Ready", 3, clock).poll(
            lambda: call(status(503, "unavailable"), lambda api: api.get("/api/v1/nodes/n1")),
            sleep=clock.sleep,
        )


def test_is_ready() -> None:
    assert kube.is_ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert not kube.is_ready({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert not kube.is_ready({})


# -- list_with_version and watch -----------------------------------------------------------------


def stream(*chunks: bytes, error: Exception | None = None) -> httpx.AsyncByteStream:
    """A streamed body sent chunk by chunk (lines may be split across chunks), then ``error``."""

    class Chunks(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            for chunk in chunks:
                yield chunk
            if error is not None:
                raise error

    return Chunks()


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def svc(name: str, version: str) -> dict[str, Any]:
    return {"kind": "Service", "metadata": {"name": name, "resourceVersion": version}}


def watch_all(handler: Handler, **options: Any) -> list[tuple[str, dict[str, Any]]]:
    async def use(api: kube.KubeClient) -> list[tuple[str, dict[str, Any]]]:
        return [item async for item in api.watch("/api/v1/services", "7", **options)]

    return call(handler, use)  # type: ignore[no-any-return]


def test_list_with_version_returns_items_and_the_lists_resource_version() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["labelSelector"] == "a=b"
        return httpx.Response(200, json={"metadata": {"resourceVersion": "42"}, "items": [svc("x", "40")]})

    items, version = call(
        handler, lambda api: api.list_with_version("/api/v1/services", label_selector="a=b")
    )
    assert version == "42"
    assert [item["metadata"]["name"] for item in items] == ["x"]


def test_watch_streams_events_line_by_line_from_the_version_with_bookmarks() -> None:
    seen: list[httpx.Request] = []
    body = event("ADDED", svc("a", "8")) + event("MODIFIED", svc("a", "9"))
    deleted = event("DELETED", svc("a", "10"))
    bookmark = event("BOOKMARK", {"kind": "Service", "metadata": {"resourceVersion": "11"}})

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        # A line split over two chunks and an empty keep-alive line are read as whole events.
        return httpx.Response(200, stream=stream(body, deleted[:10], deleted[10:], b"\n", bookmark))

    events = watch_all(handler, timeout_seconds=30)
    assert [(kind, obj["metadata"]["resourceVersion"]) for kind, obj in events] == [
        ("ADDED", "8"),
        ("MODIFIED", "9"),
        ("DELETED", "10"),
        ("BOOKMARK", "11"),
    ]
    params = seen[0].url.params
    assert (params["watch"], params["resourceVersion"], params["timeoutSeconds"]) == ("1", "7", "30")
    assert params["allowWatchBookmarks"] == "true"
    # The stream may stay quiet for timeoutSeconds: the read timeout is longer than that.
    assert seen[0].extensions["timeout"]["read"] > 30


def test_watch_without_bookmarks_does_not_ask_for_them() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, stream=stream())

    assert watch_all(handler, bookmarks=False) == []
    assert "allowWatchBookmarks" not in seen[0].url.params


def test_watch_answered_410_raises_kube_gone() -> None:
    with pytest.raises(errors.KubeGone) as caught:
        watch_all(status(410, "too old resource version: 7 (50)"))
    assert caught.value.status == 410
    assert "too old resource version" in str(caught.value)


def test_watch_error_event_with_code_410_raises_kube_gone_after_earlier_events() -> None:
    gone = {"kind": "Status", "status": "Failure", "code": 410, "message": "too old resource version"}
    got: list[str] = []

    async def use(api: kube.KubeClient) -> None:
        async for kind, _ in api.watch("/api/v1/services", "7"):
            got.append(kind)

    body = stream(event("ADDED", svc("a", "8")), event("ERROR", gone))
    with pytest.raises(errors.KubeGone):
        call(lambda request: httpx.Response(200, stream=body), use)
    assert got == ["ADDED"]


def test_watch_error_event_with_another_code_raises_its_typed_error() -> None:
    forbidden = {"kind": "Status", "code": 403, "message": "no"}
    with pytest.raises(errors.KubeForbidden):
        watch_all(lambda request: httpx.Response(200, stream=stream(event("ERROR", forbidden))))


def test_watch_broken_line_raises_kube_unavailable() -> None:
    body = stream(event("ADDED", svc("a", "8")), b'{"type": "MODIFIED", "obj\n')
    with pytest.raises(errors.KubeUnavailable, match="watch stream broken"):
        watch_all(lambda request: httpx.Response(200, stream=body))


def test_watch_dropped_stream_raises_kube_unavailable_and_a_clean_end_ends_the_iterator() -> None:
    dropped = stream(event("ADDED", svc("a", "8")), error=httpx.RemoteProtocolError("peer closed"))
    with pytest.raises(errors.KubeUnavailable, match="peer closed") as caught:
        watch_all(lambda request: httpx.Response(200, stream=dropped))
    assert caught.value.retryable
    ended = stream(event("ADDED", svc("a", "8")))
    assert len(watch_all(lambda request: httpx.Response(200, stream=ended))) == 1


def test_watch_that_cannot_connect_raises_kube_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(errors.KubeUnavailable):
        watch_all(handler)
