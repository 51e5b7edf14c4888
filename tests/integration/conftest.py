"""Fixtures for integration tests: real processes, certificates, etcd, network namespaces, cgroups.

Everything lives under the test's ``tmp_path`` (a node's root starts in a short directory for its
unix sockets and is moved there afterwards); every process is started in its own process
group and stopped by that group's ID, every namespace, link and cgroup the fixtures create is
removed by the fixture that created it, even when the test fails. A missing prerequisite fails
the test with a message pointing at ``scripts/setup``; nothing is skipped.
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
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from kubeplane import pki
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


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


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
    """A fresh namespace ``kpt-XXXX`` with ``10.213.X.2`` inside and ``10.213.X.1`` on the host."""
    require_binary("/usr/sbin/ip", "ip")
    require_binary("/usr/bin/nsenter", "nsenter")
    suffix = uuid.uuid4().hex[:6]
    subnet = int(suffix[:2], 16)
    ns = NetNS(
        name=f"kpt-{suffix}",
        host_link=f"kpt{suffix}h",
        host_ip=f"10.213.{subnet}.1",
        node_ip=f"10.213.{subnet}.2",
    )
    peer = f"kpt{suffix}n"
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
        # Deleting the host end removes the pair; deleting the namespace removes what is left.
        _ip("link", "del", ns.host_link, check=False)
        _ip("netns", "del", ns.name, check=False)


CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_hierarchies() -> list[Path]:
    """Mount points of the cgroup v1 hierarchies (the unified one of a hybrid host excluded)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup":
            found.append(Path(fields[1]))
    return found


def remove_cgroup(path: Path) -> None:
    """rmdir a cgroup and everything below it, deepest first (cgroupfs refuses rm -r)."""
    if not path.is_dir():
        return
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


