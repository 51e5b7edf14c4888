"""``kubeplane cluster create``: check the host, then build the planned cluster step by step.

:func:`preflight` only *reads* the host (toolchain cache, binaries, addresses, existing state).
:class:`Creation` is the creation as a :class:`kubeplane.plan.Plan` (what ``cluster create
--dry-run`` prints) and the ``run_step`` the one executor (:func:`kubeplane.plan.execute`) runs it
with. Every step records what it makes in the cluster state before it acts, so
:func:`kubeplane.provision.teardown.destroy` can undo a half-made cluster as well as a whole one:

``write cluster state`` (metadata and the secrets bundle) → ``create network`` → ``start load
balancer`` (not with ``--vip``: the control plane nodes elect the owner of the shared VIP that is
the endpoint, once they run) → ``start registry`` (seeded with the images of every complete
toolchain build in the cache, so an upgrade to another cached version pulls through it; its
storage starts as a copy of the last seeded one kept in the cache (``registry-storage``), so the
pushes mostly find their image present) → ``start master nodes`` / ``start worker nodes`` (one
``kubeplaned`` per node in its network namespace, in maintenance mode on port 50000, each waited
for) → ``apply configs`` (insecure apply; booted, a node's node API moves to the cluster's
``machine.ports``, :attr:`~kubeplane.provision.state.ClusterState.node_api_port`, where every later
call reaches it) → ``bootstrap etcd`` (the first control plane node founds etcd) →
``write client config and kubeconfig``. Waiting for health is a step the caller adds (the CLI runs
:mod:`kubeplane.ops.health`), because ``provision`` and ``ops`` are siblings that never import
each other.

A creation is not resumed in place: the resume command of a failed one destroys the half-made
cluster and creates it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kubeplane import api, retry
from kubeplane import plan as plan_module
from kubeplane.agent import owned
from kubeplane.agent import services as agent_services
from kubeplane.config import client as client_config
from kubeplane.config import defaults as config_defaults
from kubeplane.config import generate as gen
from kubeplane.config import toolchain_cache
from kubeplane.provision import (
    checkpointer_image,
    dns_image,
    hostproc,
    machine,
    netns,
    python_image,
    workload_images,
)
from kubeplane.provision import loadbalancer as lb
from kubeplane.provision import registry as registry_mod
from kubeplane.provision import state as state_mod
from kubeplane.provision import toolchain as toolchain_mod
from kubeplane.provision.cluster import (
    AGENT,
    AGENT_PORT,
    ClusterMeta,
    CreateError,
    PreflightError,
    node_hint,
    node_root,
    write_kubeconfig,
    write_secrets_bundle,
)
from kubeplane.provision.planning import ClusterPlan, ClusterRequest, NodePlan

T = TypeVar("T")

#: Host tools a cluster needs besides the toolchain (Debian package in parentheses).
HOST_TOOLS = {
    "haproxy": "haproxy",
    "docker-registry": "docker-registry",
    "skopeo": "skopeo",
    "containerd": "containerd",
    "nsenter": "util-linux",
}
#: What the nodes run for ``--wireguard-cidr`` (this kernel has no wireguard module).
WIREGUARD_TOOLS = {"wireguard-go": "wireguard-go"}
#: The environment a local node's agent adds to the host's, which its services inherit. A local
#: node is no cloud machine: kubelet v1.20's built-in ECR credential provider would otherwise
#: ask the EC2 metadata address for credentials at every kubelet start and wait about 6 s for an
#: answer that never comes from a node's network namespace (the kubelet's log shows
#: ``aws_credentials.go: while getting AWS credentials``). Local nodes pull through the cluster's
#: registry only; ``machine.env`` still replaces this for a node that wants otherwise.
NODE_ENV = {"AWS_EC2_METADATA_DISABLED": "true"}


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
    tools = dict(HOST_TOOLS)
    if cluster_plan.network.vip:
        del tools["haproxy"]
    if cluster_plan.request.wireguard_cidr is not None:
        tools.update(WIREGUARD_TOOLS)
    missing = [
        f"{tool} (Debian package {package})" for tool, package in tools.items() if not shutil.which(tool)
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


@dataclasses.dataclass(frozen=True)
class CreatedCluster:
    """What a :class:`Creation` made that the caller needs next (waits, printing)."""

    name: str
    directory: Path
    endpoint: str
    kubeconfig: Path
    client_config_path: Path
    controlplanes: tuple[str, ...]
    workers: tuple[str, ...]
    credentials: api.Credentials
    #: Where the booted nodes' node API listens (``cluster create --node-api-port``).
    node_api_port: int = api.DEFAULT_PORT

    def node_api_endpoint(self, ip: str) -> str:
        """The node API of the (booted) node at ``ip``, with the cluster's port when it moved it."""
        return gen.node_api_endpoint(ip, self.node_api_port)

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The node API endpoints of the control plane nodes (the client config context's)."""
        return tuple(self.node_api_endpoint(ip) for ip in self.controlplanes)


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def _retry(action: Callable[[], T], *, timeout: float, what: str, hint: str) -> T:
    """Call ``action`` until it stops raising an API error; the last one ends up in the message."""
    done = retry.Wait(
        what=what,
        timeout=timeout,
        backoff=retry.fixed(0.5),
        retry_on=(api.APIError,),
        error=CreateError,
        hint=hint,
    ).poll(lambda: (action(),))
    return done[0]


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


KIND_STATE = "write"
KIND_NETWORK = "create"
KIND_START = "start"
KIND_APPLY = "apply"
KIND_BOOTSTRAP = "bootstrap"

#: What a re-run of a failed creation does (its resume command destroys and creates again).
RERUN = "the half-made cluster stays for inspection until destroyed; the creation starts over"


def new_step(kind: str, component: str, target: str, node: str = "") -> plan_module.Step:
    """A step of a provisioning plan (create, grow, kubeadm create): nothing to compare first."""
    return plan_module.Step(kind=kind, component=component, node=node, current="", target=target)


class Creation:
    """The creation of ``cluster_plan`` (after :func:`preflight`): its plan and how to run each step."""

    def __init__(
        self,
        cluster_plan: ClusterPlan,
        *,
        toolchain_paths: toolchain_mod.ToolchainPaths,
        client_config_path: Path,
        progress: plan_module.Progress | None = None,
        state_root: Path | None = None,
        step_timeout: float = 120.0,
    ) -> None:
        self.cluster_plan = cluster_plan
        self.toolchain_paths = toolchain_paths
        self.client_config_path = client_config_path
        self.progress = progress if progress is not None else plan_module.RecordingProgress()
        self.state_root = state_root
        self.step_timeout = step_timeout
        context_name, context = client_config.current(cluster_plan.client_config)
        self._context_name = context_name
        self.credentials = api.Credentials(
            ca=context.ca_pem, cert=context.client.cert, key=context.client.key
        )
        self._cluster: state_mod.ClusterState | None = None
        self._meta = ClusterMeta(
            endpoint=cluster_plan.endpoint, kubernetes_version=cluster_plan.request.kubernetes_version
        )

    def plan(self) -> plan_module.Plan:
        """The steps, in the order :meth:`run_step` takes them."""
        cluster_plan = self.cluster_plan
        network = cluster_plan.network
        directory = state_mod.cluster_dir(cluster_plan.name, root=self.state_root)
        seeded = "the images of every complete cached toolchain build, the cluster DNS image"
        seeded += ", the pod-checkpointer image" if cluster_plan.request.self_hosted else ""
        seeded += " and the busybox and agnhost workload images"
        steps = [
            new_step(KIND_STATE, "cluster state", f"{directory} (metadata, secrets bundle)"),
            new_step(
                KIND_NETWORK, "network", f"bridge {network.bridge} on {network.cidr}, a namespace per node"
            ),
        ]
        if not network.vip:
            steps.append(
                new_step(
                    KIND_START,
                    "load balancer",
                    f"haproxy on {network.host_ip}:{lb.API_PORT} to {len(cluster_plan.controlplanes)} "
                    "control plane nodes",
                )
            )
        steps.append(new_step(KIND_START, "registry", f"{cluster_plan.registry_url} holding {seeded}"))
        for role, title in (("controlplane", "master nodes"), ("worker", "worker nodes")):
            members = [node for node in cluster_plan.nodes if node.role == role]
            if members:
                names = ", ".join(f"{node.name} ({node.ip})" for node in members)
                steps.append(new_step(KIND_START, title, f"{AGENT} in maintenance mode on {names}"))
        configs = f"{len(cluster_plan.nodes)} machine configs (insecure)"
        ports = (cluster_plan.node_api_port, cluster_plan.trustd_port)
        if ports != (AGENT_PORT, config_defaults.DEFAULT_TRUSTD_PORT):
            configs += f"; booted, the node API moves to port {ports[0]}, trustd to {ports[1]}"
        if network.vip:
            configs += f"; the control plane nodes elect the owner of the endpoint's VIP {network.vip}"
        steps.append(new_step(KIND_APPLY, "configs", configs))
        first = cluster_plan.controlplanes[0]
        founding = "self-hosted control plane" if cluster_plan.request.self_hosted else "static pods"
        steps.append(new_step(KIND_BOOTSTRAP, "etcd", f"founded here, {founding}", node=first.ip))
        steps.append(new_step(KIND_STATE, "client config and kubeconfig", str(self.client_config_path)))
        return plan_module.Plan(
            title=f"create cluster {cluster_plan.name!r} ({cluster_plan.request.kubernetes_version})",
            steps=tuple(steps),
            rerun=RERUN,
        )

    async def run_step(self, step: plan_module.Step) -> plan_module.Outcome:
        """Run one step (in a thread: the node API calls of a step run their own event loop)."""
        handlers: dict[str, Callable[[], None]] = {
            "cluster state": self._state,
            "network": self._network,
            "load balancer": self._load_balancer,
            "registry": self._registry,
            "master nodes": lambda: self._nodes("controlplane"),
            "worker nodes": lambda: self._nodes("worker"),
            "configs": self._configs,
            "etcd": self._bootstrap,
            "client config and kubeconfig": self._client_config,
        }
        await asyncio.to_thread(handlers[step.component])
        return plan_module.CHANGED

    def created(self) -> CreatedCluster:
        """What the steps made that the caller needs next (waits, printing)."""
        return CreatedCluster(
            name=self.cluster_plan.name,
            directory=self.cluster.directory,
            endpoint=self.cluster_plan.endpoint,
            kubeconfig=self.cluster.directory / "kubeconfig",
            client_config_path=self.client_config_path,
            controlplanes=tuple(node.ip for node in self.cluster_plan.controlplanes),
            workers=tuple(node.ip for node in self.cluster_plan.workers),
            credentials=self.credentials,
            node_api_port=self.cluster_plan.node_api_port,
        )

    @property
    def cluster(self) -> state_mod.ClusterState:
        if self._cluster is None:
            raise CreateError("the cluster state is written by the first step")
        return self._cluster

    # -- the steps --

    def _state(self) -> None:
        self._cluster = state_mod.ClusterState.open(self.cluster_plan.name, root=self.state_root)
        self._cluster.node_api_port = self.cluster_plan.node_api_port
        self._cluster.trustd_port = self.cluster_plan.trustd_port
        self._cluster.save()
        self._meta.save(self._cluster.directory)
        write_secrets_bundle(self._cluster.directory, self.cluster_plan.secrets)

    def _network(self) -> None:
        roles = {node.name: node.role for node in self.cluster_plan.nodes}
        netns.create(self.cluster_plan.network, self.cluster, roles=roles)

    def _load_balancer(self) -> None:
        cluster = self.cluster
        haproxy = lb.HAProxy(directory=cluster.directory / "haproxy")
        cluster.dirs["haproxy"] = str(haproxy.directory)
        haproxy.write_config(
            bind_address=self.cluster_plan.network.host_ip,
            backends=[
                lb.Backend(name=node.name, address=node.ip) for node in self.cluster_plan.controlplanes
            ],
        )
        cluster.processes["haproxy"] = haproxy.start()
        cluster.save()

    def _registry(self) -> None:
        start_registry(
            self.cluster,
            address=self.cluster_plan.network.host_ip,
            toolchain_paths=self.toolchain_paths,
            progress=self.progress,
            self_hosted=self.cluster_plan.request.self_hosted,
        )

    def _nodes(self, role: str) -> None:
        command = agent_command()
        members = [node for node in self.cluster_plan.nodes if node.role == role]
        for node in members:
            start_agent(self.cluster, node, command=command)
        for node in members:
            wait_maintenance(self.cluster.node(node.name), timeout=self.step_timeout)

    def _configs(self) -> None:
        for node in self.cluster_plan.nodes:
            apply_config(self.cluster.node(node.name), node.config, timeout=self.step_timeout)

    def _bootstrap(self) -> None:
        first = self.cluster.node(self.cluster_plan.controlplanes[0].name)
        address = self.cluster.node_api_endpoint(first.ip)
        _retry(
            lambda: _run(_bootstrap(address, self.credentials, request=self.cluster_plan.request)),
            timeout=self.step_timeout,
            what=f"bootstrap of {first.name} ({first.ip})",
            hint=node_hint(first),
        )

    def _client_config(self) -> None:
        cluster, meta, path = self.cluster, self._meta, self.client_config_path
        first = cluster.node(self.cluster_plan.controlplanes[0].name)
        merged, renames = client_config.merge(
            _without(client_config.load(path), self._context_name), self.cluster_plan.client_config
        )
        client_config.save(merged, path)
        meta.client_config_path = str(path)
        meta.context = renames.get(self._context_name, self._context_name)
        meta.save(cluster.directory)
        text = _retry(
            lambda: _run(_kubeconfig(self.cluster.node_api_endpoint(first.ip), self.credentials)),
            timeout=self.step_timeout,
            what=f"fetching the admin kubeconfig from {first.name}",
            hint=node_hint(first),
        )
        kubeconfig_path = cluster.directory / "kubeconfig"
        write_kubeconfig(kubeconfig_path, text)
        meta.kubeconfig = str(kubeconfig_path)
        meta.save(cluster.directory)
        self.progress.info(f"merged context {meta.context!r} into {path} (current)")
        self.progress.info(f"kubeconfig: {kubeconfig_path}")


def _without(config: client_config.ClientConfig, name: str) -> client_config.ClientConfig:
    # A context of the same name is a leftover of an earlier cluster with this name: replace it.
    return client_config.remove_context(config, name) if name in config.contexts else config


def start_registry(
    cluster: state_mod.ClusterState,
    *,
    address: str,
    toolchain_paths: toolchain_mod.ToolchainPaths,
    progress: plan_module.Progress,
    self_hosted: bool = False,
    aliases: dict[str, tuple[str, ...]] | None = None,
) -> None:
    """Start the cluster's registry on ``address`` and seed it (see the module docstring):
    the images of every complete cached toolchain build (the kubeadm-only ones too), the cluster
    DNS image, the pod-checkpointer image when ``self_hosted``, the workload images. ``aliases``
    pushes an image under more names as well (a kubeadm cluster runs the DNS image as its
    CoreDNS). ``cluster add`` and ``cluster create --kubeadm`` share it."""
    registry = registry_mod.Registry(directory=cluster.directory / "registry", address=address)
    cluster.dirs["registry"] = str(registry.directory)
    cache = toolchain_paths.root.parent.parent
    seed = cache / toolchain_cache.REGISTRY_STORAGE_DIR
    restored = registry_mod.restore_storage(seed, registry.storage)
    cluster.processes["registry"] = registry.start()
    cluster.save()
    log = cluster.directory / "logs" / "registry-seed.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    pushed_any = False
    with log.open("a") as out:
        out.write(f"storage {'restored from' if restored else 'empty, no copy of'} {seed}\n")
        for paths in registry_toolchains(toolchain_paths):
            # The kubeadm-only images (etcd) too: a kubeadm cluster pulls them through here.
            archives = [(paths.image_ref(name), tar) for name, tar in paths.images.items()]
            archives += [(ref, tar) for ref, tar in paths.kubeadm_images.items() if tar.is_file()]
            for ref, tar in archives:
                pushed = registry.push(tar, ref)
                pushed_any |= pushed
                out.write(f"{ref}: {'pushed' if pushed else 'already present'}\n")
        # kubeplane's own images and the workload images (`kubectl run --image=busybox`, an
        # agnhost echo server pull offline) live in the same cache as the toolchain build;
        # each is built here if the cache lacks it. Every cluster runs the DNS add-on's image.
        own: list[python_image.Builder] = [dns_image.Builder(cache)]
        if self_hosted:
            own.append(checkpointer_image.Builder(cache))
        pushes: list[tuple[Path, tuple[str, ...]]] = []
        for builder in own:
            image = builder.ensure(progress=progress)
            pushes.append((image.archive, (image.ref, *(aliases or {}).get(image.ref, ()))))
        for workload in workload_images.Builder(cache).ensure(progress=progress):
            pushes.append((workload.archive, workload.refs))
        for archive, refs in pushes:
            for ref in refs:
                pushed = registry.push(archive, ref)
                pushed_any |= pushed
                out.write(f"{ref}: {'pushed' if pushed else 'already present'}\n")
    if pushed_any:
        # The next cluster starts from this storage. Only a speed-up: without it (a cache
        # that is not writable), every create pushes as before.
        try:
            registry_mod.save_storage(registry.storage, seed)
        except OSError as exc:
            progress.info(f"could not keep a copy of the registry storage in {seed}: {exc}")


def power_on(cluster: state_mod.ClusterState, name: str) -> None:
    """Start node ``name``'s agent again over its directory, after it was stopped or powered off: it
    boots with its saved config, as a machine switched back on."""
    node = cluster.node(name)
    plan = NodePlan(node.name, node.role, node.ip, node.netns, config="")
    start_agent(cluster, plan, command=agent_command())


def start_agent(cluster: state_mod.ClusterState, node: NodePlan, *, command: Sequence[str]) -> None:
    """Start ``kubeplaned`` for the recorded node ``node`` in its namespace (a machine over its own
    directory), recording its directory, cgroups and process first; nothing if it already runs.
    ``cluster add`` starts its nodes with this too."""
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
        env=NODE_ENV,
    )
    cluster.save()


def wait_maintenance(node: state_mod.NodeState, *, timeout: float) -> None:
    """Wait until the node's agent answers (insecure: it has no config yet) on ``--listen``'s
    :data:`AGENT_PORT`, whatever ports its config will move it to; fail if it exited."""

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


def apply_config(node: state_mod.NodeState, text: str, *, timeout: float) -> None:
    """Apply machine config ``text`` to the node in maintenance mode (insecure), retried."""

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
