"""Pydantic models of the ``v1alpha1`` machine configuration.

Field names are the document's own (``extraArgs``, ``certSANs``, ``aescbcEncryptionSecret``) via
aliases, so configs written for the original system load unchanged; unknown keys are rejected.
Field-level checks (CIDRs, URLs, base64, paths) live in the field types (:mod:`.scalars`); rules
that relate several fields live in :mod:`.validate`. Every optional field defaults to ``None``
(absent), and the helpers on the models apply the documented defaults from :mod:`.defaults`, so a
model always says what the file says.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kubeplane.config import defaults
from kubeplane.config.scalars import (
    CIDR,
    HTTPSURL,
    URL,
    AbsPath,
    Base64,
    Bool,
    DNSDomain,
    Duration,
    EnvName,
    Int,
    IPAddress,
    NonEmptyStr,
    PEMBase64,
    Port,
    Str,
    UInt8,
    UInt16,
    UInt32,
    WireguardKey,
    decode_base64,
)


class Model(BaseModel):
    """Base of every config model: document field names, no unknown keys, no silent coercion."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        strict=False,
        defer_build=True,
    )


# --- shared pieces ----------------------------------------------------------------------------


class CertificateAndKey(Model):
    """A PEM certificate and its private key, each base64-encoded (``key`` is empty on workers)."""

    crt: PEMBase64 = ""
    key: PEMBase64 = ""

    def crt_pem(self) -> bytes:
        """The decoded PEM certificate."""
        return decode_base64(self.crt)

    def key_pem(self) -> bytes:
        """The decoded PEM private key (empty when the config carries no key)."""
        return decode_base64(self.key)


class Volume(Model):
    """A host path mounted into a control plane static pod."""

    host_path: AbsPath
    mount_path: AbsPath
    readonly: Bool | None = None


class ExtraMount(Model):
    """An OCI-style mount into the kubelet container."""

    destination: AbsPath
    type: Str | None = None
    source: Str | None = None
    options: list[Str] | None = None


# --- machine ---------------------------------------------------------------------------------


class NodeIP(Model):
    valid_subnets: list[CIDR] | None = None


class Kubelet(Model):
    image: NonEmptyStr | None = None
    extra_args: dict[Str, Str] | None = None
    extra_mounts: list[ExtraMount] | None = None
    cluster_dns: list[IPAddress] | None = Field(default=None, alias="clusterDNS")
    register_with_fqdn: Bool | None = Field(default=None, alias="registerWithFQDN")
    node_ip: NodeIP | None = Field(default=None, alias="nodeIP")


class Route(Model):
    network: CIDR
    gateway: IPAddress | None = None
    metric: UInt32 | None = None


class DHCPOptions(Model):
    route_metric: UInt32 | None = None
    ipv4: Bool | None = None
    ipv6: Bool | None = None


BondMode = Literal[
    "balance-rr", "active-backup", "balance-xor", "broadcast", "802.3ad", "balance-tlb", "balance-alb"
]


class Bond(Model):
    """Linux bonding driver options, named as in the original (``lacpRate``, ``xmitHashPolicy``...)."""

    interfaces: list[NonEmptyStr] | None = None
    arp_ip_target: list[IPAddress] | None = Field(default=None, alias="arpIPTarget")
    mode: BondMode | None = None
    xmit_hash_policy: Literal["layer2", "layer3+4", "layer2+3", "encap2+3", "encap3+4"] | None = None
    lacp_rate: Literal["slow", "fast"] | None = None
    ad_actor_system: Str | None = None
    arp_validate: (
        Literal["none", "active", "backup", "all", "filter", "filter_active", "filter_backup"] | None
    ) = None
    arp_all_targets: Literal["any", "all"] | None = None
    primary: Str | None = None
    primary_reselect: Literal["always", "better", "failure"] | None = None
    fail_over_mac: Literal["none", "active", "follow"] | None = None
    ad_select: Literal["stable", "bandwidth", "count"] | None = None
    miimon: UInt32 | None = None
    updelay: UInt32 | None = None
    downdelay: UInt32 | None = None
    arp_interval: UInt32 | None = None
    resend_igmp: UInt32 | None = None
    min_links: UInt32 | None = None
    lp_interval: UInt32 | None = None
    packets_per_slave: UInt32 | None = None
    num_peer_notif: UInt8 | None = None
    tlb_dynamic_lb: UInt8 | None = None
    all_slaves_active: UInt8 | None = None
    use_carrier: Bool | None = None
    ad_actor_sys_prio: UInt16 | None = None
    ad_user_port_key: UInt16 | None = None
    peer_notify_delay: UInt32 | None = None


