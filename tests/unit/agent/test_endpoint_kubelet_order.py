"""An ``--immediate`` endpoint change restarts the kubelet, and waits for it, before the controllers
see the new config.

The new config makes the controllers re-issue certificates and rewrite the static pods. A kubelet
restarted while it replaces a static pod kills the old container at once (SIGTERM, then SIGKILL
milliseconds later) instead of granting its grace period: a kube-apiserver killed that way drops
its clients' connections without the HTTP/2 GOAWAY of its graceful shutdown (seen in the
endpoint change of a three control plane cluster). So the order is: kubelet restarted with the
new endpoint and healthy, then the config saved and published.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeplane import config
from kubeplane.agent.node import KUBELET_RESTART_WAIT, Node
from kubeplane.config import generate as gen

pytestmark = pytest.mark.unit

OLD = "https://10.5.0.1:6443"
NEW = "https://10.5.0.254:7443"


class FakeServices:
    def __init__(self, log: list[str], document: config.MachineConfig) -> None:
        self.log = log
        self.document = document

    async def reconfigure_kubelet(self, document: config.MachineConfig, *, wait: float = 0.0) -> None:
        self.log.append(
            f"kubelet restarted for {document.model.cluster.control_plane.endpoint}, waited {wait:g}s"
        )


def controlplane_text(endpoint: str, secrets: gen.SecretsBundle) -> str:
    documents = gen.generate(gen.GenOptions(cluster_name="unit", endpoint=endpoint), secrets).documents
    return gen.dump_yaml(documents["controlplane"])


def booted_node(tmp_path: Path, log: list[str]) -> tuple[Node, gen.SecretsBundle]:
    secrets = gen.new_secrets()
    old = config.load(controlplane_text(OLD, secrets))
    node = Node(root=tmp_path / "node", listen="127.0.0.1:50000", services=False)
    node.maintenance = False
    node.store.save(old)
    node.services = FakeServices(log, old)  # type: ignore[assignment]

    def publish(document: config.MachineConfig) -> None:
        log.append(f"published {document.model.cluster.control_plane.endpoint}")

    node._publish_current = publish  # type: ignore[method-assign]
    return node, secrets


def test_the_kubelet_restarts_before_the_new_endpoint_is_published(tmp_path: Path) -> None:
    log: list[str] = []
    node, secrets = booted_node(tmp_path, log)
    said: Any = asyncio.run(
        node.apply_configuration(data=controlplane_text(NEW, secrets), mode="immediate", dry_run=False)
    )
    assert log == [f"kubelet restarted for {NEW}, waited {KUBELET_RESTART_WAIT:g}s", f"published {NEW}"]
    assert "the kubelet restarted to reach the new endpoint" in said["message"]
    saved = node.store.current()
    assert saved is not None and saved.model.cluster.control_plane.endpoint == NEW


def test_a_change_that_keeps_the_endpoint_leaves_the_kubelet_alone(tmp_path: Path) -> None:
    log: list[str] = []
    node, secrets = booted_node(tmp_path, log)
    document = yaml.safe_load(controlplane_text(OLD, secrets))
    patched = gen.apply_patches(document, [{"cluster": {"apiServer": {"certSANs": ["extra.example"]}}}])
    asyncio.run(node.apply_configuration(data=gen.dump_yaml(patched), mode="immediate", dry_run=False))
    assert log == [f"published {OLD}"]
