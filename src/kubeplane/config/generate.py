"""Generating a cluster's machine configs, its secrets bundle and the matching client config.

:func:`new_secrets` makes every secret a cluster needs (CAs, keys, tokens) as a
:class:`SecretsBundle`; :func:`generate` turns a bundle plus :class:`GenOptions` into the
``v1alpha1`` documents for each machine type and a client config holding an admin certificate for
the node API. Documents are plain dicts built in the original's key order, so the emitted YAML is
stable and familiar; secrets inside them are base64 of PEM, as the original writes them.

Worker documents carry CA certificates only: a worker never holds a CA private key, the
aggregator CA, the service account key or the encryption secret.

Pure: no file access. The ``kubeplane gen`` commands do the reading and writing.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import yaml

from kubeplane import pki
from kubeplane.config import client, defaults, errors
from kubeplane.config import document as config_document
from kubeplane.config import patch as config_patch

#: kubeplane runs the kubelet binary of the local toolchain; the image name records its version.
KUBELET_IMAGE = "kubeplane/kubelet"
ADMIN_CERT_LIFETIME = timedelta(days=365)
#: Machine types :func:`generate` produces, in output order.
MACHINE_TYPES = ("init", "controlplane", "worker")

Document = dict[str, Any]
#: An RFC 6902 JSON patch (a list of operations) or an RFC 7386 merge patch (a mapping).
Patch = list[Any] | Document


class GenerateError(ValueError):
    """Generation inputs are invalid (endpoint, secrets bundle, patch); the message says which and why."""


@dataclasses.dataclass(frozen=True)
class SecretsBundle:
    """Everything secret about a cluster; regenerating configs from the same bundle keeps the PKI."""

    cluster_id: str
    cluster_secret: str
    bootstrap_token: str
    aescbc_encryption_secret: str
    trustd_token: str
    os_ca: pki.CertKey
    kubernetes_ca: pki.CertKey
    etcd_ca: pki.CertKey
    aggregator_ca: pki.CertKey
    service_account_key: bytes


@dataclasses.dataclass(frozen=True)
class GenOptions:
    """What ``gen config`` is asked for besides the secrets."""

    cluster_name: str
    endpoint: str
    kubernetes_version: str = defaults.KUBERNETES_VERSION
    additional_sans: tuple[str, ...] = ()
    dns_domain: str = defaults.DEFAULT_DNS_DOMAIN
    #: Registry host (or ``*``) -> mirror endpoints, in the order given.
    registry_mirrors: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: Node API endpoints of the client config context (default: the host of ``endpoint``).
    client_endpoints: tuple[str, ...] = ()
    with_init: bool = False
    #: ``machine.ports`` of every config (None: the default 50000 and 50001, left out of the file).
    node_api_port: int | None = None
    trustd_port: int | None = None
    #: Applied in order to every document (see :func:`parse_patch`), then each result is validated.
    patches: tuple[Patch, ...] = ()


@dataclasses.dataclass(frozen=True)
class GeneratedConfigs:
    """Machine config documents by machine type (``init`` only when asked for) and the client config."""

    documents: Mapping[str, Document]
    client_config: client.ClientConfig


# --- secrets ----------------------------------------------------------------------------------


def new_secrets() -> SecretsBundle:
    """Generate a fresh bundle: ECDSA P-256 CAs (10 years), tokens and symmetric secrets."""
    return SecretsBundle(
        cluster_id=pki.random_secret(),
        cluster_secret=pki.random_secret(),
        bootstrap_token=pki.bootstrap_token(),
        aescbc_encryption_secret=pki.random_secret(),
        trustd_token=pki.bootstrap_token(),
        os_ca=pki.new_ca("kubeplane", organization="kubeplane"),
        kubernetes_ca=pki.new_ca("kubernetes", organization="kubernetes"),
        etcd_ca=pki.new_ca("etcd", organization="etcd"),
        aggregator_ca=pki.aggregator_ca(),
        service_account_key=pki.service_account_key(),
    )


def secrets_to_dict(bundle: SecretsBundle) -> Document:
    """The bundle file's document (field names as the original's ``secrets.yaml``)."""
    return {
        "cluster": {"id": bundle.cluster_id, "secret": bundle.cluster_secret},
        "secrets": {
            "bootstraptoken": bundle.bootstrap_token,
            "aescbcencryptionsecret": bundle.aescbc_encryption_secret,
        },
        "trustdinfo": {"token": bundle.trustd_token},
        "certs": {
            "etcd": _pair(bundle.etcd_ca),
            "k8s": _pair(bundle.kubernetes_ca),
            "k8saggregator": _pair(bundle.aggregator_ca),
            "k8sserviceaccount": {"key": _b64(bundle.service_account_key)},
            "os": _pair(bundle.os_ca),
        },
    }


def secrets_from_dict(document: object, *, source: str = "secrets bundle") -> SecretsBundle:
    """Read a bundle document back; every missing or malformed field is reported at once."""
    problems: list[str] = []

    def text(*path: str) -> str:
        node: object = document
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, str) or not node:
            problems.append(f"{'.'.join(path)}: missing (expected a non-empty string)")
            return ""
        return node

    def pem(*path: str) -> bytes:
        value = text(*path)
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            problems.append(f"{'.'.join(path)}: not valid base64 of a PEM document")
            return b""

    def pair(name: str) -> pki.CertKey:
        return pki.CertKey(cert=pem("certs", name, "crt"), key=pem("certs", name, "key"))

    bundle = SecretsBundle(
        cluster_id=text("cluster", "id"),
        cluster_secret=text("cluster", "secret"),
        bootstrap_token=text("secrets", "bootstraptoken"),
        aescbc_encryption_secret=text("secrets", "aescbcencryptionsecret"),
        trustd_token=text("trustdinfo", "token"),
        os_ca=pair("os"),
        kubernetes_ca=pair("k8s"),
        etcd_ca=pair("etcd"),
        aggregator_ca=pair("k8saggregator"),
        service_account_key=pem("certs", "k8sserviceaccount", "key"),
    )
    if not problems:
        for name, ca in (
            ("os", bundle.os_ca),
            ("k8s", bundle.kubernetes_ca),
            ("etcd", bundle.etcd_ca),
            ("k8saggregator", bundle.aggregator_ca),
        ):
            try:
                pki.cert_info(ca.cert)
                pki.load_private_key(ca.key)
            except pki.PKIError as exc:
                problems.append(f"certs.{name}: {exc}")
    if problems:
        raise GenerateError(
            f"{len(problems)} problem(s) in {source}:\n" + "\n".join(f"  {p}" for p in problems)
        )
    return bundle


def load_secrets(text: str, *, source: str = "secrets bundle") -> SecretsBundle:
    """Parse a bundle from YAML text (as written by :func:`dump_yaml` of :func:`secrets_to_dict`)."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GenerateError(f"{source} is not valid YAML: {exc}") from exc
    return secrets_from_dict(document, source=source)


