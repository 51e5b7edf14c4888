"""RootSecretsController: the machine config's cluster secrets → ``secrets/RootSecrets`` ``etcd`` and ``k8s``.

Spec of ``k8s`` (PEM strings, not base64): ``name``, ``endpoint``, ``localEndpoint``
(``https://localhost:<port>``), ``localAPIServerPort``, ``certSANs`` (``cluster.apiServer.certSANs``
then ``machine.certSANs``), ``dnsDomain``, ``apiServiceIP``, ``ca{crt,key}``, ``aggregatorCA{crt,key}``,
``serviceAccount{key}``, ``aescbcEncryptionSecret``, ``bootstrapToken``, ``adminCertLifetimeSeconds``.
Spec of ``etcd``: ``ca{crt,key}``.

Only control plane nodes (``init``, ``controlplane``) have them; on a worker both are removed, and
the rest of the chain then removes what it derived from them. A missing secret removes only the
resource that needs it and fails the reconcile with ``missing <field> secret``: a config from a
self-hosted control plane lacks ``cluster.aggregatorCA``, and its etcd must keep running so that
``convert-k8s`` can add it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kubeplane import config
from kubeplane.config import models
from kubeplane.config.scalars import decode_base64
from kubeplane.controllers.secrets import SecretsError, common
from kubeplane.resources import Spec, catalog
from kubeplane.runtime import Input, Output, ReconcileContext

ETCD_ID = "etcd"
K8S_ID = "k8s"

#: Lifetime of the admin kubeconfig certificate when ``cluster.adminKubeconfig.certLifetime`` is unset.
DEFAULT_ADMIN_CERT_LIFETIME = timedelta(days=365)

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {
    "ns": timedelta(microseconds=0.001),
    "us": timedelta(microseconds=1),
    "µs": timedelta(microseconds=1),
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
}

# A config from a self-hosted (pre-static-pod) cluster lacks these; the hint says how to fix it.
_MISSING_HINT = (
    "configs of a self-hosted control plane lack it and `kubeplane convert-k8s` adds it; otherwise "
    "add it with `kubeplane patch mc --immediate` at /{path}, or regenerate the configs of a new "
    "cluster with `kubeplane gen config`"
)


def parse_duration(text: str) -> timedelta:
    """A Go-style duration (``8760h``, ``1h30m``, ``0``) as a timedelta."""
    if text == "0":
        return timedelta(0)
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise SecretsError(f"{text!r} is not a duration: expected e.g. 8760h, 30m or 1h30m")
    return sum((float(number) * _DURATION_UNITS[unit] for number, unit in parts), timedelta(0))


class RootSecretsController:
    """Publishes the cluster CAs and keys a control plane node issues everything else from."""

    name = "secrets.RootSecretsController"
    inputs = (Input(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID),)
    outputs = (Output(catalog.ROOT_SECRETS),)

    async def reconcile(self, ctx: ReconcileContext) -> None:
        data = common.running_spec(
            ctx, catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID
        )
        model = config.MachineConfig.from_dict(data).model if data is not None else None
        if model is None or not model.machine.is_control_plane:
            ctx.cleanup(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, ())
            return
        builders = {ETCD_ID: etcd_spec, K8S_ID: k8s_spec}
        specs: dict[str, dict[str, Any]] = {}
        problems: list[str] = []
        for resource_id, build in builders.items():
            try:
                specs[resource_id] = build(model)
            except SecretsError as exc:
                problems.append(str(exc))
        for resource_id, spec in specs.items():
            ctx.modify(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, resource_id, _replace_with(spec))
        ctx.cleanup(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, specs.keys())
        if problems:
            raise SecretsError("; ".join(problems))


def _replace_with(data: dict[str, Any]) -> Callable[[Spec | None], Spec]:
    spec = catalog.RootSecretSpec(data=data)
    return lambda _: spec


def _missing(path: str) -> SecretsError:
    return SecretsError(f"missing {path} secret: {_MISSING_HINT.format(path=path.replace('.', '/'))}")


def _required_pair(value: models.CertificateAndKey | None, path: str) -> dict[str, str]:
    if value is None or not value.crt or not value.key:
        raise _missing(path)
    return {"crt": value.crt_pem().decode(), "key": value.key_pem().decode()}


def etcd_spec(model: models.Config) -> dict[str, Any]:
    """The ``etcd`` root secrets: the etcd CA (``cluster.etcd.ca``)."""
    etcd = model.cluster.etcd
    return {"ca": _required_pair(etcd.ca if etcd else None, "cluster.etcd.ca")}


def k8s_spec(model: models.Config) -> dict[str, Any]:
    """The ``k8s`` root secrets (see the module docstring); SecretsError names a missing secret."""
    cluster, machine = model.cluster, model.machine
    ca = _required_pair(cluster.ca, "cluster.ca")
    aggregator_ca = _required_pair(cluster.aggregator_ca, "cluster.aggregatorCA")
    if cluster.service_account is None or not cluster.service_account.key:
        raise _missing("cluster.serviceAccount")
    if not cluster.aescbc_encryption_secret:
        raise _missing("cluster.aescbcEncryptionSecret")
    lifetime_text = cluster.admin_kubeconfig.cert_lifetime if cluster.admin_kubeconfig else None
    lifetime = parse_duration(lifetime_text) if lifetime_text else timedelta(0)
    port = cluster.local_api_server_port
    cert_sans = [
        *((cluster.api_server.cert_sans or []) if cluster.api_server else []),
        *(machine.cert_sans or []),
    ]
    return {
        "name": cluster.cluster_name or "",
        "endpoint": cluster.control_plane.endpoint,
        "localEndpoint": f"https://localhost:{port}",
        "localAPIServerPort": port,
        "certSANs": list(dict.fromkeys(cert_sans)),
        "dnsDomain": cluster.dns_domain,
        "apiServiceIP": cluster.api_service_ip,
        "ca": ca,
        "aggregatorCA": aggregator_ca,
        "serviceAccount": {"key": decode_base64(cluster.service_account.key).decode()},
        "aescbcEncryptionSecret": cluster.aescbc_encryption_secret,
        "bootstrapToken": cluster.token or "",
        "adminCertLifetimeSeconds": int((lifetime or DEFAULT_ADMIN_CERT_LIFETIME).total_seconds()),
    }
