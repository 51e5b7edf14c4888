"""Bad input and crash acceptance tests of issue 4: an invalid config or patch is refused with
the field path and leaves the config on disk byte-identical; a ``kubeplaned`` killed with SIGKILL
right after an apply or a stage loses neither when restarted."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml
from agent_harness import Cluster, json_lines, wait_for

pytestmark = pytest.mark.integration

BAD_CIDR = "10.244.0.0/33"
MACHINE_PATCH = '[{"op": "add", "path": "/machine/kubelet/extraArgs", "value": {"v": "4"}}]'


def test_invalid_config_is_refused_with_the_field_path(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.boot_agent()
    before = agent.config_bytes()
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(cluster.gen.controlplane.read_text().replace("10.244.0.0/16", BAD_CIDR))

    for mode in ((), ("--immediate",), ("--on-reboot",), ("--dry-run",)):
        result = cluster.kp("-e", agent.address, "apply-config", "-f", str(invalid), *mode, check=False)
        assert result.returncode == 1, mode
        assert "cluster.network.podSubnets[0]" in result.stderr, result.stderr
        assert BAD_CIDR in result.stderr
    assert agent.config_bytes() == before
    assert agent.staged_bytes() is None

    # The same config in maintenance mode is refused too, and the node stays unconfigured.
    fresh = cluster.start_agent()
    result = cluster.kp(
        "-n", fresh.address, "apply-config", "--insecure", "-f", str(invalid), config=None, check=False
    )
    assert result.returncode == 1
    assert "cluster.network.podSubnets[0]" in result.stderr
    assert fresh.config_bytes() is None


def test_patch_producing_an_invalid_config_changes_nothing(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    before = agent.config_bytes()

    bad_value = cluster.kp(
        "-e", agent.address, "patch", "mc", "--immediate",
        "-p", f'[{{"op": "replace", "path": "/cluster/network/podSubnets/0", "value": "{BAD_CIDR}"}}]',
        check=False,
    )  # fmt: skip
    assert bad_value.returncode == 1
    assert "cluster.network.podSubnets[0]" in bad_value.stderr

    bad_path = cluster.kp(
        "-e", agent.address, "patch", "mc",
        "-p", '[{"op": "replace", "path": "/cluster/noSuchField", "value": 1}]',
        check=False,
    )  # fmt: skip
    assert bad_path.returncode == 1
    assert "/cluster" in bad_path.stderr and "noSuchField" in bad_path.stderr
    assert agent.config_bytes() == before
    assert agent.staged_bytes() is None


def test_sigkill_after_apply_keeps_the_applied_config(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.boot_agent()
    changed = tmp_path / "changed.yaml"
    changed.write_text(
        cluster.gen.controlplane.read_text().replace("dnsDomain: cluster.local", "dnsDomain: a.test")
    )

    cluster.kp("-e", agent.address, "apply-config", "-f", str(changed))
    agent.kill(signal.SIGKILL)
    agent.start()
    cluster.wait_booted(agent)

    (mc,) = json_lines(cluster.kp("-e", agent.address, "get", "mc", "-o", "json").stdout)
    assert mc["spec"]["cluster"]["network"]["dnsDomain"] == "a.test"


def test_sigkill_after_stage_keeps_applied_and_staged_configs(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", '[{"op": "replace", '
               '"path": "/cluster/network/dnsDomain", "value": "b.test"}]')  # fmt: skip
    cluster.kp("-e", agent.address, "patch", "mc", "--on-reboot", "-p", MACHINE_PATCH)
    agent.kill(signal.SIGKILL)

    assert yaml.safe_load(agent.config_bytes() or b"")["cluster"]["network"]["dnsDomain"] == "b.test"
    agent.start()
    cluster.wait_booted(agent)
    (mc,) = json_lines(cluster.kp("-e", agent.address, "get", "mc", "-o", "json").stdout)
    assert mc["spec"]["cluster"]["network"]["dnsDomain"] == "b.test"
    # The stage survives: still staged, or (if the agent treats its restart as a reboot) applied.
    staged = yaml.safe_load(agent.staged_bytes() or b"null")
    live = mc["spec"]["machine"]["kubelet"].get("extraArgs")
    assert live == {"v": "4"} or staged["machine"]["kubelet"]["extraArgs"] == {"v": "4"}

    cluster.kp("-e", agent.address, "reboot")

    def applied() -> bool:
        result = cluster.kp("-e", agent.address, "get", "mc", "-o", "json", check=False)
        if result.returncode != 0:
            return False
        (document,) = json_lines(result.stdout)
        return bool(document["spec"]["machine"]["kubelet"].get("extraArgs") == {"v": "4"})

    wait_for(applied, timeout=30, what="the staged config to apply at reboot", logs=cluster.logs)
    (mc,) = json_lines(cluster.kp("-e", agent.address, "get", "mc", "-o", "json").stdout)
    assert mc["spec"]["cluster"]["network"]["dnsDomain"] == "b.test"
