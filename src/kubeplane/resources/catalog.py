"""The resource types of a kubeplane node: namespaces, type names, spec classes and definitions.

Controllers refer to types through the constants here (``catalog.STATIC_PODS``) and build specs
with the classes here. Shapes are kept small on purpose; the controllers that produce a type
document what they put in it. Field names are shown as they appear in ``-o yaml``:

==============================  ============  ================================================
type (id examples)              namespace     spec
==============================  ============  ================================================
MachineConfigs (v1alpha1)       config        the machine config document (generic dict)
MachineTypes (machine-type)     config        ``machineType``: init | controlplane | join
KubernetesControlPlaneConfigs   config        generic dict per component (images, args, ...)
RootSecrets (etcd, k8s)         secrets       generic dict of PEMs and tokens
EtcdSecrets, KubernetesSecrets  secrets       generic dict of PEMs and kubeconfigs
SecretStatuses (static-pods)    controlplane  ``ready``, ``version`` (secrets-version annotation),
                                              ``issued`` (of the KubernetesSecrets on disk)
CertificateRenewals (k8s-certs) controlplane  ``notBefore``: re-issue what was issued before it
StaticPods (kube-apiserver)     controlplane  ``pod``: the Pod object written for the kubelet
StaticPodStatuses               controlplane  ``podStatus``: the pod's ``status`` from the kubelet
Manifests (10-kube-proxy)       controlplane  ``items``: Kubernetes objects to create
ManifestStatuses                controlplane  ``manifestsApplied`` ids, ``errors`` id → message
BootstrapStatuses               runtime       ``selfHostedControlPlane``
Services (etcd, kubelet)        runtime       ``running``, ``healthy``, ``unknown``
TimeStatuses (node)             runtime       ``synced``, ``syncDisabled``, ``servers``, ``source``,
                                              ``stratum``, ``offset``, ``leapStatus``, ``error``
NodeAddresses (current)         network       ``hostname``, ``addresses`` (published by the agent)
PodNetworkStatuses (current)    network       ``podCidr``, ``routes``, ``skipped``, ``error`` (host-gw)
MachineAddresses (eth0/IP/len)  network       ``link``, ``address``, ``owned``, ``field`` (machine.network)
MachineRoutes (eth0/NET/metric) network       ``link``, ``network``, ``gateway``, ``metric``, ``owned``,
                                              ``field``
MachineLinks (eth0)             network       ``mtu``, ``up``, ``operState``, ``configuredMtu``, ``field``
MachineNetworkStatuses          network       ``hostname``, ``nameservers``, ``extraHostEntries``,
(current)                                     ``errors``, ``unsupported``
WireguardDevices (wg0)          network       ``publicKey``, ``listenPort``, ``peers`` (public keys,
                                              endpoints, allowed IPs, latest handshakes)
VipStatuses (10.5.0.100)        network       ``ip``, ``link``, ``owner``, ``held``, ``reason`` (shared VIP)
==============================  ============  ================================================

Sensitivity. A type is ``sensitive`` (only the admin role may get, list or watch it) when any of
its resources may hold key material, a token, a kubeconfig with credentials, or content the user
wrote that may hold either. The reader role sees every other type in full, so a type is only left
readable when none of its resources can carry a secret:

- sensitive: MachineConfigs (the whole config: CA keys, tokens), RootSecrets, EtcdSecrets and
  KubernetesSecrets (PEM keys, tokens, kubeconfigs), Manifests (the bootstrap token Secret and
  any inline or downloaded manifest, which may hold Secrets) and KubernetesControlPlaneConfigs
  (``extra-manifests`` holds ``cluster.extraManifestHeaders``, e.g. an Authorization header, and
  the inline manifests' contents);
- readable: MachineTypes, SecretStatuses (a readiness flag, a version and a time, no secret),
  CertificateRenewals (a time),
  StaticPods (pods reference their secrets by file path only), StaticPodStatuses,
  ManifestStatuses (manifest ids and apply errors, which name objects), BootstrapStatuses,
  Services, TimeStatuses (NTP server names and the sync state), NodeAddresses,
  PodNetworkStatuses (CIDRs, node names and addresses), the machine
  network's MachineAddresses, MachineRoutes, MachineLinks and MachineNetworkStatuses (addresses,
  routes, link settings, the hostname, resolvers and extra host entries, config field paths),
  WireguardDevices (public keys only, never the private key; peer endpoints), VipStatuses (an
  address, a link and node names), and the
  ``meta`` types (definitions and namespaces).

Readers have no need for the sensitive types: ManifestStatuses tell which manifests were applied,
StaticPods show what each component runs.

SecretStatuses live in ``controlplane`` (not ``secrets``): they carry no secret, only the
readiness the static pod controller waits on, so a reader-role client may see them; so do
CertificateRenewals, an operator's request for new certificates (a time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kubeplane.resources.definitions import (
    Namespace,
    PrintColumn,
    Registry,
    ResourceDefinition,
    format_cell,
)
from kubeplane.resources.resource import Resource
from kubeplane.resources.specs import DictSpec, Spec

CONFIG_NAMESPACE = "config"
CONTROLPLANE_NAMESPACE = "controlplane"
EXTRAS_NAMESPACE = "extras"
NETWORK_NAMESPACE = "network"
RUNTIME_NAMESPACE = "runtime"
SECRETS_NAMESPACE = "secrets"

STATIC_PODS = "StaticPods.kubernetes.kubeplane.dev"
STATIC_POD_STATUSES = "StaticPodStatuses.kubernetes.kubeplane.dev"
MANIFESTS = "Manifests.kubernetes.kubeplane.dev"
MANIFEST_STATUSES = "ManifestStatuses.kubernetes.kubeplane.dev"
SECRET_STATUSES = "SecretStatuses.kubernetes.kubeplane.dev"  # noqa: S105 (a type name, not a secret)
CERTIFICATE_RENEWALS = "CertificateRenewals.kubernetes.kubeplane.dev"
KUBERNETES_CONTROL_PLANE_CONFIGS = "KubernetesControlPlaneConfigs.config.kubeplane.dev"
MACHINE_CONFIGS = "MachineConfigs.config.kubeplane.dev"
MACHINE_TYPES = "MachineTypes.config.kubeplane.dev"
BOOTSTRAP_STATUSES = "BootstrapStatuses.runtime.kubeplane.dev"
ROOT_SECRETS = "RootSecrets.secrets.kubeplane.dev"
KUBERNETES_SECRETS = "KubernetesSecrets.secrets.kubeplane.dev"
ETCD_SECRETS = "EtcdSecrets.secrets.kubeplane.dev"
SERVICES = "Services.runtime.kubeplane.dev"
NODE_ADDRESSES = "NodeAddresses.network.kubeplane.dev"
POD_NETWORK_STATUSES = "PodNetworkStatuses.network.kubeplane.dev"
MACHINE_ADDRESSES = "MachineAddresses.network.kubeplane.dev"
MACHINE_ROUTES = "MachineRoutes.network.kubeplane.dev"
MACHINE_LINKS = "MachineLinks.network.kubeplane.dev"
MACHINE_NETWORK_STATUSES = "MachineNetworkStatuses.network.kubeplane.dev"
WIREGUARD_DEVICES = "WireguardDevices.network.kubeplane.dev"
VIP_STATUSES = "VipStatuses.network.kubeplane.dev"
TIME_STATUSES = "TimeStatuses.runtime.kubeplane.dev"

#: Well-known ids.
MACHINE_CONFIG_ID = "v1alpha1"
MACHINE_TYPE_ID = "machine-type"
BOOTSTRAP_STATUS_ID = "control-plane"
STATIC_POD_SECRETS_ID = "static-pods"
NODE_ADDRESSES_ID = "current"
TIME_STATUS_ID = "node"


@dataclasses.dataclass(frozen=True)
class MachineConfigSpec(DictSpec):
    """The whole machine config document (secret-bearing)."""


@dataclasses.dataclass(frozen=True)
class MachineTypeSpec(Spec):
    """The node's machine type: ``init``, ``controlplane`` or ``join``."""

    machine_type: str


