"""How the k8s controllers reach the node's etcd: keys, a client per EtcdSecrets version, a watch.

The agent's own etcd client uses the ``client`` certificate of ``secrets/EtcdSecrets/etcd`` and the
etcd CA. :class:`EtcdConnection` keeps one :class:`~kubeplane.clients.etcd.EtcdClient` and replaces
it when the secrets change (a new certificate needs a new TLS context), so a polling controller
does not pay a TLS handshake per reconcile.

:func:`wait_for_change` watches one key through etcd's JSON gateway (``/v3/watch``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from kubeplane.clients import etcd as etcd_client
from kubeplane.resources import Resource

DEFAULT_ENDPOINTS = ("https://127.0.0.1:2379",)
ETCD_SECRETS_ID = "etcd"

KEY_PREFIX = b"kubeplane:v1:"
#: ``"true"`` while the control plane is self-hosted (BootstrapStatusController reads it).
INITIALIZED_KEY = KEY_PREFIX + b"initialized"
#: Serialises bootstrap manifest application across control plane nodes.
MANIFEST_APPLY_MUTEX = KEY_PREFIX + b"manifestApplyMutex"


def _pem(value: Any, *, field: str) -> bytes:
    # The CA may come as a PEM string or as a {crt: PEM} pair.
    if isinstance(value, Mapping):
        value = value.get("crt")
    if not isinstance(value, str) or not value:
        raise ValueError(f"secrets/EtcdSecrets/etcd has no PEM in {field}; wait for the etcd secrets")
    return value.encode()


def client_from_secrets(
    data: Mapping[str, Any], *, endpoints: Sequence[str] = DEFAULT_ENDPOINTS
) -> etcd_client.EtcdClient:
    """An etcd client authenticated with the ``client`` pair of an EtcdSecrets spec."""
    client = data.get("client") or {}
    tls = etcd_client.tls_context(
        ca=_pem(data.get("ca"), field="ca"),
        cert=_pem(client.get("crt"), field="client.crt"),
        key=_pem(client.get("key"), field="client.key"),
    )
    return etcd_client.EtcdClient(list(endpoints), tls=tls)


class EtcdConnection:
    """One etcd client, rebuilt when the EtcdSecrets resource it was made from changes."""

    def __init__(self, endpoints: Sequence[str] = DEFAULT_ENDPOINTS) -> None:
        self.endpoints = tuple(endpoints)
        self._client: etcd_client.EtcdClient | None = None
        self._version: int | None = None

    async def client(self, secrets: Resource) -> etcd_client.EtcdClient:
        """The client for ``secrets`` (an EtcdSecrets resource)."""
        if self._client is None or self._version != secrets.metadata.version:
            await self.aclose()
            self._client = client_from_secrets(secrets.spec.to_dict(), endpoints=self.endpoints)
            self._version = secrets.metadata.version
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        self._client, self._version = None, None


async def wait_for_change(
    client: etcd_client.EtcdClient, key: bytes, *, start_revision: int, timeout: float
) -> bool:
    """Watch ``key`` from ``start_revision``; True at its first change, False after ``timeout`` s.

    Raises :class:`~kubeplane.clients.errors.EtcdError` when the watch cannot be opened or breaks.
    """
    with contextlib.suppress(TimeoutError):
        watch = client.watch(key, start_revision=start_revision)
        async with asyncio.timeout(timeout), contextlib.aclosing(watch) as changes:
            async for _ in changes:
                return True
    return False
