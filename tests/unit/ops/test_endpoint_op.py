"""``endpoint set``: the URL checks, the plan and the executor's decisions against a fake cluster.

:class:`EndpointCluster` answers like the real nodes where the executor's decisions depend on
it: an applied machine config whose endpoint or ``cluster.apiServer.certSANs`` changed makes a
control plane node issue new certificates (its kube-apiserver then serves the names of the config
at that moment), written to disk a couple of polls later under the next secrets version, which
its pods report a couple of polls after that; an endpoint change restarts the kubelet with its
kubeconfig's server rewritten. The new endpoint is a load balancer in front of the control plane
nodes: it answers with this cluster's CA, and as this cluster's API for its name only once every
API server's certificate carries that name.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from ops_fakes import NODES, Broken, FakeClock

from kubeplane import config
from kubeplane import plan as plan_module
from kubeplane.ops import endpoint, upgrade
from kubeplane.ops.errors import OpsError, PreflightError
from kubeplane.ops.versions import image_patch

pytestmark = pytest.mark.unit

OLD = "https://10.5.0.1:6443"
NEW = "https://api.example.test:443"
CP = [node for node in NODES if node.control_plane]
WORKERS = [node for node in NODES if not node.control_plane]
RESUME = f"kubeplane endpoint set {NEW}"
LAG = 2


@dataclasses.dataclass
class Certs:
    """A control plane node's issued certificates and the files on its disk."""

    names: tuple[str, ...]
    server: str
    #: The names of the certificates issued but not on disk yet.
    next_names: tuple[str, ...] = ()
    issued: int = 1
    disk_issued: int = 1
    disk_version: int = 1
    pending: int = 0


