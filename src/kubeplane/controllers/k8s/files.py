"""Layout and contents of the per-component secrets directories of the control plane.

Owns three things, all pure: which files each control plane component finds in its secrets
directory (names relative to that directory, with the mode a writer must give them), where that
directory is relative to the node root, and the two configuration files that are rendered rather
than issued (the API server's EncryptionConfiguration and audit Policy). The static pod renderer
takes its flag paths from here, so a file name lives in exactly one place.

Writing the files (atomically, with these modes) is the job of the secrets controller.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import yaml

from kubeplane.controllers.k8s import RenderError

__all__ = [
    "AGGREGATOR_CA_CRT",
    "APISERVER",
    "APISERVER_CRT",
    "APISERVER_KEY",
    "APISERVER_KUBELET_CLIENT_CRT",
    "APISERVER_KUBELET_CLIENT_KEY",
    "AUDIT_POLICY",
    "CA_CRT",
    "CA_KEY",
    "COMPONENTS",
    "CONTROLLER_MANAGER",
    "DEFAULT_SECRETS_ROOT",
    "ENCRYPTION_CONFIG",
    "ETCD_CA_CRT",
    "ETCD_CLIENT_CRT",
    "ETCD_CLIENT_KEY",
    "FRONT_PROXY_CLIENT_CRT",
    "FRONT_PROXY_CLIENT_KEY",
    "KUBECONFIG",
    "LAYOUT",
    "PRIVATE_MODE",
    "PUBLIC_MODE",
    "SCHEDULER",
    "SERVICE_ACCOUNT_KEY",
    "SERVICE_ACCOUNT_PUB",
    "SecretFile",
    "render_audit_policy",
    "render_encryption_config",
    "secret_path",
    "secrets_dir",
]

APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
COMPONENTS = (APISERVER, CONTROLLER_MANAGER, SCHEDULER)

# Relative to the node root: the agent may run with any root directory (a per-node directory in a
# local cluster), so no absolute node path is hard-coded anywhere.
DEFAULT_SECRETS_ROOT = PurePosixPath("system/secrets/kubernetes")

# Components run as root, so readable-by-owner is enough for anything secret; certificates and the
# audit policy are public and readable by all so that debugging does not need root.
PRIVATE_MODE = 0o400
PUBLIC_MODE = 0o444


@dataclass(frozen=True)
class SecretFile:
    """One file in a component's secrets directory: its name there and the mode it must have."""

    name: str
    mode: int

    @property
    def private(self) -> bool:
        """True when the file holds key material and must not be readable by others."""
        return self.mode == PRIVATE_MODE


CA_CRT = SecretFile("ca.crt", PUBLIC_MODE)
CA_KEY = SecretFile("ca.key", PRIVATE_MODE)
APISERVER_CRT = SecretFile("apiserver.crt", PUBLIC_MODE)
APISERVER_KEY = SecretFile("apiserver.key", PRIVATE_MODE)
APISERVER_KUBELET_CLIENT_CRT = SecretFile("apiserver-kubelet-client.crt", PUBLIC_MODE)
APISERVER_KUBELET_CLIENT_KEY = SecretFile("apiserver-kubelet-client.key", PRIVATE_MODE)
ETCD_CA_CRT = SecretFile("etcd-ca.crt", PUBLIC_MODE)
ETCD_CLIENT_CRT = SecretFile("etcd-client.crt", PUBLIC_MODE)
ETCD_CLIENT_KEY = SecretFile("etcd-client.key", PRIVATE_MODE)
SERVICE_ACCOUNT_PUB = SecretFile("service-account.pub", PUBLIC_MODE)
SERVICE_ACCOUNT_KEY = SecretFile("service-account.key", PRIVATE_MODE)
AGGREGATOR_CA_CRT = SecretFile("aggregator-ca.crt", PUBLIC_MODE)
FRONT_PROXY_CLIENT_CRT = SecretFile("front-proxy-client.crt", PUBLIC_MODE)
FRONT_PROXY_CLIENT_KEY = SecretFile("front-proxy-client.key", PRIVATE_MODE)
# Holds the at-rest encryption key.
ENCRYPTION_CONFIG = SecretFile("encryptionconfig.yaml", PRIVATE_MODE)
AUDIT_POLICY = SecretFile("auditpolicy.yaml", PUBLIC_MODE)
# Embeds a client key.
KUBECONFIG = SecretFile("kubeconfig", PRIVATE_MODE)

