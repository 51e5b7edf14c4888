"""Answers: every row of the Kubernetes DNS specification's table (design 5.9), and the wire path."""

from __future__ import annotations

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.reversename
import pytest
from dns_objects import CONFIG, COREFILE, endpoint, endpoint_slice, external_name, query, service
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeplane.dns import corefile
from kubeplane.dns.answer import MAX_ROTATIONS, Forward, Reply, answer, respond
from kubeplane.dns.records import Table

pytestmark = pytest.mark.unit

SVC = "echo.default.svc.cluster.local."
HL = "hl.default.svc.cluster.local."


def cluster() -> Table:
    """echo (ClusterIP, named + unnamed port), echo6 (IPv6), hl (headless: 2 ready over 2 slices, 1 not)."""
    return Table.from_objects(
        [
            service("echo", ports=[("http", 80, "TCP"), (None, 81, "TCP"), ("dns", 53, "UDP")]),
            service("echo6", cluster_ip="fd00:10:96::a"),
            service("hl", cluster_ip="None"),
        ],
        [
            endpoint_slice(
                "hl",
                [endpoint("10.244.1.5", hostname="web-0"), endpoint("10.244.2.9", ready=False)],
                suffix="one",
            ),
            endpoint_slice(
                "hl", [endpoint("10.244.2.7", ready=None)], suffix="two", api_version="discovery.k8s.io/v1"
            ),
        ],
    )


def ask(table: Table, name: str, rdtype: str = "A", config: corefile.Config = CONFIG) -> dns.message.Message:
    result = answer(table, config, query(name, rdtype))
    assert isinstance(result, dns.message.Message), f"{name} {rdtype} was not answered here"
    assert result.flags & dns.flags.AA, "answers inside the zones are authoritative"
    return result


def records(section: list[dns.rrset.RRset]) -> set[str]:
    """``"<owner> <ttl> <type> <rdata>"`` per record."""
    return {
        f"{rrset.name} {rrset.ttl} {dns.rdatatype.to_text(rrset.rdtype)} {rd}"
        for rrset in section
        for rd in rrset
    }


def assert_negative(
    response: dns.message.Message, rcode: dns.rcode.Rcode, zone: str = "cluster.local."
) -> None:
    assert response.rcode() == rcode
    assert not response.answer
    [soa] = response.authority
    assert (soa.rdtype, str(soa.name), soa.ttl) == (dns.rdatatype.SOA, zone, 5)


# -- specification table ---------------------------------------------------------------------------


def test_dns_version_txt_is_the_schema_version() -> None:
    assert records(ask(cluster(), "dns-version.cluster.local.", "TXT").answer) == {
        'dns-version.cluster.local. 5 TXT "1.1.0"'
    }


def test_cluster_ip_service_a_and_nodata_for_the_other_family() -> None:
    table = cluster()
    assert records(ask(table, SVC).answer) == {f"{SVC} 5 A 10.96.0.50"}
    assert_negative(ask(table, SVC, "AAAA"), dns.rcode.NOERROR)
    six = "echo6.default.svc.cluster.local."
    assert records(ask(table, six, "AAAA").answer) == {f"{six} 5 AAAA fd00:10:96::a"}
    assert_negative(ask(table, six, "A"), dns.rcode.NOERROR)


def test_dual_stack_cluster_ips_answer_both_families() -> None:
    table = Table.from_objects([service("ds", cluster_ips=["10.96.0.7", "fd00::7"])], [])
    name = "ds.default.svc.cluster.local."
    assert records(ask(table, name).answer) == {f"{name} 5 A 10.96.0.7"}
    assert records(ask(table, name, "AAAA").answer) == {f"{name} 5 AAAA fd00::7"}


def test_srv_for_named_ports_with_the_address_as_additional() -> None:
    table = cluster()
    response = ask(table, f"_http._tcp.{SVC}", "SRV")
    assert records(response.answer) == {f"_http._tcp.{SVC} 5 SRV 0 100 80 {SVC}"}
    assert records(response.additional) == {f"{SVC} 5 A 10.96.0.50"}
    assert records(ask(table, f"_dns._udp.{SVC}", "SRV").answer) == {f"_dns._udp.{SVC} 5 SRV 0 100 53 {SVC}"}
    # The protocol is part of the name; the unnamed port 81 has no SRV record at all.
    assert_negative(ask(table, f"_http._udp.{SVC}", "SRV"), dns.rcode.NXDOMAIN)
    assert_negative(ask(table, f"_81._tcp.{SVC}", "SRV"), dns.rcode.NXDOMAIN)


