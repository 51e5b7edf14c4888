"""kube-apiserver from the toolchain cache against a real etcd, with the project's certificates."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from kubernetes import client as k8s

from kubeplane.clients import kube

if TYPE_CHECKING:
    from conftest import ApiServer

pytestmark = pytest.mark.integration


def test_version_through_the_official_client(start_apiserver: Callable[..., ApiServer]) -> None:
    server = start_apiserver("127.0.0.1")
    api = kube.api_client(server.admin_kubeconfig)
    version = kube.wait_for(
        lambda: k8s.VersionApi(api).get_code(), timeout=30, interval=0.5, describe="kube-apiserver /version"
    )
    assert version.git_version == "v1.20.2"

    # The admin certificate's O=system:masters is what grants access: a stranger is forbidden.
    namespaces = k8s.CoreV1Api(api).list_namespace()
    assert "kube-system" in {item.metadata.name for item in namespaces.items}
    stranger = kube.api_client(server.client_kubeconfig(user="nobody", organizations=[]))
    with pytest.raises(k8s.ApiException) as caught:
        k8s.CoreV1Api(stranger).list_namespace()
    assert caught.value.status == 403
    assert not kube.is_retryable(caught.value)
