"""``kubeplane cluster create --kubeadm``: a real kubeadm cluster on local machine nodes.

The starting point of the HA guide (the fifth seed): one control plane node made by ``kubeadm
init`` (stacked etcd, static pods) and workers joined with ``kubeadm join``, every node a machine
reached by SSH. Nothing of kubeplane runs on these nodes but their init
(:mod:`kubeplane.provision.kubeadm_node`, the units a kubeadm machine's systemd would run:
containerd, the kubelet with kubeadm's drop-in, sshd) and two commands Debian lacks,
``/usr/local/sbin/crictl`` (:mod:`kubeplane.cli.crictl`) and ``systemctl``. kubeadm itself,
kubelet and kubectl are the toolchain's, built from the same Kubernetes source.

Steps (each records what it makes before making it, so ``cluster destroy`` undoes a half-made
cluster as well as a whole one)::

    write cluster state    metadata (kind kubeadm), the SSH client key, an empty known_hosts
    create network         bridge, one namespace per node (as for kubeplane clusters)
    start registry         the same registry, also holding the etcd image kubeadm asks for and
                           the cluster DNS image under the CoreDNS name kubeadm's config gives it
    start machines         per node: its directories, containerd's config, /etc/default/kubelet,
                           its CNI config, sshd's config and host key (pinned in known_hosts), the
                           commands under /usr/local/sbin; then its init; waits for SSH
    route pod networks     each node routes every other node's pod subnet via that node
    kubeadm init           over SSH on the first node: `kubeadm init --config`
    kubeadm join           over SSH on each worker: the join command the first node prints
    admin kubeconfig       /etc/kubernetes/admin.conf of the first node, kept in the cluster dir

The pod network is a static ``host-gw``: node N's pods get ``10.244.N.0/24`` from Debian's bridge
and host-local plugins (:func:`kubeplane.services.cni.render_conflist`), the provisioner routes
the other nodes' subnets in each node's namespace (as a cloud's route controller would), and the
node's init enables forwarding and masquerades pod traffic that leaves the pod subnet. kubeadm's
own defaults stay otherwise: no ``podSubnet`` (so the controller manager allocates nothing), the
DNS add-on phase deploys kubeplane's cluster DNS image (``dns.imageRepository``/``imageTag``, as
``kubeplane/coredns:1.7.0``: it is started exactly like CoreDNS 1.7.0, from the Corefile kubeadm
writes, and reads Endpoints where kubeadm's RBAC rules allow no EndpointSlices).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from kubeplane import fileio, retry
from kubeplane import plan as plan_module
from kubeplane.agent import owned
from kubeplane.agent import services as agent_services
from kubeplane.clients import ssh
from kubeplane.config import kubeadm as kubeadm_config
from kubeplane.config import toolchain_cache
from kubeplane.provision import create, dns_image, hostproc, machine, netns
from kubeplane.provision import registry as registry_mod
from kubeplane.provision import state as state_mod
from kubeplane.provision import toolchain as toolchain_mod
from kubeplane.provision.cluster import (
    KIND_KUBEADM,
    KUBEADM_INIT,
    ClusterMeta,
    CreateError,
    PlanError,
    PreflightError,
    node_root,
    write_kubeconfig,
)
from kubeplane.provision.create import new_step as _step
from kubeplane.services import cni
from kubeplane.services import containerd as containerd_mod

#: The pod subnet of every kubeadm cluster; node N (its index) gets ``10.244.N.0/24``.
POD_SUBNET = "10.244.0.0/16"
CRI_SOCKET = "/run/containerd/containerd.sock"
#: Where the pod network's settings for the node's init live (the node's own /var/lib/kubeplane).
POD_NETWORK_FILE = "var/lib/kubeplane/pod-network.json"
#: The file kubeadm's configuration goes to on the first node (as an operator keeps it).
KUBEADM_CONFIG = f"{kubeadm_config.CONFIG_DIR}/kubeadm-config.yaml"
ADMIN_CONF = "/etc/kubernetes/admin.conf"
#: The repository kubeadm's DNS add-on image is taken from: ``<repository>/coredns:<tag>``.
DNS_REPOSITORY = "docker.io/kubeplane"
#: kubeadm's preflight checks that fail on a machine node for reasons that are not faults: the
#: kernel configuration is not readable in a container-like node (SystemVerification).
IGNORED_PREFLIGHT = ("SystemVerification",)
#: Host tools a kubeadm cluster needs besides the toolchain (Debian package in parentheses).
HOST_TOOLS = {
    "docker-registry": "docker-registry",
    "skopeo": "skopeo",
    "containerd": "containerd",
    "nsenter": "util-linux",
    "sshd": "openssh-server",
    "iptables": "iptables",
    "conntrack": "conntrack",
}
SSHD = Path("/usr/sbin/sshd")
#: Where a kubeadm node's commands are (first on root's PATH; see machine.KUBEADM_DIRS).
COMMANDS_DIR = "usr/local/sbin"
SSH_DIR = "ssh"
CLIENT_KEY = "id_ed25519"
KNOWN_HOSTS = "known_hosts"
#: How long kubeadm init / join may take.
INIT_TIMEOUT = 600.0


@dataclasses.dataclass(frozen=True)
class KubeadmRequest:
    """What ``kubeplane cluster create --kubeadm`` was asked for."""

    name: str
    workers: int = 1
    kubernetes_version: str = "v1.20.2"
    cidr: str = netns.DEFAULT_CIDR
    service_subnet: str = "10.96.0.0/16"


@dataclasses.dataclass(frozen=True)
class KubeadmNode:
    name: str
    role: state_mod.Role
    ip: str
    netns: str
    index: int

    @property
    def pod_cidr(self) -> str:
        return pod_cidr(self.index)


@dataclasses.dataclass(frozen=True)
class KubeadmPlan:
    request: KubeadmRequest
    network: netns.NetworkPlan
    registry_url: str
    nodes: tuple[KubeadmNode, ...]

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def first(self) -> KubeadmNode:
        return self.nodes[0]

    @property
    def endpoint(self) -> str:
        """The API server as every component reaches it: the first node, as kubeadm init leaves it."""
        return f"https://{self.first.ip}:6443"


def pod_cidr(index: int) -> str:
    """The pod subnet of the node with ``index`` (1, 2, ...): ``10.244.<index>.0/24``."""
    network = ipaddress.IPv4Network(POD_SUBNET)
    if not 0 < index < 256:
        raise PlanError(f"node index {index} has no pod subnet in {POD_SUBNET}")
    return str(list(network.subnets(new_prefix=24))[index])


def plan(request: KubeadmRequest) -> KubeadmPlan:
    """Names and addresses (pure); raises :class:`PlanError`."""
    if request.workers < 0:
        raise PlanError(f"--workers is {request.workers}: give 0 or more")
    try:
        toolchain_mod.parse_version(request.kubernetes_version)
        first: state_mod.Role = "controlplane"
        worker: state_mod.Role = "worker"
        names = [(f"{request.name}-controlplane-1", first)] + [
            (f"{request.name}-worker-{i}", worker) for i in range(1, request.workers + 1)
        ]
        network = netns.plan(request.name, [name for name, _ in names], cidr=request.cidr)
    except (netns.NetworkError, toolchain_mod.ToolchainError) as exc:
        raise PlanError(str(exc)) from exc
    roles = dict(names)
    network = dataclasses.replace(network, routes=((request.service_subnet, network.nodes[0].ip),))
    nodes = tuple(
        KubeadmNode(
            name=address.name, role=roles[address.name], ip=address.ip, netns=address.netns, index=index
        )
        for index, address in enumerate(network.nodes, start=1)
    )
    return KubeadmPlan(
        request=request,
        network=network,
        registry_url=f"http://{network.host_ip}:{registry_mod.REGISTRY_PORT}",
        nodes=nodes,
    )


def preflight(
    cluster_plan: KubeadmPlan, *, toolchain: toolchain_mod.Toolchain, state_root: Path | None
) -> toolchain_mod.ToolchainPaths:
    """Check the host can make the cluster without changing anything; the toolchain paths."""
    if os.geteuid() != 0:
        raise PreflightError("local clusters need root (network namespaces, mounts, cgroups): run as root")
    missing = [
        f"{tool} (Debian package {package})"
        for tool, package in HOST_TOOLS.items()
        if not shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin")
    ]
    if missing:
        raise PreflightError(
            f"missing host tools: {', '.join(missing)}; run scripts/setup or apt-get install them"
        )
    directory = state_mod.cluster_dir(cluster_plan.name, root=state_root)
    if (directory / state_mod.STATE_FILE).exists():
        raise PreflightError(
            f"cluster {cluster_plan.name!r} already exists (state in {directory}); destroy it first with "
            f"`kubeplane cluster destroy --name {cluster_plan.name}` or pick another --name"
        )
    try:
        paths = toolchain.require(cluster_plan.request.kubernetes_version)
        netns.check_host(cluster_plan.network, None)
    except (toolchain_mod.ToolchainError, netns.NetworkError) as exc:
        raise PreflightError(str(exc)) from exc
    if not paths.kubeadm_images:
        raise PreflightError(
            f"kubeadm clusters of Kubernetes {paths.version} are not supported: no etcd image tag is known "
            "for it"
        )
    return paths


# -- what goes on a node ------------------------------------------------------------------------


def commands(paths: toolchain_mod.ToolchainPaths) -> dict[str, Path]:
    """The node's ``/usr/local/sbin``: name → what it runs (symlinks)."""
    scripts = Path(sys.executable).parent
    return {
        "kubeadm": paths.binary("kubeadm"),
        "kubelet": paths.binary("kubelet"),
        "kubectl": paths.binary("kubectl"),
        "crictl": scripts / "kubeplane-crictl",
        "systemctl": scripts / "kubeplane-systemctl",
    }


