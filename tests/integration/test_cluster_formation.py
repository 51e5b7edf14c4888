"""A control plane node's kubeplaned in a network namespace: services, bootstrap, restarts, refusals.

The node is a machine (``machines``): the agent runs in the network namespace with its own mount
and UTS namespaces over the node's directory (``node_root``), at the default ``--root /``; it
supervises a real containerd, kubelet and etcd. The etcd certificates are written by the test
exactly where the etcd secrets controller writes them (``system/secrets/etcd``), so this test
does not depend on that controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import machines
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kubeplane import api, pki
from kubeplane.agent import owned
from kubeplane.agent import services as agent_services
from kubeplane.api import trustd
from kubeplane.config import generate as gen

if TYPE_CHECKING:
    from conftest import NetNS, Processes, Started

pytestmark = pytest.mark.integration

API_PORT = 50000
METRICS_PORT = 50010


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o600)


def write_etcd_certs(directory: Path, *, ca: pki.CertKey, name: str, ip: str) -> None:
    """What the etcd secrets controller writes: CA, server/peer for the node's addresses, a client."""
    names = {"dns_names": [name, "localhost"], "ip_addresses": [ip, "127.0.0.1"]}
    server = pki.issue(ca=ca, common_name=name, usages=["server", "client"], **names)  # type: ignore[arg-type]
    peer = pki.issue(ca=ca, common_name=name, usages=["server", "client"], **names)  # type: ignore[arg-type]
    client = pki.issue(ca=ca, common_name="kube-apiserver-etcd-client", usages=["client"])
    _write(directory / "ca.crt", ca.cert)
    for stem, pair in (("server", server), ("peer", peer), ("client", client)):
        _write(directory / f"{stem}.crt", pair.cert)
        _write(directory / f"{stem}.key", pair.key)


class Agent:
    """One kubeplaned and a secure client to it."""

    def __init__(
        self, *, name: str, root: Path, address: str, credentials: api.Credentials, started: Started
    ) -> None:
        self.name = name
        self.root = root
        self.address = address
        self.credentials = credentials
        self.os_ca = credentials.ca
        self.started = started

    def call(self, method: Callable[[api.NodeClient], Any]) -> Any:
        async def scenario() -> Any:
            async with api.NodeClient([self.address], credentials=self.credentials) as client:
                return await method(client)

        return asyncio.run(scenario())

    def services(self) -> dict[str, dict[str, Any]]:
        replies = self.call(lambda c: c.service_list())
        return {item["id"]: item for item in replies[0].unwrap()}


def _healthy(service: dict[str, Any] | None) -> bool:
    return bool(service and service["state"] == "Running" and service["health"]["healthy"])


@pytest.fixture
def agent(
    node_root: Path, processes: Processes, netns: NetNS, wait_until: Callable[..., Any]
) -> Iterator[Agent]:
    for binary in ("containerd", "ctr", "etcd", "etcdctl", "nsenter"):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is missing; run scripts/setup", pytrace=False)
    secrets = gen.new_secrets()
    name = f"cp-{netns.name}"
    options = gen.GenOptions(cluster_name="formation", endpoint=f"https://{netns.node_ip}:6443")
    document = gen.generate(options, secrets).documents["controlplane"]
    document["machine"]["network"] = {"hostname": name}
    root = node_root
    write_etcd_certs(root / "system/secrets/etcd", ca=secrets.etcd_ca, name=name, ip=netns.node_ip)
    kubeplaned = Path(sys.executable).parent / "kubeplaned"
    address = f"{netns.node_ip}:{API_PORT}"
    started = processes.start(
        machines.argv(
            node_dir=root, hostname=name, command=[kubeplaned, "--listen", address, "--log-level", "debug"]
        ),
        name="kubeplaned",
        netns=netns.name,
    )
    admin = pki.issue(
        ca=secrets.os_ca, common_name="admin", organizations=[pki.ROLE_ADMIN], usages=["client"]
    )
    node = Agent(
        name=name,
        root=root,
        address=address,
        credentials=api.Credentials(ca=secrets.os_ca.cert, cert=admin.cert, key=admin.key),
        started=started,
    )
    try:

        async def apply() -> Any:
            async with api.NodeClient.insecure([address]) as client:
                return (await client.apply_configuration(yaml.safe_dump(document)))[0].unwrap()

        def applied() -> Any:
            return asyncio.run(apply())

        wait_until(
            applied,
            timeout=30,
            what="apply-config --insecure",
            logs=processes.logs,
        )
        yield node
    finally:
        # kubeplaned stops its services on SIGTERM (kubelet, containers, containerd, etcd).
        pgid = started.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(Exception):
            started.process.wait(timeout=90)
        processes.forget(started)
        cgroups = agent_services.NodeServices.node_cgroups(root)
        leftovers = [path for path in owned.cgroup_paths(cgroups) if path.exists()]
        assert not leftovers, f"kubeplaned left cgroups behind: {leftovers}"


