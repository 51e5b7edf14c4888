"""Security acceptance tests of issue 4: callers without a client certificate, with one from
another CA, with an expired one, and with a reader certificate are refused what they may not do,
and nothing changes on the node (config files compared byte for byte)."""

from __future__ import annotations

import datetime
import json
import socket
import ssl
from pathlib import Path

import grpc
import pytest
from agent_harness import Agent, Cluster, json_lines
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

pytestmark = pytest.mark.integration

PATCH = '[{"op": "add", "path": "/cluster/allowSchedulingOnMasters", "value": true}]'
MACHINE_CONFIG_FILE = "system/config.yaml"
APPLY_METHOD = "/kubeplane.machine.Machine/ApplyConfiguration"


def changed_config(cluster: Cluster, tmp_path: Path) -> Path:
    """A valid config that differs from the applied one only in a field that applies live."""
    path = tmp_path / "changed.yaml"
    path.write_text(
        cluster.gen.controlplane.read_text().replace("dnsDomain: cluster.local", "dnsDomain: evil.test")
    )
    return path


def assert_changes_refused(cluster: Cluster, agent: Agent, config: Path, changed: Path) -> list[str]:
    """Every changing or secret-reading command fails with ``config``; returns their stderr."""
    before = (agent.config_bytes(), agent.staged_bytes())
    errors = []
    for args in (
        ("get", "mc"),
        ("get", "mc", "-o", "yaml"),
        ("apply-config", "-f", str(changed), "--immediate"),
        ("apply-config", "-f", str(changed), "--on-reboot"),
        ("patch", "mc", "--immediate", "-p", PATCH),
        ("read", MACHINE_CONFIG_FILE),
        ("reboot",),
    ):
        result = cluster.kp("-e", agent.address, "-n", agent.address, *args, config=config, check=False)
        assert result.returncode == 1, f"`{' '.join(args)}` was not refused: {result.stdout}"
        assert "allowSchedulingOnMasters" not in result.stdout and "token" not in result.stdout
        errors.append(result.stderr)
    assert (agent.config_bytes(), agent.staged_bytes()) == before
    return errors


