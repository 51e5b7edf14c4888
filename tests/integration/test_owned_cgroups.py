"""The agent kills only the processes in the cgroups it made, for real (needs root)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from kubeplane.agent import owned

pytestmark = pytest.mark.integration


@pytest.fixture
def cgroup() -> Iterator[str]:
    name = f"/kubeplane-test-{uuid.uuid4().hex[:8]}"
    owned.make_cgroup(name)
    try:
        yield name
    finally:
        owned.kill_cgroups([name], timeout=5.0)
        for path in owned.cgroup_paths([name]):
            owned.remove_cgroup(path)


def test_kill_cgroups_kills_members_and_nothing_else(cgroup: str) -> None:
    inside = subprocess.Popen(["sleep", "300"])
    outside = subprocess.Popen(["sleep", "300"])
    try:
        # Every hierarchy, cpuset included: a cgroup make_cgroup made takes tasks at once.
        for path in owned.cgroup_paths([cgroup]):
            (path / "cgroup.procs").write_text(str(inside.pid))
        assert owned.cgroup_members(owned.cgroup_paths([cgroup])) == [inside.pid]

        assert owned.kill_cgroups([cgroup], timeout=5.0) == []

        assert inside.wait(timeout=5.0) == -9
        assert outside.poll() is None, "a process outside the node's cgroups was killed"
        assert owned.cgroup_members(owned.cgroup_paths([cgroup])) == []
    finally:
        for process in (inside, outside):
            if process.poll() is None:
                os.kill(process.pid, 9)
                process.wait()
