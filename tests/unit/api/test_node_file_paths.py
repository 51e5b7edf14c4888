"""The node API's file calls (ReadFile, ListDir, served by the agent backend) on paths the file
system refuses to follow: a clear INVALID_ARGUMENT or NOT_FOUND naming the path, never an
exception the server turns into INTERNAL (with the node root's absolute path in it)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubeplane import api
from kubeplane.agent import backend
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit


@dataclass
class FileNode:
    root: Path
    name: str = "node-1"

    @property
    def paths(self) -> NodePaths:
        return NodePaths(self.root)


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
