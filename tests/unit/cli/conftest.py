"""Fixtures for CLI tests: real node API servers on loopback with in-memory fake nodes.

The servers run on an asyncio loop in a background thread (the CLI runs its own loop per command,
as it does for real); each test gets fresh nodes on 127.0.0.2-4, all on one free port (as real
nodes share port 50000, so proxying works), and a client config file in ``tmp_path``. Servers are
stopped when the test ends, even when it fails.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result

from kubeplane import api, config, pki, resources
from kubeplane.cli.main import cli
from kubeplane.config import client as client_config
from kubeplane.config import generate
from kubeplane.resources import catalog

T = TypeVar("T")
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
#: A fixed time for resource timestamps and service events, so tables are reproducible.
EPOCH = datetime.datetime(2021, 3, 9, 13, 57, 11, tzinfo=datetime.UTC)
REGISTRY = catalog.default_registry()


def ts(value: datetime.datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def resource(node: str, type_name: str, id_: str, spec: resources.Spec, version: int = 1) -> dict[str, Any]:
    definition = REGISTRY.get(type_name)
    metadata = resources.Metadata(
        namespace=definition.default_namespace,
        type=type_name,
        id=id_,
        version=version,
        created=EPOCH,
        updated=EPOCH,
    )
    return resources.to_output_dict(resources.Resource(metadata, spec), node=node)


def service_spec(running: bool, healthy: bool) -> resources.Spec:
    return catalog.ServiceSpec(running=running, healthy=healthy, unknown=False)


@dataclass
class FakeNode:
    """An in-memory NodeBackend that keeps its config like a node would (validated, diffed, modes)."""

    name: str
    config: str
    staged: str | None = None
    calls: list[str] = field(default_factory=list)
    applied: list[tuple[str, str]] = field(default_factory=list)
    try_seconds: list[int | None] = field(default_factory=list)
    resources: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Events the watch sends after the initial state, then the watch ends (so the CLI returns).
    watch_events: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    services: list[dict[str, Any]] = field(default_factory=list)
    #: The agent build the node runs (``upgrade`` changes it, as a restart into the build would).
    tag: str = "0.1.0-test"

    def __post_init__(self) -> None:
        self.resources = {
            catalog.SERVICES: [
                resource(self.name, catalog.SERVICES, "etcd", service_spec(True, True), version=3),
                resource(self.name, catalog.SERVICES, "kubelet", service_spec(True, False), version=5),
            ],
            catalog.MANIFESTS: [
                resource(
                    self.name, catalog.MANIFESTS, "00-kubelet-bootstrapping-token", catalog.ManifestSpec()
                ),
                resource(self.name, catalog.MANIFESTS, "10-kube-proxy", catalog.ManifestSpec()),
            ],
            catalog.STATIC_PODS: [
                resource(
                    self.name,
                    catalog.STATIC_PODS,
                    "kube-apiserver",
                    catalog.StaticPodSpec(pod={"kind": "Pod", "spec": {"containers": [{"name": "a"}]}}),
                )
            ],
        }
        self.files = {"etc/hosts": b"127.0.0.1 localhost\n", "bin/blob": bytes(range(256))}
        self.services = [
            {
                "id": "etcd",
                "state": "Running",
                "health": "OK",
                "events": [
                    {"state": "Preparing", "message": "Running pre state", "ts": ts(EPOCH)},
                    {"state": "Running", "message": "Health check successful", "ts": ts(EPOCH)},
                ],
            },
            {
                "id": "kubelet",
                "state": "Waiting",
                "health": {"unknown": True},
                "events": [
                    {
                        "state": "Waiting",
                        "message": 'Waiting for service "etcd"',
                        "timestamp": EPOCH.timestamp(),
                    }
                ],
            },
        ]

    def service(self, id_: str, *, running: bool, healthy: bool, version: int = 1) -> dict[str, Any]:
        """A Services resource of this node as the API sends it."""
        return resource(self.name, catalog.SERVICES, id_, service_spec(running, healthy), version=version)

    async def version(self) -> dict[str, Any]:
        self.calls.append("version")
        found: dict[str, Any] = {"tag": self.tag, "kubernetes": "v1.20.2"}
        return {**found, "phase": "running"} if self.tag != "0.1.0-test" else found

    def _type(self, type: str) -> resources.ResourceDefinition:
        try:
            return REGISTRY.resolve(type)
        except resources.UnknownTypeError as exc:
            raise api.NotFoundError(str(exc)) from exc

    async def resource_sensitive(self, *, type: str) -> bool:
        return self._type(type).sensitive

    async def resource_get(self, *, type: str, id: str, namespace: str | None) -> dict[str, Any]:
        self.calls.append("resource_get")
        for item in self.resources.get(self._type(type).type, []):
            if item["metadata"]["id"] == id:
                return item
        raise api.NotFoundError(f"resource {type}/{id} not found")

    async def resource_list(self, *, type: str, namespace: str | None) -> list[dict[str, Any]]:
        self.calls.append("resource_list")
        return self.resources.get(self._type(type).type, [])

    async def resource_watch(
        self, *, type: str, namespace: str | None, id: str | None
    ) -> AsyncIterator[dict[str, Any]]:
        self.calls.append("resource_watch")
        for item in self.resources.get(self._type(type).type, []):
            yield {"event": "created", "resource": item}
        yield {"event": "bootstrapped"}
        for event in self.watch_events:
            yield event

    async def apply_configuration(
        self, *, data: str, mode: str, dry_run: bool, try_seconds: int | None = None
    ) -> dict[str, Any]:
        self.try_seconds.append(try_seconds)
        try:
            new = config.load(data)
        except config.ConfigError as exc:
            raise api.InvalidArgumentError(
                "invalid machine config", fields=[(e.path, e.message) for e in exc.errors]
            ) from exc
        old = config.load(self.config)
        allowed = config.allowed_modes(old, new)
        refusal = allowed.refusal(mode) if mode in config.APPLY_MODES else None  # type: ignore[arg-type]
        if refusal:
            raise api.FailedPreconditionError(refusal)
        if not dry_run:
            self.calls.append("apply_configuration")
            self.applied.append((mode, data))
            if mode == "on-reboot":
                self.staged = data
            else:
                self.config = data
        verb = "would apply" if dry_run else "applied"
        return {
            "mode": mode,
            "diff": config.diff(old, new),
            "allowed_modes": list(allowed.modes),
            "message": f"{verb} in mode {mode}",
        }

    async def machine_config(self) -> dict[str, Any]:
        self.calls.append("machine_config")
        return {"current": self.config, "staged": self.staged}

    async def read_file(self, *, path: str) -> AsyncIterator[bytes]:
        self.calls.append("read_file")
        if path not in self.files:
            raise api.NotFoundError(f"file {path} does not exist")
        data = self.files[path]
        yield data[:100]
        yield data[100:]

    async def list_dir(self, *, path: str, recurse: bool) -> list[dict[str, Any]]:
        self.calls.append("list_dir")
        entries = [
            {"name": "etc", "size": 4096, "mode": 0o40755, "is_dir": True, "modified": ts(EPOCH)},
            # The agent sends Unix seconds and a filemode string; both forms are accepted.
            {"name": "etc/hosts", "size": 21, "mode": "-rw-r--r--", "modified": int(EPOCH.timestamp())},
        ]
        return entries if recurse else entries[:1]

    async def logs(self, *, service: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        self.calls.append("logs")
        if service not in {"etcd", "kubelet", "controller-runtime"}:
            raise api.NotFoundError(f"no log for service {service!r}")
        lines = [f"{service} line {n}" for n in range(5)]
        for line in lines[-tail:] if tail else lines:
            yield line
        if follow:
            yield f"{service} followed line"

    async def service_list(self) -> list[dict[str, Any]]:
        self.calls.append("service_list")
        return self.services

    async def service_control(self, *, id: str, action: str) -> dict[str, Any]:
        self.calls.append(f"service_{action}")
        return {"message": f"service {id!r}: {action} requested"}

    async def reset(self, *, graceful: bool, reboot: bool, wipe: str | None, dry_run: bool) -> dict[str, Any]:
        """A worker's reset: the fake leaves no etcd; it records what it was asked."""
        self.calls.append(f"reset graceful={graceful} reboot={reboot} wipe={wipe} dry_run={dry_run}")
        summary = {"hostname": f"host-{self.name}", "leaves_etcd": False, "wipe": (wipe or "").split(",")}
        text = f"stop the services, wipe {wipe}, then {'reboot' if reboot else 'stop the agent'}"
        return {**summary, "message": f"dry run: {text}" if dry_run else f"node {self.name} reset: {text}"}

    async def upgrade(self, *, path: str, stage: bool, preserve: bool | None, force: bool) -> dict[str, Any]:
        """A worker installing the build at ``path`` (its version is the file name's stem) and,
        unless staged, running it at once; a path not under the uploads directory is refused."""
        self.calls.append(f"upgrade path={path} stage={stage} preserve={preserve} force={force}")
        if not path.startswith("/var/lib/kubeplane/uploads/"):
            raise api.InvalidArgumentError(f"{path} is not under /var/lib/kubeplane/uploads")
        version = path.rsplit("/", 1)[-1].removesuffix(".whl")
        if not stage:
            self.tag = version
        summary = {"hostname": f"host-{self.name}", "from": "0.1.0-test", "version": version}
        return {
            **summary,
            "staged": stage,
            "preserve": bool(preserve),
            "message": f"{self.name} -> {version}",
        }

    async def kubernetes_certificates_renew(self, *, not_before: int | None) -> dict[str, Any]:
        """A control plane node's answer: its certificates (issued at the epoch) are re-issued."""
        self.calls.append(f"kubernetes_certificates_renew not_before={not_before}")
        requested = EPOCH if not_before is None else datetime.datetime.fromtimestamp(not_before, datetime.UTC)
        return {"notBefore": ts(requested), "issued": ts(EPOCH), "renewing": requested > EPOCH}

    async def reboot(self) -> dict[str, Any]:
        self.calls.append("reboot")
        if self.staged is not None:
            self.config, self.staged = self.staged, None
        return {"message": "restarting services"}


