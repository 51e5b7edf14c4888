"""e2e: ``kubeplane certs renew`` on the shared 3 control plane + 1 worker cluster.

Uses ``cluster_3cp1w`` of the e2e conftest (as test_upgrade.py does; this module changes only the
control plane nodes' certificates, which the others do not look at). In order: a dry run changes
nothing; a rolling renewal, with a client listing pods through the endpoint every 100 ms the whole
time, gives every kube-apiserver a new serving certificate from the same CA, keeps every node in
the load balancer's rotation at the end and leaves ``health`` passing; a renewal killed on its
second node and continued with the command it printed renews no node twice.

The serving certificates are read straight from each node's kube-apiserver port (TLS handshake,
no verification) and then verified against the cluster CA of the admin kubeconfig.
"""

from __future__ import annotations

import base64
import re
import shlex
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from cryptography.hazmat.primitives.serialization import Encoding
from e2e_clients import ApiPoller, Http2Poller, Run, run_cli, serving_certificate

from kubeplane import pki

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

STEP_DONE = re.compile(r"^ < (?P<what>done|already at target, skipped) \((?P<seconds>[\d.]+)s\)")
EXPIRY = re.compile(
    r"^ > kube-apiserver certificate of node (?P<node>\S+): expires (?P<before>\S+) -> (?P<after>\S+)"
)
CONTINUE = re.compile(r"^to continue this renewal if it is interrupted: (?P<command>.+)$")


@pytest.fixture(scope="module")
def cluster(cluster_3cp1w: E2ECluster) -> E2ECluster:
    return cluster_3cp1w


def serials(cluster: Any) -> dict[str, int]:
    return {node: serving_certificate(node).serial_number for node in cluster.control_plane}


def cluster_ca(cluster: Any) -> bytes:
    document = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    return base64.b64decode(document["clusters"][0]["cluster"]["certificate-authority-data"])


def names(cluster: Any) -> dict[str, str]:
    """Control plane node address -> node name."""
    return {node.ip: node.name for node in cluster.state().nodes if node.role == "controlplane"}


def step_seconds(run: Run) -> list[tuple[float, str]]:
    return [(float(m["seconds"]), m["what"]) for line in run.lines if (m := STEP_DONE.match(line))]


def test_dry_run_changes_nothing(cluster: Any) -> None:
    before = serials(cluster)
    run = run_cli(cluster.env, "certs", "renew", "--dry-run")
    output = "\n".join(run.lines)
    assert run.returncode == 0, output
    assert "dry run: nothing was changed" in output
    for node in cluster.control_plane:
        assert f"renew kubernetes-certs on node {node}: issued " in output
    assert "not renewed: the CAs, etcd's certificates" in output
    # -n names one node to talk through; the plan still covers every control plane node.
    guide = run_cli(cluster.env, "-n", cluster.control_plane[1], "certs", "renew", "--dry-run")
    assert guide.returncode == 0, "\n".join(guide.lines)
    assert sum(1 for line in guide.lines if "renew kubernetes-certs on node " in line) == 3
    assert serials(cluster) == before


