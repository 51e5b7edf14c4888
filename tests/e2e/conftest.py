"""Shared e2e fixtures: whole local clusters created and destroyed through the CLI.

Clusters are expensive (tens of seconds each), so they are shared wherever sharing weakens no
test: ``cluster_1cp1w`` is created once per session, ``cluster_3cp1w`` lazily once per session
(only if a test asks for it); ``cluster`` is a fresh 3+1 cluster per module, for tests that
change the cluster (upgrades). Each yields an :class:`E2ECluster`.

Isolation: ``KUBEPLANE_STATE`` and ``KUBEPLANECONFIG`` point into the session's temporary
directory, so no test reads or writes the user's client config or clusters. Every cluster is
destroyed at the end even when its tests (or its creation) failed, and then the fixture asserts
that nothing is left: no namespace, link, mount, cgroup, process or state of it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from e2e_clients import KUBEPLANE

from kubeplane.config import client as client_config
from kubeplane.provision import cluster as cluster_mod
from kubeplane.provision import hostproc, netns, state, toolchain
from kubeplane.provision import leftovers as leftovers_mod
from kubeplane.provision import loadbalancer as lb

KUBERNETES_VERSION = "v1.20.2"
CREATE_TIMEOUT = 900


def run_kubeplane(
    env: Mapping[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``kubeplane ARGS`` with ``env`` (stdout and stderr captured as text)."""
    return subprocess.run(
        [KUBEPLANE, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclasses.dataclass
class E2ECluster:
    """A running local cluster and how to reach it."""

    name: str
    env: dict[str, str]
    directory: Path
    client_config: Path
    kubeconfig: Path
    endpoint: str
    control_plane: tuple[str, ...]
    workers: tuple[str, ...]
    #: The load balancer in front of the API servers; None when the endpoint is a VIP.
    haproxy: lb.HAProxy | None
    registry_log: Path

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run_kubeplane(self.env, *args, timeout=timeout)

    def state(self) -> state.ClusterState:
        return state.ClusterState.load(self.name, root=self.directory.parent)

    def kubectl_argv(self) -> list[str]:
        binary = toolchain.Toolchain().require(KUBERNETES_VERSION).binary("kubectl")
        return [str(binary), "--kubeconfig", str(self.kubeconfig)]

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.kubectl_argv(), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def pod_network_namespaces() -> list[str]:
    """The CNI plugin's per-pod network namespaces on this machine (``/run/netns/cni-*``)."""
    return (
        [name for name in os.listdir(netns.NETNS_DIR) if name.startswith("cni-")]
        if netns.NETNS_DIR.exists()
        else []
    )


def orphaned_pod_network_namespaces() -> list[str]:
    """Pod namespace names that no live mount namespace mounts any more: what a destroyed
    cluster leaves behind. Another cluster that is still running (the e2e session runs two at
    once) mounts its own in its nodes' mount namespaces, so they do not count."""
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    mounted = leftovers_mod.pod_netns_of_all(pids)
    return [
        name
        for name in pod_network_namespaces()
        if name not in mounted and not os.path.ismount(netns.NETNS_DIR / name)
    ]


def leftovers(cluster: state.ClusterState, *, client_config_path: Path) -> list[str]:
    """Everything of ``cluster`` (as recorded before destroy) that still exists."""
    found = []
    network = cluster.network
    for name in network.netns if network else []:
        if netns.netns_exists(name):
            found.append(f"netns {name}")
    for link in [*(network.links if network else []), *([network.bridge] if network else [])]:
        if netns.link_info(link) is not None:
            found.append(f"link {link}")
    records = list(cluster.processes.values())
    for node in cluster.nodes:
        records += node.processes.values()
        found += [f"process {pid} of node {node.name}" for pid in leftovers_mod.node_processes(node)]
        found += [f"cgroup {path}" for path in node.cgroups if Path(path).exists()]
    found += [f"process {r.name} (pid {r.pid})" for r in records if hostproc.is_running(r)]
    with open("/proc/self/mounts") as mounts:
        found += [f"mount {line.split()[1]}" for line in mounts if str(cluster.directory) in line.split()[1]]
    if cluster.directory.exists():
        found.append(f"state directory {cluster.directory}")
    if cluster.name in client_config.load(client_config_path).contexts:
        found.append(f"context {cluster.name} in {client_config_path}")
    return found


#: Modules that run before the others of their shard: the self-hosted cluster's hand-over from the
#: temporary control plane is the most timing-sensitive step of the suite, so it runs before its
#: shard makes any other cluster.
FIRST_MODULES = ("test_convert.py",)


#: ``KUBEPLANE_E2E_SHARD=a`` or ``b`` runs one of two halves of the e2e tests; scripts/test-tiers
#: runs both at once (the tests mostly wait on clusters, so two streams fit the 2 cores). Unset:
#: every test. A test goes where its shared cluster is made, so each is made once: tests on the
#: 3+1 cluster in ``a``, tests on the 1+1 cluster in ``b`` (a test needing both runs in ``a``,
#: which then makes its own 1+1 cluster under another name); modules with clusters of their own
#: go to ``b`` unless listed in :data:`SHARD_A_MODULES` (which balances the two by duration).
SHARD_ENV = "KUBEPLANE_E2E_SHARD"
SHARDS = ("a", "b")
SHARD_A_MODULES = ("test_convert.py", "test_vip_failover.py", "test_wireguard_ports.py")


def shard_of(item: pytest.Item) -> str:
    """The shard (``a`` or ``b``) that runs ``item`` (see :data:`SHARD_ENV`)."""
    fixtures = getattr(item, "fixturenames", ())
    if "cluster_3cp1w" in fixtures:
        return "a"
    if "cluster_1cp1w" in fixtures:
        return "b"
    return "a" if item.path.name in SHARD_A_MODULES else "b"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def first(item: pytest.Item) -> bool:
        return item.path.parent == Path(__file__).parent and item.path.name in FIRST_MODULES

    shard = os.environ.get(SHARD_ENV)
    if shard is not None:
        if shard not in SHARDS:
            raise pytest.UsageError(f"{SHARD_ENV}={shard!r}: expected one of {', '.join(SHARDS)}")
        here = Path(__file__).parent
        other = [item for item in items if item.path.parent == here and shard_of(item) != shard]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if item not in other]
        if shard == "a":
            # Its own 1+1 cluster (session-scoped) is made for the few tests that need both, and
            # lives from then to the end of the session: last, so it is not there meanwhile.
            items.sort(key=lambda item: "cluster_1cp1w" in getattr(item, "fixturenames", ()))
    items.sort(key=lambda item: not first(item))  # stable: keeps the order within each group


SESSION_PREFIX = "kpe2e-"
#: Under /tmp: held while dead sessions are reaped (see :func:`reap_stale_sessions`).
REAPER_LOCK = ".kpe2e-reaper.lock"
#: The pytest process that owns a session directory: its PID and start time (PIDs are reused).
OWNER_FILE = "owner"


def _session_env(base: Path) -> dict[str, str]:
    return {"KUBEPLANE_STATE": str(base / "s"), "KUBEPLANECONFIG": str(base / "config")}


def _session_is_live(base: Path) -> bool:
    """Whether the e2e session in ``base`` may still run: its owner lives, or (an owner file is
    missing) a process recorded for one of its clusters does."""
    try:
        pid, start_time = (int(field) for field in (base / OWNER_FILE).read_text().split())
    except (OSError, ValueError):
        root = base / "s"
        names = cluster_mod.list_clusters(state_root=root) if root.is_dir() else []
        for name in names:
            loaded = state.ClusterState.load(name, root=root)
            records = [*loaded.processes.values()]
            for node in loaded.nodes:
                records += node.processes.values()
            if any(hostproc.is_running(record) for record in records):
                return True
        return False
    return hostproc.start_time_of(pid) == start_time


def reap_stale_sessions(tmp: Path) -> list[str]:
    """Destroy the clusters of earlier e2e sessions whose pytest is gone (killed, or the machine's
    session ended mid-run): their bridges, namespaces and host routes would otherwise collide
    with this session's clusters of the same names. Live sessions are left alone.

    The two halves of the e2e run start at the same moment and would both destroy the same dead
    session's clusters: one at a time (an exclusive lock), so the second finds them gone.
    """
    reaped = []
    with (tmp / REAPER_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for base in sorted(tmp.glob(f"{SESSION_PREFIX}*")):
            if not base.is_dir() or _session_is_live(base):
                continue
            root = base / "s"
            for name in cluster_mod.list_clusters(state_root=root) if root.is_dir() else []:
                result = run_kubeplane(_session_env(base), "cluster", "destroy", "--name", name)
                if result.returncode != 0:
                    pytest.fail(f"cannot destroy stale e2e cluster {name} of {base}:\n{result.stderr}")
                reaped.append(f"{base.name}/{name}")
            shutil.rmtree(base, ignore_errors=True)
    return reaped


@pytest.fixture(scope="session")
def e2e_env() -> Iterator[dict[str, str]]:
    # Short paths: unix sockets under the state directory (haproxy's admin socket, each node's
    # containerd socket) must fit in about 104 bytes, which pytest's own tmp paths can overrun.
    tmp = Path("/tmp")
    reaped = reap_stale_sessions(tmp)
    if reaped:
        print(f"destroyed the clusters of dead e2e sessions: {', '.join(reaped)}")
    # Made under another name and renamed once it has its owner file: a session starting at the
    # same moment (the other shard) never sees it without one and takes it for a dead session's.
    making = Path(tempfile.mkdtemp(prefix=".making-", dir=tmp))
    (making / OWNER_FILE).write_text(f"{os.getpid()} {hostproc.start_time_of(os.getpid())}\n")
    base = tmp / f"{SESSION_PREFIX}{making.name.removeprefix('.making-')}"
    making.rename(base)
    yield _session_env(base)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def kubeplane() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``kubeplane(env, *args)`` runs the CLI (see :func:`run_kubeplane`)."""
    return run_kubeplane


@pytest.fixture(scope="session")
def toolchain_paths() -> toolchain.ToolchainPaths:
    try:
        return toolchain.Toolchain().require(KUBERNETES_VERSION)
    except toolchain.ToolchainError as exc:
        pytest.fail(f"e2e tests need the toolchain: {exc}")


def _cluster(
    env: dict[str, str],
    *,
    name: str,
    cidr: str,
    controlplanes: int,
    workers: int,
    extra_args: tuple[str, ...] = (),
) -> Iterator[E2ECluster]:
    root = Path(env["KUBEPLANE_STATE"])
    created = None
    # Pod sandboxes get named network namespaces from the CNI plugin; destroy must remove them.
    pod_netns_before = set(pod_network_namespaces())
    try:
        result = run_kubeplane(
            env,
            "cluster",
            "create",
            "--name",
            name,
            "--cidr",
            cidr,
            "--controlplanes",
            str(controlplanes),
            "--workers",
            str(workers),
            "--kubernetes-version",
            KUBERNETES_VERSION,
            # A deadline, not a figure: a 3-node cluster is healthy in about 2 min beside the rest
            # of the suite here, and a CI machine once ran such work 2.3 times slower.
            "--wait-timeout",
            "10m",
            *extra_args,
            timeout=CREATE_TIMEOUT,
        )
        if cluster_mod.exists(name, state_root=root):
            created = state.ClusterState.load(name, root=root)
        assert result.returncode == 0, f"cluster create failed:\n{result.stdout}\n{result.stderr}"
        assert created is not None
        shown = cluster_mod.show(name, state_root=root)
        yield E2ECluster(
            name=name,
            # Several clusters share the client config and each create makes its context current,
            # so every command names this cluster's context, as a user with several clusters would.
            env={**env, "KUBEPLANECONTEXT": name},
            directory=created.directory,
            client_config=Path(env["KUBEPLANECONFIG"]),
            kubeconfig=Path(shown["kubeconfig"]),
            endpoint=shown["endpoint"],
            control_plane=tuple(n.ip for n in created.nodes if n.role == "controlplane"),
            workers=tuple(n.ip for n in created.nodes if n.role == "worker"),
            haproxy=(
                lb.HAProxy(directory=Path(created.dirs["haproxy"]), record=created.processes["haproxy"])
                if "haproxy" in created.dirs
                else None
            ),
            registry_log=Path(created.dirs["registry"]) / "registry.log",
        )
    finally:
        # The state as it is now: nodes a test added are checked for leftovers too.
        if cluster_mod.exists(name, state_root=root):
            created = state.ClusterState.load(name, root=root)
        destroyed = run_kubeplane(env, "cluster", "destroy", "--name", name)
        assert destroyed.returncode == 0, f"cluster destroy failed:\n{destroyed.stdout}\n{destroyed.stderr}"
        if created is not None:
            left = leftovers(created, client_config_path=Path(env["KUBEPLANECONFIG"]))
            orphans = set(orphaned_pod_network_namespaces()) - pod_netns_before
            left += [f"pod netns {name}" for name in sorted(orphans)]
            assert not left, f"cluster destroy left things behind: {left}"


@pytest.fixture(scope="session")
def cluster_1cp1w(e2e_env: dict[str, str], toolchain_paths: toolchain.ToolchainPaths) -> Iterator[E2ECluster]:
    # Shard a makes one only for a test that also needs the 3+1 cluster: another name and network,
    # as shard b (all the others) makes "e2e1" at the same time.
    name, cidr = ("e2e1a", "10.5.33.0/24") if os.environ.get(SHARD_ENV) == "a" else ("e2e1", "10.5.21.0/24")
    yield from _cluster(e2e_env, name=name, cidr=cidr, controlplanes=1, workers=1)


# Session scope: test_apps.py runs an application on it, test_cluster.py checks it as created,
# test_upgrade.py upgrades it and then (last) takes one control plane node down. One 3+1 cluster
# for all of them keeps CI inside its time budget.
@pytest.fixture(scope="session")
def cluster_3cp1w(e2e_env: dict[str, str], toolchain_paths: toolchain.ToolchainPaths) -> Iterator[E2ECluster]:
    # The cluster DNS forwards other names to the bridge address, where test_apps.py serves them.
    yield from _cluster(
        e2e_env,
        name="e2e3",
        cidr="10.5.23.0/24",
        controlplanes=3,
        workers=1,
        extra_args=("--dns-upstream", "10.5.23.1"),
    )


#: The pod-checkpointer grace period of the self-hosted cluster: long enough that the conversion
#: really waits for checkpoints to expire, short enough for CI (the reference waits 5 minutes).
SELF_HOSTED_GRACE_PERIOD = 20


@pytest.fixture(scope="module")
def cluster_selfhosted(
    e2e_env: dict[str, str], toolchain_paths: toolchain.ToolchainPaths
) -> Iterator[E2ECluster]:
    """A fresh self-hosted cluster (3 control planes + 1 worker) for the convert-k8s module.

    ``KUBEPLANE_E2E_SELFHOSTED_CLUSTER=NAME,CIDR`` moves it (a by-hand run beside other clusters).
    """
    default = "e2esh,10.5.27.0/24"
    name, _, cidr = os.environ.get("KUBEPLANE_E2E_SELFHOSTED_CLUSTER", default).partition(",")
    yield from _cluster(
        e2e_env,
        name=name,
        cidr=cidr,
        controlplanes=3,
        workers=1,
        extra_args=("--self-hosted", "--checkpointer-grace-period", str(SELF_HOSTED_GRACE_PERIOD)),
    )


@pytest.fixture(scope="module")
def cluster_wireguard(
    e2e_env: dict[str, str], toolchain_paths: toolchain.ToolchainPaths
) -> Iterator[E2ECluster]:
    """A fresh 1+1 cluster created with ``--wireguard-cidr`` and moved ports, ``--node-api-port
    51000 --trustd-port 51001`` (test_wireguard_ports.py)."""
    yield from _cluster(
        e2e_env,
        name="e2ewg",
        cidr="10.5.29.0/24",
        controlplanes=1,
        workers=1,
        extra_args=("--wireguard-cidr", "10.1.29.0/24", "--node-api-port", "51000", "--trustd-port", "51001"),
    )
