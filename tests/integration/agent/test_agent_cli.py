"""Acceptance tests of issue 4 driven through the ``kubeplane`` CLI against real ``kubeplaned``
processes: maintenance-mode apply, ``get`` formats, aliases and watch, ``patch`` in every apply
mode, ``edit`` with a scripted editor, and multi-node proxying with one node down."""

from __future__ import annotations

import json
import stat
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_harness import Agent, Cluster, documents, json_lines, rows, wait_for

pytestmark = pytest.mark.integration

RESOURCE_HEADERS = ["NODE", "NAMESPACE", "TYPE", "ID", "VERSION"]
#: A change under ``cluster`` (applies live) and one under ``machine.kubelet`` (needs a reboot).
CLUSTER_PATCH = '[{"op": "add", "path": "/cluster/allowSchedulingOnMasters", "value": true}]'
MACHINE_PATCH = '[{"op": "add", "path": "/machine/kubelet/extraArgs", "value": {"v": "4"}}]'


def get_json(cluster: Cluster, agent: Agent, *args: str) -> list[dict[str, Any]]:
    return json_lines(cluster.kp("-e", agent.address, "get", *args, "-o", "json").stdout)


def machine_config(cluster: Cluster, agent: Agent) -> dict[str, Any]:
    """The MachineConfig resource as ``get mc -o yaml`` prints it."""
    (document,) = documents(cluster.kp("-e", agent.address, "get", "mc", "-o", "yaml").stdout)
    return document


def boot_marker(cluster: Cluster, agent: Agent) -> tuple[str, int]:
    """(created, version) of the MachineType resource: a reboot rebuilds the state, so both reset."""
    (document,) = get_json(cluster, agent, "mt")
    return document["metadata"]["created"], document["metadata"]["version"]


def wait_rebooted(cluster: Cluster, agent: Agent, before: tuple[str, int]) -> None:
    def rebooted() -> bool:
        result = cluster.kp("-e", agent.address, "get", "mt", "-o", "json", check=False)
        return result.returncode == 0 and json_lines(result.stdout)[0]["metadata"]["created"] != before[0]

    wait_for(rebooted, timeout=30, what=f"{agent.address} to reboot", logs=cluster.logs)


# -- maintenance mode ------------------------------------------------------------------------


def test_maintenance_mode_accepts_only_insecure_apply_then_serves_secure_api(cluster: Cluster) -> None:
    agent = cluster.start_agent()

    refused = cluster.kp("-e", agent.address, "get", "mt", check=False)
    assert refused.returncode == 1
    assert agent.config_bytes() is None

    applied = cluster.kp(
        "-n", agent.address, "apply-config", "--insecure", "-f", str(cluster.gen.controlplane), config=None
    )
    assert "maintenance" in applied.stdout
    document = cluster.wait_booted(agent)
    (server,) = document["servers"]
    assert server["node"] == agent.address
    assert server["maintenance"] is False
    assert server["kubernetes"] == "v1.20.2"
    on_disk = yaml.safe_load(agent.config_bytes() or b"")
    assert on_disk["machine"]["type"] == "controlplane"

    # Out of maintenance mode the insecure path is closed: nothing may change without a certificate.
    before = agent.config_bytes()
    again = cluster.kp(
        "-n",
        agent.address,
        "apply-config",
        "--insecure",
        "-f",
        str(cluster.gen.worker),
        config=None,
        check=False,
    )
    assert again.returncode == 1, again.stdout
    assert agent.config_bytes() == before


# -- get ---------------------------------------------------------------------------------------


