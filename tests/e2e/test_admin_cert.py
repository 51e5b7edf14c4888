"""The PKI guide's "Renewing an expired administrator certificate", verbatim, on a real cluster.

An administrator's client certificate has expired (the test signs one with the cluster's OS CA for
the admin's own key, valid for an hour that ended two hours ago: waiting for a real expiry would
cost the suite minutes). The node itself refuses it during the TLS handshake, and the CLI refuses it
before calling anyone, naming the context and the expiry. Then the guide's commands, as a user
types them in a scratch directory: ``ca.crt``/``ca.key`` from the cluster's secrets bundle and
``admin.key`` from the client config, ``gen csr --key admin.key --ip 127.0.0.1``, ``gen crt --ca
ca --csr admin.csr --name admin``, and the base64 of ``admin.crt`` put into the client config; the
renewed config is an administrator again.

Runs on the shared 1+1 cluster and changes nothing on it."""

from __future__ import annotations

import asyncio
import base64
import datetime
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from e2e_clients import KUBEPLANE

from kubeplane import api, pki
from kubeplane.config import client as client_config

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e


def user(cluster: E2ECluster, directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubeplane ARGS`` typed in ``directory`` (the guide's commands read and write files there)."""
    return subprocess.run(
        [KUBEPLANE, *args],
        cwd=directory,
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def node_accepts(credentials: api.Credentials, node: str) -> bool:
    """Whether the node API completes a call with these credentials, asked directly (no CLI)."""

    async def call() -> bool:
        try:
            async with api.NodeClient([node], credentials=credentials) as client:
                await client.version()
        except api.APIError:
            return False
        return True

    return asyncio.run(call())


def test_an_expired_admin_certificate_is_renewed_with_the_guides_commands(
    cluster_1cp1w: E2ECluster, tmp_path: Path
) -> None:
    cluster, node = cluster_1cp1w, cluster_1cp1w.control_plane[0]
    secrets = yaml.safe_load((cluster.directory / "secrets.yaml").read_text())
    os_ca = pki.CertKey(
        cert=base64.b64decode(secrets["certs"]["os"]["crt"]),
        key=base64.b64decode(secrets["certs"]["os"]["key"]),
    )
    document = yaml.safe_load(cluster.client_config.read_text())
    name = document["context"]
    admin_key = base64.b64decode(document["contexts"][name]["key"])

    expired = pki.issue(
        ca=os_ca,
        common_name="admin",
        organizations=[pki.ROLE_ADMIN],
        usages=["client"],
        key=admin_key,
        lifetime=datetime.timedelta(hours=1),
        now=datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=3),
    )
    document["contexts"][name]["crt"] = base64.b64encode(expired.cert).decode()
    old = tmp_path / "kubeplaneconfig"
    old.write_text(yaml.safe_dump(document))
    old.chmod(0o600)

    # The node refuses the expired certificate itself; a valid one for the same key is accepted.
    context = client_config.current(client_config.load(cluster.client_config))[1]
    assert not node_accepts(api.Credentials(ca=os_ca.cert, cert=expired.cert, key=admin_key), f"{node}:50000")
    assert node_accepts(
        api.Credentials(ca=os_ca.cert, cert=context.client.cert, key=admin_key), f"{node}:50000"
    )

    refused = user(cluster, tmp_path, "--kubeplaneconfig", str(old), "-n", node, "version")
    assert refused.returncode == 1
    assert f"the client certificate of context {name!r} in {old} expired at" in refused.stderr
    assert "Renewing an expired administrator certificate" in refused.stderr

    # The guide: save the CA and the admin key, make a CSR, sign it, base64 it into the config.
    (tmp_path / "ca.crt").write_bytes(os_ca.cert)
    (tmp_path / "ca.key").write_bytes(os_ca.key)
    (tmp_path / "admin.key").write_bytes(admin_key)
    for args in (
        ("gen", "csr", "--key", "admin.key", "--ip", "127.0.0.1"),
        ("gen", "crt", "--ca", "ca", "--csr", "admin.csr", "--name", "admin"),
    ):
        step = user(cluster, tmp_path, *args)
        assert step.returncode == 0, step.stdout + step.stderr
    renewed = (tmp_path / "admin.crt").read_bytes()
    info = pki.cert_info(renewed)
    assert info.organizations == (pki.ROLE_ADMIN,) and info.not_after > datetime.datetime.now(datetime.UTC)
    document["contexts"][name]["crt"] = base64.b64encode(renewed).decode()
    old.write_text(yaml.safe_dump(document))

    version = user(cluster, tmp_path, "--kubeplaneconfig", str(old), "-n", node, "version")
    assert version.returncode == 0, version.stdout + version.stderr
    # An administrator again: the etcd member list is an admin-only call.
    members = user(cluster, tmp_path, "--kubeplaneconfig", str(old), "-n", node, "etcd", "members")
    assert members.returncode == 0, members.stdout + members.stderr
    assert node in members.stdout
