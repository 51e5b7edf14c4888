"""Planning a local cluster: pure data, before anything is created.

:func:`plan` validates the request and builds names, addresses, the generated PKI and one
validated machine config per node. Together with :func:`kubeplane.provision.create.preflight`
it runs before anything is created, so a mistake such as a bad ``--config-patch`` fails without
touching the network or the disk. Raises :class:`~kubeplane.provision.cluster.PlanError`.

With ``--vip`` (:attr:`ClusterRequest.vip`) the cluster's endpoint is a shared address of the
cluster network instead of haproxy on the host: every control plane config carries it as
``machine.network.interfaces[].vip.ip`` on the node's cluster interface, the control plane nodes
elect its owner among themselves (:mod:`kubeplane.services.vip`), and the host reaches it over
the bridge like any node address. :func:`vip_address` checks it is a free address of that network.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable, Mapping, Sequence

from kubeplane import config as config_mod
from kubeplane import pki
from kubeplane.config import client as client_config
from kubeplane.config import defaults as config_defaults
from kubeplane.config import generate as gen
from kubeplane.provision import dns_image, netns
from kubeplane.provision import loadbalancer as lb
from kubeplane.provision import registry as registry_mod
from kubeplane.provision import state as state_mod
from kubeplane.provision import toolchain as toolchain_mod
from kubeplane.provision.cluster import DEFAULT_NAME, DEFAULT_VERSION, PlanError


@dataclasses.dataclass(frozen=True)
class ClusterRequest:
    """What ``kubeplane cluster create`` was asked for."""

    name: str = DEFAULT_NAME
    controlplanes: int = 1
    workers: int = 1
    kubernetes_version: str = DEFAULT_VERSION
    cidr: str = netns.DEFAULT_CIDR
    #: Extra registry mirrors (host -> endpoints); ``*`` replaces the local registry mirror.
    registry_mirrors: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    config_patches: tuple[gen.Patch, ...] = ()
    controlplane_patches: tuple[gen.Patch, ...] = ()
    worker_patches: tuple[gen.Patch, ...] = ()
    #: Bootstrap a self-hosted control plane (configs without serviceAccount/aggregatorCA).
    self_hosted: bool = False
    #: Seconds a pod checkpoint outlives its parent (self-hosted only).
    checkpointer_grace_period: int = 300
    #: The Service subnet, routed from the host to the first control plane node; None: the
    #: default, or what the patches set. :func:`service_subnet_for` picks one that is free.
    service_subnet: str | None = None
    #: Where the cluster DNS forwards names outside the cluster (the nodes' nameservers); none:
    #: it answers only for the cluster (the host's resolver is not reachable from pods).
    dns_upstreams: tuple[str, ...] = ()
    #: ``--wireguard-cidr``: a WireGuard network between the nodes (:func:`wireguard_interfaces`).
    wireguard_cidr: str | None = None
    #: ``--vip``: the shared address that is the cluster's endpoint (no haproxy); None: haproxy.
    vip: str | None = None
    #: ``--node-api-port`` / ``--trustd-port``: every node's ``machine.ports`` (None: the default).
    node_api_port: int | None = None
    trustd_port: int | None = None


#: The port control plane nodes listen on for WireGuard (the guide's quick start).
WIREGUARD_PORT = 51111
#: How often a WireGuard peer keeps its tunnel alive, so a control plane node can always reach a
#: worker that has no listening port of its own.
WIREGUARD_KEEPALIVE = "5s"
WIREGUARD_INTERFACE = "wg0"


@dataclasses.dataclass(frozen=True)
class NodePlan:
    """One node: name, role, address, namespace and its machine config (YAML)."""

    name: str
    role: state_mod.Role
    ip: str
    netns: str
    config: str


@dataclasses.dataclass(frozen=True)
class ClusterPlan:
    """Everything :func:`create` will make (pure data)."""

    request: ClusterRequest
    network: netns.NetworkPlan
    endpoint: str
    registry_url: str
    nodes: tuple[NodePlan, ...]
    secrets: gen.SecretsBundle
    #: The client config holding just this cluster's context (named after it).
    client_config: client_config.ClientConfig

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def controlplanes(self) -> tuple[NodePlan, ...]:
        return tuple(node for node in self.nodes if node.role == "controlplane")

    @property
    def workers(self) -> tuple[NodePlan, ...]:
        return tuple(node for node in self.nodes if node.role == "worker")

    @property
    def node_api_port(self) -> int:
        """Where every node's node API listens once it booted with its config."""
        port = self.request.node_api_port
        return config_defaults.DEFAULT_NODE_API_PORT if port is None else port

    @property
    def trustd_port(self) -> int:
        port = self.request.trustd_port
        return config_defaults.DEFAULT_TRUSTD_PORT if port is None else port