@dataclass(frozen=True)
class Material:
    """Certificates and a valid machine config shared by every test of the session."""

    os_ca: pki.CertKey
    machine_config: str
    admin: pki.CertKey
    reader: pki.CertKey
    proxy: api.Credentials

    def server(self, address: str) -> api.Credentials:
        cert = pki.issue(ca=self.os_ca, common_name=address, ip_addresses=[address], usages=["server"])
        return api.Credentials(ca=self.os_ca.cert, cert=cert.cert, key=cert.key)


def new_material() -> Material:
    """Fresh cluster secrets, client certificates per role, and a valid control plane config."""
    secrets = generate.new_secrets()
    generated = generate.generate(
        generate.GenOptions(cluster_name="test", endpoint="https://127.0.0.2:6443"), secrets
    )
    ca = secrets.os_ca

    def client_cert(role: str) -> pki.CertKey:
        return pki.issue(ca=ca, common_name=f"test {role}", organizations=[role], usages=["client"])

    proxy = client_cert(api.ROLE_PROXY)
    return Material(
        os_ca=ca,
        machine_config=generate.dump_yaml(generated.documents["controlplane"]),
        admin=client_cert(api.ROLE_ADMIN),
        reader=client_cert(api.ROLE_READER),
        proxy=api.Credentials(ca=ca.cert, cert=proxy.cert, key=proxy.key),
    )


