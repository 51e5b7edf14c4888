"""``kubeplane endpoint set`` wiring: the URL is checked, a dry run prints the plan and changes
nothing, a run completes and says how to get a kubeconfig for the new endpoint, a failure names
the command that continues it. The cluster is the fake of ``test_endpoint_op``, injected where the
command builds its adapters; the Kubernetes adapter's ConfigMap and DaemonSet calls are checked
against a fake API server."""

from __future__ import annotations

import asyncio
import base64
import copy
import http.server
import json
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
import yaml
from click.testing import CliRunner
from ops_fakes import MemoryStore
from test_endpoint_op import NEW, OLD, EndpointCluster

from kubeplane import pki
from kubeplane.cli import connect
from kubeplane.cli import endpoint as cli_endpoint
from kubeplane.cli import upgrade as cli_upgrade
from kubeplane.cli.main import Context
from kubeplane.clients import kube as kube_client
from kubeplane.ops import upgrade

pytestmark = pytest.mark.unit

CA = base64.b64encode(pki.new_ca("kubernetes").cert).decode()
ADMIN = yaml.safe_dump(
    {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "t", "cluster": {"server": OLD, "certificate-authority-data": CA}}],
        "users": [{"name": "admin", "user": {"token": "x"}}],
        "contexts": [{"name": "admin@t", "context": {"cluster": "t", "user": "admin"}}],
        "current-context": "admin@t",
    }
)


class CLICluster(EndpointCluster):
    """The fake with what the command's adapters add: the admin kubeconfig, the Lease, closing."""

    async def kubeconfig(self, node: str | None) -> str:
        return ADMIN

    def lease_store(self) -> MemoryStore:
        if not hasattr(self, "lease"):
            self.lease = MemoryStore()
        return self.lease

    async def close(self) -> None:
        return None


@pytest.fixture
def fake(generated: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch) -> CLICluster:
    cluster = CLICluster(copy.deepcopy(generated))
    monkeypatch.setattr(cli_endpoint, "EndpointNodeAPI", lambda target: cluster)
    monkeypatch.setattr(cli_endpoint, "EndpointKubeAPI", lambda api: cluster)
    monkeypatch.setattr(cli_endpoint, "TLSProbe", lambda **_: cluster)
    monkeypatch.setattr(cli_upgrade, "local_rotation", lambda addresses: cluster)
    monkeypatch.setattr(connect, "resolve", lambda obj: None)
    monkeypatch.setattr(cli_upgrade, "TIMING", upgrade.Timing(pod_timeout=5, interval=0, config_timeout=5))
    return cluster


def invoke(*args: str) -> Any:
    group = click.Group()
    cli_endpoint.register(group)
    obj = Context(config_path=None, context=None, endpoints=(), nodes=())
    return CliRunner().invoke(group, ["endpoint", "set", *args], obj=obj)


def test_a_url_that_is_not_https_host_port_is_a_usage_error(fake: CLICluster) -> None:
    result = invoke("http://lb.example.test")
    assert result.exit_code == 2
    assert "https://HOST:PORT" in result.output
    assert fake.events == []