def kubelet_defaults(*, node_ip: str, cgroup_root: str) -> str:
    """``/etc/default/kubelet``: the node's own kubelet flags (kubeadm's unit reads
    ``KUBELET_EXTRA_ARGS`` from it), as an operator sets them on a machine with several addresses."""
    flags = [f"--node-ip={node_ip}", f"--cgroup-root={cgroup_root}"]
    return f'KUBELET_EXTRA_ARGS="{" ".join(flags)}"\n'


def sshd_config(*, listen: str) -> str:
    """The node's sshd: key authentication only, root by key, on the node's address."""
    return "\n".join(
        [
            "# Written by kubeplane cluster create --kubeadm.",
            f"ListenAddress {listen}",
            "Port 22",
            "HostKey /etc/ssh/ssh_host_ed25519_key",
            "AuthorizedKeysFile /etc/ssh/authorized_keys/%u",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "X11Forwarding no",
            "AllowTcpForwarding no",
            "PidFile none",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def pod_network_settings(node: KubeadmNode) -> str:
    return json.dumps({"podCIDR": node.pod_cidr, "clusterPodSubnets": [POD_SUBNET]}, indent=2) + "\n"


def init_config(cluster_plan: KubeadmPlan) -> str:
    """kubeadm's configuration for ``kubeadm init`` on the first node (four documents)."""
    first = cluster_plan.first
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": "kubeadm.k8s.io/v1beta2",
            "kind": "InitConfiguration",
            "localAPIEndpoint": {"advertiseAddress": first.ip, "bindPort": 6443},
            "nodeRegistration": {
                "name": first.name,
                "criSocket": CRI_SOCKET,
                "ignorePreflightErrors": list(IGNORED_PREFLIGHT),
            },
        },
        {
            "apiVersion": "kubeadm.k8s.io/v1beta2",
            "kind": "ClusterConfiguration",
            "clusterName": cluster_plan.name,
            "kubernetesVersion": cluster_plan.request.kubernetes_version,
            "networking": {
                "serviceSubnet": cluster_plan.request.service_subnet,
                "dnsDomain": "cluster.local",
            },
            "dns": {
                "type": "CoreDNS",
                "imageRepository": DNS_REPOSITORY,
                "imageTag": coredns_tag(cluster_plan),
            },
            # A member that joins later cannot depose a healthy leader (see kubeplane.ops.kubeadm_ha).
            "etcd": {"local": {"extraArgs": {"pre-vote": "true"}}},
        },
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # cgroup v1 here, no systemd: the cgroupfs driver (ENVIRONMENT.md).
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
        },
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            # A network namespace cannot change the global conntrack table size; 0 leaves it alone.
            "conntrack": {"maxPerCore": 0},
        },
    ]
    return yaml.safe_dump_all(documents, sort_keys=False)