class Loop:
    """An asyncio loop in a daemon thread: the servers live there while the CLI runs its own loops."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    """Running fake nodes and a CLI bound to a client config that points at the first one."""

    loop: Loop
    material: Material
    config_path: Path
    port: int
    nodes: list[FakeNode]
    servers: list[api.NodeAPIServer]
    runner: CliRunner = field(default_factory=CliRunner)

    @property
    def endpoint(self) -> str:
        return f"{ADDRESSES[0]}:{self.port}"

    @property
    def addresses(self) -> list[str]:
        return list(ADDRESSES[: len(self.nodes)])

    def run(self, *args: str, env: dict[str, str] | None = None) -> Result:
        return self.runner.invoke(cli, ["--kubeplaneconfig", str(self.config_path), *args], env=env)

    def stop(self, index: int) -> None:
        """Take one node down (its server stops; its address stays unreachable)."""
        self.loop.run(self.servers[index].stop(0))


def write_client_config(path: Path, material: Material, *, endpoint: str, role_cert: pki.CertKey) -> None:
    context = client_config.Context.from_pem(endpoints=[endpoint], ca=material.os_ca.cert, client=role_cert)
    client_config.save(client_config.add_context(client_config.ClientConfig(), "test", context), path)


def start_cluster(
    loop: Loop, material: Material, tmp_path: Path, *, count: int, reader: bool = False
) -> Cluster:
    port = free_port()
    nodes = [FakeNode(address, config=material.machine_config) for address in ADDRESSES[:count]]
    servers: list[api.NodeAPIServer] = []
    cluster = Cluster(
        loop=loop,
        material=material,
        config_path=tmp_path / "kubeplaneconfig",
        port=port,
        nodes=nodes,
        servers=servers,
    )
    try:
        for node in nodes:
            servers.append(
                loop.run(
                    api.serve(
                        backend=node,
                        node=node.name,
                        credentials=material.server(node.name),
                        proxy_credentials=material.proxy,
                        listen=f"{node.name}:{port}",
                        proxy_port=port,
                    )
                )
            )
    except BaseException:
        stop_all(loop, servers)
        raise
    write_client_config(
        cluster.config_path,
        material,
        endpoint=cluster.endpoint,
        role_cert=material.reader if reader else material.admin,
    )
    return cluster


def stop_all(loop: Loop, servers: Sequence[api.NodeAPIServer]) -> None:
    for server in servers:
        loop.run(server.stop(0))


@pytest.fixture(scope="session")
def material() -> Material:
    return new_material()


@pytest.fixture(scope="session")
def loop() -> Iterator[Loop]:
    background = Loop()
    yield background
    background.close()


@pytest.fixture
def cluster(loop: Loop, material: Material, tmp_path: Path) -> Iterator[Cluster]:
    """One node; the client config's context points at it with the admin certificate."""
    running = start_cluster(loop, material, tmp_path, count=1)
    yield running
    stop_all(loop, running.servers)