def test_get_table_yaml_json_and_aliases(cluster: Cluster) -> None:
    agent = cluster.boot_agent()

    table = rows(cluster.kp("-e", agent.address, "get", "mt").stdout)
    assert table[0] == [*RESOURCE_HEADERS, "TYPE"]
    assert table[1:] == [[agent.address, "config", "MachineType", "machine-type", "1", "controlplane"]]

    (as_yaml,) = documents(cluster.kp("-e", agent.address, "get", "mt", "-o", "yaml").stdout)
    assert set(as_yaml) == {"node", "metadata", "spec"}
    assert as_yaml["node"] == agent.address
    assert as_yaml["metadata"]["id"] == "machine-type"
    assert as_yaml["metadata"]["namespace"] == "config"
    assert as_yaml["spec"] == {"machineType": "controlplane"}
    (as_json,) = get_json(cluster, agent, "mt")
    assert as_json == as_yaml

    full_name = as_yaml["metadata"]["type"]
    for alias in ("machinetypes", "machinetype", full_name):
        assert get_json(cluster, agent, alias) == [as_json], alias

    definitions = get_json(cluster, agent, "rd")
    ids = {d["metadata"]["id"] for d in definitions}
    assert {full_name, "MachineConfigs.config.kubeplane.dev", "Namespaces.meta.kubeplane.dev"} <= ids
    assert get_json(cluster, agent, "resourcedefinitions") == definitions
    namespaces = {d["metadata"]["id"] for d in get_json(cluster, agent, "ns")}
    assert {"config", "meta", "runtime"} <= namespaces

    (mc,) = get_json(cluster, agent, "mc")
    assert mc["spec"]["cluster"]["clusterName"] == "test-cluster"
    assert get_json(cluster, agent, "machineconfigs") == [mc]

    one = rows(cluster.kp("-e", agent.address, "get", "mt", "machine-type").stdout)
    assert one == table
    missing = cluster.kp("-e", agent.address, "get", "mt", "no-such-id", check=False)
    assert missing.returncode == 1
    assert "no-such-id" in missing.stderr
    unknown = cluster.kp("-e", agent.address, "get", "nosuchtype", check=False)
    assert unknown.returncode == 1
    assert "nosuchtype" in unknown.stderr