def test_ptr_of_a_cluster_ip_v4_and_v6_nibbles() -> None:
    table = cluster()
    assert records(ask(table, "50.0.96.10.in-addr.arpa.", "PTR").answer) == {
        f"50.0.96.10.in-addr.arpa. 5 PTR {SVC}"
    }
    six = dns.reversename.from_address("fd00:10:96::a")
    nibbles = six.relativize(dns.name.from_text("ip6.arpa.")).labels
    assert len(nibbles) == 32 and str(six).startswith("a.0.0.0.0.0.0.0")
    assert records(ask(table, str(six), "PTR").answer) == {f"{six} 5 PTR echo6.default.svc.cluster.local."}


def test_headless_answers_every_ready_endpoint_of_every_slice() -> None:
    response = ask(cluster(), HL)
    # 10.244.2.9 is not ready; 10.244.2.7 has no condition (ready); two slices merged.
    assert records(response.answer) == {f"{HL} 5 A 10.244.1.5", f"{HL} 5 A 10.244.2.7"}
    assert_negative(ask(cluster(), HL, "AAAA"), dns.rcode.NOERROR)


def test_headless_without_ready_endpoints_is_nxdomain() -> None:
    table = Table.from_objects(
        [service("hl", cluster_ip="None")], [endpoint_slice("hl", [endpoint("10.244.1.5", ready=False)])]
    )
    assert_negative(ask(table, HL), dns.rcode.NXDOMAIN)
    published = Table.from_objects(
        [service("hl", cluster_ip="None", publish_not_ready=True)],
        [endpoint_slice("hl", [endpoint("10.244.1.5", ready=False)])],
    )
    assert records(ask(published, HL).answer) == {f"{HL} 5 A 10.244.1.5"}


def test_endpoint_hostname_records_and_dashed_addresses() -> None:
    table = cluster()
    assert records(ask(table, f"web-0.{HL}").answer) == {f"web-0.{HL} 5 A 10.244.1.5"}
    assert records(ask(table, f"10-244-2-7.{HL}").answer) == {f"10-244-2-7.{HL} 5 A 10.244.2.7"}
    assert_negative(ask(table, f"10-244-2-9.{HL}"), dns.rcode.NXDOMAIN)  # not ready
    six = Table.from_objects(
        [service("hl", cluster_ip="None")],
        [endpoint_slice("hl", [endpoint("fd00:244::5")], address_type="IPv6")],
    )
    assert records(ask(six, f"fd00-244--5.{HL}", "AAAA").answer) == {f"fd00-244--5.{HL} 5 AAAA fd00:244::5"}


def test_headless_srv_targets_each_ready_endpoint_with_the_endpoint_port() -> None:
    response = ask(cluster(), f"_http._tcp.{HL}", "SRV")
    assert records(response.answer) == {
        f"_http._tcp.{HL} 5 SRV 0 100 8080 web-0.{HL}",
        f"_http._tcp.{HL} 5 SRV 0 100 8080 10-244-2-7.{HL}",
    }
    assert records(response.additional) == {f"web-0.{HL} 5 A 10.244.1.5", f"10-244-2-7.{HL} 5 A 10.244.2.7"}


def test_ptr_of_a_headless_endpoint_is_its_hostname_name() -> None:
    table = cluster()
    assert records(ask(table, "5.1.244.10.in-addr.arpa.", "PTR").answer) == {
        f"5.1.244.10.in-addr.arpa. 5 PTR web-0.{HL}"
    }
    assert records(ask(table, "7.2.244.10.in-addr.arpa.", "PTR").answer) == {
        f"7.2.244.10.in-addr.arpa. 5 PTR 10-244-2-7.{HL}"
    }


def test_external_name_is_a_cname_for_every_type() -> None:
    table = Table.from_objects([external_name("db", "db.example.org")], [])
    name = "db.default.svc.cluster.local."
    for rdtype in ("A", "AAAA", "CNAME", "SRV"):
        assert records(ask(table, name, rdtype).answer) == {f"{name} 5 CNAME db.example.org."}