def coredns_tag(cluster_plan: KubeadmPlan) -> str:
    """The CoreDNS release kubeadm of the cluster's version deploys (``1.7.0``)."""
    tag = toolchain_cache.kubeadm_coredns_tag(cluster_plan.request.kubernetes_version)
    if tag is None:
        raise PlanError(f"no CoreDNS release is known for kubeadm {cluster_plan.request.kubernetes_version}")
    return tag


def dns_alias(cluster_plan: KubeadmPlan) -> str:
    """The name kubeadm's DNS add-on phase pulls (``kubeplane/coredns:1.7.0``), under which the
    registry also holds kubeplane's cluster DNS image: kubeadm builds it from ``dns.imageRepository``
    and ``dns.imageTag``, and its upgrade checks read the CoreDNS release from that tag, so the tag
    is the CoreDNS release whose Corefile and ports the image serves (see the module docstring)."""
    return f"{DNS_REPOSITORY.removeprefix('docker.io/')}/coredns:{coredns_tag(cluster_plan)}"


# -- SSH to the nodes -----------------------------------------------------------------------------


def credentials(directory: Path) -> ssh.Credentials:
    return ssh.Credentials(
        key=directory / SSH_DIR / CLIENT_KEY, known_hosts=directory / SSH_DIR / KNOWN_HOSTS
    )