class VLAN(Model):
    vlan_id: Int = Field(ge=1, le=4094)
    cidr: CIDR | None = None
    routes: list[Route] | None = None
    dhcp: Bool | None = None
    mtu: UInt32 | None = None


class WireguardPeer(Model):
    public_key: WireguardKey
    endpoint: Str | None = None
    persistent_keepalive_interval: Duration | None = None
    allowed_ips: list[CIDR] | None = Field(default=None, alias="allowedIPs")


class Wireguard(Model):
    private_key: WireguardKey
    listen_port: Port | None = None
    firewall_mark: UInt32 | None = None
    peers: list[WireguardPeer] | None = None


class VIP(Model):
    """A shared IP that the control plane nodes elect an owner for (control plane nodes only)."""

    ip: IPAddress


class Interface(Model):
    interface: NonEmptyStr
    cidr: CIDR | None = None
    #: More addresses besides ``cidr`` (later releases of the original added the field; the
    #: guide's way, one entry per address under the same interface name, works as well).
    addresses: list[CIDR] | None = None
    routes: list[Route] | None = None
    bond: Bond | None = None
    vlans: list[VLAN] | None = None
    mtu: Int | None = Field(default=None, ge=68, le=65536)
    dhcp: Bool | None = None
    ignore: Bool | None = None
    dummy: Bool | None = None
    dhcp_options: DHCPOptions | None = None
    wireguard: Wireguard | None = None
    vip: VIP | None = None


class ExtraHost(Model):
    ip: IPAddress
    aliases: list[NonEmptyStr] | None = None


class MachineNetwork(Model):
    hostname: Str | None = None
    interfaces: list[Interface] | None = None
    nameservers: list[IPAddress] | None = None
    extra_host_entries: list[ExtraHost] | None = None


class Partition(Model):
    mountpoint: AbsPath
    size: Str | None = None


class Disk(Model):
    device: NonEmptyStr
    partitions: list[Partition] | None = None


class Install(Model):
    """Where and what to install on a real machine (``metal`` mode only; ignored elsewhere)."""

    disk: Str | None = None
    extra_kernel_args: list[Str] | None = None
    image: Str | None = None
    bootloader: Bool | None = None
    wipe: Bool | None = None
    force: Bool | None = None
    legacy_bios_support: Bool | None = Field(default=None, alias="legacyBIOSSupport")


class File(Model):
    """A file the node writes at boot: ``create`` (new file), ``append`` or ``overwrite``."""

    content: Str
    permissions: UInt32 | None = None
    path: AbsPath
    op: Literal["create", "append", "overwrite"]


class Time(Model):
    """The node's time sync (:mod:`kubeplane.services.timesync`); ``servers`` are ``HOST[:PORT]``."""

    disabled: Bool | None = None
    servers: list[NonEmptyStr] | None = None
    boot_timeout: Duration | None = None


class RegistryMirror(Model):
    endpoints: list[URL]


class RegistryTLS(Model):
    insecure_skip_verify: Bool | None = None
    ca: PEMBase64 | None = None
    client_identity: CertificateAndKey | None = None


class RegistryAuth(Model):
    username: Str | None = None
    password: Str | None = None
    auth: Str | None = None
    identity_token: Str | None = None


class RegistryConfig(Model):
    tls: RegistryTLS | None = None
    auth: RegistryAuth | None = None


class Registries(Model):
    mirrors: dict[NonEmptyStr, RegistryMirror] | None = None
    config: dict[NonEmptyStr, RegistryConfig] | None = None


class StaticKey(Model):
    passphrase: NonEmptyStr


class NodeIDKey(Model):
    """A key derived from the node's UUID and the partition label; it has no settings."""


