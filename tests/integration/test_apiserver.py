"""kube-apiserver from the toolchain cache against a real etcd, with the project's certificates."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from kubeplane import retry
from kubeplane.clients import errors, kube

if TYPE_CHECKING:
    from conftest import ApiServer

pytestmark = pytest.mark.integration


def test_version_through_the_kube_client(start_apiserver: Callable[..., ApiServer]) -> None:
    server = start_apiserver("127.0.0.1")

    def get(kubeconfig: str, path: str) -> dict[str, Any]:
        async def scenario() -> dict[str, Any]:
            async with kube.KubeClient(kubeconfig) as api:
                return await api.get(path)

        return asyncio.run(scenario())

    version = retry.Wait(
        what="kube-apiserver /version", timeout=30, backoff=retry.fixed(0.5), retry_on=kube.RETRYABLE
    ).poll(lambda: get(server.admin_kubeconfig, "/version"))
    assert version["gitVersion"] == "v1.20.2"

    # The admin certificate's O=system:masters is what grants access: a stranger is forbidden.
    namespaces = get(server.admin_kubeconfig, "/api/v1/namespaces")
    assert "kube-system" in {item["metadata"]["name"] for item in namespaces["items"]}
    stranger = server.client_kubeconfig(user="nobody", organizations=[])
    with pytest.raises(errors.KubeForbidden) as caught:
        get(stranger, "/api/v1/namespaces")
    assert caught.value.status == 403
    assert not caught.value.retryable
