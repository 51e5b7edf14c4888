"""RenderEtcdSecretsController: ``secrets/EtcdSecrets/etcd`` → ``<secrets>/etcd/`` → ``SecretStatuses etcd``.

The etcd service reads its TLS material from :func:`etcd_secrets_dir`: ``ca.crt``,
``server.crt``/``server.key``, ``peer.crt``/``peer.key``, ``client.crt``/``client.key`` (keys 0400,
certificates 0444, directory 0700), written atomically and only when their bytes change. The
``controlplane/SecretStatuses/etcd`` status ``{ready, version}`` tells it the files are there and
(by its version) when they changed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import files
from kubeplane.controllers.secrets import common, disk, etcd
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, OutputKind, ReconcileContext

ETCD_STATUS_ID = "etcd"
CA_CRT = "ca.crt"
SERVER_CRT, SERVER_KEY = "server.crt", "server.key"
PEER_CRT, PEER_KEY = "peer.crt", "peer.key"
CLIENT_CRT, CLIENT_KEY = "client.crt", "client.key"


def etcd_secrets_dir(paths: NodePaths) -> Path:
    """Where the etcd service finds its certificates on this node."""
    return paths.secrets / "etcd"


class RenderEtcdSecretsController:
    """Writes this node's etcd certificates for the etcd service and reports their version."""

    name = "secrets.RenderEtcdSecretsController"
    inputs = (Input(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd.ETCD_SECRETS_ID),)
    # Shared: RenderSecretsStaticPodController publishes the ``static-pods`` status of the same type.
    outputs = (Output(catalog.SECRET_STATUSES, OutputKind.SHARED),)

    def __init__(self, *, paths: NodePaths) -> None:
        self._paths = paths
        self._version = 0

    async def reconcile(self, ctx: ReconcileContext) -> None:
        secrets = common.running_spec(
            ctx, catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd.ETCD_SECRETS_ID
        )
        if secrets is None:
            ctx.cleanup(catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, ())
            return
        changed = await asyncio.to_thread(self._write, etcd_files(secrets))
        existing = common.running_spec(
            ctx, catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, ETCD_STATUS_ID
        )
        self._version = common.next_version(existing, changed=changed, last=self._version)
        status = catalog.SecretStatusSpec(ready=True, version=str(self._version))
        ctx.modify(catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, ETCD_STATUS_ID, lambda _: status)
        if changed:
            ctx.logger.info("wrote etcd secrets to disk (secrets version %d)", self._version)

    def _write(self, contents: dict[str, tuple[bytes, int]]) -> bool:
        """Write the etcd secrets directory (blocking I/O: run in a thread); True when anything changed."""
        disk.ensure_dir(self._paths.secrets)
        return disk.write_files(etcd_secrets_dir(self._paths), contents)


def etcd_files(secrets: dict[str, Any]) -> dict[str, tuple[bytes, int]]:
    """``file name → (content, mode)`` of the etcd secrets directory."""
    contents = {CA_CRT: (str(secrets["ca"]), files.PUBLIC_MODE)}
    for kind in ("server", "peer", "client"):
        contents[f"{kind}.crt"] = (str(secrets[kind]["crt"]), files.PUBLIC_MODE)
        contents[f"{kind}.key"] = (str(secrets[kind]["key"]), files.PRIVATE_MODE)
    return {name: (text.encode(), mode) for name, (text, mode) in contents.items()}