@dataclasses.dataclass(frozen=True)
class KubernetesControlPlaneConfigSpec(DictSpec):
    """Configuration of one control plane component or manifest set, as the producing controller defines."""


@dataclasses.dataclass(frozen=True)
class RootSecretSpec(DictSpec):
    """Cluster-wide secret material (CAs, keys, tokens) taken from the machine config."""


@dataclasses.dataclass(frozen=True)
class KubernetesSecretSpec(DictSpec):
    """Certificates and kubeconfigs generated for the Kubernetes control plane components."""


@dataclasses.dataclass(frozen=True)
class EtcdSecretSpec(DictSpec):
    """etcd peer and client certificates of this node."""


@dataclasses.dataclass(frozen=True)
class SecretStatusSpec(Spec):
    """Whether the component secrets are on disk, which version of them, and when the Kubernetes
    certificates among them were issued (``kubeplane certs renew`` waits for a renewal's)."""

    ready: bool = False
    version: str = ""
    issued: str = ""


@dataclasses.dataclass(frozen=True)
class CertificateRenewalSpec(Spec):
    """A request to re-issue the certificates of a secrets resource issued before ``not_before``.

    An ISO 8601 time, not a counter: asking again with the same time changes nothing, and the
    request is answered once the certificates' ``issued`` time reaches it.
    """

    not_before: str