class EndpointCluster:
    """Node API + Kubernetes API + TLS probe + load balancer of a 3 control plane + 1 worker cluster."""

    def __init__(self, documents: Mapping[str, Any]) -> None:
        self.events: list[tuple[str, ...]] = []
        self.configs = {
            node.address: yaml.safe_dump(documents["controlplane" if node.control_plane else "worker"])
            for node in NODES
        }
        self.certs = {node.address: Certs(names=self._names(node.address), server=OLD) for node in CP}
        self.pods = {(node.name, c): [1, 0] for node in CP for c in upgrade.COMPONENTS}
        self.kubelets = {node.address: OLD for node in NODES}
        self.configmaps: dict[tuple[str, str], str] = {
            ("kube-system", "kubeconfig-in-cluster"): OLD,
            ("kube-public", "cluster-info"): OLD,
        }
        self.proxy_annotation: str | None = None
        self.proxy_pending = 0
        self.drained: set[str] = set()
        self.foreign_endpoint = False
        self.break_apply_on: str | None = None

    def _names(self, address: str) -> tuple[str, ...]:
        cluster = config.load(self.configs[address]).model.cluster
        sans = (cluster.api_server.cert_sans if cluster.api_server else None) or []
        return (urllib.parse.urlsplit(cluster.control_plane.endpoint).hostname or "", *sans, address)

    def applies(self) -> list[tuple[str, ...]]:
        return [event for event in self.events if event[0] == "apply"]

    # -- NodeAPI --

    async def check(self, node: str) -> None:
        return None

    async def machine_config(self, node: str) -> str:
        return self.configs[node]

    async def apply_config(self, node: str, data: str, *, mode: str) -> None:
        assert mode == "immediate"
        if self.break_apply_on == node:
            raise Broken(f"killed while applying to {node}")
        old, new = config.load(self.configs[node]).model, config.load(data).model
        what = (
            "endpoint" if old.cluster.control_plane.endpoint != new.cluster.control_plane.endpoint else "sans"
        )
        self.events.append(("apply", node, what))
        self.configs[node] = data
        if node in self.certs:
            certs = self.certs[node]
            certs.issued += 1
            certs.server = new.cluster.control_plane.endpoint
            certs.next_names = self._names(node)
            certs.pending = LAG
        if what == "endpoint":
            self.kubelets[node] = new.cluster.control_plane.endpoint

    def _tick(self, node: str) -> Certs:
        """One poll of a control plane node: new certificates reach its disk (and its API server)
        :data:`LAG` polls after the apply."""
        certs = self.certs[node]
        if certs.pending:
            certs.pending -= 1
            if not certs.pending:
                certs.disk_issued, certs.disk_version = certs.issued, certs.disk_version + 1
                certs.names = certs.next_names
                name = next(n.name for n in CP if n.address == node)
                for component in upgrade.COMPONENTS:
                    self.pods[(name, component)][1] = LAG
        return certs

    async def secrets_state(self, node: str) -> endpoint.SecretsState:
        certs = self._tick(node)
        return endpoint.SecretsState(
            server=certs.server,
            issued=str(certs.issued),
            disk_issued=str(certs.disk_issued),
            disk_version=certs.disk_version,
        )

    async def kubelet_server(self, node: str) -> str:
        return self.kubelets[node]

    async def service_healthy(self, node: str, service: str) -> bool:
        return True

    # -- KubeAPI --

    async def nodes(self) -> list[upgrade.ClusterNode]:
        return list(NODES)

    async def mirror_pod(self, *, node_name: str, component: str) -> upgrade.PodState | None:
        pod = self.pods[(node_name, component)]
        if pod[1]:
            pod[1] -= 1
            if not pod[1]:
                address = next(n.address for n in CP if n.name == node_name)
                pod[0] = self.certs[address].disk_version
                self.events.append(("pod", node_name, component))
        return upgrade.PodState(
            name=f"{component}-{node_name}", config_version="1", ready=not pod[1], secrets_version=str(pod[0])
        )

    async def kubelet(self, node_name: str) -> upgrade.KubeletState | None:
        return upgrade.KubeletState(version="v1.20.2", ready=True)

    async def configmap_server(self, namespace: str, name: str) -> str | None:
        return self.configmaps.get((namespace, name))

    async def set_configmap_server(self, namespace: str, name: str, server: str) -> None:
        self.events.append(("configmap", namespace, name))
        self.configmaps[(namespace, name)] = server

    async def daemonset(self, namespace: str, name: str) -> upgrade.RolloutState | None:
        if self.proxy_pending:
            self.proxy_pending -= 1
        done = 4 - (2 if self.proxy_pending else 0)
        return upgrade.RolloutState(image="kube-proxy:v1.20.2", desired=4, updated=done, available=done)

    async def daemonset_annotation(self, namespace: str, name: str, key: str) -> str | None:
        return self.proxy_annotation

    async def restart_daemonset(self, namespace: str, name: str, *, annotation: tuple[str, str]) -> None:
        self.events.append(("restart", namespace, name))
        self.proxy_annotation = annotation[1]
        self.proxy_pending = LAG

    # -- Probe --

    async def served(self, host: str, port: int) -> endpoint.Served:
        if host in self.certs:
            return endpoint.Served(names=self._tick(host).names, by_cluster_ca=True)
        # The load balancer: one of the API servers behind it (the first not drained).
        serving = next(n.address for n in CP if n.name not in self.drained)
        return endpoint.Served(names=self.certs[serving].names, by_cluster_ca=not self.foreign_endpoint)

    async def api_answers(self, url: str) -> None:
        host = endpoint.host_of(url)
        lacking = [a for a, certs in self.certs.items() if host not in certs.names]
        if self.foreign_endpoint or lacking:
            raise OSError(f"certificate verify failed: IP address mismatch (served by {lacking})")

    # -- Rotation --

    async def drain(self, node: upgrade.ClusterNode) -> None:
        self.events.append(("drain", node.name))
        self.drained.add(node.name)

    async def restore(self, node: upgrade.ClusterNode) -> None:
        self.events.append(("restore", node.name))
        self.drained.discard(node.name)

    async def serving(self) -> set[str]:
        return {n.address for n in CP if n.name not in self.drained}


@pytest.fixture
def cluster(generated: Mapping[str, Any]) -> EndpointCluster:
    return EndpointCluster(copy.deepcopy(generated))


def observe(cluster: EndpointCluster, new: str = NEW) -> endpoint.Observed:
    options = endpoint.Options(endpoint=new)
    return asyncio.run(endpoint.prepare(options=options, node_api=cluster, kube=cluster, probe=cluster))


