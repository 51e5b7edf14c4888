"""Local clusters end to end: plan, create, destroy and show (``kubeplane cluster ...``).

This module orchestrates the building blocks of :mod:`kubeplane.provision` into the user's main
job; it adds no mechanism of its own beyond finding a node's leftover processes.

Planning (:func:`plan`) is pure: names, addresses, the generated PKI and one validated machine
config per node. Together with :func:`preflight` (which only *reads* the host: toolchain cache,
binaries, addresses, existing state) it runs before anything is created, so a mistake such as a
bad ``--config-patch`` fails without touching the network or the disk.

Creation (:func:`create`) then runs named steps, each recorded in the cluster state before it
acts, so :func:`destroy` can undo a half-made cluster as well as a whole one:

``creating network`` → ``creating load balancer`` → ``creating registry`` (seeded with the
images of every complete toolchain build in the cache, so an upgrade to another cached version
pulls through it) → ``creating master nodes`` / ``creating worker nodes`` (one ``kubeplaned`` per
node in its network namespace, in maintenance mode) → ``applying configs`` (insecure apply) →
``bootstrapping`` (the first control plane node founds etcd) → ``writing client config and
kubeconfig``. Waiting for health is the caller's (the CLI runs :mod:`kubeplane.ops.health`),
because ``provision`` and ``ops`` are siblings that never import each other.

Destroy order, and why: agents first with SIGTERM (each stops its kubelet, containers,
containerd and etcd as a powered-off machine would); then whatever still runs *inside a node* —
found by membership of the node's network namespace or of its kubelet cgroup root, never by
process name — is killed; then mounts under each node root are unmounted deepest first, the
cgroup directories removed, haproxy and the registry stopped, links and namespaces deleted, the
client config context removed and the cluster directory deleted. Every step tolerates what is
already gone, so destroy is safe to repeat.

Errors (all :class:`ClusterError`): :class:`PlanError` (the request is invalid; nothing was
touched), :class:`PreflightError` (the host cannot run it: missing tools, toolchain, address
conflict, cluster exists; nothing was touched), :class:`CreateError` (a creation step failed;
the message names it and where to look; ``kubeplane cluster destroy`` cleans up). A failing
step is raised as :class:`kubeplane.provision.steps.StepFailed` wrapping one of these.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kubeplane import api, fileio
from kubeplane import config as config_mod
from kubeplane.agent import owned
from kubeplane.agent import services as agent_services
from kubeplane.config import client as client_config
from kubeplane.config import generate as gen
from kubeplane.provision import checkpointer_image, hostproc, machine, netns
from kubeplane.provision import loadbalancer as lb
from kubeplane.provision import registry as registry_mod
from kubeplane.provision import state as state_mod
from kubeplane.provision import steps as steps_mod
from kubeplane.provision import toolchain as toolchain_mod

T = TypeVar("T")

DEFAULT_NAME = "kubeplane"
DEFAULT_VERSION = config_mod.defaults.KUBERNETES_VERSION
AGENT = "kubeplaned"
AGENT_PORT = api.DEFAULT_PORT
#: The cluster's own metadata beside the state file (endpoint, client config it was merged into).
META_FILE = "cluster.json"
SECRETS_FILE = "secrets.yaml"
#: Host tools a cluster needs besides the toolchain (Debian package in parentheses).
HOST_TOOLS = {
    "haproxy": "haproxy",
    "docker-registry": "docker-registry",
    "skopeo": "skopeo",
    "containerd": "containerd",
    "nsenter": "util-linux",
}
#: How long an agent may take to stop its services before it is killed.
AGENT_STOP_TIMEOUT = 60.0


class ClusterError(Exception):
    """Base of this module's errors."""


class PlanError(ClusterError):
    """The request is invalid (name, CIDR, counts, config patches); nothing was touched."""


class PreflightError(ClusterError):
    """The host cannot create this cluster as asked; nothing was touched."""


class CreateError(ClusterError):
    """A creation step failed; the message names it and where to look."""