def expired_client_cert(ca_cert_pem: bytes, ca_key_pem: bytes, directory: Path) -> tuple[Path, Path]:
    """An admin client certificate signed by the OS CA that expired an hour ago."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kubeplane:admin"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "expired-admin"),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2))
        .not_valid_after(now - datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    crt_path, key_path = directory / "expired.crt", directory / "expired.key"
    crt_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return crt_path, key_path


def test_no_client_certificate_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.boot_agent()
    before = agent.config_bytes()
    os_ca = cluster.gen.os_ca()[0]

    # A raw TLS client that trusts the OS CA but presents no certificate: the server must not
    # complete a usable session (TLS 1.3 reports the refusal on the first read).
    context = ssl.create_default_context(cadata=os_ca.decode())
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    raw = socket.create_connection((agent.address, 50000), timeout=5)
    with pytest.raises((ssl.SSLError, ConnectionError)), context.wrap_socket(raw) as tls:
        tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        if not tls.recv(1024):
            raise ConnectionError("closed by the server")
    raw.close()

    # A gRPC client without a certificate asking for a config change.
    credentials = grpc.ssl_channel_credentials(root_certificates=os_ca)
    with grpc.secure_channel(f"{agent.address}:50000", credentials) as channel:
        apply = channel.unary_unary(APPLY_METHOD)
        request = json.dumps(
            {"data": changed_config(cluster, tmp_path).read_text(), "mode": "immediate", "dry_run": False}
        ).encode()
        with pytest.raises(grpc.RpcError) as refused:
            apply(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    # The CLI's insecure (maintenance) path is closed on a configured node.
    insecure = cluster.kp(
        "-n", agent.address, "apply-config", "--insecure", "-f", str(changed_config(cluster, tmp_path)),
        config=None, check=False,
    )  # fmt: skip
    assert insecure.returncode == 1
    assert agent.config_bytes() == before


def test_certificate_from_another_ca_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.boot_agent()
    other = tmp_path / "other-ca"
    other.mkdir()
    cluster.kp("gen", "ca", "--organization", "other", config=None, cwd=other)
    config = cluster.client_config(
        name="stranger", roles="kubeplane:admin", ca=(other / "other.crt", other / "other.key")
    )

    errors = assert_changes_refused(cluster, agent, config, changed_config(cluster, tmp_path))
    assert cluster.kp("-e", agent.address, "get", "mt", config=config, check=False).returncode == 1
    assert all("certificate" in error for error in errors), errors[0]


def test_expired_certificate_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.boot_agent()
    directory = tmp_path / "expired"
    directory.mkdir()
    ca_crt, ca_key = cluster.gen.os_ca()
    crt, key = expired_client_cert(ca_crt, ca_key, directory)
    trusted = directory / "os.crt"
    trusted.write_bytes(ca_crt)
    config = directory / "kubeplaneconfig"
    cluster.kp(
        "config", "add", "expired", "--ca", str(trusted), "--crt", str(crt), "--key", str(key), config=config
    )

    assert_changes_refused(cluster, agent, config, changed_config(cluster, tmp_path))
    assert cluster.kp("-e", agent.address, "get", "mt", config=config, check=False).returncode == 1

    # Renewed with the "Managing PKI" guide's commands, from the OS CA in the machine config.
    (directory / "ca.crt").write_bytes(ca_crt)
    (directory / "ca.key").write_bytes(ca_key)
    for command in (
        ("gen", "key", "--name", "admin"),
        ("gen", "csr", "--key", "admin.key", "--ip", "127.0.0.1"),
        ("gen", "crt", "--ca", "ca", "--csr", "admin.csr", "--name", "admin"),
    ):
        cluster.kp(*command, config=None, cwd=directory)
    cluster.kp(
        "config", "add", "renewed", "--ca", "ca.crt", "--crt", "admin.crt", "--key", "admin.key",
        config=config, cwd=directory,
    )  # fmt: skip
    assert "MachineType" in cluster.kp("-e", agent.address, "get", "mt", config=config).stdout


def test_reader_reads_state_but_no_secrets_and_changes_nothing(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.boot_agent()
    reader = cluster.client_config(name="reader", roles="kubeplane:reader")

    # The reader is a working identity: plain state is readable.
    (mt,) = json_lines(cluster.kp("-e", agent.address, "get", "mt", "-o", "json", config=reader).stdout)
    assert mt["spec"] == {"machineType": "controlplane"}
    assert cluster.kp("-e", agent.address, "version", config=reader).returncode == 0

    errors = assert_changes_refused(cluster, agent, reader, changed_config(cluster, tmp_path))
    assert "PERMISSION_DENIED" in errors[0] or "permission" in errors[0].lower(), errors[0]
    for secrets in ("RootSecrets.secrets.kubeplane.dev", "KubernetesSecrets.secrets.kubeplane.dev"):
        result = cluster.kp("-e", agent.address, "get", secrets, config=reader, check=False)
        assert result.returncode == 1, f"reader listed {secrets}"
    # The admin certificate may do what the reader may not.
    (mc,) = json_lines(cluster.kp("-e", agent.address, "get", "mc", "-o", "json").stdout)
    assert mc["spec"]["machine"]["type"] == "controlplane"


def test_reader_role_survives_proxying(cluster: Cluster, tmp_path: Path) -> None:
    first, second = cluster.boot_agent(), cluster.boot_agent()
    reader = cluster.client_config(name="reader", roles="kubeplane:reader")
    before = second.config_bytes()

    listed = cluster.kp("-e", first.address, "-n", second.address, "get", "mt", config=reader)
    assert second.address in listed.stdout
    for args in (("get", "mc"), ("patch", "mc", "--immediate", "-p", PATCH), ("read", MACHINE_CONFIG_FILE)):
        result = cluster.kp("-e", first.address, "-n", second.address, *args, config=reader, check=False)
        assert result.returncode == 1, f"proxied reader `{' '.join(args)}` was not refused"
    assert second.config_bytes() == before
