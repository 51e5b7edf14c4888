"""KubernetesSecretsController: root secrets ``k8s`` + node addresses → ``KubernetesSecrets k8s-certs``.

Spec: ``apiServer``, ``apiServerKubeletClient``, ``frontProxyClient`` (each ``{crt, key}``), the
kubeconfigs ``adminKubeconfig`` (server = the cluster endpoint), ``localAdminKubeconfig``,
``controllerManagerKubeconfig``, ``schedulerKubeconfig`` (``https://127.0.0.1:<port>``), ``issued``
(ISO time) and ``inputsFingerprint``.

Better than the original, which issued everything again on every reconcile: certificates are
kept until an input that went into them changes (CAs, endpoint, SANs, DNS domain, service IP,
node names, admin lifetime — not, say, an image or a bootstrap token) or until one of them is due
for renewal; the controller wakes itself up for that. An operator's request
(``controlplane/CertificateRenewals/k8s-certs``, made by the node API's ``KubernetesCertificatesRenew``
call) re-issues them once when its ``notBefore`` is later than ``issued``
(:func:`~kubeplane.controllers.secrets.common.renewal_requested`); the CAs stay as they are.
"""

from __future__ import annotations

import base64
import urllib.parse
from datetime import datetime, timedelta
from typing import Any

import yaml

from kubeplane import pki
from kubeplane.controllers.secrets import common, root
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, ReconcileContext

KUBERNETES_SECRETS_ID = "k8s-certs"
MASTERS_GROUP = "system:masters"
APISERVER_CN = "kube-apiserver"
APISERVER_KUBELET_CLIENT_CN = "apiserver-kubelet-client"
#: kube-apiserver only accepts front-proxy requests from this name (``--requestheader-allowed-names``).
FRONT_PROXY_CLIENT_CN = "front-proxy-client"
ADMIN_CN = "admin"
CONTROLLER_MANAGER_CN = "system:kube-controller-manager"
SCHEDULER_CN = "system:kube-scheduler"

#: The root-secrets fields a change of which must re-issue the certificates.
_ISSUING_FIELDS = (
    "name",
    "endpoint",
    "localAPIServerPort",
    "certSANs",
    "dnsDomain",
    "apiServiceIP",
    "ca",
    "aggregatorCA",
    "adminCertLifetimeSeconds",
)
_CERTIFICATES = ("apiServer", "apiServerKubeletClient", "frontProxyClient")
_KUBECONFIGS = (
    "adminKubeconfig",
    "localAdminKubeconfig",
    "controllerManagerKubeconfig",
    "schedulerKubeconfig",
)


def local_admin_kubeconfig(ctx: ReconcileContext) -> str | None:
    """The running KubernetesSecrets' ``localAdminKubeconfig`` (a path on the node): None on a
    node without one (a worker) and while the secrets are missing or torn down. Controllers that
    talk to the local API server as admin (and so run on control plane nodes only) read it here."""
    certs = common.running_spec(
        ctx, catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, KUBERNETES_SECRETS_ID
    )
    kubeconfig = certs.get("localAdminKubeconfig") if certs is not None else None
    return str(kubeconfig) if kubeconfig else None


class KubernetesSecretsController:
    """Issues the API server certificates and the control plane kubeconfigs."""

    name = "secrets.KubernetesSecretsController"
    inputs = (
        Input(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, root.K8S_ID),
        Input(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID),
        Input(catalog.CONTROLPLANE_NAMESPACE, catalog.CERTIFICATE_RENEWALS, KUBERNETES_SECRETS_ID),
    )
    outputs = (Output(catalog.KUBERNETES_SECRETS),)

    def __init__(self, *, clock: common.Clock = common.utc_now) -> None:
        self._clock = clock

    async def reconcile(self, ctx: ReconcileContext) -> None:
        root_spec = common.running_spec(ctx, catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, root.K8S_ID)
        addresses = common.running_spec(
            ctx, catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID
        )
        if root_spec is None or addresses is None:
            ctx.cleanup(catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, ())
            return
        node_names = [*addresses.get("addresses", ()), addresses.get("hostname", "")]
        inputs_fingerprint = common.fingerprint(
            {"root": {key: root_spec.get(key) for key in _ISSUING_FIELDS}, "node": node_names}
        )
        now = self._clock()
        existing = common.running_spec(
            ctx, catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, KUBERNETES_SECRETS_ID
        )
        issued = issued_certificates(existing or {})
        request = common.running_spec(
            ctx, catalog.CONTROLPLANE_NAMESPACE, catalog.CERTIFICATE_RENEWALS, KUBERNETES_SECRETS_ID
        )
        reason = common.reissue_reason(
            existing, inputs_fingerprint=inputs_fingerprint, issued=issued, now=now
        ) or common.renewal_requested(existing, request)
        if reason is not None:
            spec = issue(root_spec=root_spec, node_names=node_names, now=now)
            spec[common.FINGERPRINT_KEY] = inputs_fingerprint
            ctx.modify(
                catalog.SECRETS_NAMESPACE,
                catalog.KUBERNETES_SECRETS,
                KUBERNETES_SECRETS_ID,
                lambda _: catalog.KubernetesSecretSpec(data=spec),
            )
            ctx.logger.info("issued Kubernetes certificates and kubeconfigs (%s)", reason)
            issued = issued_certificates(spec)
        common.requeue_for_renewal(ctx, issued.values(), now=now)


