"""The agent backend's read calls never reach outside what they name: log ids are names of known
streams (the reader role may call logs), container references are Kubernetes names, and file
paths stay under the node root."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kubeplane import api
from kubeplane.agent import backend, containers
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit

#: The agent's streams, the supervised services and the time sync's chronyd (``timed``).
KNOWN = {"kubeplaned", "controller-runtime", "containerd", "kubelet", "etcd", "timed"}

PATHS_AND_ODDITIES = [
    "../../etc/passwd",
    "/etc/passwd",
    "kubelet/../../../system/config",
    "..",
    ".",
    "kubelet.log",
    "Kubelet",
    "kubelet\n",
    "kube let",
    "*",
    "",
    "a" * 64,
]


@dataclass
class FakeSupervisor:
    service_ids: list[str]

    def ids(self) -> list[str]:
        return self.service_ids


@dataclass
class FakeServices:
    supervisor: FakeSupervisor


@dataclass
class FakeNode:
    """What AgentBackend's read calls use of a Node; records the logs it was asked for."""

    root: Path
    name: str = "node-1"
    services: FakeServices | None = None
    asked: list[str] = field(default_factory=list)

    @property
    def paths(self) -> NodePaths:
        return NodePaths(self.root)

    async def logs(self, *, service: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        self.asked.append(service)
        yield f"{service} line"


def read_logs(node: FakeNode, service: str) -> list[str]:
    async def scenario() -> list[str]:
        agent = backend.AgentBackend(node)  # type: ignore[arg-type]
        return [line async for line in agent.logs(service=service, tail=None, follow=False)]

    return asyncio.run(scenario())


@pytest.mark.parametrize("service", sorted(KNOWN))
def test_known_log_ids_are_accepted(service: str) -> None:
    backend.check_log_id(service, KNOWN, node="n")


@pytest.mark.parametrize("service", PATHS_AND_ODDITIES)
def test_log_ids_that_are_not_plain_names_are_invalid(service: str) -> None:
    with pytest.raises(api.InvalidArgumentError, match="is not a service id") as refused:
        backend.check_log_id(service, KNOWN, node="n")
    assert [name for name, _ in refused.value.fields] == ["service"]
    assert "not a path" in str(refused.value)


def test_unknown_log_id_is_not_found_and_names_the_known_ones() -> None:
    with pytest.raises(
        api.NotFoundError, match="'apiserver' on node n; known: containerd, controller-runtime"
    ):
        backend.check_log_id("apiserver", KNOWN, node="n")


def test_the_backend_checks_the_id_before_the_node_opens_anything(tmp_path: Path) -> None:
    node = FakeNode(root=tmp_path)
    for service in ("../../etc/passwd", "/etc/passwd", "nope"):
        with pytest.raises((api.InvalidArgumentError, api.NotFoundError)):
            read_logs(node, service)
    assert node.asked == []
    assert read_logs(node, "kubeplaned") == ["kubeplaned line"]
    assert node.asked == ["kubeplaned"]


def test_known_logs_are_the_agent_streams_and_every_service(tmp_path: Path) -> None:
    without = backend.AgentBackend(FakeNode(root=tmp_path))  # type: ignore[arg-type]
    assert without.known_logs() == KNOWN
    node = FakeNode(root=tmp_path, services=FakeServices(FakeSupervisor(["etcd", "kubelet", "extra"])))
    assert backend.AgentBackend(node).known_logs() == KNOWN | {"extra"}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reference", "problem"),
    [
        ("a/../../etc:passwd", "pod '../../etc' is not a Kubernetes name"),
        ("kube-system/pod:../../../etc/shadow", "container '../../../etc/shadow' is not a Kubernetes name"),
        ("../kube-system/pod:c", "namespace '..' is not a Kubernetes name"),
        ("/etc/passwd", "NAMESPACE/POD:CONTAINER"),
        ("kube-system//etc/passwd:c", "pod '/etc/passwd' is not a Kubernetes name"),
        ("kube-system/*:c", r"pod '\*' is not a Kubernetes name"),
        ("kube-system/p_x:c", "pod 'p_x' is not a Kubernetes name"),
        ("kube-system/a..b:c", "pod 'a..b' is not a Kubernetes name"),
        ("Kube-System/p:c", "namespace 'Kube-System' is not a Kubernetes name"),
        ("kube-system/p:c.d", "container 'c.d' is not a Kubernetes name"),
        (f"kube-system/p:{'c' * 64}", "at most 63 characters"),
    ],
)
def test_container_references_must_be_kubernetes_names(reference: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        containers.parse_id(reference)


def test_container_references_with_dotted_pod_names_are_accepted() -> None:
    assert containers.parse_id("kube-system/kube-apiserver-cp-1.example:kube-apiserver") == (
        "kube-system",
        "kube-apiserver-cp-1.example",
        "kube-apiserver",
    )


def test_a_traversing_container_reference_never_reads_a_log_outside_the_pod_logs(tmp_path: Path) -> None:
    pod_logs = tmp_path / "pods"
    pod_logs.mkdir()
    # A log outside the pod log directory that a traversing reference would otherwise reach.
    outside = tmp_path / "secret" / "c"
    outside.mkdir(parents=True)
    (outside / "0.log").write_text("secret\n")
    for reference in ("ns/pod:../../secret/c", "ns/..:c", "ns/*:c", "ns/pod:*"):
        with pytest.raises(ValueError, match="not a Kubernetes name"):
            containers.log_file(reference, pod_logs=pod_logs)


@dataclass
class FileNode:
    root: Path
    name: str = "node-1"

    @property
    def paths(self) -> NodePaths:
        return NodePaths(self.root)


def test_file_paths_stay_under_the_node_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hosts").write_text("hosts\n")
    (tmp_path / "outside").write_text("outside\n")
    (root / "escape").symlink_to(tmp_path)
    agent = backend.AgentBackend(FileNode(root=root))  # type: ignore[arg-type]

    async def read(path: str) -> bytes:
        return b"".join([chunk async for chunk in agent.read_file(path=path)])

    assert asyncio.run(read("/etc/hosts")) == b"hosts\n"  # absolute means under the root
    for path in ("../outside", "etc/../../outside", "escape/outside", "escape"):
        with pytest.raises(api.InvalidArgumentError, match="outside the node root"):
            asyncio.run(read(path))
        with pytest.raises(api.InvalidArgumentError, match="outside the node root"):
            asyncio.run(agent.list_dir(path=path, recurse=False))
    # The symlink itself is listed (with its target) but never followed by a recursive listing.
    listed = asyncio.run(agent.list_dir(path=".", recurse=True))
    assert {entry["name"] for entry in listed} == {"etc", "etc/hosts", "escape"}


# Paths the file system refuses to follow: a clear INVALID_ARGUMENT or NOT_FOUND naming the
# path, never an exception the server turns into INTERNAL (with the node root's path in it).


@pytest.fixture
def agent(tmp_path: Path) -> backend.AgentBackend:
    root = tmp_path / "root"
    root.mkdir()
    (root / "file").write_text("data")
    (root / "loop").symlink_to("loop")
    return backend.AgentBackend(FileNode(root=root))  # type: ignore[arg-type]


def read(agent: backend.AgentBackend, path: str) -> bytes:
    async def scenario() -> bytes:
        return b"".join([chunk async for chunk in agent.read_file(path=path)])

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("file/x", "Not a directory"),  # was NotADirectoryError: INTERNAL
        ("y" * 300, "File name too long"),  # was OSError ENAMETOOLONG: INTERNAL
        ("loop", "loop"),  # was RuntimeError (symlink loop): INTERNAL
        ("loop/x", "loop"),
    ],
)
def test_read_file_refuses_paths_it_cannot_follow(
    agent: backend.AgentBackend, path: str, reason: str
) -> None:
    with pytest.raises(api.InvalidArgumentError) as refused:
        read(agent, path)
    assert reason in refused.value.message and "cannot be followed" in refused.value.message
    assert str(agent._node.paths.root) not in refused.value.message  # type: ignore[attr-defined]
    assert dict(refused.value.fields)["path"]