def node_names(cluster: str, *, controlplanes: int, workers: int) -> list[tuple[str, state_mod.Role]]:
    """``<cluster>-controlplane-N`` then ``<cluster>-worker-N``: control plane nodes first."""
    return [(f"{cluster}-controlplane-{i}", "controlplane") for i in range(1, controlplanes + 1)] + [
        (f"{cluster}-worker-{i}", "worker") for i in range(1, workers + 1)
    ]


#: Local clusters' Service subnets: /16s inside Kubernetes' usual 10.96.0.0/12, one per cluster,
#: because each is routed from the host (so the host reaches Services) and host routes are global.
LOCAL_SERVICE_SUBNETS = tuple(f"10.{96 + index}.0.0/16" for index in range(16))


def service_subnet_for(taken: Sequence[ipaddress.IPv4Network], *, recorded: str | None = None) -> str:
    """The Service subnet for a new local cluster: the one it already has (``recorded``, from its
    state), else the first of :data:`LOCAL_SERVICE_SUBNETS` that overlaps nothing in ``taken``
    (the host's routes and addresses outside the cluster's bridge). Raises :class:`PlanError`."""
    if recorded is not None:
        return recorded
    for candidate in LOCAL_SERVICE_SUBNETS:
        network = ipaddress.IPv4Network(candidate)
        if not any(network.overlaps(other) for other in taken):
            return candidate
    raise PlanError(
        f"every local Service subnet ({LOCAL_SERVICE_SUBNETS[0]} to {LOCAL_SERVICE_SUBNETS[-1]}) is routed "
        "on this host already; destroy a cluster or set cluster.network.serviceSubnets with --config-patch"
    )


def _local_defaults(document: gen.Document, request: ClusterRequest) -> gen.Document:
    """Defaults of local clusters for what the user's patches left unset.

    No Debian package ships a CNI daemon: the node agents route pods between nodes themselves
    (``host-gw``). The cluster DNS is kubeplane's own add-on, built by the toolchain (no CoreDNS
    image exists offline). The Service subnet is the request's (free on this host), and the
    nodes' nameservers are the DNS upstreams asked for, or none.
    """
    cluster = document.setdefault("cluster", {})
    network = cluster.setdefault("network", {})
    network.setdefault("cni", {"name": "host-gw"})
    if request.service_subnet is not None and network.get("serviceSubnets") in (
        None,
        list(config_defaults.DEFAULT_SERVICE_SUBNETS),
    ):
        network["serviceSubnets"] = [request.service_subnet]
    cluster.setdefault("coreDNS", {"image": dns_image.image_ref()})
    machine_network = document.setdefault("machine", {}).setdefault("network", {})
    machine_network.setdefault("nameservers", list(request.dns_upstreams))
    return document


def service_subnet(document: gen.Document) -> str:
    """The first Service subnet of a (local defaulted) config document."""
    subnets = (document.get("cluster") or {}).get("network", {}).get("serviceSubnets")
    return str((subnets or config_defaults.DEFAULT_SERVICE_SUBNETS)[0])


