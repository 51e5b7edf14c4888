"""Fixtures for integration tests: real processes, certificates, etcd, machine nodes, cgroups.

Every node a test starts is a machine (:mod:`machines`): its own network, mount and UTS
namespaces, its directory under the test's ``tmp_path`` bind-mounted at the standard paths, so
what runs there (an agent at ``--root /``, containerd, kubelet) sees a machine of its own. Every
process is started in its own process group and stopped by that group's ID; every namespace,
link and cgroup the fixtures create is removed by the fixture that created it, and what still
runs in a node's network namespace at the end is killed and reported, even when the test fails.
A missing prerequisite fails the test with a message pointing at ``scripts/setup``; nothing is
skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import machines
import pytest

from kubeplane import pki
from kubeplane.agent import owned
from kubeplane.clients import etcd as etcd_client
from kubeplane.provision import toolchain
from kubeplane.services import containerd as containerd_service
from kubeplane.services import kubelet as kubelet_service

KUBERNETES_VERSION = "v1.20.2"
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to completion (the tests are synchronous; the etcd client is not)."""
    return asyncio.run(coro)


def require_binary(*candidates: str | Path) -> Path:
    """The first candidate path that exists, or fail naming the setup command."""
    for candidate in candidates:
        path = Path(candidate)
        if path.is_absolute() and path.exists():
            return path
        found = shutil.which(str(candidate))
        if found:
            return Path(found)
    pytest.fail(
        f"{candidates[0]} is missing; run scripts/setup to install the real components", pytrace=False
    )


def kube_binary(name: str) -> Path:
    """A Kubernetes binary from the toolchain cache, or fail naming the setup command."""
    path = toolchain.Toolchain().paths(KUBERNETES_VERSION).binary(name)
    if not path.is_file():
        pytest.fail(f"{path} is missing; run scripts/setup to build the Kubernetes toolchain", pytrace=False)
    return path


def kube_image(name: str) -> tuple[Path, str]:
    """A toolchain image archive and its upstream reference, or fail naming the setup command."""
    paths = toolchain.Toolchain().paths(KUBERNETES_VERSION)
    path = paths.image(name)
    if not path.is_file():
        pytest.fail(f"{path} is missing; run scripts/setup to build the Kubernetes images", pytrace=False)
    return path, paths.image_ref(name)