def test_dry_run_prints_the_plan_and_changes_nothing(fake: CLICluster) -> None:
    result = invoke(NEW, "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"change the control plane endpoint {OLD} -> {NEW}, one node at a time: 10 steps" in result.output
    assert "dry run: nothing was changed" in result.output
    assert fake.events == []


def test_a_run_completes_and_says_how_to_get_a_kubeconfig(fake: CLICluster) -> None:
    result = invoke(NEW)
    assert result.exit_code == 0, result.output
    assert f"to continue this change if it is interrupted: kubeplane endpoint set {NEW}" in result.output
    assert f"endpoint change to {NEW} completed: 9 step(s) changed, 1 already done" in result.output
    assert "kubeplane -n 10.5.0.2 kubeconfig --force" in result.output
    assert f"kubectl config set-cluster NAME --server={NEW}" in result.output
    assert set(fake.kubelets.values()) == {NEW}


def test_a_failure_names_the_command_that_continues(fake: CLICluster) -> None:
    fake.break_apply_on = "10.5.0.3"
    result = invoke(NEW)
    assert result.exit_code == 1
    assert f"re-run `kubeplane endpoint set {NEW}` to continue" in result.output


def test_the_kubernetes_adapter_changes_only_the_server_and_rolls_kube_proxy() -> None:
    stored = yaml.safe_dump({"clusters": [{"name": "c", "cluster": {"server": OLD, "x": 1}}], "users": []})
    requests: list[tuple[str, str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        requests.append((request.method, request.url.path, body))
        if request.url.path.endswith("/configmaps/kubeconfig-in-cluster") and request.method == "GET":
            item = {"metadata": {"resourceVersion": "7"}, "data": {"kubeconfig": stored}}
            return httpx.Response(200, json=item)
        if request.url.path.endswith("/configmaps/cluster-info"):
            return httpx.Response(404, json={"kind": "Status", "reason": "NotFound"})
        return httpx.Response(200, json={})

    async def scenario() -> None:
        api = kube_client.KubeClient(ADMIN, transport=httpx.MockTransport(handle))
        adapter = cli_endpoint.EndpointKubeAPI(api)
        assert await adapter.configmap_server("kube-system", "kubeconfig-in-cluster") == OLD
        assert await adapter.configmap_server("kube-public", "cluster-info") is None
        await adapter.set_configmap_server("kube-system", "kubeconfig-in-cluster", NEW)
        await adapter.restart_daemonset(
            "kube-system", "kube-proxy", annotation=("kubeplane.dev/endpoint", NEW)
        )
        await adapter.close()

    asyncio.run(scenario())
    patches = [(path, body) for method, path, body in requests if method == "PATCH"]
    configmap, daemonset = patches
    assert configmap[1]["metadata"] == {"resourceVersion": "7"}
    assert yaml.safe_load(configmap[1]["data"]["kubeconfig"])["clusters"] == [
        {"name": "c", "cluster": {"server": NEW, "x": 1}}
    ]
    assert daemonset == (
        "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy",
        {"spec": {"template": {"metadata": {"annotations": {"kubeplane.dev/endpoint": NEW}}}}},
    )


class VersionServer:
    """An HTTPS server on 127.0.0.1 answering ``/version`` with a certificate for ``names``."""

    def __init__(self, tmp_path: Path, ca: pki.CertKey, names: list[str]) -> None:
        dns, ips = pki.split_sans(names)
        served = pki.issue(
            ca=ca, common_name="kube-apiserver", dns_names=dns, ip_addresses=ips, usages=("server",)
        )
        (tmp_path / "tls.crt").write_bytes(served.cert)
        (tmp_path / "tls.key").write_bytes(served.key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b'{"gitVersion": "v1.20.2"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> VersionServer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_probe_reads_the_names_and_issuer_and_verifies_the_endpoint_by_its_name(tmp_path: Path) -> None:
    ca, another = pki.new_ca("kubernetes"), pki.new_ca("another cluster")

    def admin(authority: pki.CertKey) -> str:
        client = pki.issue(ca=authority, common_name="admin", usages=("client",))
        return pki.kubeconfig(
            cluster_name="t", server=OLD, ca_cert=authority.cert, user="admin", client=client
        )

    probe = cli_endpoint.TLSProbe(ca=ca.cert, admin_kubeconfig=admin(ca))
    other = cli_endpoint.TLSProbe(ca=another.cert, admin_kubeconfig=admin(another))

    async def scenario(port: int) -> None:
        served = await probe.served("127.0.0.1", port)
        assert served.names == ("kubernetes", "127.0.0.1") and served.by_cluster_ca
        assert not (await other.served("127.0.0.1", port)).by_cluster_ca
        await probe.api_answers(f"https://127.0.0.1:{port}")
        # The certificate has no name "localhost": the endpoint is refused by that name.
        with pytest.raises(Exception, match=r"certificate verify failed|hostname|doesn't match"):
            await probe.api_answers(f"https://localhost:{port}")
        with pytest.raises(Exception, match="certificate verify failed"):
            await other.api_answers(f"https://127.0.0.1:{port}")

    with VersionServer(tmp_path, ca, ["kubernetes", "127.0.0.1"]) as server:
        asyncio.run(scenario(server.port))
