"""machine.files on a machine node: written before containerd starts, the containerd guide's
``/var/cri/conf.d`` metrics fragment served by a real containerd, and an append to the CA bundle
made once across two boots (Debian's bundle and the guide's path) without touching the host's.

The node is a machine (:mod:`machines`) running the agent's own containerd service (its spec from
``NodeServices``, run by the supervisor), not a whole agent: the kubelet and the API are not
needed to show what containerd reads at its start.
"""

from __future__ import annotations

import copy
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import machines
import pytest
import yaml

from kubeplane.agent import owned
from kubeplane.agent.services import NodeServices
from kubeplane.config import generate as gen
from kubeplane.provision import machine

if TYPE_CHECKING:
    from conftest import NetNS, Processes

pytestmark = pytest.mark.integration

METRICS_PORT = 11234
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
#: The certificate authorities guide's path (Go programs such as containerd read every file there).
GUIDE_BUNDLE = "/etc/ssl/certs/ca-certificates"
EXTRA_CA = "-----BEGIN CERTIFICATE-----\nTEST-ONLY-NOT-A-CA\n-----END CERTIFICATE-----\n"

#: Runs inside the machine: the agent's containerd service at root /, until killed.
CONTAINERD_SERVICE = """
import asyncio, sys
from pathlib import Path
from kubeplane import config, resources
from kubeplane.agent.services import CONTAINERD, NodeServices
from kubeplane.config.paths import NodePaths

async def main() -> None:
    services = NodeServices(
        paths=NodePaths(Path("/")),
        document=config.load(Path(sys.argv[1]).read_text()),
        name="files",
        node_ip=sys.argv[2],
        state=resources.State(resources.default_registry()),
    )
    services.supervisor.register(services.specs()[0])
    await services.supervisor.start(CONTAINERD)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def worker_config() -> str:
    documents = gen.generate(
        gen.GenOptions(cluster_name="files", endpoint="https://10.5.0.1:6443"), gen.new_secrets()
    ).documents
    document = copy.deepcopy(documents["worker"])
    document["machine"]["files"] = [
        {
            "content": f'[metrics]\n  address = "0.0.0.0:{METRICS_PORT}"\n',
            "path": "/var/cri/conf.d/metrics.toml",
            "op": "create",
        },
        {"content": EXTRA_CA, "permissions": 0o644, "path": BUNDLE, "op": "append"},
        {"content": EXTRA_CA, "permissions": 0o644, "path": GUIDE_BUNDLE, "op": "append"},
    ]
    return yaml.safe_dump(document)


def test_machine_files_are_written_before_containerd_which_serves_the_conf_d_metrics(
    node_root: Path, netns: NetNS, processes: Processes, wait_until: Callable[..., Any], tmp_path: Path
) -> None:
    config_path = tmp_path / "worker.yaml"
    config_path.write_text(worker_config())
    host_bundle = Path(BUNDLE).read_bytes()
    shims = f"{NodeServices.cgroup_name_of(machine.machine_id(node_root))}-shims"
    url = f"http://{netns.node_ip}:{METRICS_PORT}/v1/metrics"

    def boot() -> Any:
        return processes.start(
            machines.argv(
                node_dir=node_root,
                hostname="files",
                command=[sys.executable, "-c", CONTAINERD_SERVICE, config_path, netns.node_ip],
            ),
            name="containerd-service",
            netns=netns.name,
        )

    def metrics() -> str | None:
        try:
            response = httpx.get(url, timeout=2.0)
        except httpx.TransportError:
            return None
        return response.text if response.status_code == httpx.codes.OK else None

    try:
        for _ in range(2):  # a first boot, then a restart: the append is made once
            started = boot()
            text = wait_until(metrics, timeout=60, what=f"containerd metrics at {url}", logs=processes.logs)
            assert "# TYPE containerd_build_info_total counter" in text
            processes.forget(started)
            machines.kill_in_netns(netns.name)
            assert metrics() is None
    finally:
        machines.kill_in_netns(netns.name)
        for path in owned.cgroup_paths([shims]):
            owned.remove_cgroup(path)
    node_bundle = (node_root / BUNDLE.lstrip("/")).read_bytes()
    assert node_bundle.startswith(host_bundle), "the node's bundle starts as a copy of the host's"
    assert node_bundle.count(EXTRA_CA.encode()) == 1
    assert node_bundle.endswith(EXTRA_CA.encode())
    assert hashlib.sha256(Path(BUNDLE).read_bytes()).digest() == hashlib.sha256(host_bundle).digest()
    assert (node_root / "var/cri/conf.d/metrics.toml").stat().st_mode & 0o777 == 0o644
    assert (node_root / GUIDE_BUNDLE.lstrip("/")).read_bytes() == EXTRA_CA.encode()
    assert not Path(GUIDE_BUNDLE).exists() or Path(GUIDE_BUNDLE).read_bytes() != EXTRA_CA.encode()