def target(node: state_mod.NodeState | KubeadmNode) -> ssh.Target:
    return ssh.Target(host=node.ip, name=node.name)


def write_client_key(directory: Path) -> None:
    """The cluster's SSH client key (0600) and an empty known_hosts, once."""
    creds = credentials(directory)
    creds.key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not creds.key.is_file():
        key = ssh.generate_key()
        fileio.write_atomic(creds.key, ssh.private_key_text(key), mode=fileio.SECRET_MODE)
        fileio.write_atomic(
            creds.key.with_suffix(".pub"), ssh.public_key_line(key, "kubeplane"), mode=fileio.PUBLIC_MODE
        )
    if not creds.known_hosts.is_file():
        fileio.write_atomic(creds.known_hosts, "", mode=fileio.PUBLIC_MODE)


def pin_host_key(directory: Path, host: str, public_line: str) -> None:
    """Record ``host``'s key in the cluster's known_hosts (replacing an older line for it)."""
    path = credentials(directory).known_hosts
    lines = [line for line in path.read_text().splitlines(keepends=True) if line.split(" ", 1)[0] != host]
    fileio.write_atomic(
        path, "".join(lines) + ssh.known_hosts_line([host], public_line), mode=fileio.PUBLIC_MODE
    )


async def run(
    directory: Path,
    node: state_mod.NodeState | KubeadmNode,
    command: str,
    *,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    check: bool = True,
) -> ssh.Result:
    async with ssh.connect(target(node), credentials(directory)) as session:
        return await session.run(command, timeout=timeout, on_line=on_line, check=check)


# -- making a machine ---------------------------------------------------------------------------


