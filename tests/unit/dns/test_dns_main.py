"""The process's entry: in-cluster kubeconfig text from the service account, HTTP status paths,
exit codes for what it cannot run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from dns_objects import CONFIG

from kubeplane import pki
from kubeplane.clients.kube import KubeClient
from kubeplane.dns import DNSError, forward, main, watch
from kubeplane.dns.server import Server

pytestmark = pytest.mark.unit


def test_in_cluster_kubeconfig_from_the_service_account_files(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("secret-token\n")
    (tmp_path / "ca.crt").write_bytes(pki.new_ca("kubernetes").cert)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    text = main.in_cluster_kubeconfig(tmp_path, env)

    async def open_client() -> tuple[str, str]:
        async with KubeClient(text) as client:
            return client.server, client._http.headers["Authorization"]

    assert asyncio.run(open_client()) == ("https://10.96.0.1:443", "Bearer secret-token")
    v6 = main.in_cluster_kubeconfig(tmp_path, {**env, "KUBERNETES_SERVICE_HOST": "fd00::1"})
    assert "https://[fd00::1]:443" in v6


def test_outside_a_cluster_without_kubeconfig_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DNSError, match="--kubeconfig"):
        main.in_cluster_kubeconfig(tmp_path, {})
    with pytest.raises(DNSError, match="service account"):
        main.in_cluster_kubeconfig(tmp_path, {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"})


def test_a_corefile_it_cannot_run_exits_2(tmp_path: Path) -> None:
    corefile = tmp_path / "Corefile"
    corefile.write_text(".:53 {\n    forward . 10.0.0.1\n}\n")
    assert main.main(["-conf", str(corefile), "--kubeconfig", str(tmp_path / "kc")]) == 2


def test_ready_is_503_until_both_lists_health_always_200() -> None:
    mirror = watch.Mirror()
    server = Server(CONFIG, mirror, forward.Forwarder(()))
    assert server._status("/health")[0] == "200 OK"
    assert server._status("/ready")[0].startswith("503")
    mirror.replace_services([])
    assert server._status("/ready")[0].startswith("503")
    mirror.replace_slices([])
    assert server._status("/ready")[0] == "200 OK"
    assert server._status("/metrics")[0].startswith("404")
    assert server.http_ports() == [("0.0.0.0", 8080), ("0.0.0.0", 8181)]
