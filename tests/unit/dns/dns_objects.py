"""Service and EndpointSlice objects shaped as the Kubernetes API returns them, and DNS queries."""

from __future__ import annotations

from typing import Any

import dns.message
import dns.rdatatype

from kubeplane.dns import corefile

ZONE = "cluster.local."

#: What kubeplane renders for CoreDNS, without a ttl (so the CoreDNS default of 5 s applies).
COREFILE = """\
.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    prometheus :9153
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
}
"""
CONFIG = corefile.parse(COREFILE)

Port = tuple[str | None, int, str]


def _ports(ports: list[Port]) -> list[dict[str, Any]]:
    return [
        {"name": n, "port": p, "protocol": proto} if n else {"port": p, "protocol": proto}
        for n, p, proto in ports
    ]


def service(
    name: str,
    namespace: str = "default",
    *,
    cluster_ip: str = "10.96.0.50",
    cluster_ips: list[str] | None = None,
    ports: list[Port] | None = None,
    publish_not_ready: bool = False,
) -> dict[str, Any]:
    """A ClusterIP Service (``cluster_ip="None"``: headless), named port ``http`` 80/TCP by default."""
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "clusterIP": cluster_ip,
        "ports": _ports(ports if ports is not None else [("http", 80, "TCP")]),
    }
    if cluster_ips is not None:
        spec["clusterIPs"] = cluster_ips
    if publish_not_ready:
        spec["publishNotReadyAddresses"] = True
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def external_name(name: str, target: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"type": "ExternalName", "externalName": target},
    }


def endpoint(
    address: str | list[str], *, ready: bool | None = True, hostname: str | None = None
) -> dict[str, Any]:
    """One endpoint; ``ready=None`` leaves the condition out (it then counts as ready)."""
    item: dict[str, Any] = {"addresses": address if isinstance(address, list) else [address]}
    if ready is not None:
        item["conditions"] = {"ready": ready}
    if hostname is not None:
        item["hostname"] = hostname
    return item


def endpoint_slice(
    service_name: str,
    endpoints: list[dict[str, Any]],
    namespace: str = "default",
    *,
    suffix: str = "abcde",
    address_type: str = "IPv4",
    ports: list[Port] | None = None,
    api_version: str = "discovery.k8s.io/v1beta1",
) -> dict[str, Any]:
    """An EndpointSlice of ``service_name``; v1 moves topology to nodeName/zone, the rest is alike."""
    for item in endpoints:
        if api_version.endswith("v1beta1"):
            item.setdefault("topology", {"kubernetes.io/hostname": "worker-1"})
        else:
            item.setdefault("nodeName", "worker-1")
    return {
        "apiVersion": api_version,
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service_name}-{suffix}",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": _ports(ports if ports is not None else [("http", 8080, "TCP")]),
    }


def query(name: str, rdtype: str = "A", **kwargs: Any) -> dns.message.Message:
    return dns.message.make_query(name, dns.rdatatype.from_text(rdtype), **kwargs)
