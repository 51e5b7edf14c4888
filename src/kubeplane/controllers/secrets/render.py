"""RenderSecretsStaticPodController: secrets resources → component files → ``SecretStatuses static-pods``.

Writes ``<secrets>/kubernetes/<component>/`` for kube-apiserver, kube-controller-manager and
kube-scheduler exactly as :data:`kubeplane.controllers.k8s.files.LAYOUT` lists them (the static pod
flags point there), directories 0700, key material 0400, certificates 0444, each file atomically
and only when its bytes change. Then publishes ``controlplane/SecretStatuses/static-pods``
``{ready: true, version, issued}``; the version — the static pods'
``kubeplane.dev/secrets-version`` annotation — goes up only when some file's content changed, so
the kubelet restarts the components exactly when their secrets did; ``issued`` is the
``KubernetesSecrets`` issue time of the files written, so a caller that asked for a renewal knows
which version carries it. Without all inputs the status is removed (the static pod controller
then removes the pods); files already on disk are left in place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from kubeplane import pki
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import files
from kubeplane.controllers.secrets import common, disk, etcd, kubernetes, root
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, OutputKind, ReconcileContext

_COMPONENT_KUBECONFIG = {
    files.CONTROLLER_MANAGER: "controllerManagerKubeconfig",
    files.SCHEDULER: "schedulerKubeconfig",
}


class RenderSecretsStaticPodController:
    """Writes the control plane components' secrets to disk and reports their version."""

    name = "secrets.RenderSecretsStaticPodController"
    inputs = (
        Input(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS),
        Input(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd.ETCD_SECRETS_ID),
        Input(catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, kubernetes.KUBERNETES_SECRETS_ID),
    )
    # Shared: RenderEtcdSecretsController publishes the ``etcd`` status of the same type.
    outputs = (Output(catalog.SECRET_STATUSES, OutputKind.SHARED),)

    def __init__(self, *, paths: NodePaths) -> None:
        self._paths = paths
        self._version = 0

    async def reconcile(self, ctx: ReconcileContext) -> None:
        def secrets(type_name: str, resource_id: str) -> dict[str, Any] | None:
            return common.running_spec(ctx, catalog.SECRETS_NAMESPACE, type_name, resource_id)

        root_k8s = secrets(catalog.ROOT_SECRETS, root.K8S_ID)
        etcd_secrets = secrets(catalog.ETCD_SECRETS, etcd.ETCD_SECRETS_ID)
        k8s_secrets = secrets(catalog.KUBERNETES_SECRETS, kubernetes.KUBERNETES_SECRETS_ID)
        if root_k8s is None or etcd_secrets is None or k8s_secrets is None:
            ctx.cleanup(catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, ())
            return
        contents = component_files(root_k8s=root_k8s, etcd_secrets=etcd_secrets, k8s_secrets=k8s_secrets)
        changed = await asyncio.to_thread(self._write, contents)
        existing = common.running_spec(
            ctx, catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, catalog.STATIC_POD_SECRETS_ID
        )
        self._version = common.next_version(existing, changed=changed, last=self._version)
        status = catalog.SecretStatusSpec(
            ready=True, version=str(self._version), issued=str(k8s_secrets.get("issued", ""))
        )
        ctx.modify(
            catalog.CONTROLPLANE_NAMESPACE,
            catalog.SECRET_STATUSES,
            catalog.STATIC_POD_SECRETS_ID,
            lambda _: status,
        )
        if changed:
            ctx.logger.info("wrote static pod secrets to disk (secrets version %d)", self._version)

    def _write(self, contents: Mapping[str, Mapping[files.SecretFile, bytes]]) -> bool:
        """Write every component's files (blocking I/O: run in a thread); True when any changed."""
        disk.ensure_dir(self._paths.secrets)
        changed = False
        for component, component_contents in contents.items():
            directory = Path(files.secrets_dir(component, node_root=PurePosixPath(self._paths.root)))
            disk.ensure_dir(directory.parent)
            written = {file.name: (content, file.mode) for file, content in component_contents.items()}
            changed = disk.write_files(directory, written) or changed
        return changed


def component_files(
    *, root_k8s: Mapping[str, Any], etcd_secrets: Mapping[str, Any], k8s_secrets: Mapping[str, Any]
) -> dict[str, dict[files.SecretFile, bytes]]:
    """The bytes of every file of every component, by component name and :class:`files.SecretFile`."""
    service_account_key = str(root_k8s["serviceAccount"]["key"]).encode()
    shared = {
        files.CA_CRT: root_k8s["ca"]["crt"],
        files.CA_KEY: root_k8s["ca"]["key"],
        files.APISERVER_CRT: k8s_secrets["apiServer"]["crt"],
        files.APISERVER_KEY: k8s_secrets["apiServer"]["key"],
        files.APISERVER_KUBELET_CLIENT_CRT: k8s_secrets["apiServerKubeletClient"]["crt"],
        files.APISERVER_KUBELET_CLIENT_KEY: k8s_secrets["apiServerKubeletClient"]["key"],
        files.ETCD_CA_CRT: etcd_secrets["ca"],
        files.ETCD_CLIENT_CRT: etcd_secrets["client"]["crt"],
        files.ETCD_CLIENT_KEY: etcd_secrets["client"]["key"],
        files.SERVICE_ACCOUNT_PUB: pki.public_key_pem(service_account_key).decode(),
        files.SERVICE_ACCOUNT_KEY: service_account_key.decode(),
        files.AGGREGATOR_CA_CRT: root_k8s["aggregatorCA"]["crt"],
        files.FRONT_PROXY_CLIENT_CRT: k8s_secrets["frontProxyClient"]["crt"],
        files.FRONT_PROXY_CLIENT_KEY: k8s_secrets["frontProxyClient"]["key"],
        files.ENCRYPTION_CONFIG: files.render_encryption_config(str(root_k8s["aescbcEncryptionSecret"])),
        files.AUDIT_POLICY: files.render_audit_policy(),
    }
    result: dict[str, dict[files.SecretFile, bytes]] = {}
    for component, layout in files.LAYOUT.items():
        kubeconfig = k8s_secrets.get(_COMPONENT_KUBECONFIG.get(component, ""), "")
        result[component] = {
            file: str(kubeconfig if file == files.KUBECONFIG else shared[file]).encode() for file in layout
        }
    return result