# --- machine configs ---------------------------------------------------------------------------


def normalize_endpoint(endpoint: str) -> str:
    """``host``, ``host:port`` or a URL -> ``https://host:port`` (port 6443 unless given)."""
    raw = endpoint.strip()
    parsed = urllib.parse.urlsplit(raw if "://" in raw else f"https://{raw}")
    try:
        port = parsed.port
    except ValueError as exc:
        raise GenerateError(f"endpoint {endpoint!r} has an invalid port: {exc}") from exc
    if parsed.scheme != "https" or not parsed.hostname or parsed.path not in ("", "/"):
        raise GenerateError(
            f"endpoint {endpoint!r} is not a control plane URL: give https://HOST[:PORT] "
            "(the load balancer or first control plane node)"
        )
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return f"https://{host}:{port or defaults.DEFAULT_LOCAL_API_SERVER_PORT}"


def normalize_version(version: str) -> str:
    """``1.20.2`` or ``v1.20.2`` -> ``v1.20.2``."""
    stripped = version.strip()
    parts = stripped.removeprefix("v").split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise GenerateError(f"Kubernetes version {version!r} is not a version: use e.g. v1.20.2")
    return "v" + stripped.removeprefix("v")


def generate(options: GenOptions, secrets: SecretsBundle) -> GeneratedConfigs:
    """Build the machine config documents and the client config for one cluster."""
    if not options.cluster_name.strip():
        raise GenerateError("cluster name is empty: give the cluster a name")
    endpoint = normalize_endpoint(options.endpoint)
    version = normalize_version(options.kubernetes_version)
    host = urllib.parse.urlsplit(endpoint).hostname or ""
    types = MACHINE_TYPES if options.with_init else MACHINE_TYPES[1:]
    documents: dict[str, Document] = {}
    for machine_type in types:
        document = _document(
            machine_type=machine_type, options=options, secrets=secrets, endpoint=endpoint, version=version
        )
        try:
            document = apply_patches(document, options.patches)
        except errors.ConfigError as exc:
            subject = f"generated {machine_type}.yaml, {exc.subject}"
            raise GenerateError(str(errors.ConfigError(exc.errors, subject=subject))) from exc
        documents[machine_type] = document
    admin = pki.issue(
        ca=secrets.os_ca,
        common_name="admin",
        organizations=[pki.ROLE_ADMIN],
        usages=["client"],
        lifetime=ADMIN_CERT_LIFETIME,
    )
    context = client.Context.from_pem(
        endpoints=options.client_endpoints or (_node_api_endpoint(host, documents),),
        ca=secrets.os_ca.cert,
        client=admin,
    )
    client_config = client.add_context(client.ClientConfig(), options.cluster_name, context)
    return GeneratedConfigs(documents=documents, client_config=client_config)


def _node_api_endpoint(host: str, documents: Mapping[str, Document]) -> str:
    """The client endpoint of ``host`` with the node API's port of the configs (options or patches)."""
    ports = next(iter(documents.values()))["machine"].get("ports") or {}
    return node_api_endpoint(host, ports.get("nodeAPI"))


