"""Helpers of the k8s controller tests: publishing inputs, waits, a local HTTP server.

Inputs produced by controllers outside the one under test (SecretStatuses, BootstrapStatuses,
RootSecrets) are published directly into the state with no owner: that is test state, not a mock.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import ssl
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from kubeplane import pki
from kubeplane.resources import Resource, Spec, State, catalog
from kubeplane.runtime import Controller, Runtime

NODE_ADDRESS = "10.5.0.2"


@functools.cache
def cluster_admin() -> tuple[pki.CertKey, str]:
    """A cluster CA and a ``system:masters`` kubeconfig it signed, for ``https://127.0.0.1:6443``
    (made once per test run: the controllers that talk to a fake API server need both)."""
    ca = pki.new_ca("kubernetes")
    admin = pki.issue(ca=ca, common_name="admin", organizations=["system:masters"], usages=("client",))
    kubeconfig = pki.kubeconfig(
        cluster_name="c1", server="https://127.0.0.1:6443", ca_cert=ca.cert, user="admin", client=admin
    )
    return ca, kubeconfig


def put(state: State, namespace: str, type_name: str, resource_id: str, spec: Spec) -> Resource:
    """Create or update a resource as a user (no owner) would."""
    current = state.find(namespace, type_name, resource_id)
    if current is None:
        return state.create(namespace, type_name, resource_id, spec=spec)
    return state.update(namespace, type_name, resource_id, spec=spec, version=current.metadata.version)


def publish_config(state: State, doc: dict[str, Any]) -> Resource:
    return put(
        state,
        catalog.CONFIG_NAMESPACE,
        catalog.MACHINE_CONFIGS,
        catalog.MACHINE_CONFIG_ID,
        catalog.MachineConfigSpec(data=doc),
    )


def publish_addresses(state: State) -> Resource:
    spec = catalog.NodeAddressesSpec(hostname="node1", addresses=[NODE_ADDRESS])
    return put(state, catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID, spec)


def publish_secret_status(state: State, *, ready: bool, version: str = "1") -> Resource:
    return put(
        state,
        catalog.CONTROLPLANE_NAMESPACE,
        catalog.SECRET_STATUSES,
        catalog.STATIC_POD_SECRETS_ID,
        catalog.SecretStatusSpec(ready=ready, version=version),
    )


def publish_bootstrap_status(state: State, *, self_hosted: bool) -> Resource:
    return put(
        state,
        catalog.RUNTIME_NAMESPACE,
        catalog.BOOTSTRAP_STATUSES,
        catalog.BOOTSTRAP_STATUS_ID,
        catalog.BootstrapStatusSpec(self_hosted_control_plane=self_hosted),
    )


async def eventually(predicate: Callable[[], Any], *, timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll ``predicate`` on the event loop until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def run(controllers: list[Controller], body: Callable[[State], Awaitable[None]]) -> None:
    """Run ``body(state)`` while ``controllers`` run on a fresh State + Runtime (fast backoff)."""

    async def main() -> None:
        state = State()
        runtime = Runtime(state, backoff_initial=0.01, backoff_max=0.1)
        for controller in controllers:
            runtime.register(controller)
        async with runtime:
            await body(state)

    asyncio.run(main())


async def settle() -> None:
    """Give the runtime time to run every queued reconcile (used before asserting absence)."""
    await asyncio.sleep(0.3)


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, bytes]] = {}
    seen_headers: list[dict[str, str]] = []

    def do_GET(self) -> None:
        self.seen_headers.append(dict(self.headers))
        status, body = self.routes.get(self.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LocalServer:
    """An HTTP server on 127.0.0.1 serving fixed bodies per path; HTTPS with ``tls`` (an SSL
    server context holding its certificate)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        handler = type("Handler", (_Handler,), {"routes": {}, "seen_headers": []})
        self.handler = handler
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.scheme = "http"
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}{path}"

    def serve(self, path: str, body: bytes, status: int = 200) -> str:
        self.handler.routes[path] = (status, body)
        return self.url(path)

    @property
    def seen_headers(self) -> list[dict[str, str]]:
        return self.handler.seen_headers