@dataclasses.dataclass(frozen=True)
class StaticPodSpec(Spec):
    """A Pod object (apiVersion/kind/metadata/spec) for the kubelet manifest directory."""

    pod: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class StaticPodStatusSpec(Spec):
    """The ``status`` of a static pod as the kubelet reports it."""

    pod_status: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class ManifestSpec(Spec):
    """Kubernetes objects to create in the cluster, in order."""

    items: Sequence[Mapping[str, Any]] = ()


@dataclasses.dataclass(frozen=True)
class ManifestStatusSpec(Spec):
    """Outcome of applying the manifests: ids applied, and an error message per manifest id that failed."""

    manifests_applied: Sequence[str] = ()
    errors: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class BootstrapStatusSpec(Spec):
    """Whether the control plane is still self-hosted (the etcd ``initialized`` key says so)."""

    self_hosted_control_plane: bool = False


@dataclasses.dataclass(frozen=True)
class ServiceSpec(Spec):
    """State of a supervised service; ``unknown`` when there is no health check result yet."""

    running: bool = False
    healthy: bool = False
    unknown: bool = True


@dataclasses.dataclass(frozen=True)
class TimeStatusSpec(Spec):
    """The node's time sync (``machine.time``): whether its ``chronyd`` is ``synced``, or
    ``syncDisabled`` (no servers, or ``disabled``: nothing runs), the configured ``servers``, the
    selected ``source`` (an address), its ``stratum`` (plus one), the clock's ``offset`` from NTP
    time in seconds (positive: ahead), chrony's ``leapStatus``, and the last ``error``."""

    synced: bool = False
    sync_disabled: bool = True
    servers: Sequence[str] = ()
    source: str = ""
    stratum: int = 0
    offset: float = 0.0
    leap_status: str = ""
    error: str = ""


@dataclasses.dataclass(frozen=True)
class NodeAddressesSpec(Spec):
    """The node's name and IPv4 addresses (loopback excluded), as certificates and etcd need them."""

    hostname: str = ""
    addresses: Sequence[str] = ()


@dataclasses.dataclass(frozen=True)
class PodNetworkStatusSpec(Spec):
    """The host-gw pod network of the node: its pod CIDR, its routes to other nodes' pods
    (``cidr``, ``via``, ``node``), the nodes it cannot route to with the reason, the last error."""

    pod_cidr: str = ""
    routes: Sequence[Mapping[str, str]] = ()
    skipped: Sequence[Mapping[str, str]] = ()
    error: str = ""


@dataclasses.dataclass(frozen=True)
class MachineAddressSpec(Spec):
    """An address ``machine.network`` configures on ``link``: ``owned`` when kubeplane added it
    (and so removes it once unconfigured), false when it was there already; ``field`` is the
    config field asking for it."""

    link: str = ""
    address: str = ""
    owned: bool = False
    field: str = ""


