"""The Corefile subset: what kubeplane renders, CoreDNS's own default, and what is refused."""

from __future__ import annotations

import re

import dns.name
import pytest

from kubeplane.controllers.k8s import manifests, render
from kubeplane.dns import CorefileError, corefile
from kubeplane.dns.corefile import DEFAULT_TTL, Listen, Upstream

pytestmark = pytest.mark.unit


def names(*texts: str) -> tuple[dns.name.Name, ...]:
    return tuple(dns.name.from_text(text) for text in texts)


def rendered_corefile(dns_domain: str) -> str:
    inputs = manifests.ManifestInputs(
        kubernetes_version=render.KubeVersion(1, 20, 2),
        server="https://10.5.0.1:6443",
        bootstrap_token="abcdef.0123456789abcdef",
        pod_cidrs=("10.244.0.0/16",),
        dns_service_ip="10.96.0.10",
        dns_domain=dns_domain,
        proxy_image="k8s.gcr.io/kube-proxy:v1.20.2",
    )
    [config_map] = [
        item
        for item in manifests.render_bootstrap_manifests(inputs)["11-core-dns"]
        if item["kind"] == "ConfigMap"
    ]
    text: str = config_map["data"]["Corefile"]
    return text


def test_what_kubeplane_renders() -> None:
    text = rendered_corefile("cluster.example")
    config = corefile.parse(text)
    assert config.zones == names("cluster.example", "in-addr.arpa", "ip6.arpa")
    assert config.primary_zone == dns.name.from_text("cluster.example")
    assert config.forward_zones == names("cluster.example")
    assert config.reverse_zones == names("in-addr.arpa", "ip6.arpa")
    assert config.pods == "insecure"
    assert config.fallthrough == names("in-addr.arpa", "ip6.arpa")
    ttl = re.search(r"^\s*ttl (\d+)$", text, re.MULTILINE)
    assert config.ttl == (int(ttl.group(1)) if ttl else DEFAULT_TTL)
    assert (config.resolv_conf, config.upstreams) == ("/etc/resolv.conf", ())
    assert config.cache_ttl == 30 and config.loadbalance
    assert config.dns_port == 53
    assert (config.health, config.ready, config.metrics) == (
        Listen("", 8080),
        Listen("", 8181),
        Listen("", 9153),
    )
    assert config.ignored == ("line 4: health option 'lameduck 5s'",)


COREDNS_DEFAULT = """\
# CoreDNS's deployment default, with its extras
.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    hosts /etc/hosts {   # not understood: reported, not fatal
       fallthrough
    }
    prometheus 0.0.0.0:9153
    forward . dns://10.0.0.2 10.0.0.3:5353 [fd00::53]:53 {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
"""


def test_coredns_default_with_unknown_plugins_reported() -> None:
    config = corefile.parse(COREDNS_DEFAULT)
    assert config.ttl == 30
    assert config.upstreams == (
        Upstream("10.0.0.2", 53),
        Upstream("10.0.0.3", 5353),
        Upstream("fd00::53", 53),
    )
    assert config.resolv_conf is None
    assert config.metrics == Listen("0.0.0.0", 9153)
    assert config.ignored == (
        "line 5: health option 'lameduck 5s'",
        "line 13: plugin 'hosts'",
        "line 18: forward option 'max_concurrent 1000'",
    )


def test_defaults_of_a_minimal_corefile() -> None:
    config = corefile.parse('.:1053 {\n  kubernetes "cluster.local"\n  forward . 192.0.2.1\n}\n')
    assert config.dns_port == 1053 and config.zones == names("cluster.local")
    assert (config.pods, config.ttl, config.fallthrough, config.cache_ttl) == ("disabled", 5, (), None)
    assert (
        not config.loadbalance and config.health is None and config.ready is None and config.metrics is None
    )
    assert config.falls_through(dns.name.from_text("1.2.0.192.in-addr.arpa")) is False


def test_one_line_blocks() -> None:
    config = corefile.parse(".:53 {\n health :8081 { lameduck 5s }\n kubernetes cluster.local { }\n}\n")
    assert config.health == Listen("", 8081) and config.zones == names("cluster.local")
    assert config.ignored == ("line 2: health option 'lameduck 5s'",)


def test_fallthrough_without_zones_means_all_of_the_plugin_zones() -> None:
    config = corefile.parse(".:53 {\n kubernetes cluster.local in-addr.arpa {\n  fallthrough\n }\n}\n")
    assert config.fallthrough == names("cluster.local", "in-addr.arpa")
    assert config.falls_through(dns.name.from_text("4.3.2.1.in-addr.arpa"))


def test_pods_verified_is_reported_and_answers_no_pod_records() -> None:
    config = corefile.parse(".:53 {\n kubernetes cluster.local {\n  pods verified\n }\n}\n")
    assert config.pods == "disabled" and config.ignored == ("line 3: kubernetes option 'pods verified'",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "exactly one server block"),
        (
            ".:53 {\n kubernetes cluster.local\n}\n.:54 {\n kubernetes cluster.local\n}\n",
            "exactly one server block",
        ),
        (".:53 {\n forward . /etc/resolv.conf\n}\n", "no 'kubernetes' plugin"),
        (".:53 {\n kubernetes\n}\n", "line 2: kubernetes needs its zones"),
        (".:53 {\n kubernetes in-addr.arpa\n}\n", "line 2: kubernetes needs a zone of names"),
        ("cluster.local:53 {\n kubernetes cluster.local\n}\n", "line 1: the server block must be for '.'"),
        (".:53 {\n kubernetes cluster.local\n", "line 1: server block is not closed"),
        (".:53 {\n kubernetes cluster.local {\n ttl 5\n", "line 2: 'kubernetes' block is not closed"),
        (
            ".:53 {\n kubernetes cluster.local {\n ttl 99999\n }\n}\n",
            "line 3: ttl must be a number in 0..3600",
        ),
        (
            ".:53 {\n kubernetes cluster.local\n forward example.org 1.1.1.1\n}\n",
            "line 3: only 'forward . TO",
        ),
        (".:53 {\n kubernetes cluster.local\n forward . tls://1.1.1.1\n}\n", "only plain DNS upstreams"),
        (".:53 {\n kubernetes cluster.local\n forward . dns.example\n}\n", "is not an IP address"),
        (".:53 {\n kubernetes cluster.local\n forward .\n}\n", "line 3: forward needs at least one target"),
        (".:53 {\n kubernetes cluster.local\n health 8080\n}\n", "line 3: health address must be"),
        (".:53 {\n kubernetes cluster.local\n cache x\n}\n", "line 3: cache TTL must be"),
        (".:53 {\n kubernetes 'unclosed\n}\n", "line 2: No closing quotation"),
        ("kubernetes cluster.local\n", "line 1: expected a server block"),
    ],
)
def test_what_cannot_run_is_refused_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(CorefileError, match=re.escape(message)):
        corefile.parse(text)