class EncryptionKey(Model):
    static: StaticKey | None = None
    node_id: NodeIDKey | None = Field(default=None, alias="nodeID")
    slot: Int | None = Field(default=None, ge=0, le=31)


class EncryptionConfig(Model):
    provider: Literal["luks2"] = defaults.DEFAULT_DISK_ENCRYPTION_PROVIDER
    keys: list[EncryptionKey] | None = None
    cipher: (
        Literal["aes-xts-plain64", "xchacha12,aes-adiantum-plain64", "xchacha20,aes-adiantum-plain64"] | None
    ) = None
    key_size: UInt32 | None = None
    block_size: UInt32 | None = None
    options: list[Str] | None = None


class SystemDiskEncryption(Model):
    state: EncryptionConfig | None = None
    ephemeral: EncryptionConfig | None = None


class MachinePorts(Model):
    """TCP ports of the node's own services (docs/ports.md).

    Nodes dial each other on them (a node forwards ``-n OTHER`` to OTHER's node API, a worker asks
    the control plane's trustd), so every node of a cluster must carry the same values.
    """

    node_api: Port | None = Field(default=None, alias="nodeAPI")
    trustd: Port | None = None


MachineType = Literal["init", "controlplane", "join", "worker"]


class Machine(Model):
    type: MachineType
    token: Str | None = None
    ca: CertificateAndKey | None = None
    cert_sans: list[NonEmptyStr] | None = Field(default=None, alias="certSANs")
    kubelet: Kubelet | None = None
    network: MachineNetwork | None = None
    disks: list[Disk] | None = None
    install: Install | None = None
    files: list[File] | None = None
    env: dict[EnvName, Str] | None = None
    time: Time | None = None
    sysctls: dict[NonEmptyStr, Str] | None = None
    registries: Registries | None = None
    system_disk_encryption: SystemDiskEncryption | None = None
    ports: MachinePorts | None = None

    @property
    def node_api_port(self) -> int:
        """The node API's port (``machine.ports.nodeAPI``, default 50000)."""
        port = self.ports.node_api if self.ports else None
        return port if port is not None else defaults.DEFAULT_NODE_API_PORT

    @property
    def trustd_port(self) -> int:
        """trustd's port (``machine.ports.trustd``, default 50001)."""
        port = self.ports.trustd if self.ports else None
        return port if port is not None else defaults.DEFAULT_TRUSTD_PORT

    @property
    def is_control_plane(self) -> bool:
        """Whether the node runs etcd and the control plane (``init`` or ``controlplane``)."""
        return self.type in ("init", "controlplane")

    @property
    def is_worker(self) -> bool:
        """Whether the node only runs a kubelet (``join``, or its modern name ``worker``)."""
        return not self.is_control_plane

    @property
    def role(self) -> Literal["init", "controlplane", "worker"]:
        """The type with ``join`` normalised to ``worker``."""
        return "worker" if self.type in ("join", "worker") else self.type  # type: ignore[return-value]

    @property
    def kubelet_image(self) -> str:
        return (self.kubelet.image if self.kubelet else None) or defaults.DEFAULT_KUBELET_IMAGE


# --- cluster ---------------------------------------------------------------------------------


class ControlPlane(Model):
    endpoint: HTTPSURL
    local_api_server_port: Port | None = Field(default=None, alias="localAPIServerPort")


class CNI(Model):
    name: Literal["flannel", "custom", "host-gw", "none"]
    urls: list[URL] | None = None


class ClusterNetwork(Model):
    cni: CNI | None = None
    dns_domain: DNSDomain | None = None
    pod_subnets: list[CIDR] | None = None
    service_subnets: list[CIDR] | None = None


class ServiceAccount(Model):
    key: PEMBase64


class APIServer(Model):
    image: NonEmptyStr | None = None
    extra_args: dict[Str, Str] | None = None
    extra_volumes: list[Volume] | None = None
    cert_sans: list[NonEmptyStr] | None = Field(default=None, alias="certSANs")


class ControllerManager(Model):
    image: NonEmptyStr | None = None
    extra_args: dict[Str, Str] | None = None
    extra_volumes: list[Volume] | None = None


class Scheduler(ControllerManager):
    pass


