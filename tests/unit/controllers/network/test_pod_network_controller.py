"""PodNetworkController against a fake API (httpx.MockTransport) and a recording network: the
conflist follows the node's own pod CIDR, routes follow the other Nodes (through a watch), and
leaving host-gw undoes everything."""

from __future__ import annotations

import asyncio
import base64
import copy
import ipaddress
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kubeplane import pki
from kubeplane.clients import kube
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.network import pod_network
from kubeplane.resources import State, catalog
from kubeplane.services import cni

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "k8s"))
from k8s_harness import eventually, publish_addresses, publish_config, run

pytestmark = pytest.mark.unit

CA = pki.new_ca("kubernetes")


class RecordingNetwork:
    def __init__(self) -> None:
        self.routes: dict[str, str] = {"10.244.9.0/24": "10.5.0.9"}  # a stale route of ours
        self.forwarding = False
        self.masquerade = ""
        self.calls: list[str] = []

    def on_link_networks(self) -> list[ipaddress.IPv4Network]:
        return [ipaddress.IPv4Network("10.5.0.0/24")]

    def sync_routes(self, routes: Sequence[cni.Route]) -> tuple[list[str], list[str]]:
        wanted = {route.cidr: route.via for route in routes}
        changed = [cidr for cidr, via in wanted.items() if self.routes.get(cidr) != via]
        removed = [cidr for cidr in self.routes if cidr not in wanted]
        self.routes = wanted
        return changed, removed

    def enable_forwarding(self) -> bool:
        was, self.forwarding = self.forwarding, True
        return not was

    def apply_masquerade(self, rules: str) -> None:
        self.calls.append("masquerade")
        self.masquerade = rules

    def remove_masquerade(self) -> None:
        self.masquerade = ""


def node(name: str, cidr: str, ip: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"podCIDR": cidr},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }


class FakeApi:
    """Serves the Node list, then one watch event per watch (a node gets added)."""

    def __init__(self) -> None:
        self.nodes = [node("node1", "10.244.0.0/24", "10.5.0.2"), node("node2", "10.244.1.0/24", "10.5.0.3")]
        self.pending = [("ADDED", node("node3", "10.244.2.0/24", "10.5.0.4"))]
        self.requests: list[str] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(str(request.url))
        assert request.url.path == kube.NODES_PATH
        if request.url.params.get("watch") == "1":
            lines = []
            while self.pending:
                kind, obj = self.pending.pop(0)
                self.nodes.append(obj)
                lines.append(json.dumps({"type": kind, "object": obj}))
            return httpx.Response(200, content="\n".join(lines).encode())
        return httpx.Response(200, json={"metadata": {"resourceVersion": "7"}, "items": self.nodes})


def kubelet_conf(tmp_path: Path) -> Path:
    """A kubeconfig as the kubelet writes it: CA and client credentials as file paths."""
    client = pki.issue(
        ca=CA, common_name="system:node:node1", organizations=["system:nodes"], usages=("client",)
    )
    pki_dir = tmp_path / "var/lib/kubelet/pki"
    pki_dir.mkdir(parents=True)
    (pki_dir / "ca.crt").write_bytes(CA.cert)
    (pki_dir / "kubelet-client-current.pem").write_bytes(client.cert + client.key)
    document = {
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": "https://10.5.0.1:6443",
                    "certificate-authority": str(pki_dir / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "client-certificate": str(pki_dir / "kubelet-client-current.pem"),
                    "client-key": str(pki_dir / "kubelet-client-current.pem"),
                },
            }
        ],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = NodePaths(tmp_path).kubernetes_etc / "kubelet.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


GENERATED = gen.generate(gen.GenOptions(cluster_name="test", endpoint="10.5.0.1"), gen.new_secrets())


def config(cni_name: str) -> dict[str, Any]:
    document = copy.deepcopy(dict(GENERATED.documents["controlplane"]))
    document["cluster"].setdefault("network", {})["cni"] = {"name": cni_name}
    document["cluster"]["network"]["podSubnets"] = ["10.244.0.0/16"]
    return document


def status(state: State) -> dict[str, Any] | None:
    found = state.find(catalog.NETWORK_NAMESPACE, catalog.POD_NETWORK_STATUSES, pod_network.STATUS_ID)
    return found.spec.to_dict() if found is not None else None


def test_inline_files_reads_the_kubelets_file_references(tmp_path: Path) -> None:
    text = kube.inline_files(kubelet_conf(tmp_path).read_text())
    document = yaml.safe_load(text)
    cluster, user = document["clusters"][0]["cluster"], document["users"][0]["user"]
    assert "certificate-authority" not in cluster
    assert base64.b64decode(cluster["certificate-authority-data"]) == CA.cert
    assert set(user) == {"client-certificate-data", "client-key-data"}
    kube.KubeClient(text)  # a usable kubeconfig now


def test_routes_conflist_and_masquerade_follow_the_nodes(tmp_path: Path) -> None:
    kubelet_conf(tmp_path)
    network, api = RecordingNetwork(), FakeApi()
    controller = pod_network.PodNetworkController(
        paths=NodePaths(tmp_path),
        network=network,
        retry_interval=0.05,
        kube_client=lambda text: kube.KubeClient(text, transport=httpx.MockTransport(api.handle)),
    )

    async def body(state: State) -> None:
        publish_addresses(state)  # hostname node1
        publish_config(state, config("host-gw"))
        await eventually(lambda: (status(state) or {}).get("routes", [])[1:], what="node3's route")
        assert network.routes == {"10.244.1.0/24": "10.5.0.3", "10.244.2.0/24": "10.5.0.4"}
        assert network.forwarding
        assert "! -s 10.244.0.0/24 -j RETURN" in network.masquerade
        assert network.calls.count("masquerade") == 1  # unchanged rules are not rewritten
        conflist = json.loads(controller.conflist.read_text())
        assert conflist["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.244.0.0/24"}]]
        assert status(state) == {
            "podCidr": "10.244.0.0/24",
            "routes": [
                {"cidr": "10.244.1.0/24", "via": "10.5.0.3", "node": "node2"},
                {"cidr": "10.244.2.0/24", "via": "10.5.0.4", "node": "node3"},
            ],
            "skipped": [],
            "error": "",
        }
        assert any("watch=1" in url for url in api.requests)

        publish_config(state, config("flannel"))
        await eventually(lambda: status(state) is None, what="status removed")
        assert network.routes == {} and network.masquerade == ""
        assert not controller.conflist.exists()

    run([controller], body)


def test_nothing_happens_until_the_kubelet_has_credentials(tmp_path: Path) -> None:
    network = RecordingNetwork()
    controller = pod_network.PodNetworkController(
        paths=NodePaths(tmp_path), network=network, retry_interval=0.05
    )

    async def body(state: State) -> None:
        publish_addresses(state)
        publish_config(state, config("host-gw"))
        await asyncio.sleep(0.3)
        assert status(state) is None
        assert network.routes == {"10.244.9.0/24": "10.5.0.9"} and not network.forwarding

    run([controller], body)