@dataclasses.dataclass(frozen=True)
class MachineRouteSpec(Spec):
    """A main-table route ``machine.network`` configures (``gateway`` empty: on-link); ``owned``
    as for addresses."""

    link: str = ""
    network: str = ""
    gateway: str = ""
    metric: int = 0
    owned: bool = False
    field: str = ""


@dataclasses.dataclass(frozen=True)
class MachineLinkSpec(Spec):
    """A configured interface as the kernel shows it (``mtu``, ``up``, ``operState``, its link
    ``kind``: ``bond``, ``vlan``, ``wireguard``..., empty for a physical link; the ``master`` bond
    of a bond's slave; a VLAN's ``parent`` and ``vlanId``) and the MTU asked for
    (``configuredMtu``, None when the config leaves it)."""

    mtu: int = 0
    up: bool = False
    oper_state: str = ""
    kind: str = ""
    master: str = ""
    parent: str = ""
    vlan_id: int | None = None
    configured_mtu: int | None = None
    field: str = ""


@dataclasses.dataclass(frozen=True)
class WireguardDeviceSpec(Spec):
    """A WireGuard device of ``machine.network`` as it reports itself: its ``publicKey`` (what its
    peers configure), ``listenPort``, and per peer ``publicKey``, ``endpoint``, ``allowedIPs``,
    ``persistentKeepaliveInterval`` (seconds), ``latestHandshake`` (Unix seconds, 0: none yet),
    ``rxBytes`` and ``txBytes``."""

    public_key: str = ""
    listen_port: int = 0
    peers: Sequence[Mapping[str, Any]] = ()


@dataclasses.dataclass(frozen=True)
class VipStatusSpec(Spec):
    """A shared VIP of ``machine.network`` as this node sees its election: the ``ip`` on
    ``link``, its ``owner`` (node name; empty while none is known), whether this node ``held``
    it, and the ``reason`` of the last change (elected, who holds it, why it was given up)."""

    ip: str = ""
    link: str = ""
    owner: str = ""
    held: bool = False
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class MachineNetworkStatusSpec(Spec):
    """The rest of ``machine.network`` as applied (``hostname``, ``nameservers``,
    ``extraHostEntries`` lines), the ``errors`` that kept the whole of it from being applied, and
    the fields it ``unsupported`` (not implemented)."""

    hostname: str = ""
    nameservers: Sequence[str] = ()
    extra_host_entries: Sequence[str] = ()
    errors: Sequence[str] = ()
    unsupported: Sequence[str] = ()


def _error_count(resource: Resource) -> str:
    spec = resource.spec
    return str(len(spec.errors)) if isinstance(spec, MachineNetworkStatusSpec) else ""


def _peer_count(resource: Resource) -> str:
    spec = resource.spec
    return str(len(spec.peers)) if isinstance(spec, WireguardDeviceSpec) else ""


def _route_count(resource: Resource) -> str:
    spec = resource.spec
    return str(len(spec.routes)) if isinstance(spec, PodNetworkStatusSpec) else ""


def _pod_ready(resource: Resource) -> str:
    spec = resource.spec
    if not isinstance(spec, StaticPodStatusSpec):
        return ""
    for condition in spec.pod_status.get("conditions", ()):
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return str(condition.get("status", ""))
    return ""


def _service_health(resource: Resource) -> str:
    spec = resource.spec
    if not isinstance(spec, ServiceSpec):
        return ""
    return "?" if spec.unknown else format_cell(spec.healthy)


NAMESPACE_LIST = (
    Namespace(CONFIG_NAMESPACE, "Machine configuration and what is derived from it"),
    Namespace(CONTROLPLANE_NAMESPACE, "Control plane static pods, manifests and their status"),
    Namespace(EXTRAS_NAMESPACE, "Extra manifests downloaded from URLs or given inline"),
    Namespace(NETWORK_NAMESPACE, "Node name and addresses, machine network, pod network"),
    Namespace(RUNTIME_NAMESPACE, "Services and bootstrap state of the node"),
    Namespace(SECRETS_NAMESPACE, "Secret material: CAs, certificates, keys, tokens"),
)

