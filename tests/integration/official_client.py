"""The official ``kubernetes`` client for integration tests that check kubeplane's work with an
independent client (a dev dependency only; kubeplane itself uses :mod:`kubeplane.clients.kube`)."""

from __future__ import annotations

from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config


def api_client(kubeconfig: str) -> Any:
    """A ``kubernetes.client.ApiClient`` from kubeconfig text (never ``~/.kube`` or ``$KUBECONFIG``)."""
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config_from_dict(
        yaml.safe_load(kubeconfig), client_configuration=configuration, persist_config=False
    )
    return k8s_client.ApiClient(configuration)
