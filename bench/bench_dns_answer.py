"""In-process figures of the cluster DNS core (kubeplane.dns); prints figures, asserts nothing.

A table of 1,000 ClusterIP Services and 100 headless Services with 10 ready endpoints each (two
EndpointSlices per Service) in 20 namespaces, the Corefile kubeplane renders. Measured, single
thread, no sockets:

(a) building that table from the API objects, and replacing one Service (copy-on-write);
(b) answers per second of the slow path (``answer.respond``: parse, answer, render) for a
    ClusterIP A, a headless A (10 addresses), a headless SRV (10 targets + additionals), a PTR and
    an NXDOMAIN search-path expansion;
(c) answers per second of a wire cache hit (``WireCache.reply``) for the same plain queries, and
    for a hit spelled with mixed case (0x20).

The end-to-end server figures (UDP, q/s, p50/p99) are the later server step's benchmark.

Run: .venv/bin/python bench/bench_dns_answer.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import dns.message

from kubeplane.dns import corefile
from kubeplane.dns.answer import respond
from kubeplane.dns.records import Table
from kubeplane.dns.wirecache import WireCache

COREFILE = """\
.:53 {
    errors
    health
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    prometheus :9153
    forward . /etc/resolv.conf
    cache 30
    loadbalance
}
"""
SERVICES, HEADLESS, ENDPOINTS, NAMESPACES = 1000, 100, 10, 20


def objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    services: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    port = [{"name": "http", "port": 80, "protocol": "TCP"}]
    for i in range(SERVICES):
        meta = {"name": f"svc-{i}", "namespace": f"ns-{i % NAMESPACES}"}
        ip = f"10.96.{i // 250}.{i % 250 + 1}"
        services.append({"metadata": meta, "spec": {"type": "ClusterIP", "clusterIP": ip, "ports": port}})
    for i in range(HEADLESS):
        meta = {"name": f"hl-{i}", "namespace": f"ns-{i % NAMESPACES}"}
        services.append({"metadata": meta, "spec": {"clusterIP": "None", "ports": port}})
        for half in range(2):
            endpoints = [
                {"addresses": [f"10.{200 + half}.{i}.{j + 1}"], "conditions": {"ready": True}}
                for j in range(ENDPOINTS // 2)
            ]
            slices.append(
                {
                    "metadata": {
                        "namespace": meta["namespace"],
                        "labels": {"kubernetes.io/service-name": meta["name"]},
                    },
                    "addressType": "IPv4",
                    "endpoints": endpoints,
                    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                }
            )
    return services, slices


def per_second(work: Callable[[], object], seconds: float = 0.5) -> tuple[float, float]:
    """(calls per second, microseconds per call) of ``work`` over about ``seconds``."""
    count, started = 0, time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            work()
        count += 100
    elapsed = time.perf_counter() - started
    return count / elapsed, elapsed / count * 1e6


def main() -> None:
    config = corefile.parse(COREFILE)
    services, slices = objects()
    started = time.perf_counter()
    table = Table.from_objects(services, slices)
    built = time.perf_counter() - started
    print(f"(a) table of {len(services)} Services, {len(slices)} slices: built in {built * 1000:.0f} ms")
    changed = dict(services[0], spec=dict(services[0]["spec"], clusterIP="10.96.9.9"))
    rate, micros = per_second(lambda: table.with_service(("ns-0", "svc-0"), changed), seconds=1.0)
    print(f"    replace one Service: {micros:.0f} µs ({rate:,.0f}/s)")

    queries = {
        "ClusterIP A": ("svc-7.ns-7.svc.cluster.local.", "A"),
        "headless A (10)": ("hl-3.ns-3.svc.cluster.local.", "A"),
        "headless SRV (10)": ("_http._tcp.hl-3.ns-3.svc.cluster.local.", "SRV"),
        "PTR": ("8.0.96.10.in-addr.arpa.", "PTR"),
        "NXDOMAIN expansion": ("www.example.com.ns-1.svc.cluster.local.", "A"),
    }
    print("(b) slow path (respond: parse + answer + render)")
    for label, (name, rdtype) in queries.items():
        data = dns.message.make_query(name, rdtype).to_wire()
        rate, micros = per_second(lambda data=data: respond(table, config, data))
        print(f"    {label:<20} {rate:>10,.0f} answers/s  {micros:7.1f} µs")
    print("(c) wire cache hit (WireCache.reply)")
    cache = WireCache()
    for label, (name, rdtype) in queries.items():
        data = dns.message.make_query(name, rdtype).to_wire()
        cache.reply(table, config, data)
        rate, micros = per_second(lambda data=data: cache.reply(table, config, data))
        print(f"    {label:<20} {rate:>10,.0f} answers/s  {micros:7.1f} µs")
    mixed = dns.message.make_query("SvC-7.Ns-7.sVc.CLUSTER.local.", "A").to_wire()
    rate, micros = per_second(lambda: cache.reply(table, config, mixed))
    print(f"    {'0x20 mixed case':<20} {rate:>10,.0f} answers/s  {micros:7.1f} µs")


if __name__ == "__main__":
    main()
