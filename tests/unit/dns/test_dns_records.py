"""The record table: built from API objects, updated per Service without touching the others."""

from __future__ import annotations

import ipaddress

import dns.name
import dns.rdatatype
import dns.reversename
import pytest
from dns_objects import endpoint, endpoint_slice, external_name, service

from kubeplane.dns.records import Table, pod_address, service_records

pytestmark = pytest.mark.unit

A, AAAA, SRV = dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.SRV


def rel(text: str) -> dns.name.Name:
    return dns.name.from_text(text, origin=None)


def addresses(table: Table, name: str, rdtype: dns.rdatatype.RdataType = A) -> list[str]:
    found = table.lookup(rel(name)) or {}
    return [rdata.address for rdata in found.get(rdtype, ())]


def test_v1beta1_and_v1_slices_of_one_service_merge_without_duplicates() -> None:
    table = Table.from_objects(
        [service("hl", cluster_ip="None")],
        [
            endpoint_slice("hl", [endpoint("10.244.1.5"), endpoint("10.244.2.7")], suffix="a"),
            # A Pod moving between slices shows up in both for a moment: one record.
            endpoint_slice(
                "hl",
                [endpoint("10.244.2.7"), endpoint("10.244.3.3")],
                suffix="b",
                api_version="discovery.k8s.io/v1",
            ),
            endpoint_slice("other", [endpoint("10.244.9.9")]),  # another Service's slice
            endpoint_slice(
                "hl", [endpoint("10.244.8.8")], namespace="elsewhere"
            ),  # same name, other namespace
        ],
    )
    assert addresses(table, "hl.default.svc") == ["10.244.1.5", "10.244.2.7", "10.244.3.3"]
    assert table.services == {("default", "hl")}


def test_not_ready_endpoints_are_left_out_unless_the_service_publishes_them() -> None:
    slices = [endpoint_slice("hl", [endpoint("10.244.1.5", ready=False), endpoint("10.244.1.6", ready=None)])]
    table = Table.from_objects([service("hl", cluster_ip="None")], slices)
    assert addresses(table, "hl.default.svc") == ["10.244.1.6"]
    assert table.lookup(rel("10-244-1-5.hl.default.svc")) is None
    assert table.pointers(dns.reversename.from_address("10.244.1.5")) == ()
    published = Table.from_objects([service("hl", cluster_ip="None", publish_not_ready=True)], slices)
    assert addresses(published, "hl.default.svc") == ["10.244.1.5", "10.244.1.6"]


def test_fqdn_slices_bad_addresses_and_bad_hostnames_are_skipped() -> None:
    table = Table.from_objects(
        [service("hl", cluster_ip="None")],
        [
            endpoint_slice("hl", [endpoint("db.example.org")], address_type="FQDN", suffix="f"),
            endpoint_slice(
                "hl",
                [endpoint("not-an-ip"), endpoint("10.244.1.5", hostname="x" * 64), endpoint("10.244.1.6")],
                suffix="g",
            ),
        ],
    )
    assert addresses(table, "hl.default.svc") == ["10.244.1.6"]


def test_a_service_without_a_usable_address_has_no_names() -> None:
    assert not service_records(service("bad", cluster_ip="banana")).names
    assert not service_records(
        {"metadata": {"name": "no-namespace"}, "spec": {"clusterIP": "10.96.0.1"}}
    ).names
    assert not service_records(external_name("ext", "")).names
    # A headless Service's own slices are needed: the Service alone has no records.
    assert not service_records(service("hl", cluster_ip="None")).names


def test_srv_names_exist_for_named_ports_only() -> None:
    records = service_records(
        service("echo", ports=[("http", 80, "TCP"), (None, 81, "TCP"), ("q", 9, "SCTP")])
    )
    assert sorted(str(name) for name in records.names) == [
        "_http._tcp.echo.default.svc",
        "_q._sctp.echo.default.svc",
        "echo.default.svc",
    ]
    [srv] = records.names[rel("_http._tcp.echo.default.svc")][SRV]
    assert (srv.port, str(srv.target)) == (80, "echo.default.svc")  # relative: any zone completes it


