"""The agent's Prometheus metrics: every name, in one place, and the calls that record them.

The metrics live in the process-wide registry of :mod:`prometheus_client` (which also carries its
``process_*`` metrics: CPU, resident memory, open files) and are recorded where things happen:
the controller runtime counts and times reconciles, the service supervisor reports each
service's state and restarts, the node API server counts calls by method and status code, and
the etcd member reports what its health check sees. ``kubeplaned --metrics-listen`` serves them
(:func:`serve`); docs/metrics.md documents each name, and a unit test keeps the two in step.

Labels are bounded: controller and service names and API method names come from the code, never
from a request, and status codes are gRPC's fixed set; so a caller cannot grow the registry.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.exposition import ThreadingWSGIServer

#: Reconcile durations: most are milliseconds; an apply or a bootstrap step can take seconds.
_SECONDS = (0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0)

CONTROLLER_RECONCILES = Counter(
    "kubeplane_controller_reconciles",
    "Reconciles a controller finished, by result (ok or error).",
    ["controller", "result"],
)
CONTROLLER_RECONCILE_SECONDS = Histogram(
    "kubeplane_controller_reconcile_duration_seconds",
    "How long one reconcile of a controller took, errors included.",
    ["controller"],
    buckets=_SECONDS,
)
SERVICE_STATE = Gauge(
    "kubeplane_service_state",
    "1 for the state a supervised service is in, 0 for the states it is not in.",
    ["service", "state"],
)
SERVICE_RESTARTS = Counter(
    "kubeplane_service_restarts",
    "Times the supervisor restarted a service after its process ended.",
    ["service"],
)
API_REQUESTS = Counter(
    "kubeplane_api_requests",
    "Node API calls handled by this node, by method and gRPC status code.",
    ["method", "code"],
)
API_REQUEST_SECONDS = Histogram(
    "kubeplane_api_request_duration_seconds",
    "How long the node API took to answer a unary call (streams are not timed).",
    ["method"],
    buckets=_SECONDS,
)
ETCD_MEMBER = Gauge(
    "kubeplane_etcd_member",
    "This node's etcd member as its last health check saw it: 1 on the role it has (voter or "
    "learner), 0 on the other.",
    ["role"],
)
ETCD_HEALTH_CHECKS = Counter(
    "kubeplane_etcd_health_checks",
    "Health checks of this node's etcd member (a status call and a quorum read), by result.",
    ["result"],
)


def observe_reconcile(controller: str, seconds: float, *, ok: bool) -> None:
    """Count one finished reconcile of ``controller`` and its duration."""
    CONTROLLER_RECONCILES.labels(controller=controller, result="ok" if ok else "error").inc()
    CONTROLLER_RECONCILE_SECONDS.labels(controller=controller).observe(seconds)


def set_service_state(service: str, state: str, states: Iterable[str]) -> None:
    """Mark ``service`` as being in ``state`` (one of ``states``, all of which get a series)."""
    for each in states:
        SERVICE_STATE.labels(service=service, state=each).set(1 if each == state else 0)


def observe_api_call(method: str, code: str, seconds: float | None) -> None:
    """Count one node API call of ``method`` that ended with ``code`` (``OK`` or a gRPC code name)."""
    API_REQUESTS.labels(method=method, code=code).inc()
    if seconds is not None:
        API_REQUEST_SECONDS.labels(method=method).observe(seconds)


def set_etcd_member(*, learner: bool) -> None:
    """Record the role this node's etcd member has (learner or voter)."""
    ETCD_MEMBER.labels(role="learner").set(1 if learner else 0)
    ETCD_MEMBER.labels(role="voter").set(0 if learner else 1)


def names() -> set[str]:
    """The names of the samples this module defines (what a scrape shows), for docs and tests."""
    found: set[str] = set()
    for metric in (
        CONTROLLER_RECONCILES,
        CONTROLLER_RECONCILE_SECONDS,
        SERVICE_STATE,
        SERVICE_RESTARTS,
        API_REQUESTS,
        API_REQUEST_SECONDS,
        ETCD_MEMBER,
        ETCD_HEALTH_CHECKS,
    ):
        for family in metric.describe():
            found.add(family.name + ("_total" if family.type == "counter" else ""))
    return found


class MetricsServer:
    """The HTTP server of ``/metrics`` (:mod:`prometheus_client`'s, in its own thread)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The port it listens on (useful when asked for port 0)."""
        return int(self._server.server_port)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Server(ThreadingWSGIServer):
    """:mod:`prometheus_client`'s threaded WSGI server, without naming itself by reverse DNS.

    :meth:`http.server.HTTPServer.server_bind` sets the server name to ``socket.getfqdn(address)``,
    a reverse lookup of the listen address. In a local node's network namespace the host's
    resolver does not answer, so that lookup waited out its timeouts (10 s) before every agent
    could serve anything, its node API included. The name only fills in WSGI's ``SERVER_NAME``:
    the address does as well.
    """

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape on stderr (the agent's log)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(host: str, port: int) -> MetricsServer:
    """Serve the registry as Prometheus text on ``http://host:port/metrics`` until stopped."""

    class Server(_Server):
        # The socket's family is a class attribute, read before binding: IPv6 for an IPv6 host.
        address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    server: WSGIServer = make_server(
        host, port, prometheus_client.make_wsgi_app(), Server, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)
