"""``teardown.power_off``: a node's agent and its process group go at once, with SIGKILL."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kubeplane.provision import hostproc, state, teardown
from kubeplane.provision.cluster import AGENT

pytestmark = pytest.mark.unit


def alive(pid: int) -> bool:
    """Running (an orphan's zombie, not reaped yet, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_power_off_kills_the_agent_and_its_group_at_once(tmp_path: Path) -> None:
    # An "agent" that ignores SIGTERM (a graceful stop would wait) and has a child in its group.
    script = "trap '' TERM; sleep 300 & echo $! > child; wait"
    record = hostproc.start(["sh", "-c", script], name="agent", log=tmp_path / "agent.log", cwd=tmp_path)
    node = state.NodeState(
        name="n1", role="controlplane", index=1, ip="10.0.0.2", netns="kpt-no-such-netns", host_veth="veth-x"
    )
    node.processes[AGENT] = record
    deadline = time.monotonic() + 10
    while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text().strip():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    child = int((tmp_path / "child").read_text())
    started = time.monotonic()
    try:
        teardown.power_off(node)
        while hostproc.is_running(record) or alive(child):
            assert time.monotonic() - started < 5, "power_off left a process of the node running"
            time.sleep(0.02)
    finally:
        hostproc.stop(record, timeout=1)
    assert time.monotonic() - started < 5