LAYOUT: dict[str, tuple[SecretFile, ...]] = {
    APISERVER: (
        CA_CRT,
        APISERVER_CRT,
        APISERVER_KEY,
        APISERVER_KUBELET_CLIENT_CRT,
        APISERVER_KUBELET_CLIENT_KEY,
        ETCD_CA_CRT,
        ETCD_CLIENT_CRT,
        ETCD_CLIENT_KEY,
        SERVICE_ACCOUNT_PUB,
        SERVICE_ACCOUNT_KEY,
        AGGREGATOR_CA_CRT,
        FRONT_PROXY_CLIENT_CRT,
        FRONT_PROXY_CLIENT_KEY,
        ENCRYPTION_CONFIG,
        AUDIT_POLICY,
    ),
    CONTROLLER_MANAGER: (CA_CRT, CA_KEY, SERVICE_ACCOUNT_KEY, KUBECONFIG),
    SCHEDULER: (KUBECONFIG,),
}
"""Every file each component expects in its secrets directory, in a stable order."""


def secrets_dir(
    component: str, *, node_root: PurePosixPath, secrets_root: PurePosixPath = DEFAULT_SECRETS_ROOT
) -> PurePosixPath:
    """The secrets directory of `component` on a node whose root directory is `node_root`."""
    if component not in LAYOUT:
        raise RenderError(f"unknown control plane component {component!r}: expected one of {COMPONENTS}")
    if secrets_root.is_absolute():
        raise RenderError(
            f"secrets root {str(secrets_root)!r} must be relative to the node root; drop the leading '/'"
        )
    return node_root / secrets_root / component


def secret_path(
    component: str,
    file: SecretFile,
    *,
    node_root: PurePosixPath,
    secrets_root: PurePosixPath = DEFAULT_SECRETS_ROOT,
) -> PurePosixPath:
    """Where `file` of `component` lives; refuses a file that is not in the component's layout."""
    if file not in LAYOUT.get(component, ()):
        raise RenderError(f"{file.name} is not part of the {component} secrets layout")
    return secrets_dir(component, node_root=node_root, secrets_root=secrets_root) / file.name


# AES-CBC accepts AES-128, AES-192 and AES-256 keys.
_AESCBC_KEY_SIZES = (16, 24, 32)


def render_encryption_config(aescbc_secret: str) -> str:
    """The API server's EncryptionConfiguration: secrets encrypted with aescbc, identity to read old data.

    `aescbc_secret` is the cluster's base64-encoded key (``cluster.aescbcEncryptionSecret``).
    """
    try:
        key = base64.b64decode(aescbc_secret, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RenderError(
            "cluster.aescbcEncryptionSecret is not valid base64; "
            "generate one with: head -c 32 /dev/urandom | base64"
        ) from exc
    if len(key) not in _AESCBC_KEY_SIZES:
        raise RenderError(
            f"cluster.aescbcEncryptionSecret decodes to {len(key)} bytes, expected 16, 24 or 32; "
            "generate one with: head -c 32 /dev/urandom | base64"
        )
    config: dict[str, Any] = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "EncryptionConfiguration",
        "resources": [
            {
                "resources": ["secrets"],
                "providers": [
                    {"aescbc": {"keys": [{"name": "key1", "secret": aescbc_secret}]}},
                    # Listed last so secrets written before encryption was enabled stay readable.
                    {"identity": {}},
                ],
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def render_audit_policy() -> str:
    """The API server's audit Policy: request metadata for every request, never bodies."""
    policy = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}
    return yaml.safe_dump(policy, sort_keys=False)