# -- planning --------------------------------------------------------------------------------


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


def node_names(cluster: str, *, controlplanes: int, workers: int) -> list[tuple[str, state_mod.Role]]:
    """``<cluster>-controlplane-N`` then ``<cluster>-worker-N``: control plane nodes first."""
    return [(f"{cluster}-controlplane-{i}", "controlplane") for i in range(1, controlplanes + 1)] + [
        (f"{cluster}-worker-{i}", "worker") for i in range(1, workers + 1)
    ]


def _local_defaults(document: gen.Document) -> gen.Document:
    """Defaults of local clusters for what the user's patches left unset.

    No Debian package ships a CNI or CoreDNS image: the nodes use the bridge CNI config the
    agent writes (``cni: none`` leaves the flannel manifest out) and CoreDNS, which could never
    pull, is disabled.
    """
    cluster = document.setdefault("cluster", {})
    cluster.setdefault("network", {}).setdefault("cni", {"name": "none"})
    cluster.setdefault("coreDNS", {"disabled": True})
    return document


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
    endpoint = f"https://{network.host_ip}:{lb.API_PORT}"
    roles = dict(names)
    cp_ips = tuple(node.ip for node in network.nodes if roles[node.name] == "controlplane")
    options = gen.GenOptions(
        cluster_name=request.name,
        endpoint=endpoint,
        kubernetes_version=request.kubernetes_version,
        additional_sans=(network.host_ip,),
        registry_mirrors={"*": (registry_url,), **request.registry_mirrors},
        client_endpoints=cp_ips,
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
        "controlplane": _local_defaults(controlplane_document),
        "worker": _local_defaults(_patched(generated.documents["worker"], request.worker_patches, "worker")),
    }
    nodes = tuple(
        NodePlan(
            name=address.name,
            role=roles[address.name],
            ip=address.ip,
            netns=address.netns,
            config=_node_config(role_documents[roles[address.name]], hostname=address.name),
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


def _node_config(document: gen.Document, *, hostname: str) -> str:
    """The node's config: its role's document with its hostname, validated like the agent does."""
    patched = gen.apply_patches(document, [{"machine": {"network": {"hostname": hostname}}}])
    text = gen.dump_yaml(patched)
    try:
        config_mod.load(text)
    except config_mod.ConfigError as exc:
        raise PlanError(f"the machine config of node {hostname} is invalid: {exc}") from exc
    return text


# -- the host --------------------------------------------------------------------------------


def agent_command() -> list[str]:
    """How to run ``kubeplaned``: the console script beside this Python, else the one on PATH."""
    beside = Path(sys.executable).parent / AGENT
    if beside.is_file():
        return [str(beside)]
    found = shutil.which(AGENT)
    if found is None:
        raise PreflightError(f"{AGENT} is not installed: install kubeplane (pip install -e .) first")
    return [found]


def preflight(
    cluster_plan: ClusterPlan, *, toolchain: toolchain_mod.Toolchain, state_root: Path | None = None
) -> toolchain_mod.ToolchainPaths:
    """Check the host can create the cluster without changing anything; return the toolchain paths."""
    if os.geteuid() != 0:
        raise PreflightError("local clusters need root (network namespaces, mounts, cgroups): run as root")
    missing = [
        f"{tool} (Debian package {package})" for tool, package in HOST_TOOLS.items() if not shutil.which(tool)
    ]
    if missing:
        raise PreflightError(
            f"missing host tools: {', '.join(missing)}; run scripts/setup or apt-get install them"
        )
    agent_command()
    directory = state_mod.cluster_dir(cluster_plan.name, root=state_root)
    if (directory / state_mod.STATE_FILE).exists():
        raise PreflightError(
            f"cluster {cluster_plan.name!r} already exists (state in {directory}); "
            f"destroy it first with `kubeplane cluster destroy --name {cluster_plan.name}` "
            "or pick another --name"
        )
    try:
        paths = toolchain.require(cluster_plan.request.kubernetes_version)
        netns.check_host(cluster_plan.network, None)
    except (toolchain_mod.ToolchainError, netns.NetworkError) as exc:
        raise PreflightError(str(exc)) from exc
    return paths


# -- metadata --------------------------------------------------------------------------------


@dataclasses.dataclass
class ClusterMeta:
    """What the cluster directory records besides the state: endpoint, files written for the user."""

    endpoint: str
    kubernetes_version: str
    client_config_path: str = ""
    context: str = ""
    kubeconfig: str = ""

    @classmethod
    def load(cls, directory: Path) -> ClusterMeta | None:
        try:
            data = json.loads((directory / META_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return cls(**{field.name: str(data.get(field.name, "")) for field in dataclasses.fields(cls)})

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(dataclasses.asdict(self), indent=2) + "\n"
        fileio.write_atomic(directory / META_FILE, text, mode=fileio.PUBLIC_MODE)


def write_secrets_bundle(directory: Path, bundle: gen.SecretsBundle) -> Path:
    """``secrets.yaml`` (the cluster's CAs, keys and tokens), atomically and 0600 from the first byte."""
    path = directory / SECRETS_FILE
    fileio.write_atomic(path, gen.dump_yaml(gen.secrets_to_dict(bundle)), mode=fileio.SECRET_MODE)
    return path


def write_kubeconfig(path: Path, text: str) -> None:
    """The admin kubeconfig (cluster-admin credentials), atomically and 0600 from the first byte."""
    fileio.write_atomic(path, text, mode=fileio.SECRET_MODE)


# -- create ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CreatedCluster:
    """What :func:`create` made that the caller needs next (waits, printing)."""

    name: str
    directory: Path
    endpoint: str
    kubeconfig: Path
    client_config_path: Path
    controlplanes: tuple[str, ...]
    workers: tuple[str, ...]
    credentials: api.Credentials


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def _retry(action: Callable[[], T], *, timeout: float, what: str, hint: str) -> T:
    """Call ``action`` until it stops raising an API error; the last one ends up in the message."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except api.APIError as exc:
            if time.monotonic() >= deadline:
                raise CreateError(f"{what} did not succeed within {timeout:g}s: {exc}; {hint}") from exc
        time.sleep(0.5)


def node_root(directory: Path, node: str) -> Path:
    """The directory holding node ``node``'s machine state (``nodes/controlplane-1`` under the
    cluster directory): bind-mounted over the node's standard paths (:mod:`.machine`), so
    ``nodes/controlplane-1/var/log/kubeplane`` is that node's ``/var/log/kubeplane``."""
    return (directory / "nodes" / node.removeprefix(f"{directory.name}-")).resolve()


def node_hint(node: state_mod.NodeState) -> str:
    """Where to look when a node misbehaves."""
    logs = Path(node.root_dir) / "var" / "log" / "kubeplane"
    return f"look at {logs}/*.log (kubeplaned.log, kubelet.log, ...) or `kubeplane -n {node.ip} logs kubelet`"


def registry_toolchains(cluster_paths: toolchain_mod.ToolchainPaths) -> list[toolchain_mod.ToolchainPaths]:
    """The toolchain builds whose images seed the registry: the cluster's, then every other complete one.

    Holding every cached build makes ``upgrade-k8s --to`` any of them pull through the mirror, as
    an air-gapped registry holds the target release before an upgrade; incomplete builds are left
    out (their images may be partial).
    """
    cache = toolchain_mod.Toolchain(cluster_paths.root.parent.parent)
    others = []
    for version in cache.versions():
        if version == cluster_paths.version:
            continue
        with contextlib.suppress(toolchain_mod.ToolchainError):
            others.append(cache.require(version))
    return [cluster_paths, *others]


def create(
    cluster_plan: ClusterPlan,
    *,
    toolchain_paths: toolchain_mod.ToolchainPaths,
    client_config_path: Path,
    progress: steps_mod.Progress = steps_mod.no_progress,
    state_root: Path | None = None,
    step_timeout: float = 120.0,
) -> CreatedCluster:
    """Create the cluster of ``cluster_plan`` (after :func:`preflight`); see the module docstring."""
    cluster = state_mod.ClusterState.open(cluster_plan.name, root=state_root)
    meta = ClusterMeta(
        endpoint=cluster_plan.endpoint, kubernetes_version=cluster_plan.request.kubernetes_version
    )
    meta.save(cluster.directory)
    write_secrets_bundle(cluster.directory, cluster_plan.secrets)
    steps = steps_mod.Steps(cluster.directory / "logs", progress)
    roles = {node.name: node.role for node in cluster_plan.nodes}

    with steps.step("creating network", cluster_plan.network.bridge):
        netns.create(cluster_plan.network, cluster, roles=roles)

    with steps.step("creating load balancer", f"{cluster_plan.network.host_ip}:{lb.API_PORT}"):
        haproxy = lb.HAProxy(directory=cluster.directory / "haproxy")
        cluster.dirs["haproxy"] = str(haproxy.directory)
        haproxy.write_config(
            bind_address=cluster_plan.network.host_ip,
            backends=[lb.Backend(name=node.name, address=node.ip) for node in cluster_plan.controlplanes],
        )
        cluster.processes["haproxy"] = haproxy.start()
        cluster.save()

    with steps.step("creating registry", cluster_plan.registry_url) as log:
        registry = registry_mod.Registry(
            directory=cluster.directory / "registry", address=cluster_plan.network.host_ip
        )
        cluster.dirs["registry"] = str(registry.directory)
        cluster.processes["registry"] = registry.start()
        cluster.save()
        with log.open("a") as out:
            for paths in registry_toolchains(toolchain_paths):
                for name, tar in paths.images.items():
                    ref = paths.image_ref(name)
                    pushed = registry.push(tar, ref)
                    out.write(f"{ref}: {'pushed' if pushed else 'already present'}\n")
            if cluster_plan.request.self_hosted:
                image = checkpointer_image.Builder().ensure(progress=progress)
                pushed = registry.push(image.archive, image.ref)
                out.write(f"{image.ref}: {'pushed' if pushed else 'already present'}\n")

    command = agent_command()
    for role, title in (("controlplane", "creating master nodes"), ("worker", "creating worker nodes")):
        members = [node for node in cluster_plan.nodes if node.role == role]
        if not members:
            continue
        with steps.step(title, ", ".join(node.name for node in members)):
            for node in members:
                _start_agent(cluster, node, command=command)
            for node in members:
                _wait_maintenance(cluster.node(node.name), timeout=step_timeout)

    with steps.step("applying configs"):
        for node in cluster_plan.nodes:
            _apply(cluster.node(node.name), node.config, timeout=step_timeout)

    context_name, context = client_config.current(cluster_plan.client_config)
    credentials = api.Credentials(ca=context.ca_pem, cert=context.client.cert, key=context.client.key)
    first = cluster.node(cluster_plan.controlplanes[0].name)
    with steps.step("bootstrapping", first.name):
        _retry(
            lambda: _run(_bootstrap(first.ip, credentials, request=cluster_plan.request)),
            timeout=step_timeout,
            what=f"bootstrap of {first.name} ({first.ip})",
            hint=node_hint(first),
        )

    kubeconfig_path = cluster.directory / "kubeconfig"
    with steps.step("writing client config and kubeconfig", str(client_config_path)):
        merged, renames = client_config.merge(
            _without(client_config.load(client_config_path), context_name), cluster_plan.client_config
        )
        client_config.save(merged, client_config_path)
        meta.client_config_path = str(client_config_path)
        meta.context = renames.get(context_name, context_name)
        meta.save(cluster.directory)
        text = _retry(
            lambda: _run(_kubeconfig(first.ip, credentials)),
            timeout=step_timeout,
            what=f"fetching the admin kubeconfig from {first.name}",
            hint=node_hint(first),
        )
        write_kubeconfig(kubeconfig_path, text)
        meta.kubeconfig = str(kubeconfig_path)
        meta.save(cluster.directory)

    return CreatedCluster(
        name=cluster_plan.name,
        directory=cluster.directory,
        endpoint=cluster_plan.endpoint,
        kubeconfig=kubeconfig_path,
        client_config_path=client_config_path,
        controlplanes=tuple(node.ip for node in cluster_plan.controlplanes),
        workers=tuple(node.ip for node in cluster_plan.workers),
        credentials=credentials,
    )


def _without(config: client_config.ClientConfig, name: str) -> client_config.ClientConfig:
    # A context of the same name is a leftover of an earlier cluster with this name: replace it.
    return client_config.remove_context(config, name) if name in config.contexts else config


def _start_agent(cluster: state_mod.ClusterState, node: NodePlan, *, command: Sequence[str]) -> None:
    record = cluster.node(node.name)
    root = node_root(cluster.directory, node.name)
    root.mkdir(parents=True, exist_ok=True)
    try:
        created = machine.prepare(root)
    except machine.MachineError as exc:
        raise CreateError(f"node {node.name}: {exc}") from exc
    cluster.host_dirs = list(dict.fromkeys([*cluster.host_dirs, *map(str, created)]))
    record.root_dir = str(root)
    # The node's /etc/machine-id is the one in its directory (machine.prepare made it).
    cgroups = agent_services.NodeServices.node_cgroups(root)
    record.cgroups = [str(path) for path in owned.cgroup_paths(cgroups)]
    cluster.save()
    existing = record.processes.get(AGENT)
    if existing is not None and hostproc.is_running(existing):
        return
    # The node is a machine: its agent runs with the default root, /, over its own bind mounts.
    agent = [*command, "--listen", f"{node.ip}:{AGENT_PORT}", "--node-name", node.name]
    record.processes[AGENT] = hostproc.start(
        machine.argv(node_dir=root, hostname=node.name, command=agent),
        name=f"{AGENT} {node.name}",
        log=cluster.directory / "logs" / f"{node.name}.log",
        netns=node.netns,
    )
    cluster.save()


def _wait_maintenance(node: state_mod.NodeState, *, timeout: float) -> None:
    async def version() -> object:
        async with api.NodeClient.insecure([node.ip], timeout=5.0) as client:
            return (await client.version())[0].unwrap()

    def attempt() -> object:
        record = node.processes[AGENT]
        if not hostproc.is_running(record):
            raise CreateError(
                f"the agent of {node.name} exited; see {record.log}:\n{hostproc.tail(record.log)}"
            )
        return _run(version())

    _retry(
        attempt,
        timeout=timeout,
        what=f"the agent of {node.name} answering on {node.ip}",
        hint=node_hint(node),
    )


def _apply(node: state_mod.NodeState, text: str, *, timeout: float) -> None:
    async def apply() -> object:
        async with api.NodeClient.insecure([node.ip], timeout=30.0) as client:
            return (await client.apply_configuration(text, mode="reboot"))[0].unwrap()

    _retry(
        lambda: _run(apply()),
        timeout=timeout,
        what=f"applying the config of {node.name}",
        hint=node_hint(node),
    )


async def _bootstrap(address: str, credentials: api.Credentials, *, request: ClusterRequest) -> object:
    async with api.NodeClient([address], credentials=credentials, timeout=30.0) as client:
        if not request.self_hosted:
            return (await client.bootstrap())[0].unwrap()
        replies = await client.bootstrap(
            self_hosted=True,
            checkpointer_image=checkpointer_image.image_ref(),
            checkpointer_grace_period=request.checkpointer_grace_period,
        )
        return replies[0].unwrap()


async def _kubeconfig(address: str, credentials: api.Credentials) -> str:
    async with api.NodeClient([address], credentials=credentials) as client:
        return str((await client.kubeconfig())[0].unwrap()["kubeconfig"])


# -- destroy ---------------------------------------------------------------------------------


def exists(name: str, *, state_root: Path | None = None) -> bool:
    return (state_mod.cluster_dir(name, root=state_root) / state_mod.STATE_FILE).exists()


def destroy(
    name: str, *, state_root: Path | None = None, progress: Callable[[str], None] = lambda _: None
) -> bool:
    """Remove everything cluster ``name`` made; False if there was nothing to remove."""
    directory = state_mod.cluster_dir(name, root=state_root)
    if not (directory / state_mod.STATE_FILE).exists():
        if directory.exists():
            shutil.rmtree(directory)
        return False
    cluster = state_mod.ClusterState.load(name, root=state_root)
    meta = ClusterMeta.load(directory)
    progress("stopping node agents")
    agents = [node.processes[AGENT] for node in cluster.nodes if AGENT in node.processes]
    pod_netns = pod_netns_of_all([record.pid for record in agents if hostproc.is_running(record)])
    for record in agents:
        if hostproc.is_running(record):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGTERM)
    for record in agents:
        hostproc.stop(record, timeout=AGENT_STOP_TIMEOUT)
    progress("stopping what the nodes left running")
    for node in cluster.nodes:
        kill_node_processes(node)
    # The CNI plugin's per-pod network namespaces were mounted inside the nodes' mount namespaces;
    # with those gone only their (empty) names are left under /run/netns.
    remove_pod_netns_names(pod_netns)
    progress("unmounting node filesystems and removing cgroups")
    for node in cluster.nodes:
        if node.root_dir:
            unmount_under(Path(node.root_dir))
        for cgroup in node.cgroups:
            owned.remove_cgroup(Path(cgroup))
    for path in cluster.cgroups:
        owned.remove_cgroup(Path(path))
    left = machine.remove_host_dirs([Path(path) for path in cluster.host_dirs])
    if left:
        progress(f"keeping mount points another node still mounts on: {', '.join(map(str, left))}")
    progress("stopping the load balancer and the registry")
    for record in cluster.processes.values():
        hostproc.stop(record)
    progress("removing the network")
    netns.destroy(cluster)
    if meta is not None and meta.client_config_path and meta.context:
        progress(f"removing context {meta.context!r} from {meta.client_config_path}")
        _remove_context(Path(meta.client_config_path), meta.context, endpoint_ips=_cp_ips(cluster))
    cluster.remove()
    return True


def _cp_ips(cluster: state_mod.ClusterState) -> tuple[str, ...]:
    return tuple(node.ip for node in cluster.nodes if node.role == "controlplane")


def _remove_context(path: Path, name: str, *, endpoint_ips: tuple[str, ...]) -> None:
    try:
        config = client_config.load(path)
    except client_config.ClientConfigError:
        return
    context = config.contexts.get(name)
    # Only the context this cluster wrote: a same-named one pointing elsewhere is the user's.
    if context is not None and context.endpoints == endpoint_ips:
        client_config.save(client_config.remove_context(config, name), path)


def pod_netns_of(pid: int) -> set[str]:
    """Names of the pod network namespaces (``/run/netns/cni-*``) mounted in ``pid``'s mount namespace."""
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        fields = line.split()
        point = fields[4] if len(fields) > 4 else ""
        parent, _, leaf = point.rpartition("/")
        if parent in ("/run/netns", "/var/run/netns") and leaf.startswith("cni-"):
            found.add(leaf)
    return found


def netns_members(netns_name: str) -> list[int]:
    """PIDs whose network namespace is ``netns_name`` (the namespace file's inode)."""
    try:
        target = os.stat(netns.NETNS_DIR / netns_name)
    except FileNotFoundError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                ns = os.stat(entry / "ns" / "net")
                if (ns.st_ino, ns.st_dev) == (target.st_ino, target.st_dev):
                    found.append(int(entry.name))
    return found


def node_processes(node: state_mod.NodeState) -> list[int]:
    """Processes still running for ``node``: in its network namespace or its kubelet cgroup root."""
    return sorted(set(netns_members(node.netns)) | set(owned.cgroup_members(node.cgroups)))


def stop_node(node: state_mod.NodeState) -> None:
    """Take one node down for good: stop its agent, kill what it left running, remove pod netns names."""
    record = node.processes.get(AGENT)
    pod_netns = pod_netns_of_all([record.pid] if record is not None and hostproc.is_running(record) else [])
    if record is not None:
        hostproc.stop(record, timeout=AGENT_STOP_TIMEOUT)
    kill_node_processes(node)
    remove_pod_netns_names(pod_netns)


def kill_node_processes(node: state_mod.NodeState, *, timeout: float = 10.0) -> None:
    """SIGKILL every process of :func:`node_processes` until none is left (or ``timeout``).

    The pod network namespaces mounted in those processes' mount namespaces die with them; their
    names, read first, are removed afterwards (see :func:`remove_pod_netns_names`).
    """
    deadline = time.monotonic() + timeout
    pod_netns = pod_netns_of_all(node_processes(node))
    try:
        _kill_until_gone(node, deadline)
    finally:
        remove_pod_netns_names(pod_netns)


def pod_netns_of_all(pids: Sequence[int]) -> set[str]:
    """:func:`pod_netns_of` over ``pids``, reading each mount namespace once."""
    seen: set[tuple[int, int]] = set()
    found: set[str] = set()
    for pid in pids:
        try:
            ns = os.stat(f"/proc/{pid}/ns/mnt")
        except OSError:
            continue
        if (ns.st_ino, ns.st_dev) not in seen:
            seen.add((ns.st_ino, ns.st_dev))
            found |= pod_netns_of(pid)
    return found


def remove_pod_netns_names(names: set[str]) -> None:
    """Remove the empty ``/run/netns`` names of pod namespaces whose mount namespace is gone.

    A name still mounted on in the host's namespace is someone else's live namespace: kept.
    """
    for netns_name in sorted(names):
        leftover = netns.NETNS_DIR / netns_name
        if leftover.exists() and not os.path.ismount(leftover):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def _kill_until_gone(node: state_mod.NodeState, deadline: float) -> None:
    while pids := node_processes(node):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if time.monotonic() >= deadline:
            raise ClusterError(
                f"processes {pids} of node {node.name} survive SIGKILL; check `ps -o pid,stat,cmd -p "
                f"{','.join(map(str, pids))}` and run destroy again"
            )
        time.sleep(0.1)


def unmount_under(root: Path) -> None:
    """Unmount everything at or below ``root``, deepest first (lazily if a mount stays busy)."""
    for _ in range(3):
        points = owned.mounts_under(root)
        if not points:
            return
        for point in points:
            owned.unmount(point)
    left = owned.mounts_under(root)
    if left:
        raise ClusterError(
            f"cannot unmount {', '.join(map(str, left))}; unmount them by hand and run destroy again"
        )


# -- show ------------------------------------------------------------------------------------


def show(name: str, *, state_root: Path | None = None) -> dict[str, Any]:
    """The cluster as a document: name, endpoint, version, and each node's role, IP and agent."""
    cluster = state_mod.ClusterState.load(name, root=state_root)
    meta = ClusterMeta.load(cluster.directory)
    return {
        "name": cluster.name,
        "endpoint": meta.endpoint if meta else "",
        "kubernetes_version": meta.kubernetes_version if meta else "",
        "kubeconfig": meta.kubeconfig if meta else "",
        "client_config": meta.client_config_path if meta else "",
        "context": meta.context if meta else "",
        "cidr": cluster.network.cidr if cluster.network else "",
        "nodes": [
            {
                "name": node.name,
                "role": node.role,
                "ip": node.ip,
                "netns": node.netns,
                "root": node.root_dir,
                "agent": "running"
                if AGENT in node.processes and hostproc.is_running(node.processes[AGENT])
                else "stopped",
            }
            for node in cluster.nodes
        ],
    }


def list_clusters(*, state_root: Path | None = None) -> list[str]:
    root = state_root if state_root is not None else state_mod.clusters_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / state_mod.STATE_FILE).is_file())
