"""``kubeplane config new``: a control plane node signs a client certificate with the chosen roles
for a key that never leaves the client; a reader config reads and cannot write; the proxy role and
malformed requests are refused by the node itself. And the node's side of ``certs renew``: a
renewal request re-issues the Kubernetes certificates once."""

from __future__ import annotations

import asyncio
import base64
import datetime
import stat
import time
from typing import Any

import pytest
import yaml
from agent_harness import API_PORT, Cluster, Generated, wait_for

from kubeplane import api, pki
from kubeplane.config import client as client_config

pytestmark = pytest.mark.integration

PATCH = '[{"op": "add", "path": "/cluster/allowSchedulingOnMasters", "value": true}]'


def admin_call(gen: Generated, address: str, request: dict[str, Any]) -> api.CallError:
    """A raw ClientCertificate call as the admin; returns the error it must end with."""
    context = client_config.current(client_config.load(gen.admin_config))[1]
    credentials = api.Credentials(ca=context.ca_pem, cert=context.client.cert, key=context.client.key)

    async def scenario() -> api.CallError:
        async with api.NodeClient([f"{address}:{API_PORT}"], credentials=credentials) as client:
            with pytest.raises(api.CallError) as refused:
                await client.call("ClientCertificate", request)
        return refused.value

    return asyncio.run(scenario())


