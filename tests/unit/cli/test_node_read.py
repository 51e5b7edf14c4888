"""`version`, `get` (table, yaml, json, watch), `read`, `ls`, `logs`, `service`, `reboot` against real
node API servers on loopback, including several nodes with one of them down."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest
import yaml

from kubeplane.config import client as client_config

if TYPE_CHECKING:  # fixtures' types, defined in conftest.py
    from conftest import Cluster

pytestmark = pytest.mark.unit


def test_version_prints_client_and_server(cluster: Cluster) -> None:
    result = cluster.run("version")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "Client:",
        "    Tag:   0.1.0",
        "Server:",
        "    Tag:          0.1.0-test",
        "    Kubernetes:   v1.20.2",
    ]


def test_version_client_only_needs_no_client_config(cluster: Cluster) -> None:
    cluster.config_path.unlink()
    result = cluster.run("version", "--client")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "Client:\n    Tag:   0.1.0\n"


def test_version_labels_nodes_and_reports_a_down_node(three: Cluster) -> None:
    three.stop(2)
    result = three.run("-n", ",".join(three.addresses), "version", "-o", "json")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert [server["node"] for server in document["servers"]] == three.addresses[:2]
    assert document["client"] == {"tag": "0.1.0"}
    assert "node 127.0.0.4:" in result.stderr
    assert "UNAVAILABLE" in result.stderr

    table = three.run("-n", ",".join(three.addresses[:2]), "version")
    assert table.exit_code == 0
    assert "    NODE:         127.0.0.3" in table.stdout.splitlines()


def test_get_table_has_the_generic_and_extra_columns(cluster: Cluster) -> None:
    result = cluster.run("get", "svc")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        "NODE        NAMESPACE   TYPE      ID        VERSION   RUNNING   HEALTHY\n"
        "127.0.0.2   runtime     Service   etcd      3         true      true\n"
        "127.0.0.2   runtime     Service   kubelet   5         true      false\n"
    )


def test_get_one_resource_by_alias(cluster: Cluster) -> None:
    result = cluster.run("get", "StaticPods", "kube-apiserver")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[1].split() == [
        "127.0.0.2",
        "controlplane",
        "StaticPod",
        "kube-apiserver",
        "1",
    ]
    missing = cluster.run("get", "sp", "nope")
    assert missing.exit_code == 1
    assert "nope" in missing.stderr and "NOT_FOUND" in missing.stderr


def test_get_unknown_type_suggests_close_names(cluster: Cluster) -> None:
    result = cluster.run("get", "staticpod5")
    assert result.exit_code == 1
    assert "unknown resource type 'staticpod5'" in result.stderr
    assert "staticpods" in result.stderr
    assert cluster.nodes[0].calls == []


def test_get_yaml_is_one_document_per_resource(cluster: Cluster) -> None:
    result = cluster.run("get", "manifests", "-o", "yaml")
    assert result.exit_code == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert [d["metadata"]["id"] for d in documents] == ["00-kubelet-bootstrapping-token", "10-kube-proxy"]
    assert list(documents[0]) == ["node", "metadata", "spec"]
    assert documents[0]["node"] == "127.0.0.2"
    assert result.stdout.startswith("node: 127.0.0.2\nmetadata:\n    namespace: controlplane\n")
    assert "\n---\n" in result.stdout
    pod = cluster.run("get", "sp", "-o", "yaml").stdout
    assert "            containers:\n                - name: a\n" in pod  # lists indented under their key


def test_get_json_is_one_object_per_line(cluster: Cluster) -> None:
    result = cluster.run("get", "svc", "-o", "json")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [json.loads(line)["metadata"]["id"] for line in lines] == ["etcd", "kubelet"]
    assert json.loads(lines[0])["spec"] == {"running": True, "healthy": True, "unknown": False}


def test_get_across_nodes_with_one_down_prints_the_others(three: Cluster) -> None:
    three.stop(1)
    result = three.run("-n", ",".join(three.addresses), "get", "svc")
    assert result.exit_code == 1
    rows = [line.split()[:4] for line in result.stdout.splitlines()[1:]]
    assert rows == [
        ["127.0.0.2", "runtime", "Service", "etcd"],
        ["127.0.0.2", "runtime", "Service", "kubelet"],
        ["127.0.0.4", "runtime", "Service", "etcd"],
        ["127.0.0.4", "runtime", "Service", "kubelet"],
    ]
    assert result.stderr.startswith("Error: node 127.0.0.3: ")
    assert len(result.stderr.splitlines()) == 1


def test_get_watch_marks_created_updated_and_destroyed(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    updated = node.service("kubelet", running=True, healthy=True, version=6)
    added = node.service("apid-with-a-long-name", running=False, healthy=False)
    node.watch_events = [
        {"event": "updated", "resource": updated},
        {"event": "created", "resource": added},
        {"event": "destroyed", "resource": added},
    ]
    result = cluster.run("get", "svc", "--watch")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NODE", "NAMESPACE", "TYPE", "ID", "VERSION", "RUNNING", "HEALTHY"]
    assert lines[0].startswith("    NODE")  # the marker column comes first
    assert [(line[:1], line.split()[-4]) for line in lines[1:]] == [
        ("+", "etcd"),
        ("+", "kubelet"),
        (" ", "kubelet"),
        ("+", "apid-with-a-long-name"),
        ("-", "apid-with-a-long-name"),
    ]
    assert lines[3].split()[-3:] == ["6", "true", "true"]

    as_json = cluster.run("get", "svc", "-w", "-o", "json")
    events = [(e["event"], e["metadata"]["id"]) for e in map(json.loads, as_json.stdout.splitlines())]
    assert events[-1] == ("destroyed", "apid-with-a-long-name")
    as_yaml = list(yaml.safe_load_all(cluster.run("get", "svc", "-w", "-o", "yaml").stdout))
    assert [d["event"] for d in as_yaml] == ["created", "created", "updated", "created", "destroyed"]


def test_get_watch_across_nodes_reports_the_down_node(three: Cluster) -> None:
    three.stop(2)
    result = three.run("-n", ",".join(three.addresses), "get", "svc", "-w")
    assert result.exit_code == 1
    nodes = sorted({line.split()[1] for line in result.stdout.splitlines()[1:]})
    assert nodes == three.addresses[:2]
    assert "node 127.0.0.4" in result.stderr


def test_reader_certificate_is_refused_secrets_but_reads_services(
    reader_cluster: Cluster,
) -> None:
    assert reader_cluster.run("get", "svc").exit_code == 0
    refused = reader_cluster.run("get", "mc")
    assert refused.exit_code == 1
    assert "PERMISSION_DENIED" in refused.stderr
    assert "kubeplane:reader" in refused.stderr


def test_read_writes_the_file_bytes(cluster: Cluster) -> None:
    result = cluster.run("read", "bin/blob")
    assert result.exit_code == 0, result.stderr
    assert result.stdout_bytes == bytes(range(256))
    missing = cluster.run("read", "etc/nope")
    assert missing.exit_code == 1
    assert "etc/nope" in missing.stderr


def test_read_refuses_several_nodes(three: Cluster) -> None:
    result = three.run("-n", "127.0.0.2,127.0.0.3", "read", "etc/hosts")
    assert result.exit_code != 0
    assert "one node at a time" in result.stderr


def test_ls_short_long_and_json(cluster: Cluster) -> None:
    assert cluster.run("ls").stdout == "NODE        NAME\n127.0.0.2   etc\n"
    long = cluster.run("ls", "-l", "-r", "/")
    assert long.exit_code == 0, long.stderr
    assert long.stdout.splitlines() == [
        "NODE        MODE         SIZE(B)   MODIFIED               NAME",
        "127.0.0.2   drwxr-xr-x   4096      2021-03-09T13:57:11Z   etc",
        "127.0.0.2   -rw-r--r--   21        2021-03-09T13:57:11Z   etc/hosts",
    ]
    entries = [json.loads(line) for line in cluster.run("ls", "-r", "-o", "json").stdout.splitlines()]
    assert [e["name"] for e in entries] == ["etc", "etc/hosts"]
    assert entries[0]["node"] == "127.0.0.2"


def test_logs_tail_follow_and_labels(three: Cluster) -> None:
    single = three.run("logs", "etcd", "--tail", "2")
    assert single.exit_code == 0, single.stderr
    assert single.stdout == "etcd line 3\netcd line 4\n"
    followed = three.run("logs", "kubelet", "-f", "--tail", "1")
    assert followed.stdout == "kubelet line 4\nkubelet followed line\n"
    both = three.run("-n", "127.0.0.2,127.0.0.3", "logs", "etcd", "--tail", "1")
    assert sorted(both.stdout.splitlines()) == ["127.0.0.2: etcd line 4", "127.0.0.3: etcd line 4"]
    missing = three.run("logs", "nope")
    assert missing.exit_code == 1
    assert "nope" in missing.stderr


AGO = re.compile(r"\d+d\d+h ago")


def test_service_list_and_detail(cluster: Cluster) -> None:
    listing = cluster.run("service")
    assert listing.exit_code == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert re.split(r"\s{3,}", lines[0]) == [
        "NODE",
        "SERVICE",
        "STATE",
        "HEALTH",
        "LAST CHANGE",
        "LAST EVENT",
    ]
    etcd = re.split(r"\s{3,}", lines[1])
    assert etcd[:4] == ["127.0.0.2", "etcd", "Running", "OK"]
    assert AGO.fullmatch(etcd[4])
    assert etcd[5] == "Health check successful"
    kubelet = re.split(r"\s{3,}", lines[2])
    assert kubelet[:4] == ["127.0.0.2", "kubelet", "Waiting", "?"]
    assert AGO.fullmatch(kubelet[4])

    detail = cluster.run("service", "etcd")
    assert detail.exit_code == 0, detail.stderr
    lines = detail.stdout.splitlines()
    assert lines[:4] == ["NODE     127.0.0.2", "ID       etcd", "STATE    Running", "HEALTH   OK"]
    assert re.fullmatch(r"EVENTS   \[Running\]: Health check successful \(\d+d\d+h ago\)", lines[4])
    assert re.fullmatch(r"         \[Preparing\]: Running pre state \(\d+d\d+h ago\)", lines[5])

    missing = cluster.run("service", "nope")
    assert missing.exit_code == 1
    assert "node 127.0.0.2: no service 'nope'" in missing.stderr


def test_service_actions_and_reboot(cluster: Cluster) -> None:
    result = cluster.run("service", "etcd", "restart")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "service 'etcd': restart requested\n"
    assert cluster.run("reboot").stdout == "restarting services\n"
    assert cluster.nodes[0].calls[-2:] == ["service_restart", "reboot"]
    bad = cluster.run("service", "etcd", "explode")
    assert bad.exit_code == 2


def test_no_endpoints_is_a_clear_error(cluster: Cluster) -> None:
    assert cluster.run("config", "endpoints", "x").exit_code == 0
    config = client_config.load(cluster.config_path)
    emptied = client_config.set_endpoints(config, [])
    client_config.save(emptied, cluster.config_path)
    result = cluster.run("get", "svc")
    assert result.exit_code == 1
    assert "no endpoints: pass -e or set them with `kubeplane config endpoints`" in result.stderr
    assert cluster.run("-e", cluster.endpoint, "get", "svc").exit_code == 0


def test_unreachable_endpoint_names_it(cluster: Cluster) -> None:
    result = cluster.run("-e", "127.0.0.1:1", "version")
    assert result.exit_code == 1
    assert "127.0.0.1:1" in result.stderr
