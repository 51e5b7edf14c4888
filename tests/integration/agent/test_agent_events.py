"""``kubeplane events`` against a real agent: the boot sequence and config applies as they
happened, selection by count and time, and a follower that sees a change as it is applied."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agent_harness import Cluster, json_lines, rows, wait_for

pytestmark = pytest.mark.integration

CLUSTER_PATCH = '[{"op": "add", "path": "/cluster/allowSchedulingOnMasters", "value": true}]'


def json_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_events_tell_the_boot_and_config_story_and_follow_changes(cluster: Cluster) -> None:
    agent = cluster.boot_agent()

    def booted_events() -> list[dict[str, Any]] | None:
        found = json_lines(cluster.kp("-e", agent.address, "events", "-o", "json").stdout)
        return found if any(e["message"].endswith(" booted as controlplane") for e in found) else None

    history = wait_for(booted_events, timeout=30, what="the booted event", logs=cluster.logs)
    story = [(e["kind"], e["subject"], e["message"]) for e in history]
    assert story[:4] == [
        ("sequence", "maintenance", "no machine config: waiting for apply-config --insecure"),
        ("config", "maintenance", "config applied; the node leaves maintenance mode and boots"),
        ("sequence", "boot", "booting as controlplane"),
        ("sequence", "boot", f"node {agent.address} booted as controlplane"),
    ], story
    assert [e["id"] for e in history] == sorted(e["id"] for e in history)
    assert all(e["node"] == agent.address for e in history)

    # The table has the documented columns; --tail and --since select.
    table = rows(cluster.kp("-e", agent.address, "events", "--tail", "2").stdout)
    assert table[0] == ["NODE", "ID", "TIME", "KIND", "SUBJECT", "MESSAGE"]
    assert len(table) == 3
    (last,) = json_lines(cluster.kp("-e", agent.address, "events", "--tail", "1", "-o", "json").stdout)
    assert last["id"] >= history[-1]["id"]  # the newest (a later event may have arrived since)
    assert (
        len(json_lines(cluster.kp("-e", agent.address, "events", "--since", "1h", "-o", "json").stdout)) >= 4
    )
    refused = cluster.kp("-e", agent.address, "events", "--since", "soon", check=False)
    assert refused.returncode == 2 and "'soon' is not a duration" in refused.stderr

    # --tail 1: the newest event of the history, then what happens while following. Its first
    # line shows the follower is connected (a CLI start can take seconds on a loaded machine),
    # so the change below cannot happen before it listens.
    follower = cluster.processes.start(
        cluster.kp_argv("-e", agent.address, "events", "-f", "--tail", "1", "-o", "json"), name="events-f"
    )
    try:
        (connected, *_) = wait_for(
            lambda: json_events(follower.log.read_text()),
            timeout=30,
            what="the follower to print the newest event",
            logs=follower.tail,
        )
        assert connected["id"] >= history[-1]["id"]
        cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", CLUSTER_PATCH)
        followed = wait_for(
            lambda: [e for e in json_events(follower.log.read_text()) if e["kind"] == "config"],
            timeout=15,
            what="the follower to print the config apply",
            logs=follower.tail,
        )
        assert (followed[-1]["subject"], followed[-1]["message"]) == (
            "immediate",
            "config applied immediately",
        )
        assert followed[-1]["id"] > connected["id"]
        assert follower.process.poll() is None, "a follower keeps running"
        # Only the newest event of the history, then newer ones.
        assert all(e["id"] > connected["id"] for e in json_events(follower.log.read_text())[1:])
    finally:
        cluster.processes.forget(follower)