def node_api_endpoint(host: str, port: int | None) -> str:
    """A client endpoint of the node API: ``host``, or ``host:port`` (``[v6]:port``) when ``port``
    is not the default (None is the default)."""
    if port is None or port == defaults.DEFAULT_NODE_API_PORT:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _document(
    *, machine_type: str, options: GenOptions, secrets: SecretsBundle, endpoint: str, version: str
) -> Document:
    control_plane = machine_type != "worker"

    def ca(pair: pki.CertKey) -> Document:
        return _pair(pair) if control_plane else {"crt": _b64(pair.cert)}

    machine: Document = {
        "type": machine_type,
        "token": secrets.trustd_token,
        "ca": ca(secrets.os_ca),
        "certSANs": list(options.additional_sans),
        "kubelet": {"image": f"{KUBELET_IMAGE}:{version}"},
        "network": {},
    }
    ports = {"nodeAPI": options.node_api_port, "trustd": options.trustd_port}
    if any(port is not None for port in ports.values()):
        machine["ports"] = {name: port for name, port in ports.items() if port is not None}
    if options.registry_mirrors:
        machine["registries"] = {
            "mirrors": {host: {"endpoints": list(urls)} for host, urls in options.registry_mirrors.items()}
        }
    cluster: Document = {
        "controlPlane": {"endpoint": endpoint},
        "clusterName": options.cluster_name,
        "network": {
            "dnsDomain": options.dns_domain,
            "podSubnets": list(defaults.DEFAULT_POD_SUBNETS),
            "serviceSubnets": list(defaults.DEFAULT_SERVICE_SUBNETS),
        },
        "token": secrets.bootstrap_token,
    }
    if control_plane:
        host = urllib.parse.urlsplit(endpoint).hostname or ""
        cluster.update(
            {
                "aescbcEncryptionSecret": secrets.aescbc_encryption_secret,
                "ca": ca(secrets.kubernetes_ca),
                "aggregatorCA": ca(secrets.aggregator_ca),
                "serviceAccount": {"key": _b64(secrets.service_account_key)},
                "apiServer": {
                    "image": defaults.image(defaults.KUBE_APISERVER_IMAGE, version),
                    "certSANs": list(dict.fromkeys([host, *options.additional_sans])),
                },
                "controllerManager": {
                    "image": defaults.image(defaults.KUBE_CONTROLLER_MANAGER_IMAGE, version)
                },
                "proxy": {"image": defaults.image(defaults.KUBE_PROXY_IMAGE, version)},
                "scheduler": {"image": defaults.image(defaults.KUBE_SCHEDULER_IMAGE, version)},
                "etcd": {"ca": ca(secrets.etcd_ca)},
                "extraManifests": [],
                "inlineManifests": [],
            }
        )
    else:
        cluster.update(
            {
                "ca": ca(secrets.kubernetes_ca),
                "proxy": {"image": defaults.image(defaults.KUBE_PROXY_IMAGE, version)},
            }
        )
    return {
        "version": defaults.CONFIG_VERSION,
        "debug": False,
        "persist": True,
        "machine": machine,
        "cluster": cluster,
    }


# --- patches -----------------------------------------------------------------------------------


def parse_patch(text: str, *, source: str = "config patch") -> Patch:
    """A JSON/YAML text: a list is an RFC 6902 JSON patch, a mapping an RFC 7386 merge patch."""
    try:
        patch = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GenerateError(f"{source} is neither JSON nor YAML: {exc}") from exc
    if isinstance(patch, list | dict):
        return patch
    raise GenerateError(
        f"{source} must be a list of JSON patch operations or a mapping to merge, got {type(patch).__name__}"
    )


def apply_patches(document: Document, patches: Sequence[Patch]) -> Document:
    """Apply patches in order and return the validated result; ``document`` itself is never changed.

    Uses :mod:`kubeplane.config.patch`, so ``gen --config-patch`` behaves exactly like patching a
    node's config later; raises ``ConfigError`` naming the failing operation or field.
    """
    machine_config = config_document.MachineConfig.from_dict(document)
    for number, patch in enumerate(patches, start=1):
        try:
            if isinstance(patch, list):
                machine_config = config_patch.apply_json_patch(machine_config, patch)
            else:
                machine_config = config_patch.apply_merge_patch(machine_config, patch)
        except errors.ConfigError as exc:
            raise errors.ConfigError(exc.errors, subject=f"config patch #{number} ({exc.subject})") from exc
    return machine_config.to_dict()


# --- output -----------------------------------------------------------------------------------


def dump_yaml(document: object) -> str:
    """YAML in the document's own key order (block style), as every generated file is written."""
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=1 << 16)


def _pair(pair: pki.CertKey) -> Document:
    return {"crt": _b64(pair.cert), "key": _b64(pair.key)}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def parse_mirrors(values: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``HOST=URL`` flags -> host -> endpoints (repeating a host adds endpoints in order)."""
    mirrors: dict[str, tuple[str, ...]] = {}
    for value in values:
        host, sep, url = value.partition("=")
        if not sep or not host.strip() or not url.strip():
            raise GenerateError(
                f"registry mirror {value!r} is not HOST=URL: e.g. docker.io=http://10.5.0.1:6000 or '*=http://...'"
            )
        mirrors[host.strip()] = (*mirrors.get(host.strip(), ()), url.strip())
    return mirrors
