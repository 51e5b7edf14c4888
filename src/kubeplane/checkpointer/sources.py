"""Where the checkpointer's observations come from: the API server and the kubelet.

Standard library only (urllib + ssl): the image has no third-party HTTP client. Credentials come
either from a kubeconfig file (server, CA, bearer token or client certificate, inline data or
file paths) or from the in-cluster service account files Kubernetes mounts into the pod, with the
server given by flag or by ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT``.

Errors are split by what the caller may conclude: :class:`~kubeplane.checkpointer.SourceUnavailable`
(no answer, 5xx, 429: conclude nothing, keep checkpoints) and
:class:`~kubeplane.checkpointer.SourceRejected` (4xx: a real answer that is not the data).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kubeplane.checkpointer import ConfigError, SourceRejected, SourceUnavailable

__all__ = ["SERVICE_ACCOUNT_DIR", "ApiServer", "fetch_kubelet_pods"]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_RETRYABLE = frozenset({429, 500, 502, 503, 504})


def _get_json(opener: urllib.request.OpenerDirector, request: urllib.request.Request, timeout: float) -> Any:
    try:
        with opener.open(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = f"{request.full_url}: HTTP {exc.code} {exc.reason}"
        if exc.code in _RETRYABLE:
            raise SourceUnavailable(detail) from exc
        raise SourceRejected(detail) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SourceUnavailable(f"{request.full_url}: {exc}") from exc


def _http_url(url: str, *, what: str) -> str:
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ConfigError(f"{what} {url!r} is not an http(s) URL")
    return url


def fetch_kubelet_pods(url: str, *, timeout: float = 5.0) -> tuple[dict[str, Any], ...]:
    """Pods from the kubelet's read-only ``/pods`` endpoint (a PodList)."""
    opener = urllib.request.build_opener()
    request = urllib.request.Request(_http_url(url, what="kubelet URL"))  # noqa: S310 - scheme checked
    data = _get_json(opener, request, timeout)
    try:
        return tuple(data.get("items") or ())
    except AttributeError as exc:
        raise SourceUnavailable(f"{url} did not answer with a PodList") from exc


class ApiServer:
    """A minimal read-only API server client: list pods on a node, get Secrets and ConfigMaps."""

    def __init__(
        self,
        server: str,
        *,
        context: ssl.SSLContext,
        token: str | None = None,
        token_file: Path | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.server = _http_url(server, what="API server").rstrip("/")
        self.token = token
        # Re-read on every request: the kubelet rotates projected tokens in place.
        self.token_file = token_file
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))

    @classmethod
    def in_cluster(cls, *, server: str | None = None, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> ApiServer:
        """Credentials from the mounted service account; server from `server` or the environment."""
        if server is None:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
            if not host or not port:
                raise ConfigError(
                    "no API server given: pass --server or --kubeconfig, or run in a pod where "
                    "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are set"
                )
            server = f"https://{f'[{host}]' if ':' in host else host}:{port}"
        token_file, ca_file = sa_dir / "token", sa_dir / "ca.crt"
        if not token_file.is_file() or not ca_file.is_file():
            raise ConfigError(
                f"no service account credentials in {sa_dir} (token, ca.crt); "
                "mount the service account token or pass --kubeconfig"
            )
        return cls(server, context=ssl.create_default_context(cafile=str(ca_file)), token_file=token_file)

    @classmethod
    def from_kubeconfig(cls, path: Path) -> ApiServer:
        """Server and credentials of the current context of the kubeconfig at `path`."""
        try:
            config = yaml.safe_load(path.read_text())
            contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
            context = (
                contexts[config["current-context"]]
                if config.get("current-context")
                else next(iter(contexts.values()))
            )
            cluster = {c["name"]: c["cluster"] for c in config["clusters"]}[context["cluster"]]
            user = {u["name"]: u["user"] for u in config.get("users") or []}.get(
                context.get("user"), {}
            ) or {}
            server = str(cluster["server"])
        except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, StopIteration) as exc:
            raise ConfigError(
                f"kubeconfig {path} is unreadable or lacks a current context with cluster and user: {exc!r}"
            ) from exc
        base = path.parent
        ca_pem = _inline_or_file(cluster, "certificate-authority", base)
        ssl_context = ssl.create_default_context(cadata=ca_pem.decode() if ca_pem else None)
        if ca_pem is None:
            ssl_context.load_default_certs()
        cert, key = (
            _inline_or_file(user, "client-certificate", base),
            _inline_or_file(user, "client-key", base),
        )
        if cert and key:
            _load_client_cert(ssl_context, cert, key)
        token = user.get("token")
        token_file = Path(base, user["tokenFile"]) if user.get("tokenFile") else None
        return cls(server, context=ssl_context, token=token, token_file=token_file)

    def _request(self, path: str) -> Any:
        # The scheme was checked in __init__.
        request = urllib.request.Request(self.server + path, headers={"Accept": "application/json"})  # noqa: S310
        token = self.token
        if self.token_file is not None:
            try:
                token = self.token_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read the service account token {self.token_file}: {exc}") from exc
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        return _get_json(self._opener, request, self.timeout)

    def pods_on_node(self, node: str) -> tuple[dict[str, Any], ...]:
        """Every pod bound to `node`, in all namespaces."""
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}"})
        data = self._request(f"/api/v1/pods?{query}")
        return tuple(data.get("items") or ())

    def _get_or_none(self, path: str) -> dict[str, Any] | None:
        """The object at `path`; None when the API server answers 404."""
        try:
            obj: dict[str, Any] = self._request(path)
        except SourceRejected as exc:
            if "HTTP 404" in str(exc):
                return None
            raise
        return obj

    def daemonset_exists(self, namespace: str, name: str) -> bool:
        """Whether DaemonSet `namespace`/`name` exists (a 404 is the answer "no")."""
        quoted = f"{urllib.parse.quote(namespace)}/daemonsets/{urllib.parse.quote(name)}"
        return self._get_or_none(f"/apis/apps/v1/namespaces/{quoted}") is not None

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A Secret or ConfigMap; None when it does not exist."""
        plural = {"Secret": "secrets", "ConfigMap": "configmaps"}[kind]
        obj = self._get_or_none(
            f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/{plural}/{urllib.parse.quote(name)}"
        )
        if obj is not None:
            obj.setdefault("kind", kind)
        return obj


def _inline_or_file(section: Mapping[str, Any], field: str, base: Path) -> bytes | None:
    if section.get(f"{field}-data"):
        return base64.b64decode(section[f"{field}-data"])
    if section.get(field):
        return Path(base, section[field]).read_bytes()
    return None


def _load_client_cert(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl only loads certificates from files: write them to a private directory, load, delete.
    with tempfile.TemporaryDirectory(prefix="checkpointer-") as scratch:
        cert_path, key_path = Path(scratch, "client.crt"), Path(scratch, "client.key")
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        context.load_cert_chain(str(cert_path), str(key_path))
