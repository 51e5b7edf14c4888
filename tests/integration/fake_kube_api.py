"""A fake Kubernetes API server for the DNS add-on's tests: Services and EndpointSlices.

Lists, chunked watches with resourceVersions and a compactable event log (410 Gone), and
discovery as Kubernetes 1.20 serves it (``discovery.k8s.io/v1beta1`` only): what
``kubeplane.dns`` reads. :func:`serve` runs it on a thread (stdlib ``http.server``) and stops it,
open watches included, when the block ends. Used by test_dns_server.py (the add-on from the
source tree) and test_toolchain_artifacts.py (the add-on from its image).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVICES = "/api/v1/services"
SLICES = "/apis/discovery.k8s.io/v1beta1/endpointslices"
ZONE = "cluster.local"


def service(name: str, cluster_ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": cluster_ip, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    }


def endpoint_slice(service_name: str, address: str, hostname: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1beta1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service_name}-x1",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}, "hostname": hostname}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


class FakeCluster:
    """Objects, a resourceVersion counter and the event log the watches stream from."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.version = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {SERVICES: {}, SLICES: {}}
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []
        #: Watches from a version at or below this get 410 (the rest of the log is compacted).
        self.compacted = 0
        self.lists: dict[str, int] = {SERVICES: 0, SLICES: 0}
        #: Set to answer the EndpointSlice list (cleared: the list waits).
        self.slices_listable = threading.Event()
        self.slices_listable.set()
        self.closing = False

    def put(self, path: str, obj: dict[str, Any], *, kind: str = "", silent: bool = False) -> None:
        """Create or replace (``kind`` DELETED: delete) ``obj``; ``silent``: no watch event."""
        with self.changed:
            self.version += 1
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["resourceVersion"] = str(self.version)
            name = obj["metadata"]["name"]
            existed = name in self.objects[path]
            if kind == "DELETED":
                self.objects[path].pop(name, None)
            else:
                self.objects[path][name] = obj
            if not silent:
                self.events.append((self.version, path, kind or ("MODIFIED" if existed else "ADDED"), obj))
            self.changed.notify_all()

    def compact(self) -> None:
        """Drop the event log: open watches end with a 410 ERROR event, new ones from old versions too."""
        with self.changed:
            self.compacted = self.version
            self.events.clear()
            self.changed.notify_all()

    def listing(self, path: str) -> dict[str, Any]:
        if path == SLICES:
            self.slices_listable.wait()
        with self.changed:
            self.lists[path] += 1
            items = list(self.objects[path].values())
            return {"metadata": {"resourceVersion": str(self.version)}, "items": items}


class FakeAPI(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cluster: FakeCluster

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/apis/discovery.k8s.io/v1beta1":
            resource = {"name": "endpointslices", "kind": "EndpointSlice", "namespaced": True}
            self._json(200, {"kind": "APIResourceList", "resources": [resource]})
        elif url.path in (SERVICES, SLICES) and query.get("watch"):
            self._watch(url.path, int(query["resourceVersion"]), float(query.get("timeoutSeconds", "60")))
        elif url.path in (SERVICES, SLICES):
            self._json(200, self.cluster.listing(url.path))
        else:
            self._json(404, {"kind": "Status", "code": 404, "message": "not found"})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, path: str, since: int, timeout: float) -> None:
        cluster = self.cluster
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + timeout
        with cluster.changed:
            while not cluster.closing and time.monotonic() < deadline:
                if since <= cluster.compacted:
                    gone = {"kind": "Status", "code": 410, "message": f"too old resource version: {since}"}
                    self._chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                    break
                for version, where, kind, obj in cluster.events:
                    if version > since and where == path:
                        self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                if cluster.events:
                    since = max(since, cluster.events[-1][0])
                cluster.changed.wait(0.5)
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True


@contextlib.contextmanager
def serve(host: str = "127.0.0.1") -> Iterator[tuple[FakeCluster, int]]:
    """A fake API server on ``host`` (a free port): its state and the port; stopped at the end."""
    state = FakeCluster()
    handler = type("Handler", (FakeAPI,), {"cluster": state})
    server = ThreadingHTTPServer((host, 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, int(server.server_address[1])
    finally:
        with state.changed:
            state.closing = True
            state.changed.notify_all()
        state.slices_listable.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