def test_updates_copy_on_write_and_share_other_services() -> None:
    first = Table.from_objects([service("a"), service("b", cluster_ip="10.96.0.51")], [])
    second = first.with_service(("default", "a"), service("a", cluster_ip="10.96.0.99"))
    assert addresses(first, "a.default.svc") == ["10.96.0.50"], "a snapshot never changes"
    assert addresses(second, "a.default.svc") == ["10.96.0.99"]
    assert second.lookup(rel("b.default.svc")) is first.lookup(rel("b.default.svc"))
    assert second.generation == first.generation + 1
    assert first.pointers(dns.reversename.from_address("10.96.0.50")) == (rel("a.default.svc"),)
    assert second.pointers(dns.reversename.from_address("10.96.0.50")) == ()
    third = second.without_service(("default", "a"))
    assert third.lookup(rel("a.default.svc")) is None and third.services == {("default", "b")}
    assert third.without_service(("default", "a")) is third


def test_empty_non_terminals_come_and_go_with_the_names_below_them() -> None:
    table = Table.from_objects([service("a"), service("b", namespace="prod", cluster_ip="10.96.0.51")], [])
    for name in (
        "svc",
        "default.svc",
        "prod.svc",
        "a.default.svc",
        "_tcp.a.default.svc",
        "_http._tcp.a.default.svc",
    ):
        assert table.exists(rel(name)), name
    assert not table.exists(rel("c.default.svc")) and not table.exists(rel("pod"))
    table = table.without_service(("prod", "b"))
    assert not table.exists(rel("prod.svc")) and table.exists(rel("svc"))
    table = table.without_service(("default", "a"))
    assert not table.exists(rel("svc"))


def test_reverse_index_keeps_every_service_of_a_shared_address() -> None:
    slices = [
        endpoint_slice("one", [endpoint("10.244.1.5", hostname="p")]),
        endpoint_slice("two", [endpoint("10.244.1.5")]),
    ]
    table = Table.from_objects([service("one", cluster_ip="None"), service("two", cluster_ip="None")], slices)
    reverse = dns.reversename.from_address("10.244.1.5")
    assert sorted(map(str, table.pointers(reverse))) == ["10-244-1-5.two.default.svc", "p.one.default.svc"]
    table = table.without_service(("default", "one"))
    assert table.pointers(reverse) == (rel("10-244-1-5.two.default.svc"),)


def test_external_name_is_one_cname() -> None:
    records = service_records(external_name("db", "db.example.org"))
    [cname] = records.names[rel("db.default.svc")][dns.rdatatype.CNAME]
    assert str(cname.target) == "db.example.org." and not records.pointers


def test_ipv6_headless_endpoints() -> None:
    table = Table.from_objects(
        [service("hl", cluster_ip="None")],
        [endpoint_slice("hl", [endpoint("fd00:244::5", hostname="web-0")], address_type="IPv6")],
    )
    assert addresses(table, "hl.default.svc", AAAA) == ["fd00:244::5"]
    assert addresses(table, "web-0.hl.default.svc", AAAA) == ["fd00:244::5"]
    assert table.pointers(dns.reversename.from_address("fd00:244::5")) == (rel("web-0.hl.default.svc"),)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("10-244-1-5.default.pod", ("default", "10.244.1.5")),
        ("10-244-1-5.DEFAULT.POD", ("default", "10.244.1.5")),
        ("fd00--1.kube-system.pod", ("kube-system", "fd00::1")),
        ("10-244-1.default.pod", None),
        ("300-1-1-1.default.pod", None),
        ("10-244-1-5.default.svc", None),
        ("10-244-1-5.pod", None),
        ("x.10-244-1-5.default.pod", None),
    ],
)
def test_pod_names(name: str, expected: tuple[str, str] | None) -> None:
    parsed = pod_address(rel(name))
    assert parsed == (expected and (expected[0], ipaddress.ip_address(expected[1])))
