"""e2e on the shared 1+1 cluster (issue 18, items 3 and 4), through the CLI as a user types it:

- ``kubeplane config new --roles os:reader`` mints a client config signed by the control plane
  node; with it a user reads the nodes' state and changes nothing: a patch, a reboot and
  minting an admin config are refused, and the secrets resources stay hidden;
- ``patch mc --mode try`` on the worker runs a live change (an extra host entry) without saving
  it; nobody confirms it, so the node rolls it back at the timeout, and says so in its events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import run_kubeplane
from e2e_clients import wait_until

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

ALIAS = "e2e-tried-entry"
#: The try window: long enough to see the change live through a few CLI calls on a loaded machine.
TRY_SECONDS = 20


def documents(result: Any) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_a_reader_config_from_config_new_reads_and_changes_nothing(
    cluster_1cp1w: E2ECluster, tmp_path: Path
) -> None:
    cluster = cluster_1cp1w
    (cp,) = cluster.control_plane
    (worker,) = cluster.workers
    path = tmp_path / "reader.config"
    made = cluster.cli("-n", cp, "config", "new", "--roles", "os:reader", "--crt-ttl", "1h", str(path))
    assert made.returncode == 0, made.stdout + made.stderr
    assert "roles kubeplane:reader" in made.stdout, made.stdout  # os:reader is the original's name
    reader = {**cluster.env, "KUBEPLANECONFIG": str(path)}
    info = documents(run_kubeplane(reader, "config", "info", "-o", "json"))[0]
    assert info["roles"] == ["kubeplane:reader"], info

    # It reads: the nodes' state, services and versions.
    (machine_type,) = documents(run_kubeplane(reader, "-n", worker, "get", "mt", "-o", "json"))
    assert machine_type["spec"] == {"machineType": "join"}  # the original's name for a worker
    services = documents(run_kubeplane(reader, "-n", cp, "service", "-o", "json"))
    assert {"etcd", "kubelet"} <= {s["id"] for s in services}, services
    versions = documents(run_kubeplane(reader, "-n", f"{cp},{worker}", "version", "-o", "json"))
    assert len(versions[0]["servers"]) == 2, versions
    # The etcd members (ids, names, URLs): the one other etcd call, `etcd leave`, is refused below.
    listed = run_kubeplane(reader, "-n", cp, "etcd", "members", "-o", "json")
    (member,) = documents(listed)
    assert not member["learner"] and any(cp in url for url in member["client_urls"]), member
    assert "PRIVATE KEY" not in listed.stdout

    # It changes nothing, and sees no secret.
    before = documents(cluster.cli("-n", worker, "get", "mc", "-o", "json"))[0]["spec"]
    patch = json.dumps([{"op": "add", "path": "/machine/network/extraHostEntries", "value": []}])
    for args in (
        ("-n", worker, "patch", "mc", "--immediate", "-p", patch),
        ("-n", worker, "reboot"),
        ("-n", cp, "etcd", "leave"),
        ("-n", cp, "config", "new", "--roles", "admin", str(tmp_path / "admin.config")),
    ):
        refused = run_kubeplane(reader, *args)
        assert refused.returncode != 0, f"the reader ran `{' '.join(args)}`"
        assert "permission" in refused.stderr.lower(), (args, refused.stderr)
    for secrets in ("RootSecrets.secrets.kubeplane.dev", "KubernetesSecrets.secrets.kubeplane.dev"):
        hidden = run_kubeplane(reader, "-n", cp, "get", secrets, "-o", "json")
        assert hidden.returncode != 0 and "BEGIN" not in hidden.stdout, f"the reader listed {secrets}"
    assert not (tmp_path / "admin.config").exists()
    assert documents(cluster.cli("-n", worker, "get", "mc", "-o", "json"))[0]["spec"] == before


def test_an_unconfirmed_try_is_rolled_back(cluster_1cp1w: E2ECluster) -> None:
    cluster = cluster_1cp1w
    (worker,) = cluster.workers

    def live_entries() -> list[str]:
        found = documents(cluster.cli("-n", worker, "get", "netstatus", "-o", "json"))
        return list(found[0]["spec"].get("extraHostEntries") or []) if found else []

    def saved_entries() -> list[dict[str, Any]]:
        (config,) = documents(cluster.cli("-n", worker, "get", "mc", "-o", "json"))
        return list(config["spec"]["machine"].get("network", {}).get("extraHostEntries") or [])

    assert not any(ALIAS in entry for entry in live_entries())
    entries = [*saved_entries(), {"ip": "10.77.1.1", "aliases": [ALIAS]}]
    patch = json.dumps([{"op": "add", "path": "/machine/network/extraHostEntries", "value": entries}])
    tried = cluster.cli(
        "-n", worker, "patch", "mc", "--mode", "try", "--timeout", f"{TRY_SECONDS}s", "-p", patch
    )
    assert tried.returncode == 0, tried.stdout + tried.stderr
    assert f"rolled back in {TRY_SECONDS}s unless applied again with --immediate" in tried.stdout, (
        tried.stdout
    )
    wait_until("the tried entry to be live", lambda: f"10.77.1.1 {ALIAS}" in live_entries(), timeout=15)

    wait_until(
        "the try to be rolled back",
        lambda: not any(ALIAS in entry for entry in live_entries()),
        timeout=TRY_SECONDS + 30,
    )
    assert not any(ALIAS in str(entry) for entry in saved_entries())
    events = documents(cluster.cli("-n", worker, "events", "-o", "json"))
    assert any(e["subject"] == "try" and "rolled back" in e["message"] for e in events), events[-5:]
    health = cluster.cli("health", "--wait-timeout", "3m")
    assert health.returncode == 0, health.stdout + health.stderr
