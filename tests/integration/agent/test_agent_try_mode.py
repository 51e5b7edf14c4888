"""``--mode try`` against a real agent: the change runs live, is not saved, and is rolled back when
nobody confirms it in time; applying it again with ``--immediate`` confirms and saves it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from agent_harness import Agent, Cluster, json_lines, wait_for

pytestmark = pytest.mark.integration

TRY_PATCH = '[{"op": "add", "path": "/cluster/allowSchedulingOnMasters", "value": true}]'
MACHINE_PATCH = '[{"op": "add", "path": "/machine/kubelet/extraArgs", "value": {"v": "4"}}]'
#: The try window. The test reads the live config and confirms within it, each through a new CLI
#: process: 3 s was too short on a loaded 2-core CI machine (the rollback came first).
TRY_SECONDS = 12


def live(cluster: Cluster, agent: Agent) -> dict[str, Any]:
    """The cluster section of the MachineConfig resource: what the node's controllers run with."""
    (document,) = json_lines(cluster.kp("-e", agent.address, "get", "mc", "-o", "json").stdout)
    cluster_section: dict[str, Any] = document["spec"]["cluster"]
    return cluster_section


def test_an_unconfirmed_try_is_rolled_back_and_a_confirmed_one_is_saved(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    saved = agent.config_bytes()
    assert not live(cluster, agent).get("allowSchedulingOnMasters")

    result = cluster.kp(
        "-e", agent.address, "patch", "mc", "--mode", "try", "--timeout", f"{TRY_SECONDS}s", "-p", TRY_PATCH
    )
    assert f"rolled back in {TRY_SECONDS}s unless applied again with --immediate" in result.stdout
    assert live(cluster, agent)["allowSchedulingOnMasters"] is True
    assert agent.config_bytes() == saved, "a tried config is not saved"
    wait_for(
        lambda: not live(cluster, agent).get("allowSchedulingOnMasters"),
        timeout=TRY_SECONDS + 15,
        what="the try to be rolled back",
        logs=cluster.logs,
    )
    events = json_lines(cluster.kp("-e", agent.address, "events", "-o", "json").stdout)
    assert any(e["subject"] == "try" and "rolled back" in e["message"] for e in events)

    # A try needs a change the node can apply live.
    refused = cluster.kp(
        "-e", agent.address, "patch", "mc", "--mode", "try", "-p", MACHINE_PATCH, check=False
    )
    assert refused.returncode == 1 and "--mode try applies live, like --immediate" in refused.stderr

    # Confirmed: the same change applied with --immediate before the timeout is saved and stays.
    cluster.kp(
        "-e", agent.address, "patch", "mc", "--mode", "try", "--timeout", f"{TRY_SECONDS}s", "-p", TRY_PATCH
    )
    cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", TRY_PATCH)
    confirmed = json_lines(cluster.kp("-e", agent.address, "events", "--tail", "1", "-o", "json").stdout)[0][
        "id"
    ]
    assert agent.config_bytes() != saved
    # Proving that nothing rolls back takes the try's timeout: watch the events until then.
    deadline = time.monotonic() + TRY_SECONDS + 2
    while time.monotonic() < deadline:
        events = json_lines(cluster.kp("-e", agent.address, "events", "-o", "json").stdout)
        assert not [e for e in events if e["subject"] == "try" and e["id"] > confirmed], events
        assert live(cluster, agent)["allowSchedulingOnMasters"] is True