class Proxy(Model):
    disabled: Bool | None = None
    image: NonEmptyStr | None = None
    mode: Literal["iptables", "ipvs", "userspace", "kernelspace"] | None = None
    extra_args: dict[Str, Str] | None = None


class Etcd(Model):
    image: NonEmptyStr | None = None
    ca: CertificateAndKey | None = None
    extra_args: dict[Str, Str] | None = None


class CoreDNS(Model):
    image: NonEmptyStr | None = None
    disabled: Bool | None = None


class InlineManifest(Model):
    name: NonEmptyStr
    contents: Str


class AdminKubeconfig(Model):
    cert_lifetime: Duration | None = None


class Cluster(Model):
    control_plane: ControlPlane
    cluster_name: Str | None = None
    network: ClusterNetwork | None = None
    token: Str | None = None
    aescbc_encryption_secret: Base64 | None = None
    ca: CertificateAndKey | None = None
    aggregator_ca: CertificateAndKey | None = Field(default=None, alias="aggregatorCA")
    service_account: ServiceAccount | None = None
    api_server: APIServer | None = None
    controller_manager: ControllerManager | None = None
    proxy: Proxy | None = None
    scheduler: Scheduler | None = None
    etcd: Etcd | None = None
    core_dns: CoreDNS | None = Field(default=None, alias="coreDNS")
    extra_manifests: list[URL] | None = None
    extra_manifest_headers: dict[NonEmptyStr, Str] | None = None
    inline_manifests: list[InlineManifest] | None = None
    admin_kubeconfig: AdminKubeconfig | None = None
    allow_scheduling_on_masters: Bool | None = None

    @property
    def local_api_server_port(self) -> int:
        port = self.control_plane.local_api_server_port
        return port if port is not None else defaults.DEFAULT_LOCAL_API_SERVER_PORT

    @property
    def dns_domain(self) -> str:
        return (self.network.dns_domain if self.network else None) or defaults.DEFAULT_DNS_DOMAIN

    @property
    def pod_subnets(self) -> list[str]:
        subnets = self.network.pod_subnets if self.network else None
        return list(subnets or defaults.DEFAULT_POD_SUBNETS)

    @property
    def service_subnets(self) -> list[str]:
        subnets = self.network.service_subnets if self.network else None
        return list(subnets or defaults.DEFAULT_SERVICE_SUBNETS)

    @property
    def cni_name(self) -> str:
        cni = self.network.cni if self.network else None
        return cni.name if cni else defaults.DEFAULT_CNI

    def _service_ip(self, index: int) -> str:
        network = ipaddress.ip_interface(self.service_subnets[0]).network
        return str(network.network_address + index)

    @property
    def api_service_ip(self) -> str:
        """The ``kubernetes`` service IP: the 1st address of the first service subnet."""
        return self._service_ip(defaults.API_SERVICE_IP_INDEX)

    @property
    def dns_service_ip(self) -> str:
        """The cluster DNS service IP: the 10th address of the first service subnet."""
        return self._service_ip(defaults.DNS_SERVICE_IP_INDEX)

    @property
    def api_server_image(self) -> str:
        return (self.api_server.image if self.api_server else None) or defaults.DEFAULT_API_SERVER_IMAGE

    @property
    def controller_manager_image(self) -> str:
        image = self.controller_manager.image if self.controller_manager else None
        return image or defaults.DEFAULT_CONTROLLER_MANAGER_IMAGE

    @property
    def scheduler_image(self) -> str:
        return (self.scheduler.image if self.scheduler else None) or defaults.DEFAULT_SCHEDULER_IMAGE

    @property
    def proxy_image(self) -> str:
        return (self.proxy.image if self.proxy else None) or defaults.DEFAULT_PROXY_IMAGE

    @property
    def etcd_image(self) -> str:
        return (self.etcd.image if self.etcd else None) or defaults.DEFAULT_ETCD_IMAGE

    @property
    def coredns_image(self) -> str:
        return (self.core_dns.image if self.core_dns else None) or defaults.DEFAULT_COREDNS_IMAGE


class Config(Model):
    """A whole ``v1alpha1`` machine configuration."""

    version: Literal["v1alpha1"]
    debug: Bool | None = None
    persist: Bool | None = None
    machine: Machine
    cluster: Cluster