def test_pod_records_follow_the_pods_mode() -> None:
    table = cluster()
    pod = "10-244-1-5.default.pod.cluster.local."
    assert records(ask(table, pod).answer) == {f"{pod} 5 A 10.244.1.5"}
    assert_negative(ask(table, pod, "AAAA"), dns.rcode.NOERROR)
    pod6 = "fd00-244--5.default.pod.cluster.local."
    assert records(ask(table, pod6, "AAAA").answer) == {f"{pod6} 5 AAAA fd00:244::5"}
    assert_negative(ask(table, "not-an-ip.default.pod.cluster.local."), dns.rcode.NXDOMAIN)
    # Under ``pods insecure`` every <ns>.pod name has names below it: NODATA, not NXDOMAIN.
    assert_negative(ask(table, "default.pod.cluster.local."), dns.rcode.NOERROR)
    disabled = corefile.parse(COREFILE.replace("pods insecure", "pods disabled"))
    assert_negative(ask(table, pod, config=disabled), dns.rcode.NXDOMAIN)
    assert_negative(ask(table, "default.pod.cluster.local.", config=disabled), dns.rcode.NXDOMAIN)


def test_names_are_case_insensitive_and_the_question_keeps_its_case() -> None:
    response = ask(cluster(), "EcHo.DeFaulT.SVC.Cluster.LOCAL.")
    assert records(response.answer) == {"EcHo.DeFaulT.SVC.Cluster.LOCAL. 5 A 10.96.0.50"}
    assert str(response.question[0].name) == "EcHo.DeFaulT.SVC.Cluster.LOCAL."
    assert records(ask(cluster(), "WEB-0.HL.default.svc.cluster.local.").answer) == {
        "WEB-0.HL.default.svc.cluster.local. 5 A 10.244.1.5"
    }


def test_empty_non_terminals_are_nodata_and_absent_names_nxdomain() -> None:
    table = cluster()
    for name in ("svc.cluster.local.", "default.svc.cluster.local.", f"_tcp.{SVC}"):
        assert_negative(ask(table, name), dns.rcode.NOERROR)
    for name in (
        "nope.default.svc.cluster.local.",
        "other.svc.cluster.local.",
        "www.example.com.default.svc.cluster.local.",  # a search-path expansion
        "x.cluster.local.",
    ):
        assert_negative(ask(table, name), dns.rcode.NXDOMAIN)


def test_zone_apex_has_the_soa() -> None:
    response = ask(cluster(), "cluster.local.", "SOA")
    serial = cluster().generation
    assert records(response.answer) == {
        f"cluster.local. 5 SOA ns.dns.cluster.local. hostmaster.cluster.local. {serial} 7200 1800 86400 5"
    }
    assert_negative(ask(cluster(), "cluster.local.", "NS"), dns.rcode.NOERROR)


def test_any_returns_every_record_at_the_name() -> None:
    table = Table.from_objects([service("ds", cluster_ips=["10.96.0.7", "fd00::7"])], [])
    name = "ds.default.svc.cluster.local."
    assert records(ask(table, name, "ANY").answer) == {f"{name} 5 A 10.96.0.7", f"{name} 5 AAAA fd00::7"}


def test_ttl_comes_from_the_corefile() -> None:
    config = corefile.parse(COREFILE.replace("pods insecure", "pods insecure\n        ttl 30"))
    assert records(ask(cluster(), SVC, config=config).answer) == {f"{SVC} 30 A 10.96.0.50"}
    [soa] = ask(cluster(), "nope.cluster.local.", config=config).authority
    assert soa.ttl == 30 and soa[0].minimum == 30


def test_names_too_long_for_dns_under_a_long_zone_are_left_out() -> None:
    zone = ".".join(["z" * 60, "example"])
    config = corefile.parse(COREFILE.replace("kubernetes cluster.local", f"kubernetes {zone}"))
    long_label = "h" * 63
    table = Table.from_objects(
        [service("s" * 60, namespace="n" * 60, cluster_ip="None")],
        [
            endpoint_slice(
                "s" * 60,
                [endpoint("10.244.1.5", hostname=long_label), endpoint("10.244.1.6", hostname="short")],
                namespace="n" * 60,
            )
        ],
    )
    base = f"{'s' * 60}.{'n' * 60}.svc.{zone}."
    srv = ask(table, f"_http._tcp.{base}", "SRV", config=config)
    assert [str(rd.target) for rd in srv.answer[0]] == [f"short.{base}"]
    assert not ask(table, "5.1.244.10.in-addr.arpa.", "PTR", config=config).answer
    assert records(ask(table, "6.1.244.10.in-addr.arpa.", "PTR", config=config).answer) == {
        f"6.1.244.10.in-addr.arpa. 5 PTR short.{base}"
    }