def test_control_plane_node_services_bootstrap_and_restarts(
    agent: Agent, wait_until: Callable[..., Any]
) -> None:
    logs = agent.started.tail
    # containerd and kubelet come up without etcd; etcd waits for bootstrap or a cluster to join.
    wait_until(
        lambda: _healthy(agent.services().get("containerd")), timeout=60, what="containerd healthy", logs=logs
    )
    wait_until(
        lambda: _healthy(agent.services().get("kubelet")), timeout=240, what="kubelet healthy", logs=logs
    )
    etcd = agent.services()["etcd"]
    assert not _healthy(etcd)
    assert any("control plane endpoint not up yet" in e["message"] for e in etcd["events"]), etcd["events"]

    started = time.monotonic()
    reply = agent.call(lambda c: c.bootstrap())[0].unwrap()
    assert "bootstrap started" in reply["message"]
    wait_until(lambda: _healthy(agent.services().get("etcd")), timeout=60, what="etcd healthy", logs=logs)
    print(f"bootstrap -> etcd healthy: {time.monotonic() - started:.1f}s")
    members = agent.call(lambda c: c.etcd_members())[0].unwrap()
    assert [(m["name"], m["leader"]) for m in members] == [(agent.name, True)]
    assert (agent.root / "system/etcd-bootstrap").read_text().strip() == "done"

    # A second bootstrap is refused with the reason, and changes nothing.
    data_before = sorted(p.name for p in (agent.root / "var/lib/etcd/member").iterdir())
    with pytest.raises(api.CallError, match="already bootstrapped") as refused:
        agent.call(lambda c: c.bootstrap())[0].unwrap()
    assert refused.value.code == "FAILED_PRECONDITION"
    assert agent.call(lambda c: c.etcd_members())[0].unwrap() == members
    assert sorted(p.name for p in (agent.root / "var/lib/etcd/member").iterdir()) == data_before

    # kill -9 etcd and kubelet: the supervisor restarts them and the events say so.
    for service_id in ("etcd", "kubelet"):
        before = agent.services()[service_id]
        os.kill(before["pid"], signal.SIGKILL)

        def restarted(sid: str = service_id, old: int = before["pid"]) -> bool:
            now = agent.services()[sid]
            return _healthy(now) and now["pid"] != old

        wait_until(restarted, timeout=180, what=f"{service_id} restarted and healthy", logs=logs)
        events = [e["message"] for e in agent.services()[service_id]["events"]]
        assert any("signal SIGKILL" in m for m in events), events
        assert any(m.startswith("Restarting in") for m in events), events

    # The metrics say the same: each service's state, the restarts, etcd a voter checked healthy.
    host = agent.address.rpartition(":")[0]
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(
            httpx.get(f"http://{host}:{METRICS_PORT}/metrics", timeout=5, trust_env=False).text
        )
        for sample in family.samples
    }
    for service_id in ("containerd", "kubelet", "etcd"):
        assert samples[("kubeplane_service_state", (("service", service_id), ("state", "Running")))] == 1
        assert samples[("kubeplane_service_state", (("service", service_id), ("state", "Failed")))] == 0
    for service_id in ("etcd", "kubelet"):
        assert samples[("kubeplane_service_restarts_total", (("service", service_id),))] >= 1
    assert samples[("kubeplane_etcd_member", (("role", "voter"),))] == 1
    assert samples[("kubeplane_etcd_health_checks_total", (("result", "ok"),))] >= 1

    # The Services resources mirror the supervisor.
    resources = agent.call(lambda c: c.resource_list("Services"))[0].unwrap()
    assert {r["metadata"]["id"]: r["spec"]["healthy"] for r in resources} == {
        "containerd": True,
        "kubelet": True,
        "etcd": True,
    }

    # trustd on the control plane node refuses a wrong machine token and signs nothing.
    csr = pki.new_csr(key=pki.generate_key(), common_name="intruder")
    with pytest.raises(trustd.TrustdError, match="refused the machine token"):
        asyncio.run(
            trustd.request_certificate(
                targets=[f"{host}:{trustd.PORT}"], token="wrong", csr=csr, ca=agent.os_ca
            )
        )