def prepare_machine(
    cluster: state_mod.ClusterState,
    node: KubeadmNode,
    *,
    paths: toolchain_mod.ToolchainPaths,
    registry_url: str,
) -> None:
    """Everything of a kubeadm machine that is on its disk before it boots (idempotent)."""
    record = cluster.node(node.name)
    root = node_root(cluster.directory, node.name)
    root.mkdir(parents=True, exist_ok=True)
    try:
        created = machine.prepare(root, extra_dirs=machine.KUBEADM_DIRS)
    except machine.MachineError as exc:
        raise CreateError(f"node {node.name}: {exc}") from exc
    cluster.host_dirs = list(dict.fromkeys([*cluster.host_dirs, *map(str, created)]))
    record.root_dir = str(root)
    cgroup_root, shim_cgroup = agent_services.NodeServices.node_cgroups(root)
    record.cgroups = [str(path) for path in owned.cgroup_paths((cgroup_root, shim_cgroup))]
    cluster.save()
    containerd = containerd_mod.render_config(
        node_root=Path("/"), mirrors={"*": [registry_url]}, shim_cgroup=shim_cgroup
    )
    _write(root / "etc/containerd/config.toml", containerd)
    _write(root / "etc/default/kubelet", kubelet_defaults(node_ip=node.ip, cgroup_root=cgroup_root))
    _write(root / "etc/cni/net.d/10-kubeplane.conflist", cni.render_conflist(pod_cidr=node.pod_cidr))
    _write(root / POD_NETWORK_FILE, pod_network_settings(node))
    for name, text in kubeadm_config.PATCHES.items():
        _write(root / kubeadm_config.PATCHES_DIR.lstrip("/") / name, text)
    _write(root / "etc/ssh/sshd_config", sshd_config(listen=node.ip))
    host_key = root / "etc/ssh/ssh_host_ed25519_key"
    if not host_key.is_file():
        key = ssh.generate_key()
        fileio.write_atomic(host_key, ssh.private_key_text(key), mode=fileio.SECRET_MODE)
        fileio.write_atomic(
            host_key.with_suffix(".pub"), ssh.public_key_line(key, node.name), mode=fileio.PUBLIC_MODE
        )
    pin_host_key(cluster.directory, node.ip, host_key.with_suffix(".pub").read_text())
    authorized = root / "etc/ssh/authorized_keys/root"
    authorized.parent.mkdir(mode=0o755, exist_ok=True)
    fileio.write_atomic(
        authorized,
        credentials(cluster.directory).key.with_suffix(".pub").read_text(),
        mode=fileio.SECRET_MODE,
    )
    for name, source in commands(paths).items():
        link = root / COMMANDS_DIR / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source)