def test_outside_the_zones_and_unknown_ptrs_are_forwarded() -> None:
    table = cluster()
    for name, rdtype in (
        ("www.example.com.", "A"),
        ("cluster.local.example.", "A"),
        ("9.9.9.9.in-addr.arpa.", "PTR"),
    ):
        message = query(name, rdtype)
        result = answer(table, CONFIG, message)
        assert isinstance(result, Forward) and result.query is message
    # Without fallthrough, the reverse zones are the server's alone: NXDOMAIN.
    strict = corefile.parse(COREFILE.replace("        fallthrough in-addr.arpa ip6.arpa\n", ""))
    assert_negative(
        ask(table, "9.9.9.9.in-addr.arpa.", "PTR", config=strict), dns.rcode.NXDOMAIN, "in-addr.arpa."
    )
    # A known reverse name asked for another type: NODATA.
    assert_negative(ask(table, "50.0.96.10.in-addr.arpa.", "A"), dns.rcode.NOERROR, "in-addr.arpa.")


def test_a_changed_table_changes_the_answer() -> None:
    before = cluster()
    after = before.with_service(("default", "echo"), service("echo", cluster_ip="10.96.0.99"))
    assert records(ask(after, SVC).answer) == {f"{SVC} 5 A 10.96.0.99"}
    assert records(ask(before, SVC).answer) == {f"{SVC} 5 A 10.96.0.50"}
    gone = after.without_service(("default", "echo"))
    assert_negative(ask(gone, SVC), dns.rcode.NXDOMAIN)
    assert records(ask(after, "99.0.96.10.in-addr.arpa.", "PTR").answer) == {
        f"99.0.96.10.in-addr.arpa. 5 PTR {SVC}"
    }
    assert isinstance(answer(after, CONFIG, query("50.0.96.10.in-addr.arpa.", "PTR")), Forward)
    assert isinstance(answer(gone, CONFIG, query("99.0.96.10.in-addr.arpa.", "PTR")), Forward)


# -- the wire path ---------------------------------------------------------------------------------


def big_headless(count: int = 100) -> Table:
    addresses = [endpoint(f"10.244.{i // 200}.{i % 200 + 1}") for i in range(count)]
    return Table.from_objects([service("big", cluster_ip="None")], [endpoint_slice("big", addresses)])


def reply_of(result: Reply | Forward | None) -> dns.message.Message:
    assert isinstance(result, Reply)
    return dns.message.from_wire(result.wire)


def test_udp_overflow_sets_tc_and_tcp_carries_everything() -> None:
    table = big_headless()
    data = query("big.default.svc.cluster.local.").to_wire()
    udp = reply_of(respond(table, CONFIG, data))
    assert udp.flags & dns.flags.TC and udp.rcode() == dns.rcode.NOERROR
    assert not udp.answer and len(respond_wire(table, data)) <= 512
    tcp = reply_of(respond(table, CONFIG, data, tcp=True))
    assert not tcp.flags & dns.flags.TC and len(tcp.answer[0]) == 100
    # An EDNS client announcing 4096 bytes gets the 100 addresses over UDP.
    edns = reply_of(
        respond(table, CONFIG, query("big.default.svc.cluster.local.", use_edns=0, payload=4096).to_wire())
    )
    assert not edns.flags & dns.flags.TC and len(edns.answer[0]) == 100 and edns.edns == 0


def test_udp_overflow_drops_additionals_before_truncating() -> None:
    table = big_headless(12)
    data = query("_http._tcp.big.default.svc.cluster.local.", "SRV").to_wire()
    udp = reply_of(respond(table, CONFIG, data))
    assert not udp.flags & dns.flags.TC and len(udp.answer[0]) == 12 and not udp.additional
    tcp = reply_of(respond(table, CONFIG, data, tcp=True))
    assert len(tcp.answer[0]) == 12 and len(tcp.additional) == 12


def respond_wire(table: Table, data: bytes) -> bytes:
    result = respond(table, CONFIG, data)
    assert isinstance(result, Reply)
    return result.wire


