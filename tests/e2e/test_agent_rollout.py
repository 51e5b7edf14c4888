"""e2e: ``kubeplane upgrade`` (the node agent) rolled over the shared 3 control plane + 1 worker
cluster while a client lists pods through the endpoint every 100 ms (issue 18 item 2).

Uses ``cluster_3cp1w`` of the e2e conftest. The build is a copy of this source whose
``__version__`` says ``+rollout``, put in each node's uploads directory (the node's root on the
host is its recorded ``root_dir``), and the command is the one a user runs, every node with
``-n``. Each control plane node leaves the haproxy rotation before its agent stops its services
and comes back only once its kube-apiserver answers ``/readyz``, so no request fails but a kept
connection the stopping kube-apiserver closes as a request goes out (at most one per restart,
which HTTP lets the client retry; seen once in a full run).

The nodes stay on the new build afterwards: it is this source with another version string, and
no other module looks at the agent's version; every haproxy server is put back in any case, so a
failure here leaves the later modules a normal cluster.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from e2e_clients import ApiPoller, run_cli

import kubeplane

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

VERSION = f"{kubeplane.__version__}+rollout"
#: Where a build goes on a node, as the node sees it (``--path``).
BUILD = "/var/lib/kubeplane/uploads/rollout"
BACK = re.compile(r"^node (?P<node>\S+): upgraded and back in (?P<seconds>[\d.]+)s$")


@pytest.fixture(scope="module")
def cluster(cluster_3cp1w: E2ECluster) -> E2ECluster:
    return cluster_3cp1w


def put_build(root_dir: str) -> None:
    """Copy the running source, its version changed, to ``BUILD`` in the node rooted at ``root_dir``."""
    target = Path(root_dir) / BUILD.lstrip("/") / "kubeplane"
    shutil.rmtree(target.parent, ignore_errors=True)
    shutil.copytree(Path(kubeplane.__file__).parent, target, ignore=shutil.ignore_patterns("__pycache__"))
    init = target / "__init__.py"
    text = init.read_text()
    current = f'__version__ = "{kubeplane.__version__}"'
    assert current in text
    init.write_text(text.replace(current, f'__version__ = "{VERSION}"'))


def agent_versions(cluster: Any, nodes: list[str]) -> dict[str, dict[str, Any]]:
    """Node -> what ``kubeplane -n NODE version`` says of its agent."""
    versions = {}
    for node in nodes:
        result = cluster.cli("-n", node, "version", "-o", "json")
        assert result.returncode == 0, result.stdout + result.stderr
        (server,) = json.loads(result.stdout)["servers"]
        versions[node] = server
    return versions


def test_rolling_agent_upgrade_keeps_the_api_answering(cluster: Any) -> None:
    started = time.monotonic()
    state = cluster.state()
    nodes = [*cluster.control_plane, *cluster.workers]
    for node in state.nodes:
        put_build(node.root_dir)
    try:
        with ApiPoller(Path(cluster.kubeconfig)) as probe:
            run = run_cli(cluster.env, "-n", ",".join(nodes), "upgrade", "--path", BUILD, echo=True)
        output = "\n".join(run.lines)
        print(
            f"API requests through the endpoint: {probe.requests}, failed: {len(probe.failures)}, "
            f"longest gap {probe.longest_gap:.1f}s"
        )
        for failure in probe.failures:
            print(f"  {failure}")
        assert run.returncode == 0, output
        seconds = {m["node"]: float(m["seconds"]) for line in run.lines if (m := BACK.match(line))}
        assert set(seconds) == set(nodes), output
        print(
            f"seconds per node: {', '.join(f'{node} {s:.1f}' for node, s in seconds.items())} "
            f"(median {statistics.median(seconds.values()):.1f})"
        )
        # Each control plane node left the rotation once and came back; the worker never was in it.
        drains = [line for line in run.lines if "out of the load balancer rotation" in line]
        assert len(drains) == len(cluster.control_plane), drains
        restores = [line for line in run.lines if "back into the load balancer rotation" in line]
        assert len(restores) == len(cluster.control_plane), restores

        # The one failure HTTP allows a client to retry (RFC 9112 §9.3.1, as client-go does): a
        # kept-alive connection the stopping kube-apiserver closed as a request went out, at most
        # once per restart (test_upgrade.py's bound). Nothing else may fail.
        others = [failure for failure in probe.failures if failure not in probe.closed]
        assert others == [], f"{len(probe.failures)} of {probe.requests} API requests failed"
        assert len(probe.closed) <= len(cluster.control_plane), probe.closed
        for node, answer in agent_versions(cluster, nodes).items():
            assert answer["tag"] == VERSION and answer["phase"] == "running", (node, answer)
        states = cluster.haproxy.server_states()
        assert len(states) == len(cluster.control_plane)
        assert all(status.in_rotation for status in states.values()), states
        # Healthy too, allowing a check in progress (a run saw one server briefly not L7OK here).
        for name in states:
            cluster.haproxy.wait_status(name, until="healthy", timeout=30)
        health = cluster.cli("health", "--wait-timeout", "3m")
        assert health.returncode == 0, health.stdout + health.stderr
    finally:
        # Whatever happened, the later modules get every API server in the rotation.
        for name in cluster.haproxy.server_states():
            cluster.haproxy.set_server_state(name, "ready")
        print(f"test runtime {time.monotonic() - started:.0f}s")