@pytest.fixture
def reader_cluster(loop: Loop, material: Material, tmp_path: Path) -> Iterator[Cluster]:
    """One node; the client config holds a reader-role certificate."""
    running = start_cluster(loop, material, tmp_path, count=1, reader=True)
    yield running
    stop_all(loop, running.servers)


@pytest.fixture
def three(loop: Loop, material: Material, tmp_path: Path) -> Iterator[Cluster]:
    """Three nodes; calls use ``-n`` to be forwarded by the first."""
    running = start_cluster(loop, material, tmp_path, count=3)
    yield running
    stop_all(loop, running.servers)


@pytest.fixture
def offline(loop: Loop, material: Material, tmp_path: Path) -> Cluster:
    """A CLI with no nodes and no client config file (for maintenance-mode and offline commands)."""
    return Cluster(loop, material, tmp_path / "absent-client-config", 0, [], [])


@pytest.fixture
def maintenance(loop: Loop, material: Material) -> Iterator[tuple[FakeNode, str]]:
    """A node in maintenance mode (no client certificates, insecure apply only) and its address."""
    port = free_port()
    node = FakeNode("maintenance", config=material.machine_config)
    server = loop.run(api.serve_maintenance(backend=node, node="maintenance", listen=f"127.0.0.5:{port}"))
    yield node, f"127.0.0.5:{port}"
    loop.run(server.stop(0))


@pytest.fixture
def dead_address() -> str:
    """A loopback address nothing listens on."""
    return f"127.0.0.1:{free_port()}"
