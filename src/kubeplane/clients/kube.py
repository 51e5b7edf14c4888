"""The one Kubernetes API client of kubeplane: asyncio over :mod:`httpx`, from kubeconfig text.

The agent, the ops layer and the CLI all talk to the API server through :class:`KubeClient`.
Rejected alternatives: the official ``kubernetes`` package is blocking (every call a thread),
its urllib3 pool retries by default (a request may be sent again behind the caller's back), it
added about 0.2 s to every CLI start, and its ``DynamicClient`` caches discovery in a file under
the system temp directory keyed by server URL, which goes stale across clusters that reuse an
address (every local test cluster is ``127.0.0.1:6443``). ``kubernetes_asyncio`` is the same
generated API and model classes over aiohttp, a second HTTP stack next to httpx. What kubeplane
needs is a handful of verbs on JSON objects, discovery for manifests of arbitrary kinds, and one
error policy; that is this module.

- **Kubeconfig text only**, never ``~/.kube`` or ``$KUBECONFIG``, so a process managing several
  clusters cannot pick up the wrong one by accident. The context is ``context``, else the
  kubeconfig's ``current-context``, else its first one; the cluster CA must be embedded; the user is a client
  certificate or a bearer token. A missing piece is a :class:`~kubeplane.clients.errors.KubeconfigError`
  naming the field.
- **Typed errors** (:mod:`kubeplane.clients.errors`): 404 ``KubeNotFound``, 409 ``KubeConflict``,
  401/403 ``KubeForbidden``, 400/422 ``KubeInvalid``; no answer, a timeout, a dropped connection,
  429 and 5xx are ``KubeUnavailable`` (retryable). A TLS failure (the server's certificate not
  trusted, or a client certificate refused) is ``KubeForbidden``: asking again fails the same way.
  Messages carry the verb, the path and the server's ``Status.message``.
- **No hidden retry**: each call sends its request once. Retrying is the caller's decision, made
  by type in one place: a :class:`kubeplane.retry.Wait` with ``retry_on=RETRYABLE``.
- **Watch**: :meth:`KubeClient.list_with_version` then :meth:`KubeClient.watch` from the list's
  ``resourceVersion`` (a reflector). The watch is one streamed GET read line by line; it yields
  ``(type, object)`` for ``ADDED``/``MODIFIED``/``DELETED``/``BOOKMARK``. A 410 answer or an
  ``ERROR`` event with code 410 raises ``KubeGone``: the version is compacted away, list again.
  When the server ends the stream (its ``timeoutSeconds`` passed) the iterator ends: watch again
  from the last version seen. A stream that breaks (reset, early EOF, a line cut mid-object, no
  byte for longer than ``timeoutSeconds`` plus the request timeout) raises ``KubeUnavailable``:
  back off, then watch again from the last version seen. Nothing is resumed behind the caller's back.
- **Discovery** (kind → resource path) is cached per client and per group/version; a kind not
  found is looked up once more (a CRD created a moment ago), then reported.

One client per event loop and operation, closed with ``async with``; ``transport=`` takes an
``httpx.MockTransport`` in unit tests.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import ssl
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import yaml

from kubeplane.clients import errors
from kubeplane.clients import etcd as etcd_client

if TYPE_CHECKING:
    import httpx

#: Seconds one request may take unless the client is made with another ``timeout``.
REQUEST_TIMEOUT = 10.0

#: What a wait over Kubernetes API calls retries (with :class:`kubeplane.retry.Wait`).
RETRYABLE: tuple[type[BaseException], ...] = (errors.KubeUnavailable, errors.EtcdUnavailable)

#: The Nodes collection.
NODES_PATH = "/api/v1/nodes"
#: The group of every kubelet's client certificate (``O=`` of ``CN=system:node:<name>``).
NODES_GROUP = "system:nodes"
#: The annotation of a mirror pod: the config hash of the kubelet's static pod it stands for.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def node_path(name: str) -> str:
    """The path of the Node ``name``."""
    return f"{NODES_PATH}/{name}"


#: Patch flavours and their content types. ``strategic`` merges lists by key (containers by
#: name), ``merge`` (RFC 7386) replaces lists whole, ``json`` is an RFC 6902 list of operations.
PatchType = Literal["merge", "strategic", "json"]
_PATCH_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}
_APPLY_PATCH = "application/apply-patch+yaml"

_BY_STATUS: dict[int, type[errors.KubeError]] = {
    400: errors.KubeInvalid,
    401: errors.KubeForbidden,
    403: errors.KubeForbidden,
    404: errors.KubeNotFound,
    409: errors.KubeConflict,
    410: errors.KubeGone,
    422: errors.KubeInvalid,
    429: errors.KubeUnavailable,
}


@dataclasses.dataclass(frozen=True)
class ApiResource:
    """Where objects of one kind live: ``/api/v1`` or ``/apis/<group>/<version>`` plus the plural."""

    base: str
    plural: str
    namespaced: bool

    def path(self, *, namespace: str | None, name: str | None = None) -> str:
        """The collection path (``name`` None) or the object path."""
        parts = [self.base]
        if self.namespaced and namespace:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name:
            parts.append(name)
        return "/".join(parts)


def is_ready(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` (a Node or a Pod) has the condition ``Ready`` with status ``True``."""
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def error_for(verb: str, path: str, response: httpx.Response) -> errors.KubeError:
    """The typed error of a failed answer, with the server's ``Status.message`` (or the body's start)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        reason = str(body["message"])
    else:
        reason = response.text[:200].strip() or response.reason_phrase
    return status_error(verb, path, response.status_code, reason)


def status_error(verb: str, path: str, status: int, reason: str) -> errors.KubeError:
    """The typed error of HTTP ``status`` (of an answer, or of a watch ``ERROR`` event's Status)."""
    kind = _BY_STATUS.get(status) or (errors.KubeUnavailable if status >= 500 else errors.KubeError)
    return kind(f"{verb} {path}: {status} {reason}", status=status, verb=verb, path=path, reason=reason)


class KubeClient:
    """An authenticated connection to one API server (use as ``async with``)."""

    def __init__(
        self,
        kubeconfig: str | bytes,
        *,
        context: str | None = None,
        timeout: float = REQUEST_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        config = _Kubeconfig.parse(kubeconfig, context=context)
        self.server = config.server
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.server,
            verify=config.tls,
            headers=config.headers,
            timeout=timeout,
            transport=transport,
            # Only the kubeconfig says where and how to connect: no proxy variables, no .netrc.
            trust_env=False,
        )
        self._discovery: dict[str, dict[str, ApiResource]] = {}

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- requests -----------------------------------------------------------------------------

    async def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """Send ``request`` once; a transport failure raises its typed error, an answer returns.

        With ``stream`` the body is not read yet (the caller reads and closes the response).
        """
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        verb, path = request.method, request.url.path
        try:
            return await self._http.send(request, stream=stream)
        except ssl.SSLError as exc:
            # httpx passes a TLS alert after the handshake (a client certificate refused under
            # TLS 1.3) through unwrapped.
            raise _tls_error(verb, path, exc) from exc
        except httpx.TransportError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ssl.SSLError) and not isinstance(cause, ssl.SSLEOFError):
                raise _tls_error(verb, path, exc) from exc
            raise self._unavailable(verb, path, exc) from exc

    def _unavailable(self, verb: str, path: str, exc: BaseException) -> errors.KubeUnavailable:
        reason = str(exc) or type(exc).__name__
        message = f"{verb} {self.server}{path}: {reason}"
        return errors.KubeUnavailable(message, verb=verb, path=path, reason=reason)

    async def request(
        self,
        verb: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one request; the answer's JSON object, or the typed error of a failure."""
        content = None if body is None else body if isinstance(body, str) else json.dumps(body)
        response = await self._send(
            self._http.build_request(
                verb,
                path,
                content=content,
                headers={"Content-Type": content_type} if content is not None else None,
                params=dict(params) if params else None,
            )
        )
        if not response.is_success:
            raise error_for(verb, path, response)
        if not response.content:
            return {}
        try:
            document = response.json()
        except ValueError as exc:
            status = response.status_code
            raise errors.KubeError(
                f"{verb} {path}: {status} answer is not JSON: {exc}", status=status, verb=verb, path=path
            ) from exc
        return document if isinstance(document, dict) else {"items": document}

    async def raw_get(self, path: str) -> tuple[int, str]:
        """GET ``path`` as text, whatever the status (``/readyz``, ``/version``); only no answer raises."""
        response = await self._send(self._http.build_request("GET", path))
        return response.status_code, response.text

    async def get(self, path: str) -> dict[str, Any]:
        return await self.request("GET", path)

    async def get_or_none(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when there is none (404)."""
        try:
            return await self.get(path)
        except errors.KubeNotFound:
            return None

    async def list_with_version(
        self, path: str, *, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        """The items of the collection at ``path`` and the list's ``resourceVersion`` to watch from."""
        params = {"labelSelector": label_selector, "fieldSelector": field_selector}
        document = await self.request("GET", path, params={k: v for k, v in params.items() if v})
        version = str((document.get("metadata") or {}).get("resourceVersion") or "")
        return list(document.get("items") or []), version

    async def list(
        self, path: str, *, label_selector: str = "", field_selector: str = ""
    ) -> list[dict[str, Any]]:
        """The items of the collection at ``path``, filtered by the selectors."""
        params = {"labelSelector": label_selector, "fieldSelector": field_selector}
        document = await self.request("GET", path, params={k: v for k, v in params.items() if v})
        return list(document.get("items") or [])

    async def watch(
        self,
        path: str,
        resource_version: str,
        *,
        timeout_seconds: int = 300,
        bookmarks: bool = True,
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """``(type, object)`` of each change of the collection at ``path`` after ``resource_version``.

        Types are ``ADDED``, ``MODIFIED``, ``DELETED`` and, with ``bookmarks``, ``BOOKMARK`` (an
        object carrying only the current ``metadata.resourceVersion``: remember it, so a later
        watch resumes from there rather than from a version that may be compacted away). The
        server ends the stream after ``timeout_seconds``: the iterator then ends. ``KubeGone``
        (410, either as the answer or as an ``ERROR`` event) means list again; ``KubeUnavailable``
        means the stream broke: watch again from the last version seen. Another ``ERROR`` event
        raises the typed error of its code. Use it under ``contextlib.aclosing`` when leaving
        the loop early, so the connection is closed at once.
        """
        verb = "WATCH"
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        if bookmarks:
            params["allowWatchBookmarks"] = "true"
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        # The stream may be quiet for the whole timeoutSeconds: read for that long, plus slack.
        timeout = httpx.Timeout(self._timeout, read=timeout_seconds + self._timeout)
        request = self._http.build_request("GET", path, params=params, timeout=timeout)
        response = await self._send(request, stream=True)
        try:
            if not response.is_success:
                await response.aread()
                raise error_for(verb, path, response)
            async for line in response.aiter_lines():
                if line.strip():
                    yield _watch_event(verb, path, line)
        except httpx.TransportError as exc:
            raise self._unavailable(verb, path, exc) from exc
        finally:
            await response.aclose()

    async def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``obj`` to the collection at ``path``; ``KubeConflict`` when it exists."""
        return await self.request("POST", path, body=obj)

    async def replace(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT ``obj`` at ``path``; with ``metadata.resourceVersion`` set, ``KubeConflict`` if it changed."""
        return await self.request("PUT", path, body=obj)

    async def patch(self, path: str, patch: Any, *, patch_type: PatchType) -> dict[str, Any]:
        """PATCH ``path`` with ``patch`` of ``patch_type`` (named by every caller: they differ on lists)."""
        return await self.request("PATCH", path, body=patch, content_type=_PATCH_TYPES[patch_type])

    async def apply(
        self,
        path: str,
        obj: Mapping[str, Any],
        *,
        field_manager: str,
        force: bool = False,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Server-side apply ``obj`` at its object ``path`` as ``field_manager`` (created when missing)."""
        params = {"fieldManager": field_manager}
        if force:
            params["force"] = "true"
        if dry_run:
            params["dryRun"] = "All"
        # JSON is YAML: the apply patch content type accepts it.
        return await self.request("PATCH", path, body=obj, content_type=_APPLY_PATCH, params=params)

    async def delete(
        self,
        path: str,
        *,
        resource_version: str | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
    ) -> dict[str, Any]:
        """DELETE ``path``; with ``resource_version`` only that version (else ``KubeConflict``);
        ``propagation_policy`` ``Orphan`` leaves the dependents (a DaemonSet's pods) in place."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        if resource_version is not None:
            options["preconditions"] = {"resourceVersion": resource_version}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        return await self.request("DELETE", path, body=options)

    # -- discovery ----------------------------------------------------------------------------

    async def resource(self, api_version: str, kind: str) -> ApiResource:
        """Discover where ``kind`` of ``api_version`` lives (refreshing the cache once on a miss)."""
        for refresh in (False, True):
            if refresh or api_version not in self._discovery:
                self._discovery[api_version] = await self._discover(api_version)
            found = self._discovery[api_version].get(kind)
            if found is not None:
                return found
        path = _group_version_path(api_version)
        raise errors.KubeNotFound(
            f"the API server does not serve kind {kind} in {api_version}; check apiVersion and kind "
            "(a custom resource needs its CustomResourceDefinition first)",
            status=404,
            verb="GET",
            path=path,
        )

    async def object_path(self, obj: Mapping[str, Any]) -> str:
        """The path of ``obj`` (by its apiVersion, kind, namespace and name), found by discovery."""
        metadata = obj.get("metadata") or {}
        resource = await self.resource(str(obj["apiVersion"]), str(obj["kind"]))
        return resource.path(namespace=metadata.get("namespace") or "default", name=metadata["name"])

    async def _discover(self, api_version: str) -> dict[str, ApiResource]:
        base = _group_version_path(api_version)
        document = await self.get_or_none(base)
        found = {}
        for item in (document or {}).get("resources") or ():
            if "/" in item.get("name", ""):
                continue  # subresources such as pods/status
            found[item["kind"]] = ApiResource(
                base=base, plural=item["name"], namespaced=bool(item["namespaced"])
            )
        return found


def _watch_event(verb: str, path: str, line: str) -> tuple[str, dict[str, Any]]:
    """One line of a watch stream as ``(type, object)``; an ``ERROR`` event raises its typed error."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict) or "type" not in event:
        # A line cut short: the connection broke mid-event.
        reason = f"watch stream broken: not an event: {line[:100]!r}"
        raise errors.KubeUnavailable(f"{verb} {path}: {reason}", verb=verb, path=path, reason=reason)
    kind, obj = str(event["type"]), event["object"]
    if kind == "ERROR":
        code = obj.get("code")
        raise status_error(verb, path, code if isinstance(code, int) else 500, str(obj.get("message") or ""))
    return kind, obj


def _group_version_path(api_version: str) -> str:
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def _tls_error(verb: str, path: str, exc: BaseException) -> errors.KubeForbidden:
    reason = str(exc) or type(exc).__name__
    return errors.KubeForbidden(
        f"{verb} {path}: TLS failed (server certificate not trusted, or client certificate "
        f"refused): {reason}",
        verb=verb,
        path=path,
    )


#: Kubeconfig fields that name a file, and the field that holds the same content inline.
_FILE_FIELDS = (
    ("clusters", "cluster", "certificate-authority", "certificate-authority-data"),
    ("users", "user", "client-certificate", "client-certificate-data"),
    ("users", "user", "client-key", "client-key-data"),
)


def kubeconfig_server(text: str | bytes) -> str:
    """The server of a kubeconfig's first cluster (empty when it has none)."""
    document = yaml.safe_load(text) or {}
    clusters = document.get("clusters") or () if isinstance(document, dict) else ()
    return str((clusters[0].get("cluster") or {}).get("server") or "") if clusters else ""


def with_server(text: str | bytes, server: str) -> str:
    """A kubeconfig with every cluster's server replaced by ``server``, the rest unchanged."""
    document = yaml.safe_load(text) or {}
    for entry in document.get("clusters") or ():
        entry.setdefault("cluster", {})["server"] = server
    return str(yaml.safe_dump(document, sort_keys=False))


def kubeconfig_ca(text: str | bytes) -> bytes | None:
    """The CA certificate (PEM) a kubeconfig trusts for its first cluster; None if it names none."""
    document = yaml.safe_load(text) or {}
    clusters = document.get("clusters") or () if isinstance(document, dict) else ()
    data = (clusters[0].get("cluster") or {}).get("certificate-authority-data") if clusters else None
    try:
        return base64.b64decode(data) if isinstance(data, str) else None
    except ValueError:
        return None


def inline_files(text: str | bytes) -> str:
    """``text`` with every file a kubeconfig refers to (a CA, a client certificate or key, as the
    kubelet writes them) read in as the matching ``-data`` field, so :class:`KubeClient` can use
    it. Blocking (reads files); an unreadable file raises :class:`~kubeplane.clients.errors.KubeconfigError`.
    Files are re-read on every call: the kubelet rotates its client certificate in place.
    """
    text = text.decode() if isinstance(text, bytes) else text
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.KubeconfigError(f"the kubeconfig is not YAML: {exc}") from exc
    if not isinstance(document, dict):
        raise errors.KubeconfigError("the kubeconfig is not a mapping")
    for section, field, path_key, data_key in _FILE_FIELDS:
        for item in document.get(section) or ():
            entry = item.get(field) if isinstance(item, dict) else None
            if not isinstance(entry, dict) or not entry.get(path_key) or entry.get(data_key):
                continue
            try:
                content = Path(str(entry.pop(path_key))).read_bytes()
            except OSError as exc:
                raise errors.KubeconfigError(f"the kubeconfig's {path_key} cannot be read: {exc}") from exc
            entry[data_key] = base64.b64encode(content).decode()
    return str(yaml.safe_dump(document))


@dataclasses.dataclass(frozen=True)
class _Kubeconfig:
    """What a client needs from a kubeconfig: server URL, TLS context, auth headers."""

    server: str
    tls: ssl.SSLContext
    headers: dict[str, str]

    @classmethod
    def parse(cls, text: str | bytes, *, context: str | None) -> _Kubeconfig:
        text = text.decode() if isinstance(text, bytes) else text
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise errors.KubeconfigError(f"the kubeconfig is not YAML: {exc}") from exc
        if not isinstance(document, dict) or not document.get("clusters"):
            raise errors.KubeconfigError(
                "the kubeconfig has no clusters; pass the text of a kubeconfig file, not a path"
            )
        contexts = document.get("contexts") or [{}]
        name = context or document.get("current-context") or str(contexts[0].get("name") or "")
        chosen = _named(document, "contexts", name, "context")
        cluster = _named(document, "clusters", str(chosen.get("cluster", "")), "cluster")
        user = _named(document, "users", str(chosen.get("user", "")), "user")
        server = str(cluster.get("server") or "").rstrip("/")
        if not server:
            raise errors.KubeconfigError(f"the kubeconfig's cluster {chosen.get('cluster')!r} has no server")
        ca = _b64_field(cluster, "certificate-authority-data")
        if ca is None:
            raise errors.KubeconfigError(
                "the kubeconfig has no certificate-authority-data; it must embed the cluster CA"
            )
        cert, key = _b64_field(user, "client-certificate-data"), _b64_field(user, "client-key-data")
        token = user.get("token")
        if cert and key:
            # A generic mutual-TLS context builder; it only lives in the etcd client module.
            tls = etcd_client.tls_context(ca=ca, cert=cert, key=key)
        elif token:
            tls = ssl.create_default_context(cadata=ca.decode())
        else:
            raise errors.KubeconfigError(
                f"the kubeconfig's user {chosen.get('user')!r} has neither client-certificate-data "
                "with client-key-data nor a token"
            )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return cls(server=server, tls=tls, headers=headers)


def _b64_field(section: Mapping[str, Any], key: str) -> bytes | None:
    value = section.get(key)
    return base64.b64decode(value) if isinstance(value, str) and value else None


def _named(document: Mapping[str, Any], section: str, name: str, field: str) -> dict[str, Any]:
    for item in document.get(section) or ():
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(field), dict):
            return dict(item[field])
    raise errors.KubeconfigError(f"the kubeconfig has no {field} named {name!r} in {section}")
