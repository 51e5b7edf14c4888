"""The DNS add-on as a process: ``python3 -m kubeplane.dns`` on loopback high ports, fed by a fake
API server (list + chunked watch of Services and EndpointSlices, discovery as Kubernetes 1.20
serves it: ``v1beta1`` only) and forwarding to a fake upstream resolver (dnspython)."""

from __future__ import annotations

import base64
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import dns.rrset
import fake_kube_api
import httpx
import pytest
import yaml
from fake_kube_api import SERVICES, SLICES, ZONE, FakeCluster, endpoint_slice, service

import kubeplane
from kubeplane import pki

if TYPE_CHECKING:
    from conftest import Processes, Started

pytestmark = pytest.mark.integration


class FakeUpstream:
    """A resolver answering ``*.upstream.test`` A 192.0.2.7 (TTL 60), NXDOMAIN for the rest."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.queries = 0
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped:
            try:
                data, addr = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            query = dns.message.from_wire(data)
            self.queries += 1
            response = dns.message.make_response(query)
            name = query.question[0].name
            if name.to_text().endswith(".upstream.test."):
                response.answer.append(dns.rrset.from_text(name, 60, "IN", "A", "192.0.2.7"))
            else:
                response.set_rcode(dns.rcode.NXDOMAIN)
            self.sock.sendto(response.to_wire(), addr)

    def stop(self) -> None:
        self.stopped = True
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def cluster() -> Iterator[tuple[FakeCluster, int]]:
    with fake_kube_api.serve("127.0.0.1") as served:
        yield served


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    resolver = FakeUpstream()
    try:
        yield resolver
    finally:
        resolver.stop()


class DNSServer:
    def __init__(self, started: Started, dns_port: int, ready_port: int, health_port: int) -> None:
        self.started = started
        self.port = dns_port
        self.ready_port = ready_port
        self.health_port = health_port

    def ask(self, name: str, rdtype: str = "A", *, tcp: bool = False) -> dns.message.Message:
        query = dns.message.make_query(name, dns.rdatatype.from_text(rdtype))
        send = dns.query.tcp if tcp else dns.query.udp
        return send(query, "127.0.0.1", timeout=2, port=self.port)

    def addresses(self, name: str) -> list[str]:
        reply = self.ask(name)
        return sorted(rdata.to_text() for rrset in reply.answer for rdata in rrset)

    def http(self, port: int, path: str) -> int:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code


@pytest.fixture
def start_dns(
    tmp_path: Path,
    processes: Processes,
    *,
    free_port: Callable[[], int],
    wait_until: Callable[..., Any],
    cluster: tuple[FakeCluster, int],
    upstream: FakeUpstream,
) -> Callable[[], DNSServer]:
    def start() -> DNSServer:
        dns_port, health_port, ready_port = free_port(), free_port(), free_port()
        corefile = tmp_path / "Corefile"
        corefile.write_text(
            f""".:{dns_port} {{
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes {ZONE} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    forward . 127.0.0.1:{upstream.port}
    cache 30
    loop
    loadbalance
}}
"""
        )
        ca = pki.new_ca("fake")
        kubeconfig = tmp_path / "kubeconfig"
        cluster_entry = {
            "server": f"http://127.0.0.1:{cluster[1]}",
            "certificate-authority-data": base64.b64encode(ca.cert).decode(),
        }
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "clusters": [{"name": "c", "cluster": cluster_entry}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        source = Path(kubeplane.__file__).parent.parent
        started = processes.start(
            [
                *(sys.executable, "-m", "kubeplane.dns", "-conf", corefile),
                *("--kubeconfig", kubeconfig, "--address", "127.0.0.1"),
            ],
            name="dns",
            env={"PYTHONPATH": str(source)},
        )
        server = DNSServer(started, dns_port, ready_port, health_port)
        wait_until(
            lambda: server.http(health_port, "/health") == 200,
            timeout=10,
            what="the DNS server's /health",
            logs=processes.logs,
        )
        return server

    return start


def answered_within(deadline: float, check: Callable[[], bool]) -> float:
    """Seconds until ``check()`` held (polling every 10 ms); fails past ``deadline`` seconds."""
    started = time.monotonic()
    while not check():
        elapsed = time.monotonic() - started
        assert elapsed < deadline, f"not answered within {deadline}s"
        time.sleep(0.01)
    return time.monotonic() - started


def test_ready_only_after_both_lists(
    start_dns: Callable[[], DNSServer], cluster: tuple[FakeCluster, int], wait_until: Callable[..., Any]
) -> None:
    state, _ = cluster
    state.slices_listable.clear()
    server = start_dns()
    wait_until(lambda: state.lists[SERVICES] >= 1, timeout=5, what="the Service list")
    time.sleep(0.3)
    assert server.http(server.ready_port, "/ready") == 503
    assert server.http(server.health_port, "/health") == 200
    state.slices_listable.set()
    wait_until(lambda: server.http(server.ready_port, "/ready") == 200, timeout=5, what="/ready 200")
    assert server.http(server.ready_port, "/nothing") == 404


def test_answers_follow_the_watch_forward_upstream_and_relist_after_410(
    start_dns: Callable[[], DNSServer],
    cluster: tuple[FakeCluster, int],
    upstream: FakeUpstream,
    wait_until: Callable[..., Any],
) -> None:
    state, _ = cluster
    state.put(SERVICES, service("web", "10.96.0.50"))
    state.put(SERVICES, service("db", "None"))
    state.put(SLICES, endpoint_slice("db", "10.244.1.5", "db-0"))
    server = start_dns()
    wait_until(lambda: server.http(server.ready_port, "/ready") == 200, timeout=5, what="/ready 200")

    # The records of the listed objects.
    assert server.addresses(f"web.default.svc.{ZONE}") == ["10.96.0.50"]
    assert server.addresses(f"db.default.svc.{ZONE}") == ["10.244.1.5"]
    assert server.addresses(f"db-0.db.default.svc.{ZONE}") == ["10.244.1.5"]
    srv = server.ask(f"_http._tcp.web.default.svc.{ZONE}", "SRV")
    assert [r.to_text() for rrset in srv.answer for r in rrset] == [f"0 100 80 web.default.svc.{ZONE}."]
    ptr = server.ask("50.0.96.10.in-addr.arpa", "PTR")
    assert [r.to_text() for rrset in ptr.answer for r in rrset] == [f"web.default.svc.{ZONE}."]
    missing = server.ask(f"nope.default.svc.{ZONE}")
    assert missing.rcode() == dns.rcode.NXDOMAIN
    # Over TCP too.
    tcp = server.ask(f"web.default.svc.{ZONE}", tcp=True)
    assert [r.to_text() for rrset in tcp.answer for r in rrset] == ["10.96.0.50"]

    # Outside names go upstream; `cache 30` keeps the answer (the upstream is asked once).
    assert server.addresses("www.upstream.test") == ["192.0.2.7"]
    assert server.addresses("www.upstream.test") == ["192.0.2.7"]
    assert upstream.queries == 1
    assert server.ask("other.example").rcode() == dns.rcode.NXDOMAIN
    assert server.ask("www.upstream.test", tcp=True).answer

    # Watch events are answered within a second: created, modified, deleted.
    name = f"api.default.svc.{ZONE}"
    state.put(SERVICES, service("api", "10.96.0.60"))
    created = answered_within(1.0, lambda: server.addresses(name) == ["10.96.0.60"])
    state.put(SERVICES, service("api", "10.96.0.61"))
    modified = answered_within(1.0, lambda: server.addresses(name) == ["10.96.0.61"])
    state.put(SERVICES, service("api", "10.96.0.61"), kind="DELETED")
    deleted = answered_within(1.0, lambda: server.ask(name).rcode() == dns.rcode.NXDOMAIN)
    print(f"watch event -> answer: created {created:.3f}s, modified {modified:.3f}s, deleted {deleted:.3f}s")

    # A 410 on the watch: the server lists again and picks up what it never saw as an event.
    lists_before = state.lists[SERVICES]
    state.put(SERVICES, service("quiet", "10.96.0.70"), silent=True)
    state.compact()
    wait_until(lambda: state.lists[SERVICES] > lists_before, timeout=5, what="a relist after 410")
    answered_within(2.0, lambda: server.addresses(f"quiet.default.svc.{ZONE}") == ["10.96.0.70"])
    # And the watch from the new list's version delivers events again.
    state.put(SERVICES, service("later", "10.96.0.80"))
    answered_within(1.0, lambda: server.addresses(f"later.default.svc.{ZONE}") == ["10.96.0.80"])
    assert server.started.process.poll() is None, server.started.tail()
