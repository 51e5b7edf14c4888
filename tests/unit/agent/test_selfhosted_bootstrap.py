"""The self-hosted bootstrap: which node directory the pod-checkpointer DaemonSet mounts on each
node, and the temporary control plane's config."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import yaml

from kubeplane import config
from kubeplane.agent.selfhosted import TEMPORARY_APISERVER_ARGS, node_root_pattern, temporary_config
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit


def test_the_machine_root_is_used_as_it_is() -> None:
    # Local cluster nodes are machines too: their agents run at / over their own bind mounts.
    assert node_root_pattern(NodePaths(Path("/")), "node-1") == "/"


def test_another_root_is_used_as_it_is_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "nodes" / "controlplane-1"
    root.mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        assert node_root_pattern(NodePaths(root), "lab-controlplane-1") == str(root.resolve())
    assert "lab-controlplane-1 runs under root" in caplog.text


def _controlplane(**api_server: object) -> config.MachineConfig:
    configs = gen.generate(gen.GenOptions(cluster_name="test", endpoint="10.5.0.1"), gen.new_secrets())
    document = copy.deepcopy(dict(configs.documents["controlplane"]))
    # As ``bootstrap --self-hosted`` configs are: no service account key, no aggregator CA.
    document["cluster"].pop("serviceAccount", None)
    document["cluster"].pop("aggregatorCA", None)
    document["cluster"]["apiServer"] = {**document["cluster"].get("apiServer", {}), **api_server}
    return config.load(yaml.safe_dump(document))


def test_the_temporary_control_plane_gets_keys_and_no_shutdown_delay() -> None:
    temporary = temporary_config(_controlplane()).model.cluster
    assert temporary.service_account is not None and temporary.service_account.key
    assert temporary.aggregator_ca is not None and temporary.aggregator_ca.key
    # The DaemonSet pod waits for its port: the temporary API server lets go of it at once.
    assert temporary.api_server is not None
    assert temporary.api_server.extra_args == TEMPORARY_APISERVER_ARGS


def test_the_temporary_control_plane_keeps_the_flags_its_config_sets() -> None:
    own = {"--shutdown-delay-duration": "5s", "profiling": "true"}
    temporary = temporary_config(_controlplane(extraArgs=own)).model.cluster
    assert temporary.api_server is not None
    assert temporary.api_server.extra_args == {**own, "permit-port-sharing": "false"}