def test_rotations_of_multi_address_answers() -> None:
    table = cluster()
    data = query(HL).to_wire()
    first = respond(table, CONFIG, data)
    assert isinstance(first, Reply) and first.rotations == (0, 1)
    orders = [
        [rd.address for rd in reply_of(respond(table, CONFIG, data, rotation=k)).answer[0]] for k in (0, 1)
    ]
    assert orders == [["10.244.1.5", "10.244.2.7"], ["10.244.2.7", "10.244.1.5"]]
    # A big set keeps MAX_ROTATIONS evenly spread starts; a single address has one answer.
    big = respond(big_headless(40), CONFIG, query("big.default.svc.cluster.local.").to_wire(), tcp=True)
    assert isinstance(big, Reply) and big.rotations == tuple(
        i * 40 // MAX_ROTATIONS for i in range(MAX_ROTATIONS)
    )
    single = respond(table, CONFIG, query(SVC).to_wire())
    assert isinstance(single, Reply) and single.rotations == (0,)
    # Without loadbalance the order is the table's and nothing rotates.
    plain = corefile.parse(COREFILE.replace("    loadbalance\n", ""))
    kept = respond(table, plain, data, rotation=1)
    assert isinstance(kept, Reply) and kept.rotations == (0,)
    assert [rd.address for rd in reply_of(kept).answer[0]] == ["10.244.1.5", "10.244.2.7"]


def test_datagrams_that_are_not_queries_are_dropped() -> None:
    table = cluster()
    assert respond(table, CONFIG, b"") is None
    assert respond(table, CONFIG, b"\x12\x34\x01") is None
    response = dns.message.make_response(query(SVC)).to_wire()
    assert respond(table, CONFIG, response) is None


def test_malformed_and_unsupported_queries_get_error_replies() -> None:
    table = cluster()
    garbage = reply_of(respond(table, CONFIG, b"\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xff"))
    assert (garbage.id, garbage.rcode(), bool(garbage.flags & dns.flags.RD)) == (
        0xABCD,
        dns.rcode.FORMERR,
        True,
    )
    notify = query(SVC, "SOA")
    notify.set_opcode(dns.opcode.NOTIFY)
    assert reply_of(respond(table, CONFIG, notify.to_wire())).rcode() == dns.rcode.NOTIMP
    two = query(SVC)
    two.question.append(query(HL).question[0])
    assert reply_of(respond(table, CONFIG, two.to_wire())).rcode() == dns.rcode.FORMERR
    chaos = dns.message.make_query("version.bind.", "TXT", "CH")
    assert reply_of(respond(table, CONFIG, chaos.to_wire())).rcode() == dns.rcode.REFUSED
    version_one = query(SVC)
    version_one.use_edns(1)
    future = reply_of(respond(table, CONFIG, version_one.to_wire()))
    assert (future.rcode(), future.edns) == (dns.rcode.BADVERS, 0)


def test_forwarded_wire_queries_carry_the_parsed_query() -> None:
    result = respond(cluster(), CONFIG, query("www.example.com.").to_wire())
    assert isinstance(result, Forward) and str(result.query.question[0].name) == "www.example.com."


def _well_formed(table: Table, data: bytes) -> None:
    result = respond(table, CONFIG, data)
    if not isinstance(result, Reply):
        assert result is None or isinstance(result, Forward)
        return
    wire = result.wire
    assert wire[:2] == data[:2], "the reply carries the query's ID"
    assert wire[2] & 0x80 and wire[2] & 0x78 == data[2] & 0x78, "a response, with the query's opcode"
    if wire[2] & 0x78:
        # Another opcode (dnspython cannot parse the unassigned ones): a bare NOTIMP header.
        assert (len(wire), wire[3] & 0x0F) == (12, dns.rcode.NOTIMP)
    else:
        dns.message.from_wire(wire)


_TABLE = cluster()
_VALID = [
    query(name, rdtype, **kw).to_wire()
    for name, rdtype, kw in (
        (SVC, "A", {}),
        (f"_http._tcp.{HL}", "SRV", {"use_edns": 0}),
        ("5.1.244.10.in-addr.arpa.", "PTR", {}),
        ("10-244-1-5.default.pod.cluster.local.", "AAAA", {}),
    )
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_any_bytes_give_a_well_formed_reply_or_a_drop(data: bytes) -> None:
    _well_formed(_TABLE, data)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(_VALID),
    st.lists(st.tuples(st.integers(0, 80), st.integers(0, 255)), max_size=6),
    st.integers(0, 8),
)
def test_mutated_queries_give_a_well_formed_reply_or_a_drop(
    data: bytes, changes: list[tuple[int, int]], cut: int
) -> None:
    # Valid queries with a few bytes changed and the tail cut reach the parser's and the
    # answer's deeper paths, which random bytes rarely do.
    mutated = bytearray(data[: len(data) - cut])
    for position, value in changes:
        if position < len(mutated):
            mutated[position] = value
    _well_formed(_TABLE, bytes(mutated))
