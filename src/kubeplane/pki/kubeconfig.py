"""Rendering kubeconfig files (clusters/users/contexts YAML with inline base64 credentials)."""

from __future__ import annotations

import base64

import yaml

from kubeplane.pki import certs


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def kubeconfig(
    *,
    cluster_name: str,
    server: str,
    ca_cert: bytes,
    user: str,
    client: certs.CertKey,
    context: str | None = None,
) -> str:
    """A single-cluster kubeconfig whose current context is ``context`` (default ``USER@CLUSTER``)."""
    context_name = context or f"{user}@{cluster_name}"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [{"name": context_name, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": context_name,
        "preferences": {},
    }
    return yaml.safe_dump(document, sort_keys=False)