def run(
    cluster: EndpointCluster, new: str = NEW, *, timing: upgrade.Timing | None = None
) -> list[plan_module.StepResult]:
    clock = FakeClock()

    async def scenario() -> list[plan_module.StepResult]:
        options = endpoint.Options(endpoint=new)
        observed = await endpoint.prepare(options=options, node_api=cluster, kube=cluster, probe=cluster)
        changer = endpoint.EndpointChanger(
            observed=observed,
            node_api=cluster,
            kube=cluster,
            probe=cluster,
            rotation=cluster,
            progress=plan_module.RecordingProgress(),
            timing=timing or upgrade.Timing(),
            sleep=clock.sleep,
            clock=clock,
        )
        return await changer.run(endpoint.build_plan(observed), resume=f"kubeplane endpoint set {new}")

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://10.5.0.9:6443", "https://10.5.0.9:6443"),
        ("https://api.example.test:443/", "https://api.example.test:443"),
        ("https://[fd00::1]:6443", "https://[fd00::1]:6443"),
    ],
)
def test_an_endpoint_is_https_host_port(text: str, expected: str) -> None:
    assert endpoint.parse_endpoint(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "http://10.5.0.9:6443",
        "https://10.5.0.9",
        "10.5.0.9:6443",
        "https://10.5.0.9:6443/api",
        "https://u:p@h:1",
    ],
)
def test_other_urls_are_refused(text: str) -> None:
    with pytest.raises(PreflightError, match="https://HOST:PORT"):
        endpoint.parse_endpoint(text)


def test_the_plan_adds_both_names_then_checks_then_switches_every_node(cluster: EndpointCluster) -> None:
    plan = endpoint.build_plan(observe(cluster))
    described = [step.describe() for step in plan.steps]
    assert described == [
        *(f"cert-sans kube-apiserver on node {n.address}: 10.5.0.1 -> 10.5.0.1,api.example.test" for n in CP),
        f"check endpoint cluster-wide: {NEW} answers as this cluster's API "
        "(cluster CA, name api.example.test)",
        *(f"endpoint control-plane on node {n.address}: {OLD} -> {NEW}" for n in CP),
        *(f"endpoint kubelet on node {n.address}: {OLD} -> {NEW}" for n in WORKERS),
        f"kubeconfig kube-proxy cluster-wide: {OLD} -> {NEW}",
        f"kubeconfig cluster-info cluster-wide: {OLD} -> {NEW}",
    ]
    assert plan.title == f"change the control plane endpoint {OLD} -> {NEW}, one node at a time"
    assert any("kept in the kube-apiserver certificates: 10.5.0.1, api.example.test" in n for n in plan.notes)


def test_a_change_keeps_every_client_with_a_certificate_for_its_name(cluster: EndpointCluster) -> None:
    results = run(cluster)
    # The check changes nothing; every other step does.
    assert [result.outcome for result in results] == ["changed"] * 3 + ["skipped"] + ["changed"] * 6
    # Every API server carries the new name before any node is switched to it, and keeps the old.
    applies = cluster.applies()
    assert applies == [
        *(("apply", n.address, "sans") for n in CP),
        *(("apply", n.address, "endpoint") for n in NODES),
    ]
    for node in CP:
        assert {"10.5.0.1", "api.example.test"} <= set(cluster.certs[node.address].names)
        assert cluster.certs[node.address].server == NEW
        sans = config.load(cluster.configs[node.address]).model.cluster.api_server
        assert sans is not None and sans.cert_sans == ["10.5.0.1", "api.example.test"]
    assert all(
        config.load(text).model.cluster.control_plane.endpoint == NEW for text in cluster.configs.values()
    )
    assert set(cluster.kubelets.values()) == {NEW}
    assert set(cluster.configmaps.values()) == {NEW}
    assert cluster.proxy_annotation == NEW
    # Each control plane node leaves the rotation for each of its two steps, one node at a time,
    # and is back once its pods run the new secrets.
    steered = [e for e in cluster.events if e[0] in ("drain", "restore")]
    assert steered == [(kind, n.name) for _ in range(2) for n in CP for kind in ("drain", "restore")]
    for node in CP:
        applied = cluster.events.index(("apply", node.address, "endpoint"))
        restored = [i for i, e in enumerate(cluster.events) if e == ("restore", node.name)][1]
        pods = [i for i, e in enumerate(cluster.events) if e[:2] == ("pod", node.name) and i > applied]
        assert len(pods) == 3 and max(pods) < restored
    assert cluster.drained == set()


