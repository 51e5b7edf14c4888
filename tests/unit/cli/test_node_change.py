"""`apply-config` (secure and --insecure), `patch mc` and `edit mc` against real node API servers:
modes, dry runs, field errors, patch atomicity across nodes, scripted editors, reader refusals."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kubeplane import config

if TYPE_CHECKING:  # fixtures' types, defined in conftest.py
    from conftest import Cluster, FakeNode

pytestmark = pytest.mark.unit

CLUSTER_PATCH = '[{"op": "replace", "path": "/cluster/clusterName", "value": "renamed"}]'
MACHINE_PATCH = '[{"op": "add", "path": "/machine/kubelet/extraArgs", "value": {"v": "2"}}]'


def changed(text: str, old: str = "clusterName: test", new: str = "clusterName: renamed") -> str:
    assert old in text
    return text.replace(old, new)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- apply-config -----------------------------------------------------------------------------


def test_apply_immediate_changes_the_config(cluster: Cluster, tmp_path: Path) -> None:
    node = cluster.nodes[0]
    new = changed(node.config)
    result = cluster.run("apply-config", "-f", str(write(tmp_path, "mc.yaml", new)), "--immediate")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "applied in mode immediate\n"
    assert node.applied == [("immediate", new)]
    assert node.config == new


def test_apply_immediate_of_a_machine_change_is_refused_and_names_the_field(
    cluster: Cluster, tmp_path: Path
) -> None:
    node = cluster.nodes[0]
    before = node.config
    new = config.apply_json_patch(config.load(before), MACHINE_PATCH).to_yaml()
    path = write(tmp_path, "mc.yaml", new)
    result = cluster.run("apply-config", "-f", str(path), "--immediate")
    assert result.exit_code == 1
    assert "FAILED_PRECONDITION" in result.stderr
    assert "--on-reboot" in result.stderr
    assert node.config == before and node.applied == []


def test_apply_invalid_config_prints_every_field_error(cluster: Cluster, tmp_path: Path) -> None:
    node = cluster.nodes[0]
    before = node.config
    bad = before.replace("type: controlplane", "type: boss").replace("clusterName: test", "clusterNam: x")
    result = cluster.run("apply-config", "-f", str(write(tmp_path, "bad.yaml", bad)))
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0] == f"Error: endpoint 127.0.0.2:{cluster.port}: invalid machine config (INVALID_ARGUMENT):"
    fields = [line.strip().split(":")[0] for line in lines[1:]]
    assert "machine.type" in fields
    assert any(field.startswith("cluster.clusterNam") for field in fields)
    assert node.config == before


def test_apply_dry_run_prints_the_diff_and_mode_and_changes_nothing(cluster: Cluster, tmp_path: Path) -> None:
    node = cluster.nodes[0]
    before = node.config
    path = write(tmp_path, "mc.yaml", changed(before))
    result = cluster.run("apply-config", "-f", str(path), "--dry-run")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "node 127.0.0.2: dry run, nothing applied: would apply in mode reboot"
        " (allowed: reboot, immediate, on-reboot)"
    )
    assert "-  clusterName: test" in lines
    assert "+  clusterName: renamed" in lines
    assert node.config == before and node.applied == []


def test_apply_on_reboot_stages_until_reboot(cluster: Cluster, tmp_path: Path) -> None:
    node = cluster.nodes[0]
    before = node.config
    new = changed(before)
    assert (
        cluster.run("apply-config", "-f", str(write(tmp_path, "m.yaml", new)), "--on-reboot").exit_code == 0
    )
    assert (node.config, node.staged) == (before, new)
    assert cluster.run("reboot").exit_code == 0
    assert (node.config, node.staged) == (new, None)


def test_apply_modes_exclude_each_other(cluster: Cluster, tmp_path: Path) -> None:
    path = write(tmp_path, "m.yaml", cluster.nodes[0].config)
    result = cluster.run("apply-config", "-f", str(path), "--immediate", "--on-reboot")
    assert result.exit_code == 2
    assert "exclude each other" in result.stderr


def test_apply_missing_file_is_a_clear_error(cluster: Cluster, tmp_path: Path) -> None:
    result = cluster.run("apply-config", "-f", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 1
    assert "cannot read machine config" in result.stderr and "nope.yaml" in result.stderr


def test_insecure_apply_reaches_maintenance_nodes_without_a_client_config(
    offline: Cluster, maintenance: tuple[FakeNode, str], dead_address: str, tmp_path: Path
) -> None:
    node, address = maintenance
    new = changed(node.config)
    path = str(write(tmp_path, "mc.yaml", new))
    result = offline.run("-n", f"{address},{dead_address}", "apply-config", "--insecure", "-f", path)
    assert result.exit_code == 1
    assert result.stdout == "maintenance: applied in mode reboot\n"
    assert f"node {dead_address}" in result.stderr
    assert node.config == new
    # Without --insecure the same node needs a client config, which does not exist.
    secure = offline.run("-n", address, "apply-config", "-f", path)
    assert secure.exit_code == 1 and "no contexts" in secure.stderr
    nowhere = offline.run("apply-config", "--insecure", "-f", path)
    assert nowhere.exit_code == 1 and "--insecure needs the node's address" in nowhere.stderr
    assert not offline.config_path.exists()
    assert node.applied == [("reboot", new)]


# --- patch ------------------------------------------------------------------------------------


def test_patch_immediate_applies_to_every_node(three: Cluster, tmp_path: Path) -> None:
    three.nodes[1].config = changed(three.nodes[1].config, "clusterName: test", "clusterName: other")
    result = three.run("-n", ",".join(three.addresses), "patch", "mc", "--immediate", "-p", CLUSTER_PATCH)
    assert result.exit_code == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"{a}: applied in mode immediate" for a in three.addresses]
    for node in three.nodes:
        assert "clusterName: renamed" in node.config
        assert [mode for mode, _ in node.applied] == ["immediate"]


def test_patch_in_mode_try_sends_the_timeout_and_conflicting_modes_are_refused(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    result = cluster.run("patch", "mc", "--mode", "try", "--timeout", "90s", "-p", CLUSTER_PATCH)
    assert result.exit_code == 0, result.stderr
    assert [mode for mode, _ in node.applied] == ["try"]
    assert node.try_seconds == [90]
    # The other modes send no timeout; --mode by name is the same as its flag.
    assert cluster.run("patch", "mc", "--mode", "immediate", "-p", CLUSTER_PATCH).exit_code == 0
    assert node.try_seconds == [90, None]
    both = cluster.run("patch", "mc", "--mode", "try", "--immediate", "-p", CLUSTER_PATCH)
    assert both.exit_code == 2 and "--immediate and --mode try exclude each other" in both.stderr
    too_long = cluster.run("patch", "mc", "--mode", "try", "--timeout", "2h", "-p", CLUSTER_PATCH)
    assert too_long.exit_code == 2 and "--timeout" in too_long.stderr
    assert len(node.applied) == 2


@pytest.mark.parametrize("how", ["-p @file", "--patch-file", "machineconfig alias"])
def test_patch_sources_and_aliases(cluster: Cluster, tmp_path: Path, how: str) -> None:
    patch_file = write(tmp_path, "patch.json", CLUSTER_PATCH)
    args = {
        "-p @file": ["patch", "mc", "-p", f"@{patch_file}"],
        "--patch-file": ["patch", "mc", "--patch-file", str(patch_file)],
        "machineconfig alias": ["patch", "MachineConfigs", "-p", CLUSTER_PATCH],
    }[how]
    result = cluster.run(*args, "--immediate")
    assert result.exit_code == 0, result.stderr
    assert "clusterName: renamed" in cluster.nodes[0].config


def test_patch_refuses_other_types_and_missing_patch(cluster: Cluster) -> None:
    other = cluster.run("patch", "sp", "-p", CLUSTER_PATCH)
    assert other.exit_code == 1
    assert "machine config only" in other.stderr and "StaticPod" in other.stderr
    missing = cluster.run("patch", "mc")
    assert missing.exit_code == 2
    assert "-p/--patch" in missing.stderr
    assert cluster.nodes[0].applied == []


def test_patch_needing_a_reboot_is_refused_immediate(cluster: Cluster) -> None:
    result = cluster.run("patch", "mc", "--immediate", "-p", MACHINE_PATCH)
    assert result.exit_code == 1
    assert "machine.kubelet.extraArgs" in result.stderr
    assert cluster.nodes[0].applied == []
    assert cluster.run("patch", "mc", "-p", MACHINE_PATCH).exit_code == 0
    assert [mode for mode, _ in cluster.nodes[0].applied] == ["reboot"]


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ('[{"op": "remove", "path": "/cluster/nope"}]', "patch[0]"),
        ('[{"op": "replace", "path": "/machine/type", "value": "boss"}]', "machine.type"),
        ("[{not json", "problem in patch"),
    ],
)
def test_a_failing_patch_applies_nothing_on_any_node(three: Cluster, patch: str, expected: str) -> None:
    before = [node.config for node in three.nodes]
    result = three.run("-n", ",".join(three.addresses), "patch", "mc", "-p", patch)
    assert result.exit_code == 1
    assert expected in result.stderr
    assert "not applied to any node" in result.stderr
    assert [node.config for node in three.nodes] == before
    assert all(node.applied == [] for node in three.nodes)


def test_patch_with_one_node_down_applies_nothing(three: Cluster) -> None:
    three.stop(2)
    result = three.run("-n", ",".join(three.addresses), "patch", "mc", "-p", CLUSTER_PATCH)
    assert result.exit_code == 1
    assert "node 127.0.0.4" in result.stderr
    assert three.nodes[0].applied == [] and three.nodes[1].applied == []


def test_patch_dry_run_shows_the_diff(cluster: Cluster) -> None:
    result = cluster.run("patch", "mc", "--dry-run", "--immediate", "-p", CLUSTER_PATCH)
    assert result.exit_code == 0, result.stderr
    assert "would apply in mode immediate" in result.stdout
    assert "+  clusterName: renamed\n" in result.stdout
    assert cluster.nodes[0].applied == []


def test_reader_certificate_cannot_read_or_change_the_machine_config(reader_cluster: Cluster) -> None:
    node = reader_cluster.nodes[0]
    before = node.config
    for args in (["patch", "mc", "-p", CLUSTER_PATCH], ["edit", "mc"]):
        result = reader_cluster.run(*args, env={"KUBEPLANE_EDITOR": "false"})
        assert result.exit_code == 1, args
        assert "PERMISSION_DENIED" in result.stderr
        assert "kubeplane:reader" in result.stderr
    assert node.config == before and node.applied == []
    assert "machine_config" not in node.calls


# --- edit -------------------------------------------------------------------------------------


def editor(tmp_path: Path, body: str) -> str:
    """A command line running a Python editor script; ``path`` is the file, ``log`` a call log."""
    script = tmp_path / "editor.py"
    log = tmp_path / "editor.log"
    script.write_text(
        "import json, sys\n"
        "from pathlib import Path\n"
        "path = Path(sys.argv[1])\n"
        f"log = Path({str(log)!r})\n"
        "text = path.read_text()\n"
        "calls = json.loads(log.read_text()) if log.exists() else []\n"
        "calls.append({'name': path.name, 'text': text, 'mode': path.stat().st_mode & 0o777})\n"
        "log.write_text(json.dumps(calls))\n" + textwrap.dedent(body)
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def editor_calls(tmp_path: Path) -> list[dict[str, object]]:
    calls: list[dict[str, object]] = json.loads((tmp_path / "editor.log").read_text())
    return calls


def test_edit_applies_the_edited_config(cluster: Cluster, tmp_path: Path) -> None:
    command = editor(tmp_path, "path.write_text(text.replace('clusterName: test', 'clusterName: renamed'))\n")
    result = cluster.run("edit", "mc", "--immediate", env={"KUBEPLANE_EDITOR": command, "EDITOR": "false"})
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "applied in mode immediate\n"
    assert "clusterName: renamed" in cluster.nodes[0].config
    (call,) = editor_calls(tmp_path)
    assert call["mode"] == 0o600  # the config holds private keys
    assert str(call["name"]).startswith("kubeplane-edit-127.0.0.2-")


def test_edit_uses_editor_when_kubeplane_editor_is_unset(cluster: Cluster, tmp_path: Path) -> None:
    command = editor(tmp_path, "path.write_text(text.replace('clusterName: test', 'clusterName: renamed'))\n")
    result = cluster.run("edit", "mc", env={"KUBEPLANE_EDITOR": None, "EDITOR": command})
    assert result.exit_code == 0, result.stderr
    assert [mode for mode, _ in cluster.nodes[0].applied] == ["reboot"]


@pytest.mark.parametrize("body", ["pass\n", "path.write_text('')\n", "path.write_text('\\n  \\n')\n"])
def test_unchanged_or_empty_edit_applies_nothing(cluster: Cluster, tmp_path: Path, body: str) -> None:
    result = cluster.run("edit", "mc", env={"KUBEPLANE_EDITOR": editor(tmp_path, body)})
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "node 127.0.0.2: edit cancelled, nothing applied\n"
    assert cluster.nodes[0].applied == []


def test_failing_editor_applies_nothing(cluster: Cluster, tmp_path: Path) -> None:
    body = "path.write_text('garbage')\nsys.exit(3)\n"
    result = cluster.run("edit", "mc", env={"KUBEPLANE_EDITOR": editor(tmp_path, body)})
    assert result.exit_code == 1
    assert "exited with status 3; nothing applied" in result.stderr
    assert cluster.nodes[0].applied == []
    missing = cluster.run("edit", "mc", env={"KUBEPLANE_EDITOR": str(tmp_path / "no-such-editor")})
    assert missing.exit_code == 1
    assert "cannot run the editor" in missing.stderr


def test_rejected_edit_is_reopened_with_the_error_then_fixed(cluster: Cluster, tmp_path: Path) -> None:
    body = """
    if len(calls) == 1:
        path.write_text(text.replace('type: controlplane', 'type: boss'))
    else:
        fixed = text.replace('type: boss', 'type: controlplane')
        path.write_text(fixed.replace('clusterName: test', 'clusterName: fixed'))
    """
    result = cluster.run("edit", "mc", env={"KUBEPLANE_EDITOR": editor(tmp_path, body)})
    assert result.exit_code == 0, result.stderr
    _, second = editor_calls(tmp_path)
    header = str(second["text"]).split("version: v1alpha1")[0]
    assert header.startswith("# the node rejected this config")
    assert "# error: " not in header and "machine.type" in header
    assert "type: boss" in str(second["text"])
    node = cluster.nodes[0]
    assert len(node.applied) == 1
    assert "clusterName: fixed" in node.config and not node.config.startswith("#")


def test_rejected_edit_saved_unchanged_gives_up(cluster: Cluster, tmp_path: Path) -> None:
    body = """
    if len(calls) == 1:
        path.write_text(text.replace('type: controlplane', 'type: boss'))
    """
    before = cluster.nodes[0].config
    result = cluster.run("edit", "mc", env={"KUBEPLANE_EDITOR": editor(tmp_path, body)})
    assert result.exit_code == 1
    assert "edit cancelled, nothing applied; the node rejected it" in result.stderr
    assert len(editor_calls(tmp_path)) == 2
    assert cluster.nodes[0].config == before


def test_edit_several_nodes_in_turn(three: Cluster, tmp_path: Path) -> None:
    body = "path.write_text(text.replace('clusterName: test', 'clusterName: renamed'))\n"
    nodes = ",".join(three.addresses[:2])
    result = three.run(
        "-n", nodes, "edit", "mc", "--dry-run", env={"KUBEPLANE_EDITOR": editor(tmp_path, body)}
    )
    assert result.exit_code == 0, result.stderr
    names = [str(call["name"]) for call in editor_calls(tmp_path)]
    assert [name.split("-")[2] for name in names] == three.addresses[:2]
    assert result.stdout.count("dry run, nothing applied") == 2
    assert all(node.applied == [] for node in three.nodes)
