"""A small asyncio REST client for the Kubernetes API: kubeconfig text, discovery, raw requests.

ManifestApplyController creates objects of arbitrary kinds, so it needs discovery (kind →
resource path, namespaced or not) and plain GET/POST/PATCH — nothing typed. Doing that over
:mod:`httpx` keeps it on the agent's event loop. Rejected alternatives: the official client's
``DynamicClient`` is blocking (a thread per apply) and caches discovery in a file under the
system temp directory keyed by server URL, which goes stale across clusters that reuse an address
(every local test cluster is ``127.0.0.1:6443``); ``ApiClient.call_api`` leaves authentication and
serialisation to the caller anyway.

Discovery is cached per client and per group/version; a kind not found is looked up once more
(a CRD created a moment ago), then reported.
"""

from __future__ import annotations

import base64
import dataclasses
import ssl
from types import TracebackType
from typing import Any

import httpx
import yaml

from kubeplane.clients import etcd as etcd_client
from kubeplane.controllers import ControllerError


class KubeApiError(ControllerError):
    """A request to the Kubernetes API failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


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


def _b64_field(section: dict[str, Any], key: str) -> bytes | None:
    value = section.get(key)
    return base64.b64decode(value) if isinstance(value, str) and value else None


def _tls_from_kubeconfig(cluster: dict[str, Any], user: dict[str, Any]) -> ssl.SSLContext:
    ca = _b64_field(cluster, "certificate-authority-data")
    if ca is None:
        raise KubeApiError("the kubeconfig has no certificate-authority-data; it must embed the cluster CA")
    cert, key = _b64_field(user, "client-certificate-data"), _b64_field(user, "client-key-data")
    if cert and key:
        # A generic mutual-TLS context builder; it only lives in the etcd client module.
        return etcd_client.tls_context(ca=ca, cert=cert, key=key)
    return ssl.create_default_context(cadata=ca.decode())


def _named(document: dict[str, Any], section: str, name: str, field: str) -> dict[str, Any]:
    for item in document.get(section) or ():
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(field), dict):
            return dict(item[field])
    raise KubeApiError(f"the kubeconfig has no {field} named {name!r} in {section}")


def error_message(response: httpx.Response) -> str:
    """The API server's ``Status.message`` of a failed response, or its body's start."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        return f"{response.status_code} {body['message']}"
    return f"{response.status_code} {response.text[:200].strip()}"


class KubeRest:
    """An authenticated connection to one API server (use as ``async with``)."""

    def __init__(self, kubeconfig: str, *, timeout: float = 10.0) -> None:
        document = yaml.safe_load(kubeconfig)
        if not isinstance(document, dict):
            raise KubeApiError("the kubeconfig is not a YAML mapping")
        context_name = document.get("current-context") or ""
        contexts = document.get("contexts") or []
        if not context_name and contexts:
            context_name = contexts[0].get("name", "")
        context = _named(document, "contexts", context_name, "context")
        cluster = _named(document, "clusters", context.get("cluster", ""), "cluster")
        user = _named(document, "users", context.get("user", ""), "user")
        headers = {"Authorization": f"Bearer {user['token']}"} if user.get("token") else {}
        self.server = str(cluster.get("server", "")).rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.server,
            verify=_tls_from_kubeconfig(cluster, user),
            headers=headers,
            timeout=timeout,
        )
        self._discovery: dict[str, dict[str, ApiResource]] = {}

    async def __aenter__(self) -> KubeRest:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request; only a transport failure raises (as ``KubeApiError`` with status 0)."""
        try:
            return await self._http.request(
                method,
                path,
                json=body if body is not None and content_type == "application/json" else None,
                content=None if body is None or content_type == "application/json" else body,
                headers={"Content-Type": content_type} if body is not None else None,
                params=params,
            )
        except (httpx.TransportError, ssl.SSLError) as exc:
            # ssl.SSLError: httpx passes a TLS alert after the handshake (a refused client
            # certificate under TLS 1.3) through unwrapped.
            raise KubeApiError(f"{method} {self.server}{path}: {exc or type(exc).__name__}") from exc

    async def resource(self, api_version: str, kind: str) -> ApiResource:
        """Discover where ``kind`` of ``api_version`` lives (refreshing the cache once on a miss)."""
        for refresh in (False, True):
            if refresh or api_version not in self._discovery:
                self._discovery[api_version] = await self._discover(api_version)
            found = self._discovery[api_version].get(kind)
            if found is not None:
                return found
        raise KubeApiError(
            f"the API server does not serve kind {kind} in {api_version}; check apiVersion and kind "
            "(a custom resource needs its CustomResourceDefinition first)",
            status=404,
        )

    async def _discover(self, api_version: str) -> dict[str, ApiResource]:
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        response = await self.request("GET", base)
        if response.status_code == httpx.codes.NOT_FOUND:
            return {}
        if response.status_code != httpx.codes.OK:
            raise KubeApiError(
                f"discovery of {api_version}: {error_message(response)}", status=response.status_code
            )
        found = {}
        for item in response.json().get("resources") or ():
            if "/" in item.get("name", ""):
                continue  # subresources such as pods/status
            found[item["kind"]] = ApiResource(
                base=base, plural=item["name"], namespaced=bool(item["namespaced"])
            )
        return found