DEFINITIONS = (
    ResourceDefinition(
        type=STATIC_PODS,
        display_type="StaticPod",
        default_namespace=CONTROLPLANE_NAMESPACE,
        spec_type=StaticPodSpec,
    ),
    ResourceDefinition(
        type=STATIC_POD_STATUSES,
        display_type="StaticPodStatus",
        default_namespace=CONTROLPLANE_NAMESPACE,
        spec_type=StaticPodStatusSpec,
        aliases=("podstatus", "podstatuses"),
        print_columns=(PrintColumn("READY", func=_pod_ready),),
    ),
    ResourceDefinition(
        type=MANIFESTS,
        display_type="Manifest",
        default_namespace=CONTROLPLANE_NAMESPACE,
        spec_type=ManifestSpec,
        sensitive=True,
    ),
    ResourceDefinition(
        type=MANIFEST_STATUSES,
        display_type="ManifestStatus",
        default_namespace=CONTROLPLANE_NAMESPACE,
        spec_type=ManifestStatusSpec,
    ),
    ResourceDefinition(
        type=SECRET_STATUSES,
        display_type="SecretStatus",
        default_namespace=CONTROLPLANE_NAMESPACE,
        spec_type=SecretStatusSpec,
        print_columns=(
            PrintColumn("READY", json_path="ready"),
            PrintColumn("SECRETS VERSION", json_path="version"),
        ),
    ),
    ResourceDefinition(
        type=CERTIFICATE_RENEWALS,
        display_type="CertificateRenewal",
        default_namespace=CONTROLPLANE_NAMESPACE,
        spec_type=CertificateRenewalSpec,
        print_columns=(PrintColumn("NOT BEFORE", json_path="notBefore"),),
    ),
    ResourceDefinition(
        type=KUBERNETES_CONTROL_PLANE_CONFIGS,
        display_type="KubernetesControlPlaneConfig",
        default_namespace=CONFIG_NAMESPACE,
        spec_type=KubernetesControlPlaneConfigSpec,
        sensitive=True,
    ),
    ResourceDefinition(
        type=MACHINE_CONFIGS,
        display_type="MachineConfig",
        default_namespace=CONFIG_NAMESPACE,
        spec_type=MachineConfigSpec,
        sensitive=True,
    ),
    ResourceDefinition(
        type=MACHINE_TYPES,
        display_type="MachineType",
        default_namespace=CONFIG_NAMESPACE,
        spec_type=MachineTypeSpec,
        print_columns=(PrintColumn("TYPE", json_path="machineType"),),
    ),
    ResourceDefinition(
        type=BOOTSTRAP_STATUSES,
        display_type="BootstrapStatus",
        default_namespace=RUNTIME_NAMESPACE,
        spec_type=BootstrapStatusSpec,
        print_columns=(PrintColumn("SELF HOSTED", json_path="selfHostedControlPlane"),),
    ),
    ResourceDefinition(
        type=ROOT_SECRETS,
        display_type="RootSecret",
        default_namespace=SECRETS_NAMESPACE,
        spec_type=RootSecretSpec,
        sensitive=True,
    ),
    ResourceDefinition(
        type=KUBERNETES_SECRETS,
        display_type="KubernetesSecret",
        default_namespace=SECRETS_NAMESPACE,
        spec_type=KubernetesSecretSpec,
        sensitive=True,
    ),
    ResourceDefinition(
        type=ETCD_SECRETS,
        display_type="EtcdSecret",
        default_namespace=SECRETS_NAMESPACE,
        spec_type=EtcdSecretSpec,
        sensitive=True,
    ),
    ResourceDefinition(
        type=SERVICES,
        display_type="Service",
        default_namespace=RUNTIME_NAMESPACE,
        spec_type=ServiceSpec,
        aliases=("svc",),
        print_columns=(
            PrintColumn("RUNNING", json_path="running"),
            PrintColumn("HEALTHY", func=_service_health),
        ),
    ),
    ResourceDefinition(
        type=TIME_STATUSES,
        display_type="TimeStatus",
        default_namespace=RUNTIME_NAMESPACE,
        spec_type=TimeStatusSpec,
        aliases=("time",),
        print_columns=(
            PrintColumn("SYNCED", json_path="synced"),
            PrintColumn("SOURCE", json_path="source"),
            PrintColumn("STRATUM", json_path="stratum"),
        ),
    ),
    ResourceDefinition(
        type=NODE_ADDRESSES,
        display_type="NodeAddress",
        default_namespace=NETWORK_NAMESPACE,
        spec_type=NodeAddressesSpec,
        print_columns=(PrintColumn("ADDRESSES", json_path="addresses"),),
    ),
    ResourceDefinition(
        type=POD_NETWORK_STATUSES,
        display_type="PodNetworkStatus",
        default_namespace=NETWORK_NAMESPACE,
        spec_type=PodNetworkStatusSpec,
        aliases=("podnetwork", "pns"),
        print_columns=(
            PrintColumn("POD CIDR", json_path="podCidr"),
            PrintColumn("ROUTES", func=_route_count),
        ),
    ),
    ResourceDefinition(
        type=MACHINE_ADDRESSES,
        display_type="MachineAddress",
        default_namespace=NETWORK_NAMESPACE,
        spec_type=MachineAddressSpec,
        aliases=("addresses", "address"),
        print_columns=(
            PrintColumn("LINK", json_path="link"),
            PrintColumn("ADDRESS", json_path="address"),
            PrintColumn("OWNED", json_path="owned"),
        ),
    ),
    ResourceDefinition(
        type=MACHINE_ROUTES,
        display_type="MachineRoute",
        default_namespace=NETWORK_NAMESPACE,
        spec_type=MachineRouteSpec,
        aliases=("routes", "route"),
        print_columns=(
            PrintColumn("NETWORK", json_path="network"),
            PrintColumn("GATEWAY", json_path="gateway"),
            PrintColumn("METRIC", json_path="metric"),
            PrintColumn("OWNED", json_path="owned"),
        ),
    ),
    ResourceDefinition(
        type=MACHINE_LINKS,
        display_type="MachineLink",
        default_namespace=NETWORK_NAMESPACE,
        spec_type=MachineLinkSpec,
        aliases=("links", "link"),
        print_columns=(
            PrintColumn("KIND", json_path="kind"),
            PrintColumn("MASTER", json_path="master"),
            PrintColumn("MTU", json_path="mtu"),
            PrintColumn("UP", json_path="up"),
            PrintColumn("STATE", json_path="operState"),
        ),
    ),
    ResourceDefinition(
        type=WIREGUARD_DEVICES,
        display_type="WireguardDevice",
        default_namespace=NETWORK_NAMESPACE,
        spec_type=WireguardDeviceSpec,
        aliases=("wireguard", "wg"),
        print_columns=(
            PrintColumn("PUBLIC KEY", json_path="publicKey"),
            PrintColumn("PORT", json_path="listenPort"),
            PrintColumn("PEERS", func=_peer_count),
        ),
    ),
    ResourceDefinition(
        type=VIP_STATUSES,
        display_type="VipStatus",
        default_namespace=NETWORK_NAMESPACE,
        spec_type=VipStatusSpec,
        aliases=("vip", "vips"),
        print_columns=(
            PrintColumn("LINK", json_path="link"),
            PrintColumn("OWNER", json_path="owner"),
            PrintColumn("HELD", json_path="held"),
        ),
    ),
    ResourceDefinition(
        type=MACHINE_NETWORK_STATUSES,
        display_type="MachineNetworkStatus",
        default_namespace=NETWORK_NAMESPACE,
        spec_type=MachineNetworkStatusSpec,
        aliases=("machinenetwork", "netstatus"),
        print_columns=(
            PrintColumn("HOSTNAME", json_path="hostname"),
            PrintColumn("ERRORS", func=_error_count),
        ),
    ),
)


def default_registry() -> Registry:
    """A fresh registry with every namespace and resource type of a kubeplane node."""
    return Registry(namespaces=NAMESPACE_LIST, definitions=DEFINITIONS)