def test_config_new_mints_a_reader_that_reads_and_cannot_write(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    path = cluster.tmp_path / "reader.config"
    result = cluster.kp(
        "-e", agent.address, "config", "new", str(path), "--roles", "os:reader", "--crt-ttl", "2h",
        "--name", "auditor",
    )  # fmt: skip
    assert f"wrote {path}" in result.stdout and "kubeplane:reader" in result.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    document = yaml.safe_load(path.read_text())
    (context,) = document["contexts"].values()
    info = pki.cert_info(base64.b64decode(context["crt"]))
    assert (info.subject_cn, info.organizations) == ("auditor", (pki.ROLE_READER,))
    assert info.extended_key_usages == ("client",)
    assert 7100 <= info.lifetime.total_seconds() <= 7300 + 3600  # 2 h (plus the signer's backdating)
    assert context["endpoints"] == [agent.address]

    # Reads work, writes are refused by the node.
    assert "MachineType" in cluster.kp("-e", agent.address, "get", "mt", config=path).stdout
    refused = cluster.kp(
        "-e", agent.address, "patch", "mc", "--immediate", "-p", PATCH, config=path, check=False
    )
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr + refused.stdout
    # A reader cannot mint itself an admin.
    escalate = cluster.kp(
        "-e", agent.address, "config", "new", str(cluster.tmp_path / "admin2"), config=path, check=False
    )
    assert escalate.returncode == 1 and "PERMISSION_DENIED" in escalate.stderr + escalate.stdout
    assert not (cluster.tmp_path / "admin2").exists()

    # Re-running without --force keeps the file; the event log records each signature.
    again = cluster.kp("-e", agent.address, "config", "new", str(path), check=False)
    assert again.returncode == 1 and "exists" in again.stderr
    events = cluster.kp("-e", agent.address, "events", "-o", "json").stdout
    assert "signed a client certificate for auditor with kubeplane:reader" in events


def test_the_node_refuses_the_proxy_role_bad_lifetimes_and_bad_csrs(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    csr = pki.new_csr(key=pki.generate_key(), common_name="mallory").decode()
    good = {"csr": csr, "roles": pki.ROLE_READER, "lifetime_seconds": 3600}
    for change, expected in (
        ({"roles": api.ROLE_PROXY}, "cannot be granted"),
        ({"roles": f"{pki.ROLE_READER},{api.ROLE_PROXY}"}, "cannot be granted"),
        ({"roles": ""}, "cannot be granted"),
        ({"lifetime_seconds": 10}, "between 60s"),
        ({"lifetime_seconds": 20 * 365 * 86400}, "between 60s"),
        ({"csr": "not a csr"}, "cannot sign the CSR"),
        ({"csr": pki.new_csr(key=pki.generate_key(), common_name="a/b").decode()}, "common name"),
    ):
        error = admin_call(cluster.gen, agent.address, {**good, **change})
        assert error.code == "INVALID_ARGUMENT", (change, error)
        assert expected in error.message, (change, error.message)
    # The CLI refuses unknown roles before asking anyone.
    unknown = cluster.kp(
        "-e", agent.address, "config", "new", str(cluster.tmp_path / "x"), "--roles", "proxy", check=False
    )
    assert unknown.returncode == 2 and "--roles" in unknown.stderr


def test_certs_reports_node_and_client_certificates_and_flags_the_short_lived(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    short = cluster.tmp_path / "short.config"
    cluster.kp("-e", agent.address, "config", "new", str(short), "--roles", "reader", "--crt-ttl", "2h")

    def node_certificates() -> list[dict[str, Any]] | None:
        result = cluster.kp("-e", agent.address, "certs", "-o", "json", config=short)
        items = [yaml.safe_load(line) for line in result.stdout.splitlines()]
        return items if any(item["node"] == agent.address for item in items) else None

    items = wait_for(node_certificates, timeout=30, what="node certificates on disk", logs=cluster.logs)
    on_node = [item for item in items if item["node"] == agent.address]
    assert all(
        item["path"].startswith(("/system/secrets/", "/etc/kubernetes/", "/var/lib/kubelet/pki/"))
        for item in on_node
    )
    assert {"client certificate of context test-cluster", "OS CA of context test-cluster"} <= {
        item["what"] for item in items if item["node"] == "(client config)"
    }
    assert [item["not_after"] for item in items] == sorted(item["not_after"] for item in items)
    assert "PRIVATE KEY" not in str(items)

    # The 2 h certificate is flagged in the table and counted in the warning.
    result = cluster.kp("-e", agent.address, "certs", config=short)
    flagged = [line for line in result.stdout.splitlines() if " RENEW " in line]
    assert len(flagged) == 1 and "kubeplane-client" in flagged[0], result.stdout
    assert "warning: 0 certificate(s) expired and 1 expire within 720h" in result.stderr


def renew_call(gen: Generated, address: str, request: dict[str, Any]) -> dict[str, Any]:
    """A raw KubernetesCertificatesRenew call as the admin; its one reply."""
    context = client_config.current(client_config.load(gen.admin_config))[1]
    credentials = api.Credentials(ca=context.ca_pem, cert=context.client.cert, key=context.client.key)

    async def scenario() -> dict[str, Any]:
        async with api.NodeClient([f"{address}:{API_PORT}"], credentials=credentials) as client:
            (reply,) = await client.call("KubernetesCertificatesRenew", request)
            result: dict[str, Any] = reply.unwrap()
            return result

    return asyncio.run(scenario())


def test_a_control_plane_node_renews_its_kubernetes_certificates_once_per_request(cluster: Cluster) -> None:
    """The node API call, the request resource, the secrets controller and the files on disk."""
    agent = cluster.boot_agent()

    def status() -> dict[str, Any] | None:
        result = cluster.kp(
            "-e", agent.address, "get", "secretstatuses", "static-pods", "-o", "json", check=False
        )
        if result.returncode != 0 or not result.stdout.strip():
            return None
        spec: dict[str, Any] = yaml.safe_load(result.stdout)["spec"]
        return spec if spec.get("issued") else None

    before = wait_for(status, timeout=30, what="the control plane secrets on disk", logs=cluster.logs)
    answer = renew_call(cluster.gen, agent.address, {})
    assert answer["renewing"] is True and answer["issued"] == before["issued"]

    def renewed() -> dict[str, Any] | None:
        now = status()
        return now if now is not None and now["issued"] >= answer["notBefore"] else None

    after = wait_for(renewed, timeout=30, what="certificates issued for the request", logs=cluster.logs)
    assert int(after["version"]) == int(before["version"]) + 1
    # The same request again is answered already and renews nothing.
    asked = int(datetime.datetime.fromisoformat(answer["notBefore"]).timestamp())
    again = renew_call(cluster.gen, agent.address, {"not_before": asked})
    assert again["renewing"] is False
    time.sleep(1)
    assert status() == after
    events = cluster.kp("-e", agent.address, "events", "-o", "json").stdout
    assert "renewal of the Kubernetes certificates issued before" in events