def issued_certificates(spec: dict[str, Any]) -> dict[str, bytes]:
    """Every certificate in a ``k8s-certs`` spec by field name, kubeconfig client certificates included."""
    found = {name: str(spec.get(name, {}).get("crt", "")).encode() for name in _CERTIFICATES}
    for name in _KUBECONFIGS:
        found[name] = _kubeconfig_client_cert(str(spec.get(name, "")))
    return found


def _kubeconfig_client_cert(text: str) -> bytes:
    try:
        document = yaml.safe_load(text) or {}
        return base64.b64decode(document["users"][0]["user"]["client-certificate-data"])
    except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError):
        # An unreadable kubeconfig counts as a missing certificate, which re-issues it.
        return b""


def issue(*, root_spec: dict[str, Any], node_names: list[str], now: datetime) -> dict[str, Any]:
    """Every certificate and kubeconfig of the ``k8s-certs`` spec, from the ``k8s`` root secrets."""
    ca = common.cert_key(root_spec["ca"])
    aggregator_ca = common.cert_key(root_spec["aggregatorCA"])
    endpoint = str(root_spec["endpoint"])
    dns_domain = str(root_spec["dnsDomain"])
    local_server = f"https://127.0.0.1:{root_spec['localAPIServerPort']}"
    cluster_name = str(root_spec.get("name") or "kubernetes")
    dns_names, ip_addresses = pki.split_sans(
        [
            urllib.parse.urlsplit(endpoint).hostname or "",
            *root_spec.get("certSANs", ()),
            str(root_spec["apiServiceIP"]),
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{dns_domain}",
            "localhost",
            "127.0.0.1",
            *node_names,
        ]
    )
    api_server = pki.issue(
        ca=ca,
        common_name=APISERVER_CN,
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        usages=("server",),
        now=now,
    )

    def client(common_name: str, *, ca: pki.CertKey = ca, **kwargs: Any) -> pki.CertKey:
        return pki.issue(ca=ca, common_name=common_name, usages=("client",), now=now, **kwargs)

    def kubeconfig(server: str, user: str, cert: pki.CertKey) -> str:
        return pki.kubeconfig(
            cluster_name=cluster_name, server=server, ca_cert=ca.cert, user=user, client=cert
        )

    admin = client(
        ADMIN_CN,
        organizations=(MASTERS_GROUP,),
        lifetime=timedelta(seconds=int(root_spec["adminCertLifetimeSeconds"])),
    )
    return {
        "apiServer": common.pair(api_server),
        "apiServerKubeletClient": common.pair(
            client(APISERVER_KUBELET_CLIENT_CN, organizations=(MASTERS_GROUP,))
        ),
        "frontProxyClient": common.pair(client(FRONT_PROXY_CLIENT_CN, ca=aggregator_ca)),
        "adminKubeconfig": kubeconfig(endpoint, ADMIN_CN, admin),
        "localAdminKubeconfig": kubeconfig(local_server, ADMIN_CN, admin),
        "controllerManagerKubeconfig": kubeconfig(
            local_server, CONTROLLER_MANAGER_CN, client(CONTROLLER_MANAGER_CN)
        ),
        "schedulerKubeconfig": kubeconfig(local_server, SCHEDULER_CN, client(SCHEDULER_CN)),
        "issued": now.isoformat(),
    }