def test_a_second_run_changes_nothing_and_the_old_url_moves_the_cluster_back(
    cluster: EndpointCluster,
) -> None:
    run(cluster)
    events = len(cluster.events)
    assert [result.outcome for result in run(cluster)] == ["skipped"] * 10
    # Nothing applied, drained or restarted (a skipped step only makes sure its node is in the rotation).
    assert [event for event in cluster.events[events:] if event[0] != "restore"] == []
    run(cluster, OLD)
    assert all(
        config.load(text).model.cluster.control_plane.endpoint == OLD for text in cluster.configs.values()
    )
    assert set(cluster.kubelets.values()) == {OLD} and set(cluster.configmaps.values()) == {OLD}
    # Both names stay: clients of either keep working.
    assert all({"10.5.0.1", "api.example.test"} <= set(c.names) for c in cluster.certs.values())


def test_a_run_killed_midway_is_finished_by_the_same_command_without_repeating(
    cluster: EndpointCluster,
) -> None:
    cluster.break_apply_on = CP[1].address
    with pytest.raises(plan_module.StepFailed) as caught:
        run(cluster)
    assert f"re-run `{RESUME}` to continue (steps already at the new endpoint are skipped)" in str(
        caught.value
    )
    assert cluster.drained == set()
    cluster.break_apply_on = None
    results = run(cluster)
    assert [r.outcome for r in results[:3]] == ["skipped", "changed", "changed"]
    assert Counter(cluster.applies()) == Counter(
        [*(("apply", n.address, "sans") for n in CP), *(("apply", n.address, "endpoint") for n in NODES)]
    )


def test_a_node_killed_between_apply_and_its_pods_is_waited_for_on_rerun(cluster: EndpointCluster) -> None:
    cluster.break_apply_on = CP[0].address
    # The apply landed but the run died before waiting: simulate by applying the first SAN change.
    document = config.load(cluster.configs[CP[0].address])
    patch = image_patch(document.to_dict(), endpoint.SANS_PATH, ["10.5.0.1", "api.example.test"])
    cluster.break_apply_on = None
    asyncio.run(
        cluster.apply_config(
            CP[0].address, config.apply_json_patch(document, patch).to_yaml(), mode="immediate"
        )
    )
    results = run(cluster)
    # The config already had the names, but the API server did not serve them yet: not "done".
    assert results[0].outcome == "changed"
    assert [e for e in cluster.applies() if e[1] == CP[0].address] == [
        ("apply", CP[0].address, "sans"),
        ("apply", CP[0].address, "endpoint"),
    ]


def test_an_endpoint_of_another_ca_is_refused_before_any_change(cluster: EndpointCluster) -> None:
    cluster.foreign_endpoint = True
    with pytest.raises(
        PreflightError, match=r"nothing was changed: .* a certificate this cluster's CA did not issue"
    ):
        run(cluster)
    assert cluster.events == []


def test_nodes_that_disagree_on_the_endpoint_are_refused(cluster: EndpointCluster) -> None:
    document = config.load(cluster.configs[WORKERS[0].address])
    patch = image_patch(document.to_dict(), endpoint.ENDPOINT_PATH, "https://10.5.0.77:6443")
    cluster.configs[WORKERS[0].address] = config.apply_json_patch(document, patch).to_yaml()
    with pytest.raises(PreflightError, match="name 2 endpoints besides"):
        run(cluster)
    assert cluster.events == []


def test_the_check_stops_the_change_before_anything_is_switched(cluster: EndpointCluster) -> None:
    async def refuses(url: str) -> None:
        raise OSError("connection reset by peer")

    cluster.api_answers = refuses  # type: ignore[method-assign]
    with pytest.raises(plan_module.StepFailed, match="nothing was switched to it") as caught:
        run(cluster, timing=upgrade.Timing(config_timeout=5))
    assert isinstance(caught.value.__cause__, OpsError)
    assert [e[2] for e in cluster.applies()] == ["sans"] * 3


def test_without_cluster_info_the_plan_says_so(cluster: EndpointCluster) -> None:
    del cluster.configmaps[("kube-public", "cluster-info")]
    plan = endpoint.build_plan(observe(cluster))
    assert not [step for step in plan.steps if step.component == "cluster-info"]
    assert "ConfigMap kube-public/cluster-info not found: nothing to update there" in plan.notes