def test_get_watch_prints_current_state_then_changes(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    watch = cluster.processes.start(cluster.kp_argv("-e", agent.address, "get", "mc", "-w"), name="watch-mc")

    def watched() -> list[list[str]]:
        return [row for row in rows(watch.log.read_text()) if "MachineConfig" in row]

    try:
        wait_for(watched, timeout=15, what="the watch to print the current state", logs=watch.tail)
        assert watched()[0][-2:] == ["v1alpha1", "1"]
        cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", CLUSTER_PATCH)
        wait_for(
            lambda: any(row[-1] == "2" for row in watched()),
            timeout=15,
            what="the watch to print the updated MachineConfig",
            logs=watch.tail,
        )
        assert watch.process.poll() is None, "the watch must keep running after a change"
    finally:
        cluster.processes.forget(watch)


# -- patch in every mode -----------------------------------------------------------------------


def test_patch_immediate_cluster_field_applies_live(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    marker = boot_marker(cluster, agent)
    addresses_before = get_json(cluster, agent, "nodeaddresses")

    result = cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", CLUSTER_PATCH)
    assert "immediately" in result.stdout

    mc = machine_config(cluster, agent)
    assert mc["spec"]["cluster"]["allowSchedulingOnMasters"] is True
    assert mc["metadata"]["version"] == 2
    assert yaml.safe_load(agent.config_bytes() or b"")["cluster"]["allowSchedulingOnMasters"] is True
    # No reboot: resources unrelated to the config keep their identity and version.
    assert boot_marker(cluster, agent) == marker
    assert get_json(cluster, agent, "nodeaddresses") == addresses_before


def test_patch_immediate_machine_field_is_refused_naming_the_path(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    before = agent.config_bytes()

    result = cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", MACHINE_PATCH, check=False)

    assert result.returncode == 1
    assert "machine.kubelet.extraArgs" in result.stderr
    assert "--immediate" in result.stderr
    assert agent.config_bytes() == before
    assert machine_config(cluster, agent)["metadata"]["version"] == 1


def test_patch_default_mode_reboots_the_node_with_the_new_config(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", CLUSTER_PATCH)
    assert machine_config(cluster, agent)["metadata"]["version"] == 2
    marker = boot_marker(cluster, agent)

    result = cluster.kp("-e", agent.address, "patch", "mc", "-p", MACHINE_PATCH)
    assert "reboot" in result.stdout
    wait_rebooted(cluster, agent, marker)

    mc = machine_config(cluster, agent)
    # A reboot rebuilds the state from the config on disk: versions start over.
    assert mc["metadata"]["version"] == 1
    assert mc["spec"]["machine"]["kubelet"]["extraArgs"] == {"v": "4"}
    assert mc["spec"]["cluster"]["allowSchedulingOnMasters"] is True
    assert agent.staged_bytes() is None


def test_patch_on_reboot_is_staged_until_reboot(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    before = agent.config_bytes()
    marker = boot_marker(cluster, agent)

    result = cluster.kp("-e", agent.address, "patch", "mc", "--on-reboot", "-p", MACHINE_PATCH)
    assert "staged" in result.stdout

    assert agent.config_bytes() == before
    assert yaml.safe_load(agent.staged_bytes() or b"")["machine"]["kubelet"]["extraArgs"] == {"v": "4"}
    mc = machine_config(cluster, agent)
    assert "extraArgs" not in mc["spec"]["machine"]["kubelet"]
    assert boot_marker(cluster, agent) == marker

    cluster.kp("-e", agent.address, "reboot")
    wait_rebooted(cluster, agent, marker)
    assert machine_config(cluster, agent)["spec"]["machine"]["kubelet"]["extraArgs"] == {"v": "4"}
    assert agent.staged_bytes() is None


def test_patch_dry_run_prints_the_diff_and_changes_nothing(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    before = agent.config_bytes()
    marker = boot_marker(cluster, agent)

    result = cluster.kp("-e", agent.address, "patch", "mc", "--dry-run", "-p", MACHINE_PATCH)

    assert "dry run" in result.stdout
    assert "mode reboot" in result.stdout
    assert "+    extraArgs:" in result.stdout
    assert "+      v: '4'" in result.stdout
    assert agent.config_bytes() == before
    assert agent.staged_bytes() is None
    assert machine_config(cluster, agent)["metadata"]["version"] == 1
    assert boot_marker(cluster, agent) == marker


# -- edit ----------------------------------------------------------------------------------------


def scripted_editor(tmp_path: Path, *, old: str, new: str) -> Path:
    """An editor that replaces ``old`` by ``new`` in the file it is given (and records the call)."""
    script = tmp_path / "editor.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import pathlib, sys
            path = pathlib.Path(sys.argv[-1])
            text = path.read_text()
            assert {old!r} in text, "field to edit not found"
            path.write_text(text.replace({old!r}, {new!r}, 1))
            pathlib.Path({str(tmp_path / "editor-called")!r}).touch()
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_edit_with_a_scripted_editor(cluster: Cluster, tmp_path: Path) -> None:
    import sys

    agent = cluster.boot_agent()
    editor = scripted_editor(tmp_path, old="dnsDomain: cluster.local", new="dnsDomain: example.test")

    result = cluster.kp(
        "-e",
        agent.address,
        "edit",
        "mc",
        "--immediate",
        env={"KUBEPLANE_EDITOR": f"{sys.executable} {editor}"},
    )

    assert (tmp_path / "editor-called").exists()
    assert "immediately" in result.stdout
    mc = machine_config(cluster, agent)
    assert mc["spec"]["cluster"]["network"]["dnsDomain"] == "example.test"
    assert yaml.safe_load(agent.config_bytes() or b"")["cluster"]["network"]["dnsDomain"] == "example.test"


# -- multi-node proxying ---------------------------------------------------------------------------


def test_proxy_to_three_nodes_and_one_down(cluster: Cluster) -> None:
    a, b, c = (cluster.boot_agent() for _ in range(3))
    nodes = f"{a.address},{b.address},{c.address}"

    table = rows(cluster.kp("-e", a.address, "-n", nodes, "get", "mt").stdout)
    assert table[0] == [*RESOURCE_HEADERS, "TYPE"]
    assert sorted(row[0] for row in table[1:]) == sorted([a.address, b.address, c.address])
    versions = json.loads(cluster.kp("-e", a.address, "-n", nodes, "version", "-o", "json").stdout)
    assert sorted(s["node"] for s in versions["servers"]) == sorted([a.address, b.address, c.address])

    c.kill()
    result = cluster.kp("-e", a.address, "-n", nodes, "get", "mt", check=False)

    assert result.returncode == 1
    answered = rows(result.stdout)
    assert sorted(row[0] for row in answered[1:]) == sorted([a.address, b.address])
    assert c.address in result.stderr
    assert a.address not in result.stderr and b.address not in result.stderr