@pytest.mark.parametrize(
    ("path", "error"), [("y" * 300, api.InvalidArgumentError), ("loop", api.InvalidArgumentError)]
)
def test_list_dir_refuses_paths_it_cannot_follow(
    agent: backend.AgentBackend, path: str, error: type[Exception]
) -> None:
    with pytest.raises(error, match="cannot be followed"):
        asyncio.run(agent.list_dir(path=path, recurse=False))


def test_a_path_through_a_file_is_not_found_by_list_dir(agent: backend.AgentBackend) -> None:
    with pytest.raises(api.NotFoundError):
        asyncio.run(agent.list_dir(path="file/x", recurse=False))
    assert read(agent, "file") == b"data"


# A recursive listing of a real machine's root: /proc and /sys hold processes and kernel objects
# that vanish while they are read; the listing neither enters them nor fails on what vanished.


def test_a_recursive_listing_skips_kernel_file_systems_and_what_vanishes(
    agent: backend.AgentBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubeplane.agent import owned

    root: Path = agent._node.paths.root  # type: ignore[attr-defined]
    (root / "proc" / "4242").mkdir(parents=True)
    (root / "proc" / "4242" / "status").write_text("gone soon")
    (root / "sub").mkdir()
    (root / "sub" / "kept").write_text("kept")
    mounts = [owned.Mount(id=1, point=root / "proc", fstype="proc")]
    monkeypatch.setattr(owned, "mount_table", lambda: mounts)
    real_lstat = Path.lstat

    def lstat(self: Path) -> object:
        if self.name == "kept":  # removed between the walk and the row
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return real_lstat(self)

    monkeypatch.setattr(Path, "lstat", lstat)
    names = [entry["name"] for entry in asyncio.run(agent.list_dir(path=".", recurse=True))]
    assert names == ["file", "loop", "proc", "sub"]  # proc listed, not entered; "kept" vanished


def test_a_recursive_listing_of_too_many_entries_asks_for_a_narrower_path(
    agent: backend.AgentBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    root: Path = agent._node.paths.root  # type: ignore[attr-defined]
    for index in range(5):
        (root / f"f{index}").write_text("")
    monkeypatch.setattr(backend, "MAX_ENTRIES", 3)
    with pytest.raises(api.InvalidArgumentError, match="more than 3 entries below this path"):
        asyncio.run(agent.list_dir(path=".", recurse=True))
    assert len(asyncio.run(agent.list_dir(path=".", recurse=False))) == 7  # one directory is fine


def test_mount_table_reads_each_mounts_file_system_type(tmp_path: Path) -> None:
    from kubeplane.agent import owned

    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n"
        "23 1 0:22 / /with\\040space rw master:1 - tmpfs tmpfs rw\n"
    )
    assert [(m.id, str(m.point), m.fstype) for m in owned.mount_table(mountinfo)] == [
        (22, "/proc", "proc"),
        (23, "/with space", "tmpfs"),
    ]