def _free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _wait_until(predicate: Callable[[], T], *, timeout: float, what: str, logs: Callable[[], str] = str) -> T:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` and the logs."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:
            last = exc
        time.sleep(0.25)
    pytest.fail(
        f"timed out after {timeout}s waiting for {what} (last error: {last!r})\n{logs()}", pytrace=False
    )


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[..., int]:
    """``free_port()`` in a test: a loopback port nobody listens on."""
    return _free_port


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., Any]:
    """``wait_until(predicate, timeout=..., what=..., logs=...)`` in a test."""
    return _wait_until


# -- processes -----------------------------------------------------------------------------


@dataclasses.dataclass
class Started:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return f"--- last lines of {self.log.name} ---\n" + "\n".join(text[-lines:])


class Processes:
    """Starts commands in their own process groups and stops exactly those groups, newest first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Started] = []
        self.deferred: list[Callable[[], Sequence[str]]] = []

    def defer(self, cleanup: Callable[[], Sequence[str]]) -> None:
        """Run ``cleanup`` once every process is stopped (newest first); it returns the leaks it
        found, which fail the test."""
        self.deferred.append(cleanup)

    def start(
        self,
        argv: Sequence[str | Path],
        *,
        name: str,
        netns: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Started:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        command = [str(arg) for arg in argv]
        if netns is not None:
            command = ["nsenter", f"--net=/run/netns/{netns}", *command]
        log = self.log_dir / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        started = Started(name, process, log)
        self.started.append(started)
        return started

    def logs(self) -> str:
        return "\n".join(item.tail() for item in self.started)

    def stop(self, started: Started, *, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds, reap the leader."""
        pgid = started.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            started.process.wait(timeout=grace)
        # Children of the group may outlive the leader; make sure the whole group is gone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            started.process.wait(timeout=5)

    def stop_all(self) -> None:
        while self.started:
            self.stop(self.started.pop())
        leaks: list[str] = []
        while self.deferred:
            leaks += self.deferred.pop()()
        assert not leaks, "left running after the test: " + ", ".join(leaks)

    def forget(self, started: Started) -> None:
        """Stop ``started`` now (a fixture that must stop it before its own teardown)."""
        if started in self.started:
            self.started.remove(started)
        self.stop(started)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.stop_all()


# -- certificates and etcd -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EtcdServer:
    """A running single-member etcd with mutual TLS on loopback."""

    endpoint: str
    peer_url: str
    ca: pki.CertKey
    client: pki.CertKey
    started: Started

    def tls(self) -> Any:
        return etcd_client.tls_context(ca=self.ca.cert, cert=self.client.cert, key=self.client.key)

    def client_for(self, *endpoints: str) -> etcd_client.EtcdClient:
        return etcd_client.EtcdClient(list(endpoints) or [self.endpoint], tls=self.tls())


def write_pem(directory: Path, name: str, pair: pki.CertKey) -> tuple[Path, Path]:
    """Write ``name.crt`` and ``name.key`` (mode 0600) and return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    cert.write_bytes(pair.cert)
    if pair.key:
        key.touch(mode=0o600)
        key.write_bytes(pair.key)
    return cert, key


@pytest.fixture
def etcd_server(tmp_path: Path, processes: Processes) -> EtcdServer:
    binary = require_binary("/usr/bin/etcd", "etcd")
    ca = pki.new_ca("etcd-ca")
    server = pki.issue(ca=ca, common_name="etcd", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    client = pki.issue(ca=ca, common_name="kube-apiserver-etcd-client", usages=("client",))
    certs = tmp_path / "etcd-pki"
    ca_path, _ = write_pem(certs, "ca", ca.cert_only())
    server_cert, server_key = write_pem(certs, "server", server)
    client_port, peer_port = _free_port(), _free_port()
    endpoint, peer_url = f"https://127.0.0.1:{client_port}", f"https://127.0.0.1:{peer_port}"
    tls = ["--cert-file", server_cert, "--key-file", server_key, "--trusted-ca-file", ca_path]
    peer_tls = [
        "--peer-cert-file",
        server_cert,
        "--peer-key-file",
        server_key,
        "--peer-trusted-ca-file",
        ca_path,
    ]
    started = processes.start(
        [
            binary,
            "--name=test",
            f"--data-dir={tmp_path / 'etcd-data'}",
            f"--listen-client-urls={endpoint}",
            f"--advertise-client-urls={endpoint}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=test={peer_url}",
            "--initial-cluster-state=new",
            "--client-cert-auth=true",
            "--peer-client-cert-auth=true",
            *tls,
            *peer_tls,
        ],
        name="etcd",
    )
    result = EtcdServer(endpoint=endpoint, peer_url=peer_url, ca=ca, client=client, started=started)

    async def healthy() -> bool:
        async with result.client_for() as etcd:
            return (await etcd.status()).leader != 0

    _wait_until(lambda: run(healthy()), timeout=30, what="etcd to elect itself leader", logs=started.tail)
    return result


# -- network namespaces and cgroups -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NetNS:
    """A network namespace joined to the host by a veth pair with a /30 on each end."""

    name: str
    host_link: str
    host_ip: str
    node_ip: str


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


@pytest.fixture
def netns() -> Iterator[NetNS]:
    """A fresh namespace ``kpt-XXXX`` with ``10.213.X.2`` inside and ``10.213.X.1`` on the host
    (``kpt<stream>-XXXX`` and the stream's half of X: :data:`machines.STREAM`)."""
    require_binary("/usr/sbin/ip", "ip")
    require_binary("/usr/bin/nsenter", "nsenter")
    suffix = uuid.uuid4().hex[:6]
    subnet = machines.octet()
    ns = NetNS(
        name=f"{machines.PREFIX}-{suffix}",
        host_link=f"{machines.PREFIX}{suffix}h",
        host_ip=f"10.213.{subnet}.1",
        node_ip=f"10.213.{subnet}.2",
    )
    peer = f"{machines.PREFIX}{suffix}n"
    try:
        _ip("netns", "add", ns.name)
        _ip("link", "add", ns.host_link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns.name)
        _ip("addr", "add", f"{ns.host_ip}/30", "dev", ns.host_link)
        _ip("link", "set", ns.host_link, "up")
        _ip("-n", ns.name, "addr", "add", f"{ns.node_ip}/30", "dev", peer)
        _ip("-n", ns.name, "link", "set", peer, "up")
        _ip("-n", ns.name, "link", "set", "lo", "up")
        # kubelet wants a default route to pick its node IP and reach anything off-link.
        _ip("-n", ns.name, "route", "add", "default", "via", ns.host_ip)
        yield ns
    finally:
        left = machines.kill_in_netns(ns.name)
        # Deleting the host end removes the pair; deleting the namespace removes what is left.
        _ip("link", "del", ns.host_link, check=False)
        _ip("netns", "del", ns.name, check=False)
    assert not left, f"processes {left} were still running in namespace {ns.name}"


@pytest.fixture
def cgroup_root() -> Iterator[str]:
    """A cgroup ``/kpt-XXXX`` created in every v1 hierarchy (kubelet's ``--cgroup-root``)."""
    name = f"{machines.PREFIX}-{uuid.uuid4().hex[:6]}"
    hierarchies = owned.cgroup_hierarchies()
    if not hierarchies:
        pytest.fail("no cgroup v1 hierarchy is mounted; kubelet v1.20 needs cgroup v1", pytrace=False)
    try:
        owned.make_cgroup(name)
        yield f"/{name}"
    finally:
        for hierarchy in hierarchies:
            owned.remove_cgroup(hierarchy / name)


# -- kube-apiserver -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ApiServer:
    """A running kube-apiserver with its CA and an admin (system:masters) kubeconfig."""

    url: str
    ca: pki.CertKey
    admin_kubeconfig: str
    started: Started

    def client_kubeconfig(self, *, user: str, organizations: Sequence[str]) -> str:
        """A kubeconfig for another client certificate signed by the cluster CA."""
        pair = pki.issue(ca=self.ca, common_name=user, organizations=organizations, usages=("client",))
        return pki.kubeconfig(
            cluster_name="test", server=self.url, ca_cert=self.ca.cert, user=user, client=pair
        )


@pytest.fixture
def start_apiserver(
    tmp_path: Path, processes: Processes, etcd_server: EtcdServer
) -> Callable[..., ApiServer]:
    """``start_apiserver(address)``: kube-apiserver from the toolchain on ``address``, ready."""

    def start(address: str = "127.0.0.1") -> ApiServer:
        binary = kube_binary("kube-apiserver")
        certs = tmp_path / "apiserver-pki"
        ca = pki.new_ca("kubernetes")
        serving = pki.issue(
            ca=ca,
            common_name="kube-apiserver",
            dns_names=["kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"],
            ip_addresses=sorted({"127.0.0.1", "10.96.0.1", address}),
            usages=("server",),
        )
        etcd_client_pair = pki.issue(
            ca=etcd_server.ca, common_name="kube-apiserver-etcd-client", usages=("client",)
        )
        sa_key = pki.service_account_key()
        ca_path, _ = write_pem(certs, "ca", ca.cert_only())
        serving_cert, serving_key = write_pem(certs, "apiserver", serving)
        etcd_ca, _ = write_pem(certs, "etcd-ca", etcd_server.ca.cert_only())
        etcd_cert, etcd_key = write_pem(certs, "apiserver-etcd-client", etcd_client_pair)
        (certs / "sa.key").write_bytes(sa_key)
        (certs / "sa.pub").write_bytes(pki.public_key_pem(sa_key))
        port = _free_port(address)
        url = f"https://{address}:{port}"
        started = processes.start(
            [
                binary,
                f"--advertise-address={address}",
                f"--bind-address={address}",
                f"--secure-port={port}",
                "--insecure-port=0",
                f"--cert-dir={certs}",
                f"--etcd-servers={etcd_server.endpoint}",
                f"--etcd-cafile={etcd_ca}",
                f"--etcd-certfile={etcd_cert}",
                f"--etcd-keyfile={etcd_key}",
                f"--client-ca-file={ca_path}",
                f"--tls-cert-file={serving_cert}",
                f"--tls-private-key-file={serving_key}",
                f"--service-account-key-file={certs / 'sa.pub'}",
                f"--service-account-signing-key-file={certs / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/12",
                "--authorization-mode=Node,RBAC",
                "--enable-bootstrap-token-auth=true",
                "--allow-privileged=true",
                "--profiling=false",
            ],
            name="kube-apiserver",
        )
        admin = pki.issue(
            ca=ca, common_name="kubeplane-admin", organizations=["system:masters"], usages=("client",)
        )
        kubeconfig = pki.kubeconfig(
            cluster_name="test", server=url, ca_cert=ca.cert, user="admin", client=admin
        )
        server = ApiServer(url=url, ca=ca, admin_kubeconfig=kubeconfig, started=started)

        def ready() -> bool:
            if started.process.poll() is not None:
                pytest.fail(
                    f"kube-apiserver exited with {started.process.returncode}\n{started.tail()}",
                    pytrace=False,
                )
            response = httpx.get(
                f"{url}/readyz", verify=ssl.create_default_context(cadata=ca.cert.decode()), timeout=5
            )
            return response.status_code == httpx.codes.OK

        _wait_until(ready, timeout=90, what=f"kube-apiserver /readyz on {url}", logs=started.tail)
        return server

    return start


# -- containerd + kubelet node ---------------------------------------------------------------


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (a path unique to one test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


@dataclasses.dataclass
class Node:
    """A machine node (:mod:`machines`) in its own network namespace: a containerd, and a kubelet
    once started, each seeing the node's directory ``root`` at the standard paths.

    ``holder`` is the machine's first process: it holds the namespaces the others enter. The
    containers and shims are in the node's cgroup (``cgroup_root``; shims in ``shims``), so
    they are found by membership, never by a name they share with other machines' processes.
    """

    root: Path
    netns: NetNS
    cgroup_root: str
    processes: Processes
    holder: Started
    containerd_process: Started
    kubelet_process: Started | None = None

    @property
    def shims(self) -> str:
        return f"{self.cgroup_root}/shims"

    def enter(self, *command: str | Path) -> list[str]:
        """``command`` run inside this machine."""
        return machines.enter_argv(self.holder.process.pid, command)

    def ctr(self, *args: str) -> str:
        result = subprocess.run(
            self.enter("ctr", "-n", "k8s.io", *args), check=False, capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            pytest.fail(f"ctr {' '.join(args)} failed: {result.stderr.strip()}", pytrace=False)
        return result.stdout

    def import_image(self, name: str) -> str:
        """Import toolchain image ``name`` (e.g. ``pause``); returns its upstream reference."""
        archive, ref = kube_image(name)
        self.ctr("images", "import", str(archive))
        return ref

    def start_kubelet(self, *, kubeconfig: str, hostname: str) -> Started:
        host_side = kubelet_service.KubeletPaths.under(self.root)
        for directory in (host_side.root_dir, host_side.pod_manifest_path, host_side.cert_dir):
            directory.mkdir(parents=True, exist_ok=True)
        host_side.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        host_side.kubeconfig.write_text(kubeconfig)
        args = kubelet_service.render_args(
            node_root=Path("/"),
            hostname=hostname,
            node_ip=self.netns.node_ip,
            runtime_socket=containerd_service.ContainerdPaths.under(Path("/")).socket,
            cgroup_root=self.cgroup_root,
            # The test machine's disk may be fuller than kubelet's default thresholds allow.
            eviction_hard={"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        )
        self.kubelet_process = self.processes.start(self.enter(kube_binary("kubelet"), *args), name="kubelet")
        return self.kubelet_process

    def logs(self) -> str:
        return self.processes.logs()

    def teardown(self) -> None:
        """Stop kubelet, the containers and shims (by cgroup), then every process of the machine
        (by network namespace); its mounts go with its mount namespace."""
        if self.kubelet_process is not None:
            self.processes.forget(self.kubelet_process)
        owned.kill_cgroups([self.cgroup_root])
        self.processes.forget(self.containerd_process)
        machines.kill_in_netns(self.netns.name)
        self.processes.forget(self.holder)


@pytest.fixture
def node_root(tmp_path: Path) -> Iterator[Path]:
    """A machine node's directory; afterwards, nothing may be mounted below it on the host."""
    root = tmp_path / "node"
    root.mkdir()
    yield root
    leaks = [f"mount {p}" for p in owned.mounts_under(root)]
    assert not leaks, f"the node under {root} left these behind: " + ", ".join(leaks)


@pytest.fixture
def node(node_root: Path, processes: Processes, netns: NetNS, cgroup_root: str) -> Iterator[Node]:
    """A machine node in ``netns`` running containerd (config from ``render_config``)."""
    binary = require_binary("/usr/bin/containerd", "containerd")
    require_binary("/usr/bin/ctr", "ctr")
    require_binary("/usr/sbin/runc", "/usr/bin/runc", "runc")
    require_binary("containerd-shim-runc-v2")
    root = node_root
    holder = processes.start(
        machines.argv(node_dir=root, hostname=f"node-{netns.name}", command=["sleep", "infinity"]),
        name="machine",
        netns=netns.name,
    )
    _wait_until(
        lambda: Path(f"/proc/{holder.process.pid}/comm").read_text().strip() == "sleep",
        timeout=30,
        what="the machine's namespaces",
        logs=holder.tail,
    )
    shims = f"{cgroup_root}/shims"
    owned.make_cgroup(shims)
    config = containerd_service.ContainerdPaths.under(root).config
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(containerd_service.render_config(node_root=Path("/"), shim_cgroup=shims))
    in_machine = containerd_service.ContainerdPaths.under(Path("/"))
    result = Node(
        root=root,
        netns=netns,
        cgroup_root=cgroup_root,
        processes=processes,
        holder=holder,
        containerd_process=processes.start(
            machines.enter_argv(holder.process.pid, [binary, "--config", in_machine.config]),
            name="containerd",
        ),
    )
    started = result.containerd_process
    try:

        def serving() -> bool:
            if started.process.poll() is not None:
                pytest.fail(f"containerd exited\n{started.tail()}", pytrace=False)
            version = subprocess.run(
                result.enter("ctr", "version"), check=False, capture_output=True, timeout=10
            )
            return version.returncode == 0

        _wait_until(serving, timeout=30, what="containerd to serve its socket", logs=started.tail)
        yield result
    finally:
        result.teardown()


# -- leak check ------------------------------------------------------------------------------


def _test_artifacts() -> set[str]:
    """Namespaces, links and cgroups with the test prefix, and what is left of the session's
    machine-node networks, that exist right now."""
    found = (
        {f"netns {p.name}" for p in Path("/run/netns").glob(f"{machines.PREFIX}-*")}
        if Path("/run/netns").is_dir()
        else set()
    )
    found |= {f"link {p.name}" for p in Path("/sys/class/net").glob(f"{machines.PREFIX}*")}
    found |= machines.lan_leftovers()
    for hierarchy in owned.cgroup_hierarchies():
        found |= {f"cgroup {p}" for p in hierarchy.glob(f"{machines.PREFIX}-*")}
    return found


@pytest.fixture(scope="session", autouse=True)
def machine_host_dirs() -> Iterator[None]:
    """Remove the host mount points the session's machine nodes needed, at its end."""
    yield
    machines.remove_created_host_dirs()


@pytest.fixture(autouse=True)
def leak_check(tmp_path: Path) -> Iterator[None]:
    """After every other fixture is torn down, assert the test left nothing behind (no mount,
    process, network namespace, link or cgroup of its own). Autouse fixtures are set up first,
    so this one is torn down last."""
    before = _test_artifacts()
    yield
    leaks = [f"mount {p}" for p in owned.mounts_under(tmp_path)]
    leaks += [f"process {pid}" for pid in processes_mentioning(str(tmp_path)) if pid != os.getpid()]
    leaks += sorted(_test_artifacts() - before)
    assert not leaks, "the test left these behind: " + ", ".join(leaks)