def _write(path: Path, text: str, *, mode: int = fileio.PUBLIC_MODE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_atomic(path, text, mode=mode)


def start_machine(
    cluster: state_mod.ClusterState, node: KubeadmNode, *, paths: toolchain_mod.ToolchainPaths
) -> None:
    """Start the node's init in its namespaces (recorded first); nothing if it already runs."""
    record = cluster.node(node.name)
    existing = record.processes.get(KUBEADM_INIT)
    if existing is not None and hostproc.is_running(existing):
        return
    root = Path(record.root_dir)
    cgroup_root, shim_cgroup = agent_services.NodeServices.node_cgroups(root)
    init = [
        sys.executable,
        "-m",
        "kubeplane.provision.kubeadm_node",
        "--kubelet",
        f"/{COMMANDS_DIR}/kubelet",
        "--cgroup",
        cgroup_root,
        "--cgroup",
        shim_cgroup,
    ]
    record.processes[KUBEADM_INIT] = hostproc.start(
        machine.argv(node_dir=root, hostname=node.name, command=init, extra_dirs=machine.KUBEADM_DIRS),
        name=f"init {node.name}",
        log=cluster.directory / "logs" / f"{node.name}.log",
        netns=node.netns,
        env={**create.NODE_ENV, "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    cluster.save()


def wait_ssh(cluster: state_mod.ClusterState, node: KubeadmNode, *, timeout: float) -> None:
    """Wait until the node answers SSH (``true``); fail at once if its init exited."""

    def attempt() -> bool:
        record = cluster.node(node.name).processes[KUBEADM_INIT]
        if not hostproc.is_running(record):
            raise CreateError(
                f"the init of {node.name} exited; see {record.log}:\n{hostproc.tail(record.log)}"
            )
        asyncio.run(run(cluster.directory, node, "true", timeout=10))
        return True

    retry.Wait(
        what=f"SSH on {node.name} ({node.ip})",
        timeout=timeout,
        backoff=retry.fixed(0.5),
        retry_on=(ssh.SSHError,),
        error=CreateError,
        hint=f"see {cluster.directory / 'logs' / f'{node.name}.log'} and the node's "
        "/var/log/kubeplane/ssh.log",
    ).poll(attempt)


def route_pod_networks(cluster: state_mod.ClusterState, nodes: Sequence[KubeadmNode]) -> None:
    """In each node's namespace, a route to every other node's pod subnet via that node (netlink,
    protocol :data:`kubeplane.services.cni.ROUTE_PROTO`; only those routes are changed)."""
    from pyroute2 import IPRoute  # type: ignore[import-untyped]  # noqa: PLC0415
    from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]  # noqa: PLC0415

    for node in nodes:
        wanted = {other.pod_cidr: other.ip for other in nodes if other.name != node.name}
        try:
            with IPRoute(netns=node.netns) as ip:
                for cidr, via in wanted.items():
                    ip.route("replace", dst=cidr, gateway=via, proto=cni.ROUTE_PROTO, table=254)
        except NetlinkError as exc:
            raise CreateError(f"cannot route the pod subnets in {node.name}'s namespace: {exc}") from exc


# -- the creation ---------------------------------------------------------------------------------


class KubeadmCreation:
    """The creation of a kubeadm cluster: its plan (``--dry-run``) and how to run each step."""

    def __init__(
        self,
        cluster_plan: KubeadmPlan,
        *,
        toolchain_paths: toolchain_mod.ToolchainPaths,
        progress: plan_module.Progress | None = None,
        state_root: Path | None = None,
        step_timeout: float = 120.0,
    ) -> None:
        self.cluster_plan = cluster_plan
        self.toolchain_paths = toolchain_paths
        self.progress = progress if progress is not None else plan_module.RecordingProgress()
        self.state_root = state_root
        self.step_timeout = step_timeout
        self._cluster: state_mod.ClusterState | None = None

    @property
    def cluster(self) -> state_mod.ClusterState:
        if self._cluster is None:
            raise CreateError("the cluster state is written by the first step")
        return self._cluster

    def plan(self) -> plan_module.Plan:
        cluster_plan = self.cluster_plan
        network = cluster_plan.network
        directory = state_mod.cluster_dir(cluster_plan.name, root=self.state_root)
        first = cluster_plan.first
        workers = [node for node in cluster_plan.nodes if node.role == "worker"]
        names = ", ".join(f"{node.name} ({node.ip})" for node in cluster_plan.nodes)
        steps = [
            _step("write", "cluster state", f"{directory} (metadata, SSH key)"),
            _step("create", "network", f"bridge {network.bridge} on {network.cidr}, a namespace per node"),
            _step("start", "registry", f"{cluster_plan.registry_url} holding the images kubeadm pulls"),
            _step("start", "machines", f"containerd, kubelet (kubeadm's unit) and sshd on {names}"),
            _step("create", "pod routes", f"{POD_SUBNET}: 10.244.N.0/24 on node N, routed between the nodes"),
            _step("run", "kubeadm init", f"kubeadm init --config {KUBEADM_CONFIG}", node=first.ip),
        ]
        if workers:
            steps.append(_step("run", "kubeadm join", "kubeadm join " + ", ".join(n.name for n in workers)))
        steps.append(
            _step("write", "admin kubeconfig", f"{ADMIN_CONF} of {first.name} -> {directory / 'kubeconfig'}")
        )
        return plan_module.Plan(
            title=f"create kubeadm cluster {cluster_plan.name!r} ({cluster_plan.request.kubernetes_version})",
            steps=tuple(steps),
            rerun=create.RERUN,
        )

    async def run_step(self, step: plan_module.Step) -> plan_module.Outcome:
        handlers: dict[str, Callable[[], None]] = {
            "cluster state": self._state,
            "network": self._network,
            "registry": self._registry,
            "machines": self._machines,
            "pod routes": self._routes,
            "kubeadm init": self._init,
            "kubeadm join": self._join,
            "admin kubeconfig": self._kubeconfig,
        }
        await asyncio.to_thread(handlers[step.component])
        return plan_module.CHANGED

    def _state(self) -> None:
        self._cluster = state_mod.ClusterState.open(self.cluster_plan.name, root=self.state_root)
        meta = ClusterMeta(
            endpoint=self.cluster_plan.endpoint,
            kubernetes_version=self.cluster_plan.request.kubernetes_version,
            kind=KIND_KUBEADM,
        )
        meta.save(self._cluster.directory)
        write_client_key(self._cluster.directory)

    def _network(self) -> None:
        roles = {node.name: node.role for node in self.cluster_plan.nodes}
        netns.create(self.cluster_plan.network, self.cluster, roles=roles)

    def _registry(self) -> None:
        create.start_registry(
            self.cluster,
            address=self.cluster_plan.network.host_ip,
            toolchain_paths=self.toolchain_paths,
            progress=self.progress,
            aliases={dns_image.image_ref(): (dns_alias(self.cluster_plan),)},
        )

    def _machines(self) -> None:
        for node in self.cluster_plan.nodes:
            prepare_machine(
                self.cluster, node, paths=self.toolchain_paths, registry_url=self.cluster_plan.registry_url
            )
            start_machine(self.cluster, node, paths=self.toolchain_paths)
        for node in self.cluster_plan.nodes:
            wait_ssh(self.cluster, node, timeout=self.step_timeout)

    def _routes(self) -> None:
        route_pod_networks(self.cluster, self.cluster_plan.nodes)

    def _ssh(self, node: KubeadmNode, command: str, *, timeout: float = INIT_TIMEOUT) -> ssh.Result:
        def line(text: str) -> None:
            self.progress.info(f"{node.name}: {text}")

        return asyncio.run(run(self.cluster.directory, node, command, timeout=timeout, on_line=line))

    def _init(self) -> None:
        first = self.cluster_plan.first

        async def upload() -> None:
            async with ssh.connect(target(first), credentials(self.cluster.directory)) as session:
                await session.write(KUBEADM_CONFIG, init_config(self.cluster_plan), mode=0o600)

        asyncio.run(upload())
        self._ssh(first, f"kubeadm init --config {KUBEADM_CONFIG} {kubeadm_config.PATCHES_FLAG}")

    def _join(self) -> None:
        first = self.cluster_plan.first
        printed = asyncio.run(
            run(self.cluster.directory, first, "kubeadm token create --print-join-command", timeout=60)
        )
        join = printed.stdout.strip().splitlines()[-1]
        if not join.startswith("kubeadm join "):
            raise CreateError(f"{first.name} printed no join command: {printed.stdout.strip()!r}")
        extra = " ".join(f"--ignore-preflight-errors={check}" for check in IGNORED_PREFLIGHT)
        for node in self.cluster_plan.nodes:
            if node.role == "worker":
                self._ssh(node, f"{join} --cri-socket {shlex.quote(CRI_SOCKET)} {extra}")

    def _kubeconfig(self) -> None:
        first = self.cluster_plan.first

        async def fetch() -> bytes:
            async with ssh.connect(target(first), credentials(self.cluster.directory)) as session:
                return await session.read(ADMIN_CONF)

        text = asyncio.run(fetch()).decode()
        path = self.cluster.directory / "kubeconfig"
        write_kubeconfig(path, text)
        meta = ClusterMeta.load(self.cluster.directory)
        if meta is not None:
            meta.kubeconfig = str(path)
            meta.save(self.cluster.directory)
        self.progress.info(f"kubeconfig: {path}")


def all_nodes(cluster: state_mod.ClusterState) -> list[KubeadmNode]:
    """Every node of the cluster that has a machine (a node directory), as :class:`KubeadmNode`."""
    return [
        KubeadmNode(name=n.name, role=n.role, ip=n.ip, netns=n.netns, index=n.index)
        for n in cluster.nodes
        if n.root_dir and netns.netns_exists(n.netns)
    ]