def test_rolling_renewal_keeps_the_api_answering(cluster: Any) -> None:
    before = serials(cluster)
    with ApiPoller(Path(cluster.kubeconfig)) as probe, Http2Poller(Path(cluster.kubeconfig)) as h2_probe:
        run = run_cli(cluster.env, "certs", "renew", echo=True)
    output = "\n".join(run.lines)
    assert run.returncode == 0, output
    print(
        f"API requests through the endpoint: {probe.requests}, failed: {len(probe.failures)} "
        f"(keep-alive connection closed by a stopping API server: {len(probe.closed)}), "
        f"longest gap {probe.longest_gap:.1f}s; over HTTP/2: {h2_probe.requests}, failed: "
        f"{len(h2_probe.failures)}, sent again after a GOAWAY: {len(h2_probe.retried)}, "
        f"longest gap {h2_probe.longest_gap:.1f}s"
    )
    for failure in [*probe.failures, *h2_probe.failures]:
        print(f"  {failure}")
    steps = step_seconds(run)
    assert [what for _, what in steps] == ["done"] * len(cluster.control_plane), output
    median = statistics.median(s for s, _ in steps)
    print(f"seconds per node: {', '.join(f'{s:.1f}' for s, _ in steps)} (median {median:.1f})")

    after = serials(cluster)
    ca = cluster_ca(cluster)
    for node in cluster.control_plane:
        assert after[node] != before[node], node
        assert pki.is_issued_by(serving_certificate(node).public_bytes(Encoding.PEM), ca), node
    # Each node's expiry, before and after, printed for each node; the new ones are later.
    expiries = {m["node"]: (m["before"], m["after"]) for line in run.lines if (m := EXPIRY.match(line))}
    assert set(expiries) == set(names(cluster).values()), output
    assert all(after_ > before_ for before_, after_ in expiries.values()), expiries
    assert "renewal completed: 3 node(s) renewed, 0 already renewed" in output
    # Every node was taken out of the rotation once, and all are back.
    drains = [line for line in run.lines if "out of the load balancer rotation" in line]
    assert len(drains) == len(cluster.control_plane), drains
    states = cluster.haproxy.server_states()
    assert len(states) == len(cluster.control_plane)
    assert all(status.in_rotation for status in states.values()), states
    health = cluster.cli("health", "--wait-timeout", "3m")
    assert health.returncode == 0, health.stdout + health.stderr
    # A client as kubectl and client-go are (HTTP/2, a GET left unanswered by a GOAWAY sent again)
    # sees no failure at all; an HTTP/1.1 client without retries at most loses the request it
    # sends on a kept-alive connection as a stopping API server closes it, once per restart.
    assert h2_probe.failures == [], f"{len(h2_probe.failures)} of {h2_probe.requests} HTTP/2 requests failed"
    assert set(h2_probe.versions) == {"HTTP/2"}, h2_probe.versions
    # A request sent again because a stopping API server ended its connection: at most one per
    # API server restart (the poller has one connection at a time).
    assert len(h2_probe.retried) <= len(cluster.control_plane), h2_probe.retried
    others = [failure for failure in probe.failures if failure not in probe.closed]
    assert others == [], f"{len(probe.failures)} of {probe.requests} API requests failed"
    assert len(probe.closed) <= len(cluster.control_plane), probe.closed


def test_a_killed_renewal_continues_without_renewing_a_node_twice(cluster: Any) -> None:
    second = names(cluster)[cluster.control_plane[1]]
    before = serials(cluster)
    killed = run_cli(
        cluster.env,
        "certs",
        "renew",
        kill_when=lambda lines: any(line.startswith(f" > asked node {second} to renew") for line in lines),
    )
    assert killed.killed, "the run ended before its kill point:\n" + "\n".join(killed.lines)
    command = next(m["command"] for line in killed.lines if (m := CONTINUE.match(line)))
    first_renewed = serving_certificate(cluster.control_plane[0]).serial_number
    assert first_renewed != before[cluster.control_plane[0]]

    words = shlex.split(command)
    assert words[0] == "kubeplane" and " certs renew --issued-before " in command, command
    resumed = run_cli(cluster.env, *words[1:])
    output = "\n".join(resumed.lines)
    assert resumed.returncode == 0, output
    # The first node was done by the killed run: skipped, not renewed again; the second was asked
    # just before the kill (skipped or renewed, depending on how far it got); the third renewed.
    outcomes = [what for _, what in step_seconds(resumed)]
    assert len(outcomes) == 3 and outcomes[0] == "already at target, skipped", output
    assert outcomes[2] == "done", output
    assert serving_certificate(cluster.control_plane[0]).serial_number == first_renewed
    after = serials(cluster)
    assert all(after[node] != before[node] for node in cluster.control_plane), (before, after)
    # The node the kill left out of the rotation is back.
    states = cluster.haproxy.server_states()
    assert all(status.in_rotation for status in states.values()), states
    health = cluster.cli("health", "--wait-timeout", "3m")
    assert health.returncode == 0, health.stdout + health.stderr
