"""The node's supervised services built from its machine config: containerd, kubelet, etcd.

:class:`NodeServices` owns one :class:`~kubeplane.services.supervisor.Supervisor` per boot. It
turns the machine config, the node paths and the node's name and address into service specs,
publishes every change as a ``runtime/Services`` resource, and on halt tears the node's
containers down as a powered-off machine would (kubelet first, then every container task
through containerd, then containerd, its shims and pods by cgroup membership, the mounts its
services made, and its cgroups: only what it owns, see :mod:`kubeplane.agent.owned`).

- ``containerd``: first writes ``machine.files`` (:mod:`kubeplane.agent.machine_files`); config
  rendered from ``machine.registries`` with the sandbox image, plus an ``imports`` line for the
  guide's ``/var/cri/conf.d/*.toml`` (containerd merges those fragments itself; a fragment's
  ``[plugins."X"]`` section replaces the whole generated section of plugin X, containerd's rule);
  own socket, root and state under the node root. Healthy when ``ctr version`` answers on its
  socket.
- ``kubelet`` (after containerd is up): TLS bootstrapping with ``cluster.token`` against the
  control plane endpoint, the read-only port 10255 (the static pod status controller reads
  ``/pods`` there), CNI bridge config, its own cgroup root. Images come through the registry
  mirrors of ``machine.registries`` (the air-gapped setup) or, on a node without mirrors, are
  imported first by an :data:`ImageLoader` (the toolchain cache by default). Control plane nodes
  register with the master taint unless
  ``allowSchedulingOnMasters``; kubelet v1.20 may not set ``node-role.kubernetes.io/*`` labels
  on itself, so the agent adds them once the node registered. Healthy when ``:10248/healthz`` is.

  The kubelet's first client certificate: kubelet v1.20 retries a failed TLS bootstrap after 2, 4,
  8, 16 and 32 s, so a kubelet started long before the API server answers registers up to half a
  minute after it could. A control plane node holds the cluster CA key, so the agent signs its
  kubelet's first ``system:node:<name>`` client certificate itself into ``kubelet.conf``, as
  ``kubeadm init`` does (the kubelet rotates it through CSRs later); the kubelet then registers
  the moment the API server it runs answers. A worker has no CA key: its kubelet's pre state waits
  (at most :data:`BOOTSTRAP_WAIT` seconds) until the control plane endpoint answers, so its first
  bootstrap attempt is the one that succeeds. Both only when the kubelet has no credentials yet.
- ``etcd`` on control plane nodes: :mod:`kubeplane.agent.etcd`.

With ``machine.time.servers`` set, the kubelet's and etcd's pre states first wait (once per boot,
at most ``machine.time.bootTimeout``) for the time to be in sync: :mod:`kubeplane.agent.timegate`.

``machine.env`` (the corporate proxy guide's ``http_proxy``, ``https_proxy``, ``no_proxy``) is
added to the environment containerd and the kubelet start with, and to the ``ctr`` pulls the
agent makes itself (:meth:`NodeServices.pull_image`): containerd's CRI pulls, the kubelet's API
calls and the agent's pulls all read the proxy from there. A configured variable replaces an
inherited one of the same name in any case (``HTTP_PROXY`` for ``http_proxy``), because Go
programs prefer the upper-case form and would otherwise ignore the config. Go reads the
environment once per process, so a change takes effect when the services restart (the default
apply mode).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kubeplane import config, fileio, pki, resources
from kubeplane.agent import machine_files, owned, timegate
from kubeplane.agent.etcd import EtcdMember, cluster_admin_client
from kubeplane.clients import kube
from kubeplane.config import toolchain_cache
from kubeplane.config.paths import NodePaths
from kubeplane.resources import catalog
from kubeplane.services import containerd, kubelet, process, supervisor, timesync

log = logging.getLogger("kubeplaned.services")

CONTAINERD = "containerd"
KUBELET = "kubelet"
CRI_NAMESPACE = "k8s.io"
READ_ONLY_PORT = 10255
HEALTHZ_URL = "http://127.0.0.1:10248/healthz"
CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
MASTER_TAINT = "node-role.kubernetes.io/master=:NoSchedule"
#: The lifetime of the first kubelet client certificate a control plane node signs (the
#: kube-controller-manager's default signing duration: what a CSR would have got).
KUBELET_CLIENT_LIFETIME = datetime.timedelta(days=365)
#: Seconds a worker's kubelet waits for the control plane endpoint before its TLS bootstrap; then
#: it starts anyway (and its own retries and log take over).
BOOTSTRAP_WAIT = 120.0
#: Seconds between two looks at the control plane endpoint during that wait.
BOOTSTRAP_POLL = 0.5
#: Environment variable naming the toolchain cache (the same one :mod:`kubeplane.provision.toolchain` fills).
CACHE_ENV = toolchain_cache.CACHE_ENV

#: ``loader(socket, versions)`` makes the sandbox and component images of ``versions`` available
#: to the containerd listening on ``socket``.
ImageLoader = Callable[[Path, Sequence[str]], Awaitable[None]]


def toolchain_dir(version: str) -> Path:
    """Where the toolchain cache keeps ``version`` (``kubernetes/<version>`` below the cache)."""
    return toolchain_cache.version_dir(version)


def image_tag(image: str) -> str:
    """The tag of an image reference (``ghcr.io/x/kubelet:v1.20.2`` → ``v1.20.2``)."""
    name = image.rsplit("/", 1)[-1]
    return name.rpartition(":")[2] if ":" in name else "latest"


def service_environment(base: Mapping[str, str], machine_env: Mapping[str, str]) -> dict[str, str]:
    """``base`` (the agent's own environment) with ``machine_env`` laid over it.

    An inherited variable whose name differs from a configured one only in case is dropped:
    ``machine.env: {http_proxy: ...}`` must not lose to an ``HTTP_PROXY`` the agent inherited.
    """
    configured = {name.lower() for name in machine_env}
    kept = {name: value for name, value in base.items() if name.lower() not in configured}
    return {**kept, **machine_env}


async def ctr(socket: Path, *args: str, timeout: float = 120.0, env: Mapping[str, str] | None = None) -> str:
    """Run ``ctr --address SOCKET -n k8s.io ARGS``; raises RuntimeError with its stderr on failure.

    ``env`` is its complete environment (``None`` inherits the agent's).
    """
    result = await asyncio.to_thread(
        subprocess.run,
        ["ctr", "--address", str(socket), "-n", CRI_NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=dict(env) if env is not None else None,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"ctr {' '.join(args)}: {result.stderr.strip() or f'exit code {result.returncode}'}"
        )
    return result.stdout


def pod_network_namespaces(info: dict[str, Any]) -> set[str]:
    """Names of the named network namespaces (``/run/netns/NAME``) a container's spec joins."""
    namespaces = (info.get("Spec") or {}).get("linux", {}).get("namespaces", [])
    found = set()
    for namespace in namespaces:
        path = str(namespace.get("path") or "")
        if namespace.get("type") == "network" and path.startswith(("/var/run/netns/", "/run/netns/")):
            found.add(path.rsplit("/", 1)[1])
    return found


def split_reference(image: str) -> tuple[str, str]:
    """``(registry host, repository path with tag)`` of an image reference, Docker's way.

    The first path component is a registry host when it has a dot or a port or is ``localhost``;
    otherwise the image lives on Docker Hub (``docker.io``).
    """
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return "docker.io", image


async def pull_through_mirrors(
    socket: Path, image: str, *, mirrors: dict[str, list[str]], env: Mapping[str, str] | None = None
) -> bool:
    """Pull ``image`` into containerd (CRI namespace), trying the mirrors of its registry first.

    ``ctr`` ignores the CRI plugin's mirror config, so the mirror is resolved here the way the CRI
    plugin does it (the registry's own entry, else ``*``) and the pulled image is tagged with its
    original reference, which is what the kubelet asks for. Returns False when it was present.
    ``env`` is the environment of the pulling ``ctr`` (the node's proxy settings).
    """
    present = set((await ctr(socket, "images", "ls", "-q")).split())
    if image in present:
        return False
    host, path = split_reference(image)
    failures = []
    for endpoint in [*mirrors.get(host, mirrors.get("*", [])), None]:
        if endpoint is None:
            source, flags = image, []
        else:
            scheme, _, address = endpoint.partition("://")
            source, flags = f"{address.rstrip('/')}/{path}", (["--plain-http"] if scheme == "http" else [])
        try:
            await ctr(socket, "images", "pull", *flags, source, timeout=600.0, env=env)
            if source != image:
                await ctr(socket, "images", "tag", "--force", source, image)
            return True
        except RuntimeError as exc:
            failures.append(f"{source}: {exc}")
    raise FileNotFoundError(f"cannot pull {image}: " + "; ".join(failures))


async def import_toolchain_images(socket: Path, versions: Sequence[str]) -> None:
    """Import the docker-archive images of ``versions`` from the toolchain cache (skipping present ones)."""
    present = set((await ctr(socket, "images", "ls", "-q")).split())
    for version in dict.fromkeys(versions):
        images = toolchain_dir(version) / toolchain_cache.IMAGES_DIR
        if not images.is_dir():
            raise FileNotFoundError(
                f"no images for Kubernetes {version} in {images}; "
                f"run `kubeplane toolchain build --version {version}`"
            )
        for archive in sorted(images.glob("*.tar")):
            name = archive.stem
            ref = toolchain_cache.image_ref(name, version)
            if ref not in present:
                log.info("importing image %s from %s", ref, archive)
                await ctr(socket, "images", "import", str(archive))


def bootstrap_kubeconfig(*, server: str, ca: bytes, token: str, cluster_name: str) -> str:
    """A kubeconfig authenticating with a bootstrap token (kubelet TLS bootstrapping)."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca).decode()},
            }
        ],
        "users": [{"name": "kubelet-bootstrap", "user": {"token": token}}],
        "contexts": [
            {"name": "bootstrap", "context": {"cluster": cluster_name, "user": "kubelet-bootstrap"}}
        ],
        "current-context": "bootstrap",
    }
    return yaml.safe_dump(document, sort_keys=False)


def retarget_kubeconfig(path: Path, server: str) -> bool:
    """Point every cluster of the kubeconfig at ``path`` to ``server``, keeping its credentials;
    False when it already did or is no kubeconfig it can read (the file is then left untouched)."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        clusters = [entry["cluster"] for entry in document.get("clusters") or () if entry.get("cluster")]
    except (yaml.YAMLError, AttributeError, KeyError, TypeError) as exc:
        log.warning("kubelet kubeconfig %s not retargeted to %s: %s", path, server, exc)
        return False
    if all(cluster.get("server") == server for cluster in clusters):
        return False
    for cluster in clusters:
        cluster["server"] = server
    _write_secret(path, yaml.safe_dump(document, sort_keys=False).encode())
    log.info("kubelet kubeconfig %s now reaches %s", path, server)
    return True


def snapshot_document(snapshot: supervisor.ServiceSnapshot) -> dict[str, Any]:
    """The API form of a service (what ``kubeplane service`` prints)."""
    health = snapshot.health
    return {
        "id": snapshot.id,
        "state": snapshot.state.value,
        "running": snapshot.running,
        "pid": snapshot.pid,
        "health": {
            "healthy": bool(health.healthy),
            "unknown": health.healthy is None,
            "message": health.message,
            "last_change": health.last_change,
        },
        "events": [
            {"state": e.state.value, "message": e.message, "ts": e.timestamp} for e in snapshot.events
        ],
    }


class NodeServices:
    """The services of one booted node; :meth:`start` after boot, :meth:`stop` at halt."""

    def __init__(
        self,
        *,
        paths: NodePaths,
        document: config.MachineConfig,
        name: str,
        node_ip: str,
        state: resources.State,
        image_loader: ImageLoader = import_toolchain_images,
        emit: timegate.Emit | None = None,
    ) -> None:
        """``emit(message)`` records a node event (the boot's wait for the time sync)."""
        self.paths = paths
        self.document = document
        self.name = name
        self.node_ip = node_ip
        self.state = state
        self.image_loader = image_loader
        self.supervisor = supervisor.Supervisor(root=paths.root)
        model = document.model
        self.control_plane = model.machine.is_control_plane
        self.etcd = (
            EtcdMember(paths=paths, document=document, name=name, node_ip=node_ip)
            if self.control_plane
            else None
        )
        #: containerd's runc runtime puts its shims in ``shim_cgroup`` (``ShimCgroup``), so they are
        #: found by membership at halt, never by a command line that other containerds could share.
        self.cgroup_root, self.shim_cgroup = self.node_cgroups(paths.root)
        self.mounts = owned.MountLedger([paths.kubelet_root, paths.containerd_root, paths.containerd_state])
        self._labeler: asyncio.Task[None] | None = None
        self._emit = emit or (lambda message: log.info("%s", message))
        self._time_sync: asyncio.Task[bool] | None = None
        self._unobserve: Callable[[], None] | None = None

    @staticmethod
    def cgroup_name(root: Path) -> str:
        """kubelet's cgroup root for the node at ``root``, unique per machine.

        Named from the machine ID (``/etc/machine-id``; every node of a local cluster has its
        own), so nodes that share one kernel's cgroup hierarchies never share a cgroup root.
        A root with no machine ID (an agent under a test directory) is named from its path.
        """
        path = root / "etc" / "machine-id"
        machine_id = path.read_text().strip() if path.is_file() else ""
        return NodeServices.cgroup_name_of(machine_id or str(root))

    @staticmethod
    def node_cgroups(root: Path) -> tuple[str, str]:
        """The cgroups of the node at ``root``: the kubelet's cgroup root and containerd's shims'."""
        cgroup_root = f"/{NodeServices.cgroup_name(root)}"
        return cgroup_root, f"{cgroup_root}-shims"

    @staticmethod
    def cgroup_name_of(identity: str) -> str:
        """The cgroup root name of a machine ID (or of a root directory without one)."""
        return f"kubeplane-{hashlib.sha256(identity.encode()).hexdigest()[:10]}"

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.mounts.mark)
        self._unobserve = self.supervisor.add_observer(self._publish)
        for spec in self.specs():
            self.supervisor.register(spec)
        await self.supervisor.start_all()
        if self.control_plane:
            self._labeler = asyncio.create_task(self._label_node(), name="label control plane node")

    async def reconfigure_kubelet(self, document: config.MachineConfig, *, wait: float = 0.0) -> None:
        """Restart the kubelet alone with ``document`` (a change under ``machine.kubelet``, or the
        endpoint its kubeconfig names); with ``wait``, until it is up and healthy, at most that
        many seconds (a kubelet still unhealthy then is logged and left to its supervisor).

        Its containers keep running: a kubelet restart adopts them, as on any machine.
        """
        self.document = document
        await self.supervisor.restart(KUBELET)
        if wait:
            try:
                await self.supervisor.wait_up(KUBELET, timeout=wait)
            except supervisor.ServiceTimeoutError as exc:
                log.warning("the restarted kubelet is not healthy yet: %s", exc)

    async def stop(self) -> None:
        """Stop everything the services started, kubelet first, and leave no container behind."""
        if self._labeler is not None:
            self._labeler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._labeler
        await self.supervisor.stop(KUBELET)
        if self.supervisor.snapshot(CONTAINERD).running:
            try:
                await self._kill_containers()
            except Exception as exc:  # the socket may be gone already; the sweep below still runs
                log.warning("could not stop containers through containerd: %s", exc)
        await self.supervisor.shutdown()
        if self._time_sync is not None:
            # After the services: a pre state waiting on it ends with its service's stop.
            self._time_sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._time_sync
        await asyncio.to_thread(self._sweep)
        if self._unobserve is not None:
            self._unobserve()

    async def _kill_containers(self) -> None:
        socket = self.paths.containerd_socket
        pod_netns = set()
        for container in (await ctr(socket, "containers", "ls", "-q")).split():
            with contextlib.suppress(RuntimeError, ValueError):
                pod_netns |= pod_network_namespaces(
                    json.loads(await ctr(socket, "containers", "info", container))
                )
        for task in (await ctr(socket, "tasks", "ls", "-q")).split():
            with contextlib.suppress(RuntimeError):
                await ctr(socket, "tasks", "kill", "-a", "-s", "SIGKILL", task)
            with contextlib.suppress(RuntimeError):
                await ctr(socket, "tasks", "delete", "-f", task)
        # The CNI plugin made a named network namespace per pod sandbox; without the kubelet's
        # StopPodSandbox nobody else removes them.
        for name in sorted(pod_netns):
            await asyncio.to_thread(
                subprocess.run, ["ip", "netns", "delete", name], check=False, capture_output=True
            )

    def _sweep(self) -> None:
        # Shims run in their own sessions, outside containerd's process group, and pods outlive
        # the kubelet: both are in cgroups this node made for them, and only those are killed.
        survivors = owned.kill_cgroups([self.shim_cgroup, self.cgroup_root])
        if survivors:
            log.warning("processes %s of this node's cgroups survived SIGKILL", survivors)
        left = self.mounts.unmount_made()
        if left:
            log.warning("could not unmount %s", ", ".join(map(str, left)))
        _remove_cgroups([self.shim_cgroup, self.cgroup_root])

    def _publish(self, snapshot: supervisor.ServiceSnapshot) -> None:
        spec = catalog.ServiceSpec(
            running=snapshot.running,
            healthy=snapshot.health.healthy is True,
            unknown=snapshot.health.healthy is None,
        )
        self.state.modify(catalog.RUNTIME_NAMESPACE, catalog.SERVICES, snapshot.id, lambda _: spec)

    # -- API --------------------------------------------------------------------------------

    def documents(self) -> list[dict[str, Any]]:
        return [snapshot_document(s) for s in self.supervisor.snapshots()]

    async def control(self, service_id: str, action: str) -> str:
        self.supervisor.snapshot(service_id)  # raises UnknownServiceError first
        if action == "start":
            await self.supervisor.start(service_id)
        elif action == "stop":
            await self.supervisor.stop(service_id)
        else:
            await self.supervisor.restart(service_id)
        return f"service {service_id!r}: {action} requested"

    # -- specs ------------------------------------------------------------------------------

    def environment(self) -> dict[str, str] | None:
        """The environment of the node's services and pulls: the agent's own with ``machine.env``
        over it (:func:`service_environment`); None (inherit unchanged) when nothing is set."""
        machine_env = self.document.model.machine.env
        if not machine_env:
            return None
        return service_environment(os.environ, machine_env)

    def specs(self) -> list[supervisor.ServiceSpec]:
        specs = [
            supervisor.ServiceSpec(
                id=CONTAINERD,
                command=self._containerd_command,
                pre_start=self._containerd_prepare,
                health=supervisor.HealthCheck(self._containerd_health, interval=5.0, timeout=5.0),
                backoff=supervisor.Backoff(initial=1.0, maximum=10.0),
            ),
            supervisor.ServiceSpec(
                id=KUBELET,
                command=self._kubelet_command,
                depends_on=(CONTAINERD,),
                pre_start=self._kubelet_prepare,
                post_stop=self._kubelet_cleanup,
                health=supervisor.HealthCheck(self._kubelet_health, interval=5.0, timeout=3.0),
                backoff=supervisor.Backoff(initial=1.0, maximum=10.0),
            ),
        ]
        if self.etcd is not None:
            etcd = self.etcd.spec()
            specs.append(dataclasses.replace(etcd, pre_start=self._after_time_sync(etcd.pre_start)))
        return specs

    async def time_synced(self) -> None:
        """Wait until the node's time is in sync, at most ``machine.time.bootTimeout`` (one wait
        per boot, shared by the kubelet and etcd: :mod:`kubeplane.agent.timegate`)."""
        if self._time_sync is None:
            wanted = timesync.desired(self.document.model.machine.time)
            self._time_sync = asyncio.ensure_future(
                timegate.wait_for_sync(self.state, wanted, emit=self._emit)
            )
        await asyncio.shield(self._time_sync)

    def _after_time_sync(self, hook: supervisor.Hook | None) -> supervisor.Hook:
        async def prepare() -> None:
            await self.time_synced()
            if hook is not None:
                await hook()

        return prepare

    # containerd

    def containerd_config(self) -> str:
        registries = self.document.model.machine.registries
        mirrors = {
            host: [str(url) for url in mirror.endpoints]
            for host, mirror in ((registries.mirrors or {}) if registries else {}).items()
        }
        configs: dict[str, containerd.RegistryConfig] = {}
        for host, entry in ((registries.config or {}) if registries else {}).items():
            configs[host] = self._registry_config(host, entry)
        text = containerd.render_config(
            node_root=self.paths.root, mirrors=mirrors, registries=configs, shim_cgroup=self.shim_cgroup
        )
        imports = f"imports = [{_toml_str(str(self.paths.containerd_conf_d / '*.toml'))}]"
        head, _, rest = text.partition("\n")
        return f"{head}\n{imports}\n{rest}"

    def _registry_config(self, host: str, entry: Any) -> containerd.RegistryConfig:
        directory = self.paths.containerd_config.parent / "certs" / host.replace(":", "_")
        files: dict[str, str] = {}
        tls, auth = entry.tls, entry.auth
        if tls is not None and tls.ca:
            files["ca_file"] = _write_secret(directory / "ca.crt", base64.b64decode(tls.ca))
        if tls is not None and tls.client_identity is not None and tls.client_identity.crt:
            files["cert_file"] = _write_secret(directory / "client.crt", tls.client_identity.crt_pem())
            files["key_file"] = _write_secret(directory / "client.key", tls.client_identity.key_pem())
        return containerd.RegistryConfig(
            insecure_skip_verify=bool(tls and tls.insecure_skip_verify),
            username=auth.username if auth else None,
            password=auth.password if auth else None,
            auth=auth.auth if auth else None,
            identity_token=auth.identity_token if auth else None,
            **files,
        )

    def _require_socket_room(self, service: str) -> None:
        """Fail the pre state with the reason when the node root is too deep for the service's
        sockets, instead of letting the service crash-loop on a bind error."""
        problem = self.paths.socket_problem(service)
        if problem is not None:
            raise ValueError(f"{problem}: run the agent with a shorter --root")

    async def _containerd_prepare(self) -> None:
        self._require_socket_room(CONTAINERD)
        await asyncio.to_thread(self._containerd_files)

    def _containerd_files(self) -> None:
        """``machine.files``, then containerd's directories, shim cgroup and config (blocking I/O: run
        in a thread). containerd starts first and the kubelet after it, so both read the files."""
        self._machine_files()
        self.paths.containerd_conf_d.mkdir(parents=True, exist_ok=True)
        self.paths.cni_conf.mkdir(parents=True, exist_ok=True)
        owned.make_cgroup(self.shim_cgroup)
        self.paths.containerd_config.write_text(self.containerd_config())

    def _machine_files(self) -> None:
        files = self.document.model.machine.files or []
        result = machine_files.apply(self.paths.root, files, self.paths.machine_files_record)
        for message in result.changed:
            log.info("machine.files: %s", message)
        for message in result.skipped:
            log.warning("machine.files: %s", message)

    async def _containerd_command(self) -> process.Command:
        binary = shutil.which("containerd")
        if binary is None:
            raise FileNotFoundError("containerd is not installed (Debian package containerd)")
        return process.Command(
            [binary, "--config", str(self.paths.containerd_config)], env=self.environment()
        )

    async def _containerd_health(self) -> None:
        await ctr(self.paths.containerd_socket, "version", timeout=5.0)

    # kubelet

    @property
    def kubelet_version(self) -> str:
        return image_tag(self.document.model.machine.kubelet_image)

    def kubelet_binary(self) -> Path:
        candidate = toolchain_dir(self.kubelet_version) / toolchain_cache.BIN_DIR / "kubelet"
        if candidate.is_file():
            return candidate
        found = shutil.which("kubelet")
        if found is None:
            raise FileNotFoundError(
                f"no kubelet {self.kubelet_version} in {candidate.parent} nor on PATH; "
                f"run `kubeplane toolchain build --version {self.kubelet_version}`"
            )
        return Path(found)

    @property
    def kubelet_ca(self) -> Path:
        return self.paths.kubernetes_etc / "kubelet-ca.crt"

    @property
    def kubelet_resolv_conf(self) -> Path:
        return self.paths.kubernetes_etc / "resolv.conf"

    def nameservers(self) -> list[str] | None:
        """``machine.network.nameservers``; None when unset (pods with ``dnsPolicy: Default``, such
        as the cluster DNS forwarding upstream, then get the machine's own /etc/resolv.conf)."""
        network = self.document.model.machine.network
        if network is None or network.nameservers is None:
            return None
        return [str(address) for address in network.nameservers]

    def kubelet_args(self) -> list[str]:
        model = self.document.model
        cluster = model.cluster
        extra: dict[str, str] = {
            "read-only-port": str(READ_ONLY_PORT),
            # The API server refuses mirror pods until the bootstrap manifests' PodSecurityPolicy
            # exists (and the first kube-apiserver's kubelet cannot register before it runs), and
            # the kubelet retries a missing mirror pod only on a pod resync (default every minute,
            # with up to half of that added): a 5 s resync shows the first control plane node's
            # pods Ready ~8 s sooner than 10 s did (docs/architecture.md, Cluster create
            # performance), for a resync of every pod every 5 s (a few CRI calls each).
            "sync-frequency": "5s",
            # containerd pulls images in parallel; one at a time (the default, for old docker
            # storage drivers) held the cluster DNS image behind kube-proxy's on a new node.
            "serialize-image-pulls": "false",
            "network-plugin": "cni",
            "cni-conf-dir": str(self.paths.cni_conf),
            "cni-bin-dir": containerd.DEFAULT_CNI_BIN_DIR,
        }
        if self.nameservers() is not None:
            extra["resolv-conf"] = str(self.kubelet_resolv_conf)
        if self.control_plane and not cluster.allow_scheduling_on_masters:
            extra["register-with-taints"] = MASTER_TAINT
        machine_kubelet = model.machine.kubelet
        extra.update((machine_kubelet.extra_args if machine_kubelet else None) or {})
        dns = [
            str(ip)
            for ip in (machine_kubelet.cluster_dns if machine_kubelet and machine_kubelet.cluster_dns else [])
        ]
        return kubelet.render_args(
            node_root=self.paths.root,
            hostname=self.name,
            node_ip=self.node_ip,
            runtime_socket=self.paths.containerd_socket,
            cgroup_root=self.cgroup_root,
            bootstrap=True,
            sandbox_image=containerd.DEFAULT_SANDBOX_IMAGE,
            client_ca_file=self.kubelet_ca,
            cluster_dns=dns or [cluster.dns_service_ip],
            cluster_domain=cluster.dns_domain,
            extra_args=extra,
        )

    async def _kubelet_prepare(self) -> None:
        self._require_socket_room(KUBELET)
        await self.time_synced()
        model = self.document.model
        cluster = model.cluster
        if cluster.ca is None or not cluster.ca.crt:
            raise ValueError(
                "cluster.ca.crt is missing from the machine config: kubelet cannot trust the API server"
            )
        await asyncio.to_thread(self._kubelet_files, cluster.ca.crt_pem())
        if not self.control_plane and not await asyncio.to_thread(self._kubelet_has_credentials):
            await self._wait_for_endpoint(cluster.control_plane.endpoint, cluster.ca.crt_pem())
        if not self.mirrors():
            # No registry to pull through (an offline machine without the air-gapped setup): load
            # the images this node runs from the local toolchain cache instead.
            versions = [self.kubelet_version]
            if self.control_plane:
                versions.append(image_tag(cluster.api_server_image))
            await self.image_loader(self.paths.containerd_socket, versions)

    def _kubelet_files(self, ca: bytes) -> None:
        """The kubelet's directories, cgroup root, CA and bootstrap kubeconfig, and on a control plane
        node its first kubeconfig (blocking I/O: run in a thread). The CNI config comes from the
        CNI: the host-gw controller writes it once the node has a pod CIDR, flannel's DaemonSet
        writes its own."""
        cluster = self.document.model.cluster
        paths = kubelet.KubeletPaths.under(self.paths.root)
        for directory in (paths.root_dir, paths.cert_dir, paths.pod_manifest_path, self.paths.cni_conf):
            directory.mkdir(parents=True, exist_ok=True)
        owned.make_cgroup(self.cgroup_root)
        _write_secret(self.kubelet_ca, ca)
        nameservers = self.nameservers()
        if nameservers is not None:
            # The resolv.conf the kubelet gives pods with dnsPolicy Default (the cluster DNS reads
            # its upstreams there). An empty list means no upstream: the cluster DNS answers only
            # for the cluster, at once, instead of timing out on an unreachable resolver.
            text = "".join(f"nameserver {address}\n" for address in nameservers)
            fileio.write_if_changed(self.kubelet_resolv_conf, text, mode=0o644)
        _write_secret(
            paths.bootstrap_kubeconfig,
            bootstrap_kubeconfig(
                server=cluster.control_plane.endpoint,
                ca=ca,
                token=cluster.token or "",
                cluster_name=cluster.cluster_name or "kubernetes",
            ).encode(),
        )
        signs = self.control_plane and cluster.ca is not None and bool(cluster.ca.key)
        if signs and not self._kubelet_has_credentials():
            _write_secret(paths.kubeconfig, self.kubelet_kubeconfig().encode())
        elif paths.kubeconfig.exists():
            # The kubelet keeps its credentials across an endpoint change (``kubeplane endpoint
            # set``); only the server it reaches follows the config.
            retarget_kubeconfig(paths.kubeconfig, cluster.control_plane.endpoint)

    def _kubelet_has_credentials(self) -> bool:
        """Whether the kubelet has a kubeconfig of its own (signed here or written by its TLS
        bootstrap) or a client certificate from a bootstrap or rotation."""
        paths = kubelet.KubeletPaths.under(self.paths.root)
        return paths.kubeconfig.exists() or (paths.cert_dir / "kubelet-client-current.pem").exists()

    def kubelet_kubeconfig(self) -> str:
        """The kubelet's kubeconfig with a ``system:node:<name>`` client certificate signed by the
        cluster CA (control plane nodes: see the module docstring)."""
        cluster = self.document.model.cluster
        assert cluster.ca is not None and cluster.ca.key
        authority = pki.CertKey(cert=cluster.ca.crt_pem(), key=cluster.ca.key_pem())
        user = f"system:node:{self.name}"
        client = pki.issue(
            ca=authority,
            common_name=user,
            organizations=(kube.NODES_GROUP,),
            usages=("client",),
            lifetime=KUBELET_CLIENT_LIFETIME,
        )
        return pki.kubeconfig(
            cluster_name=cluster.cluster_name or "kubernetes",
            server=cluster.control_plane.endpoint,
            ca_cert=authority.cert,
            user=user,
            client=client,
        )

    async def _wait_for_endpoint(self, endpoint: str, ca: bytes) -> None:
        """Until ``endpoint`` answers HTTPS (any status: the kubelet authenticates itself) or
        refuses our CA (the kubelet's log then says so), at most :data:`BOOTSTRAP_WAIT` seconds."""
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        url = f"{endpoint.rstrip('/')}/version"
        context = ssl.create_default_context(cadata=ca.decode())
        deadline = asyncio.get_running_loop().time() + BOOTSTRAP_WAIT
        async with httpx.AsyncClient(verify=context, timeout=2.0, trust_env=False) as http:
            while True:
                try:
                    await http.get(url)
                    return
                except httpx.TransportError as exc:
                    if _certificate_refused(exc) or asyncio.get_running_loop().time() > deadline:
                        return
                    log.debug("kubelet waits for %s before its TLS bootstrap: %s", endpoint, exc)
                await asyncio.sleep(BOOTSTRAP_POLL)

    def mirrors(self) -> dict[str, list[str]]:
        """Registry mirror endpoints by registry host (``*`` for every registry)."""
        registries = self.document.model.machine.registries
        if registries is None or not registries.mirrors:
            return {}
        return {host: list(mirror.endpoints) for host, mirror in registries.mirrors.items()}

    async def pull_image(self, image: str) -> bool:
        """Pull ``image`` into containerd through the node's mirrors; False when it was already there."""
        return await pull_through_mirrors(
            self.paths.containerd_socket, image, mirrors=self.mirrors(), env=self.environment()
        )

    async def _kubelet_command(self) -> process.Command:
        return process.Command([str(self.kubelet_binary()), *self.kubelet_args()], env=self.environment())

    async def _kubelet_health(self) -> None:
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        # Plain HTTP on loopback: no TLS context (a default one loads the whole CA bundle, ~25-50 ms
        # of CPU every 5 s on every node) and no proxy from the agent's environment.
        async with httpx.AsyncClient(timeout=2.0, verify=False, trust_env=False) as http:  # noqa: S501
            response = await http.get(HEALTHZ_URL)
        if response.status_code != 200:
            raise RuntimeError(f"{HEALTHZ_URL} answered HTTP {response.status_code}: {response.text[:200]}")

    async def _kubelet_cleanup(self) -> None:
        # Pods still running keep their cgroups; what is empty goes now, the rest at halt.
        await asyncio.to_thread(_remove_cgroups, [self.cgroup_root])

    def admin_kubeconfig(self, *, lifetime: datetime.timedelta = datetime.timedelta(hours=1)) -> str:
        """A short-lived ``system:masters`` kubeconfig signed by the cluster CA (control plane nodes)."""
        cluster = self.document.model.cluster
        authority, pair = cluster_admin_client(
            self.document, common_name=f"kubeplane:node:{self.name}", lifetime=lifetime
        )
        return pki.kubeconfig(
            cluster_name=cluster.cluster_name or "kubernetes",
            server=cluster.control_plane.endpoint,
            ca_cert=authority.cert,
            user=f"kubeplane:node:{self.name}",
            client=pair,
        )

    async def _label_node(self) -> None:
        """Add the control plane role labels once the node registered (kubelet may not self-label)."""
        patch = {"metadata": {"labels": dict.fromkeys(CONTROL_PLANE_LABELS, "")}}
        path = kube.node_path(self.name)
        while True:
            try:
                async with kube.KubeClient(self.admin_kubeconfig(), timeout=5.0) as api:
                    node = await api.get(path)
                    labels = node.get("metadata", {}).get("labels") or {}
                    if all(label in labels for label in CONTROL_PLANE_LABELS):
                        return
                    await api.patch(path, patch, patch_type="merge")
                    log.info("labelled node %s as a control plane node", self.name)
                    return
            except Exception as exc:
                log.debug("labelling node %s: %s", self.name, exc)
            await asyncio.sleep(5.0)


def _certificate_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a failed certificate check."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _remove_cgroups(names: Sequence[str]) -> None:
    for path in owned.cgroup_paths(names):
        owned.remove_cgroup(path)


def _write_secret(path: Path, data: bytes) -> str:
    path.parent.mkdir(mode=fileio.PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    fileio.write_atomic(path, data, mode=fileio.SECRET_MODE)
    return str(path)


def _toml_str(value: str) -> str:
    # JSON string escapes are a subset of TOML basic-string escapes.
    return json.dumps(value)
