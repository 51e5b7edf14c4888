"""kubeplane.controllers.secrets: the secret material of a control plane node.

The chain, one controller per module (register them in this order)::

    root.RootSecretsController               MachineConfig → RootSecrets etcd, k8s
    etcd.EtcdSecretsController               RootSecrets etcd + NodeAddresses → EtcdSecrets etcd
    kubernetes.KubernetesSecretsController   RootSecrets k8s + NodeAddresses → KubernetesSecrets k8s-certs
    render.RenderSecretsStaticPodController  all of the above → files, SecretStatuses static-pods
    render_etcd.RenderEtcdSecretsController  EtcdSecrets → files, SecretStatuses etcd

Helpers: ``common`` (input reads, fingerprints of issuing inputs, renewal times, PEM pairs,
secrets versions) and ``disk`` (atomic, change-detecting writes of secret files).

Exceptions::

    kubeplane.controllers.ControllerError
    └── SecretsError            a secret the chain needs is missing or unusable; the message names the
                                config field (``missing cluster.aggregatorCA secret``) and what to do
"""

from __future__ import annotations

from kubeplane.controllers import ControllerError

__all__ = ["SecretsError"]


class SecretsError(ControllerError):
    """A secret the control plane needs is missing or unusable (the message names the config field)."""