@pytest.fixture
def cgroup_root() -> Iterator[str]:
    """A cgroup ``/kpt-XXXX`` created in every v1 hierarchy (kubelet's ``--cgroup-root``)."""
    name = f"kpt-{uuid.uuid4().hex[:6]}"
    hierarchies = cgroup_hierarchies()
    if not hierarchies:
        pytest.fail("no cgroup v1 hierarchy is mounted; kubelet v1.20 needs cgroup v1", pytrace=False)
    try:
        for hierarchy in hierarchies:
            (hierarchy / name).mkdir()
        yield f"/{name}"
    finally:
        for hierarchy in hierarchies:
            remove_cgroup(hierarchy / name)


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below ``root``, deepest first."""
    prefix = str(root)
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        # /proc/mounts escapes spaces and friends as octal.
        point = line.split()[1].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(Path(point))
    return sorted(set(points), key=lambda p: len(p.parts), reverse=True)


def unmount_all(root: Path) -> None:
    """Unmount everything below ``root``, deepest first; lazily if a mount is still busy."""
    for _ in range(3):
        points = mounts_under(root)
        if not points:
            return
        for point in points:
            if subprocess.run(["umount", str(point)], check=False, capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


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


def _parent_pids() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                # The command name may contain spaces and parentheses; the ppid follows the last ")".
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first, then theirs), from /proc."""
    parents = _parent_pids()
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (orphans may wait a while for a reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


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
    """A node in its own network namespace: a containerd, and a kubelet once started."""

    root: Path
    netns: NetNS
    cgroup_root: str
    containerd: containerd_service.ContainerdPaths
    processes: Processes
    containerd_process: Started
    kubelet_process: Started | None = None

    def ctr(self, *args: str) -> str:
        result = subprocess.run(
            ["ctr", "-n", "k8s.io", "-a", str(self.containerd.socket), *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
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
        paths = kubelet_service.KubeletPaths.under(self.root)
        for directory in (paths.root_dir, paths.pod_manifest_path, paths.cert_dir):
            directory.mkdir(parents=True, exist_ok=True)
        paths.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        paths.kubeconfig.write_text(kubeconfig)
        args = kubelet_service.render_args(
            node_root=self.root,
            hostname=hostname,
            node_ip=self.netns.node_ip,
            runtime_socket=self.containerd.socket,
            cgroup_root=self.cgroup_root,
            # The test machine's disk may be fuller than kubelet's default thresholds allow.
            eviction_hard={"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        )
        self.kubelet_process = self.processes.start(
            [kube_binary("kubelet"), *args], name="kubelet", netns=self.netns.name
        )
        return self.kubelet_process

    def logs(self) -> str:
        return self.processes.logs()

    def teardown(self) -> None:
        """Stop kubelet, the containers, the shims and containerd; unmount; leave nothing behind."""
        if self.kubelet_process is not None:
            self.processes.forget(self.kubelet_process)
        containerd_pid = self.containerd_process.process.pid
        # Kill containers through containerd so shims clean up their mounts and sockets.
        if self.containerd_process.process.poll() is None:
            listing = subprocess.run(
                ["ctr", "-n", "k8s.io", "-a", str(self.containerd.socket), "tasks", "ls", "-q"],
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
            )
            for task in listing.stdout.split():
                for action in (["kill", "-a", "-s", "SIGKILL", task], ["delete", "-f", task]):
                    subprocess.run(
                        ["ctr", "-n", "k8s.io", "-a", str(self.containerd.socket), "tasks", *action],
                        check=False,
                        capture_output=True,
                        timeout=30,
                    )
        # Whatever is still below containerd (shims, containers) or names its socket is ours.
        leftovers = set(descendants(containerd_pid)) | set(processes_mentioning(str(self.containerd.socket)))
        self.processes.forget(self.containerd_process)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(pid) for pid in leftovers):
            time.sleep(0.1)
        unmount_all(self.root)


@pytest.fixture
def node_root(tmp_path: Path) -> Iterator[Path]:
    """A node root short enough for the node's unix sockets, moved to ``tmp_path/node`` afterwards.

    pytest's ``tmp_path`` runs to 70 characters; under a root over 66 the kubelet cannot bind its
    pod-resources socket (``NodePaths.sockets``) and exits at start, most of the time. Fixtures
    that start a node's processes request this one first, so it is torn down after them.
    """
    root = Path(tempfile.mkdtemp(prefix="kpnode-", dir="/tmp"))
    try:
        yield root
    finally:
        leaks = [f"mount {p}" for p in mounts_under(root)]
        leaks += [f"process {pid}" for pid in processes_mentioning(str(root)) if pid != os.getpid()]
        if not leaks:
            # Same filesystem: a rename, so the logs stay with the test's other files.
            shutil.move(root, tmp_path / "node")
        assert not leaks, f"the node under {root} left these behind: " + ", ".join(leaks)


@pytest.fixture
def node(node_root: Path, processes: Processes, netns: NetNS, cgroup_root: str) -> Iterator[Node]:
    """containerd (config from ``render_config``) running in ``netns`` with state under ``node_root``."""
    binary = require_binary("/usr/bin/containerd", "containerd")
    require_binary("/usr/bin/ctr", "ctr")
    require_binary("/usr/sbin/runc", "/usr/bin/runc", "runc")
    require_binary("containerd-shim-runc-v2")
    root = node_root
    paths = containerd_service.ContainerdPaths.under(root)
    paths.config.parent.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(containerd_service.render_config(node_root=root))
    started = processes.start([binary, "--config", paths.config], name="containerd", netns=netns.name)
    result = Node(
        root=root,
        netns=netns,
        cgroup_root=cgroup_root,
        containerd=paths,
        processes=processes,
        containerd_process=started,
    )
    try:

        def serving() -> bool:
            if started.process.poll() is not None:
                pytest.fail(f"containerd exited\n{started.tail()}", pytrace=False)
            return (
                paths.socket.exists()
                and subprocess.run(
                    ["ctr", "-a", str(paths.socket), "version"], check=False, capture_output=True, timeout=10
                ).returncode
                == 0
            )

        _wait_until(serving, timeout=30, what="containerd to serve its socket", logs=started.tail)
        yield result
    finally:
        result.teardown()


# -- leak check ------------------------------------------------------------------------------


def _test_artifacts() -> set[str]:
    """Namespaces, links and cgroups with the test prefix that exist right now."""
    found = (
        {f"netns {p.name}" for p in Path("/run/netns").glob("kpt-*")}
        if Path("/run/netns").is_dir()
        else set()
    )
    found |= {f"link {p.name}" for p in Path("/sys/class/net").glob("kpt*")}
    for hierarchy in cgroup_hierarchies():
        found |= {f"cgroup {p}" for p in hierarchy.glob("kpt-*")}
    return found


@pytest.fixture(autouse=True)
def leak_check(tmp_path: Path) -> Iterator[None]:
    """After every other fixture is torn down, assert the test left nothing behind (no mount,
    process, network namespace, link or cgroup of its own). Autouse fixtures are set up first,
    so this one is torn down last."""
    before = _test_artifacts()
    yield
    leaks = [f"mount {p}" for p in mounts_under(tmp_path)]
    leaks += [f"process {pid}" for pid in processes_mentioning(str(tmp_path)) if pid != os.getpid()]
    leaks += sorted(_test_artifacts() - before)
    assert not leaks, "the test left these behind: " + ", ".join(leaks)
