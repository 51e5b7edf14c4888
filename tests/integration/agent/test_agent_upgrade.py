"""``kubeplane upgrade`` on a real agent: it re-execs itself into another build (a copy of this
source whose ``__version__`` says so) in place, keeping its PID, and boots again; ``--stage``
waits for the next reboot; a build that fails its check is refused and changes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from agent_harness import API_PORT, Agent, Cluster, wait_for
from test_agent_recovery import server_version

import kubeplane

pytestmark = pytest.mark.integration

UPLOADS = "/var/lib/kubeplane/uploads"
NEW = "0.1.0+test"


def build(agent: Agent, name: str, *, version: str = NEW, broken: bool = False) -> str:
    """A copy of the running source under the node's uploads directory, as ``--path`` names it."""
    target = agent.paths.agent_uploads / name / "kubeplane"
    shutil.copytree(Path(kubeplane.__file__).parent, target, ignore=shutil.ignore_patterns("__pycache__"))
    init = target / "__init__.py"
    text = init.read_text()
    assert f'__version__ = "{kubeplane.__version__}"' in text
    init.write_text(text.replace(f'__version__ = "{kubeplane.__version__}"', f'__version__ = "{version}"'))
    if broken:
        (target / "agent" / "main.py").write_text("raise ImportError('this build is broken')\n")
    return f"{UPLOADS}/{name}"


def agent_processes(agent: Agent) -> dict[int, str]:
    """PID → command line of the processes serving ``agent``'s address (the agent, its wrapper)."""
    listen = f"{agent.address}:{API_PORT}"
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if listen in words and "--listen" in words:
            found[int(entry.name)] = " ".join(words)
    return found


def running(cluster: Cluster, agent: Agent, version: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        server = server_version(cluster, agent)
        ok = server and server.get("tag") == version and server.get("phase") == "running"
        return server if ok else None

    found: dict[str, Any] = wait_for(
        ready, timeout=60, what=f"{agent.address} on {version}", logs=cluster.logs
    )
    return found


def test_upgrade_re_execs_the_agent_in_place_into_the_new_build(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    before = agent_processes(agent)
    assert before and all("kubeplaned" in line or "-c" not in line for line in before.values())
    first = server_version(cluster, agent)
    assert first is not None and first["instance"]
    path = build(agent, "next")

    result = cluster.kp("-e", agent.address, "upgrade", "--path", path)
    print(result.stdout)  # the seconds it took, for pytest -rP
    assert f"restarts into kubeplaned {NEW}" in result.stdout
    assert f"node {agent.address}: upgraded and back in" in result.stdout
    server = running(cluster, agent, NEW)
    assert server["maintenance"] is False
    assert server["instance"] != first["instance"]  # a new agent process

    after = agent_processes(agent)
    assert sorted(after) == sorted(before), "the agent kept its PID (and no other process serves it)"
    assert any("from kubeplane.agent.main import main" in line for line in after.values()), after
    assert (agent.paths.agent_builds / NEW / "kubeplane" / "__init__.py").is_file()
    # The agent (root / in its machine) logged the exec, then booted again from the new build.
    log = agent.paths.log("kubeplaned").read_text()
    assert f"exec into /var/lib/kubeplane/agent/{NEW}" in log
    assert log.rindex("booted as") > log.index("exec into")

    # The same build again: the node already says NEW, so the CLI's wait must see a new agent
    # process (its instance), not just the version; the node answers from that one at once.
    again = cluster.kp("-e", agent.address, "upgrade", "--path", path)
    assert f"node {agent.address}: upgraded and back in" in again.stdout
    now = server_version(cluster, agent)
    assert now is not None and now["instance"] not in (first["instance"], server["instance"]), now


def test_a_broken_build_is_refused_and_nothing_changes(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    path = build(agent, "broken", broken=True)
    result = cluster.kp("-e", agent.address, "upgrade", "--path", path, check=False)
    assert result.returncode != 0
    assert "fails its check" in result.stderr and "nothing was changed" in result.stderr
    assert not agent.paths.active_build.exists()
    refused = cluster.kp("-e", agent.address, "upgrade", "--path", "/etc", check=False)
    assert refused.returncode != 0 and f"not under {UPLOADS}" in refused.stderr
    assert server_version(cluster, agent)["tag"] == kubeplane.__version__  # type: ignore[index]


def test_a_staged_upgrade_runs_from_the_next_reboot(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    before = agent_processes(agent)
    path = build(agent, "staged")
    result = cluster.kp("-e", agent.address, "upgrade", "--path", path, "--stage")
    assert "runs from its next start" in result.stdout
    assert server_version(cluster, agent)["tag"] == kubeplane.__version__  # type: ignore[index]

    cluster.kp("-e", agent.address, "reboot")
    running(cluster, agent, NEW)
    assert sorted(agent_processes(agent)) == sorted(before)
