"""EtcdSecretsController: the etcd CA and the node's addresses → ``secrets/EtcdSecrets/etcd``.

Spec: ``ca`` (the etcd CA certificate, PEM), ``server``, ``peer``, ``client`` (each ``{crt, key}``),
``inputsFingerprint``. Server and peer certificates are valid for the node's addresses, its
hostname, ``127.0.0.1`` and ``localhost``; the client certificate is what kube-apiserver and the
agent's own etcd client present. Certificates are issued again only when the CA or the node's
names change, or when one is due for renewal.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kubeplane import pki
from kubeplane.controllers.secrets import common, root
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, ReconcileContext

ETCD_SECRETS_ID = "etcd"
#: Common name of the etcd client certificate (kube-apiserver and the agent use it).
CLIENT_CN = "kube-apiserver-etcd-client"
_ISSUED = ("server", "peer", "client")


class EtcdSecretsController:
    """Issues this node's etcd server, peer and client certificates."""

    name = "secrets.EtcdSecretsController"
    inputs = (
        Input(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, root.ETCD_ID),
        Input(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID),
    )
    outputs = (Output(catalog.ETCD_SECRETS),)

    def __init__(self, *, clock: common.Clock = common.utc_now) -> None:
        self._clock = clock

    async def reconcile(self, ctx: ReconcileContext) -> None:
        root_spec = common.running_spec(ctx, catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, root.ETCD_ID)
        addresses = common.running_spec(
            ctx, catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID
        )
        if root_spec is None or addresses is None:
            ctx.cleanup(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, ())
            return
        ca = common.cert_key(root_spec["ca"])
        names = [*addresses.get("addresses", ()), addresses.get("hostname", ""), "127.0.0.1", "localhost"]
        inputs_fingerprint = common.fingerprint({"ca": root_spec["ca"], "names": names})
        now = self._clock()
        existing = common.running_spec(ctx, catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, ETCD_SECRETS_ID)
        issued = {name: str((existing or {}).get(name, {}).get("crt", "")).encode() for name in _ISSUED}
        reason = common.reissue_reason(
            existing, inputs_fingerprint=inputs_fingerprint, issued=issued, now=now
        )
        if reason is not None:
            spec = issue(ca=ca, names=names, now=now) | {common.FINGERPRINT_KEY: inputs_fingerprint}
            ctx.modify(
                catalog.SECRETS_NAMESPACE,
                catalog.ETCD_SECRETS,
                ETCD_SECRETS_ID,
                lambda _: catalog.EtcdSecretSpec(data=spec),
            )
            ctx.logger.info("issued etcd certificates (%s)", reason)
            issued = {name: spec[name]["crt"].encode() for name in _ISSUED}
        common.requeue_for_renewal(ctx, issued.values(), now=now)


def issue(*, ca: pki.CertKey, names: list[str], now: datetime) -> dict[str, Any]:
    """Server, peer and client certificates for a node known by ``names`` (IPs and DNS names mixed)."""
    dns_names, ip_addresses = pki.split_sans(names)
    hostname = next(iter(dns_names), "etcd")

    def peer_cert(common_name: str) -> dict[str, str]:
        return common.pair(
            pki.issue(ca=ca, common_name=common_name, dns_names=dns_names, ip_addresses=ip_addresses, now=now)
        )

    client = pki.issue(ca=ca, common_name=CLIENT_CN, usages=("client",), now=now)
    return {
        "ca": ca.cert.decode(),
        "server": peer_cert(hostname),
        "peer": peer_cert(hostname),
        "client": common.pair(client),
    }