def plan(
    request: ClusterRequest,
    *,
    secrets: gen.SecretsBundle | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> ClusterPlan:
    """Validate ``request`` and build every node's config; raises :class:`PlanError` (pure).

    ``progress`` hears the names of the two phases as they start.
    """
    progress("validating CIDR and reserving IPs")
    if request.controlplanes < 1:
        raise PlanError(f"--controlplanes is {request.controlplanes}: a cluster needs at least one")
    if request.workers < 0:
        raise PlanError(f"--workers is {request.workers}: give 0 or more")
    try:
        toolchain_mod.parse_version(request.kubernetes_version)
        names = node_names(request.name, controlplanes=request.controlplanes, workers=request.workers)
        network = netns.plan(request.name, [name for name, _ in names], cidr=request.cidr)
    except (netns.NetworkError, toolchain_mod.ToolchainError) as exc:
        raise PlanError(str(exc)) from exc
    registry_url = f"http://{network.host_ip}:{registry_mod.REGISTRY_PORT}"
    if request.vip is not None:
        network = dataclasses.replace(network, vip=vip_address(request.vip, network))
    endpoint = f"https://{network.vip or network.host_ip}:{lb.API_PORT}"
    roles = dict(names)
    cp_ips = tuple(node.ip for node in network.nodes if roles[node.name] == "controlplane")
    options = gen.GenOptions(
        cluster_name=request.name,
        endpoint=endpoint,
        kubernetes_version=request.kubernetes_version,
        additional_sans=(network.host_ip,),
        registry_mirrors={"*": (registry_url,), **request.registry_mirrors},
        client_endpoints=tuple(gen.node_api_endpoint(ip, request.node_api_port) for ip in cp_ips),
        node_api_port=request.node_api_port,
        trustd_port=request.trustd_port,
        patches=request.config_patches,
    )
    progress("generating PKI and tokens")
    bundle = secrets if secrets is not None else gen.new_secrets()
    try:
        generated = gen.generate(options, bundle)
    except (gen.GenerateError, config_mod.ConfigError) as exc:
        raise PlanError(f"cannot generate the machine configs: {exc}") from exc
    controlplane_document = _patched(
        generated.documents["controlplane"], request.controlplane_patches, "controlplane"
    )
    if request.self_hosted:
        controlplane_document = without_static_pod_secrets(controlplane_document)
    role_documents = {
        "controlplane": _local_defaults(controlplane_document, request),
        "worker": _local_defaults(
            _patched(generated.documents["worker"], request.worker_patches, "worker"), request
        ),
    }
    # The host reaches Services through the first control plane node (kube-proxy runs there and
    # masquerades the host's traffic, so replies come back the same way).
    subnet = service_subnet(role_documents["controlplane"])
    network = dataclasses.replace(network, routes=((subnet, cp_ips[0]),))
    tunnels = {}
    if request.wireguard_cidr is not None:
        nodes_of = [(node.name, roles[node.name], node.ip) for node in network.nodes]
        tunnels = wireguard_interfaces(request.wireguard_cidr, nodes_of)
        if ipaddress.ip_network(request.wireguard_cidr).overlaps(network.cidr):
            raise PlanError(
                f"--wireguard-cidr {request.wireguard_cidr} overlaps the cluster network {network.cidr}: "
                "the tunnel needs addresses of its own (e.g. 10.1.0.0/24)"
            )
    shared: list[dict[str, object]] = (
        [{"interface": netns.NODE_INTERFACE, "vip": {"ip": network.vip}}] if network.vip else []
    )
    nodes = tuple(
        NodePlan(
            name=address.name,
            role=roles[address.name],
            ip=address.ip,
            netns=address.netns,
            config=node_config(
                role_documents[roles[address.name]],
                hostname=address.name,
                interfaces=[
                    *(shared if roles[address.name] == "controlplane" else []),
                    *([tunnels[address.name]] if address.name in tunnels else []),
                ],
                node_api_port=request.node_api_port,
                trustd_port=request.trustd_port,
            ),
        )
        for address in network.nodes
    )
    name, context = client_config.current(generated.client_config)
    context = dataclasses.replace(context, nodes=tuple(node.ip for node in nodes))
    return ClusterPlan(
        request=request,
        network=network,
        endpoint=endpoint,
        registry_url=registry_url,
        nodes=nodes,
        secrets=bundle,
        client_config=client_config.ClientConfig(context=name, contexts={name: context}),
    )


def vip_address(value: str, network: netns.NetworkPlan) -> str:
    """``--vip VALUE`` checked against the cluster network: an IPv4 address inside it that is
    neither its network or broadcast address, nor the host's (the gateway, where the registry
    listens), nor a node's. Returns it normalised; raises :class:`PlanError` naming the flag.

    Nodes added later by ``cluster add`` skip it (:func:`kubeplane.provision.grow.plan_additions`).
    """
    example = network.cidr[-2]
    try:
        address = ipaddress.ip_address(value.strip())
    except ValueError:
        raise PlanError(f"--vip {value!r} is not an IP address (e.g. {example})") from None
    if address not in network.cidr:
        raise PlanError(
            f"--vip {address} is outside the cluster network {network.cidr}: the host and the nodes "
            f"reach it over the cluster bridge, so pick a free address in it (e.g. {example})"
        )
    if address in (network.cidr.network_address, network.cidr.broadcast_address):
        raise PlanError(
            f"--vip {address} is the network or broadcast address of {network.cidr}; pick another "
            f"(e.g. {example})"
        )
    if str(address) == network.host_ip:
        raise PlanError(
            f"--vip {address} is the host's address on the cluster bridge (the nodes' gateway); "
            f"pick a free one (e.g. {example})"
        )
    taken = next((node for node in network.nodes if node.ip == str(address)), None)
    if taken is not None:
        raise PlanError(
            f"--vip {address} is the address of node {taken.name}; pick one no node gets "
            f"(nodes take {network.nodes[0].ip} onwards; e.g. {example})"
        )
    return str(address)


def without_static_pod_secrets(document: gen.Document) -> gen.Document:
    """The config in the self-hosted (older) format: no ``cluster.serviceAccount`` or
    ``cluster.aggregatorCA`` (the bootstrap node generates them for its temporary control plane)."""
    cluster = dict(document.get("cluster") or {})
    for key in ("serviceAccount", "aggregatorCA"):
        cluster.pop(key, None)
    return {**document, "cluster": cluster}


def _patched(document: gen.Document, patches: Sequence[gen.Patch], role: str) -> gen.Document:
    try:
        return gen.apply_patches(document, patches)
    except config_mod.ConfigError as exc:
        raise PlanError(f"--config-patch-{role}: {exc}") from exc


def wireguard_interfaces(
    cidr: str, nodes: Sequence[tuple[str, state_mod.Role, str]]
) -> dict[str, dict[str, object]]:
    """The ``wg0`` interface of each node (name, role, cluster address) for ``--wireguard-cidr``,
    by node name, as the guide's quick start describes: control plane nodes listen on
    :data:`WIREGUARD_PORT`, every node peers with every control plane node (at its cluster
    address) and a control plane node with every other node too (a WireGuard peer is only accepted
    when it is configured), each peer's allowed IPs are its tunnel address, kept alive every
    :data:`WIREGUARD_KEEPALIVE`. Node N gets the Nth host address after the first, as on the
    cluster network. Fresh keys every time (raises :class:`PlanError` for a bad CIDR)."""
    try:
        network = ipaddress.ip_network(cidr)
    except ValueError as exc:
        raise PlanError(f"--wireguard-cidr {cidr}: {exc}") from exc
    if network.num_addresses < len(nodes) + 3:
        raise PlanError(f"--wireguard-cidr {cidr} is too small for {len(nodes)} nodes")
    keys = {name: pki.wireguard_private_key() for name, _, _ in nodes}
    tunnel_ips = {name: network[index + 2] for index, (name, _, _) in enumerate(nodes)}
    interfaces: dict[str, dict[str, object]] = {}
    for name, role, _ in nodes:
        peers = []
        for other, other_role, other_ip in nodes:
            if other == name or (role != "controlplane" and other_role != "controlplane"):
                continue
            peer: dict[str, object] = {
                "publicKey": pki.wireguard_public_key(keys[other]),
                "allowedIPs": [f"{tunnel_ips[other]}/{network.max_prefixlen}"],
                "persistentKeepaliveInterval": WIREGUARD_KEEPALIVE,
            }
            if other_role == "controlplane":
                peer["endpoint"] = f"{other_ip}:{WIREGUARD_PORT}"
            peers.append(peer)
        wireguard: dict[str, object] = {"privateKey": keys[name], "peers": peers}
        if role == "controlplane":
            wireguard["listenPort"] = WIREGUARD_PORT
        interfaces[name] = {
            "interface": WIREGUARD_INTERFACE,
            "cidr": f"{tunnel_ips[name]}/{network.prefixlen}",
            "wireguard": wireguard,
        }
    return interfaces


def node_config(
    document: gen.Document,
    *,
    hostname: str,
    interfaces: Sequence[dict[str, object]] = (),
    node_api_port: int | None = None,
    trustd_port: int | None = None,
) -> str:
    """The node's config: its role's document with its hostname and ``interfaces`` added to the
    ones the patches gave, validated like the agent does. Its ``machine.ports`` must be the
    cluster's, ``node_api_port`` and ``trustd_port`` (None: the default): the provisioner reaches
    its nodes there, and nodes dial each other there (docs/ports.md)."""
    patch: dict[str, object] = {"hostname": hostname}
    if interfaces:
        configured = ((document.get("machine") or {}).get("network") or {}).get("interfaces") or []
        patch["interfaces"] = [*configured, *interfaces]
    patched = gen.apply_patches(document, [{"machine": {"network": patch}}])
    text = gen.dump_yaml(patched)
    try:
        machine = config_mod.load(text).model.machine
    except config_mod.ConfigError as exc:
        raise PlanError(f"the machine config of node {hostname} is invalid: {exc}") from exc
    expected = (
        config_defaults.DEFAULT_NODE_API_PORT if node_api_port is None else node_api_port,
        config_defaults.DEFAULT_TRUSTD_PORT if trustd_port is None else trustd_port,
    )
    if (machine.node_api_port, machine.trustd_port) != expected:
        raise PlanError(
            f"the machine config of node {hostname} sets machine.ports to nodeAPI {machine.node_api_port}, "
            f"trustd {machine.trustd_port}, but the cluster's ports are {expected[0]}, {expected[1]} "
            "(--node-api-port, --trustd-port): a local cluster moves the ports of every node with "
            "those flags, so drop machine.ports from the config patches or give the same ports there"
        )
    return text
