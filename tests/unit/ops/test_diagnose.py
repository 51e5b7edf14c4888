"""``diagnose``: each branch of the troubleshooting guide on hand-built evidence, and no diagnosis
on the evidence of a healthy 3+1 cluster."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from kubeplane.ops import diagnose, health
from kubeplane.ops.diagnose import (
    Container,
    ControllerError,
    Csr,
    Evidence,
    KubeNode,
    NodeEvidence,
    Pod,
    Service,
)

pytestmark = pytest.mark.unit

CPS = ("10.5.0.2", "10.5.0.3", "10.5.0.4")
WORKER = "10.5.0.5"
NAMES = {"10.5.0.2": "cp-1", "10.5.0.3": "cp-2", "10.5.0.4": "cp-3", WORKER: "worker-1"}
COMPONENTS = health.CONTROL_PLANE_COMPONENTS
ALL_MANIFESTS = ("00-kubelet-bootstrapping-token", *diagnose.CSR_MANIFESTS, "01-csr-renewal-role-binding")


def up(service_id: str) -> Service:
    return Service(
        id=service_id,
        state="Running",
        running=True,
        healthy=True,
        events=("[Running]: Health check successful",),
    )


def healthy_node(address: str) -> NodeEvidence:
    control_plane = address in CPS
    name = NAMES[address]
    services = {"containerd": up("containerd"), "kubelet": up("kubelet")}
    if not control_plane:
        return NodeEvidence(address=address, control_plane=False, hostname=name, services=services)
    return NodeEvidence(
        address=address,
        control_plane=True,
        hostname=name,
        services={**services, "etcd": up("etcd")},
        bootstrap_node=address == CPS[0],
        static_pods=COMPONENTS,
        manifest_files=tuple(f"kubeplane-{c}.yaml" for c in COMPONENTS),
        manifests_applied=ALL_MANIFESTS,
        containers=tuple(Container("kube-system", f"{c}-{name}", c, "RUNNING") for c in COMPONENTS),
    )


def healthy_kube() -> diagnose.KubeEvidence:
    pods = [
        Pod(name=f"{c}-{NAMES[cp]}", node_name=NAMES[cp], host_ip=cp, app=c, phase="Running", ready=True)
        for cp in CPS
        for c in COMPONENTS
    ]
    pods += [
        Pod(
            name=f"kube-flannel-{i}",
            node_name=NAMES[a],
            host_ip=a,
            app="flannel",
            phase="Running",
            ready=True,
        )
        for i, a in enumerate(NAMES)
    ]
    return diagnose.KubeEvidence(
        server="https://10.5.0.1:6443",
        readyz=200,
        nodes=tuple(KubeNode(name=NAMES[a], address=a, ready="True") for a in NAMES),
        pods=tuple(pods),
        csrs=tuple(
            Csr(f"csr-{i}", NAMES[a], "system:bootstrap:abc", "Approved,Issued") for i, a in enumerate(NAMES)
        ),
    )


def healthy() -> Evidence:
    return Evidence(
        controlplanes=CPS,
        workers=(WORKER,),
        nodes={a: healthy_node(a) for a in NAMES},
        kube=healthy_kube(),
        checks=tuple(health.Result(name, (), 0.1) for name in health.CHECK_NAMES),
    )


def with_node(evidence: Evidence, address: str, **changes: object) -> Evidence:
    nodes = dict(evidence.nodes)
    nodes[address] = dataclasses.replace(nodes[address], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(evidence, nodes=nodes)


def with_kube(evidence: Evidence, **changes: object) -> Evidence:
    return dataclasses.replace(evidence, kube=dataclasses.replace(evidence.kube, **changes))  # type: ignore[arg-type]


def failing(evidence: Evidence, name: str, *problems: str) -> Evidence:
    checks = tuple(
        health.Result(r.name, problems, r.elapsed) if r.name == name else r for r in evidence.checks
    )
    return dataclasses.replace(evidence, checks=checks)


def only(evidence: Evidence) -> diagnose.Diagnosis:
    found = diagnose.diagnose(evidence)
    assert len(found) == 1, "\n".join(d.text() for d in found)
    return found[0]


def services(node: NodeEvidence, **replaced: Service) -> Mapping[str, Service]:
    return {**node.services, **replaced}


def test_healthy_evidence_has_no_diagnosis() -> None:
    assert diagnose.diagnose(healthy()) == []


def test_a_worker_whose_node_api_does_not_answer_waits_for_trustd() -> None:
    evidence = with_node(healthy(), WORKER, unreachable="node 10.5.0.5: connection refused", services={})
    found = only(evidence)
    assert (found.id, found.node) == ("worker-node-api-unreachable", WORKER)
    assert "trustd" in found.cause
    assert "node API: node 10.5.0.5: connection refused" in found.evidence
    assert "Kubernetes node worker-1 is registered (Ready True)" in found.evidence


def test_a_node_whose_boot_waits_is_explained_with_the_modes_that_fix_it() -> None:
    waiting = "the node API certificate from trustd (control plane endpoint https://10.9.9.9:6443): refused"
    found = only(with_node(healthy(), WORKER, boot_wait=waiting))
    assert (found.id, found.node) == ("boot-unfinished", WORKER)
    assert found.evidence == (f"the boot waits for {waiting}",)
    assert "--immediate" in found.cause and "--on-reboot" in found.cause
    assert f"kubeplane -n {WORKER} apply-config --immediate -f FIXED-CONFIG.yaml" in found.commands


def test_a_control_plane_node_whose_node_api_does_not_answer() -> None:
    found = only(with_node(healthy(), CPS[1], unreachable="connection refused", services={}))
    assert (found.id, found.node) == ("node-api-unreachable", CPS[1])
    assert found.commands == (f"kubeplane -e {CPS[1]} version",)


def test_kubelet_not_running_names_its_last_event_and_log() -> None:
    kubelet = Service(
        id="kubelet",
        state="Failed",
        running=False,
        events=("[Running]: Started task kubelet", "[Failed]: Service exited with code 1"),
    )
    node = healthy().nodes[WORKER]
    evidence = with_node(
        healthy(),
        WORKER,
        services=services(node, kubelet=kubelet),
        logs={"kubelet": ("E1 bad flag --foo",)},
    )
    found = only(evidence)
    assert (found.id, found.node) == ("kubelet-not-running", WORKER)
    assert "[Failed]: Service exited with code 1" in found.cause
    assert "service kubelet: state Failed" in found.evidence
    assert "log kubelet: E1 bad flag --foo" in found.evidence
    assert f"kubeplane -n {WORKER} logs kubelet" in found.commands


def test_etcd_crashing_on_the_bootstrap_node_points_at_extra_args_and_old_data() -> None:
    etcd = Service(
        id="etcd",
        state="Waiting",
        running=False,
        events=("[Failed]: Service exited with code 1", "[Waiting]: Restarting in 2.00s (restart 3)"),
    )
    node = healthy().nodes[CPS[0]]
    evidence = with_node(
        healthy(), CPS[0], services=services(node, etcd=etcd), logs={"etcd": ("unknown flag: --bogus",)}
    )
    found = only(failing(evidence, health.ETCD_HEALTHY, f"node {CPS[0]}: unavailable"))
    assert (found.id, found.node) == ("etcd-not-running", CPS[0])
    assert "bootstrap node" in found.cause
    assert "extraArgs" in found.cause and "old cluster" in found.cause
    assert "log etcd: unknown flag: --bogus" in found.evidence


def test_etcd_starting_from_a_removed_members_data_is_stale_data() -> None:
    etcd = Service(
        id="etcd",
        state="Waiting",
        running=False,
        events=("[Failed]: Service exited with code 1", "[Waiting]: Restarting in 4.00s (restart 5)"),
    )
    removed = '{"msg":"server error","error":"the member has been permanently removed from the cluster"}'
    must = '{"level":"warn","msg":"data-dir used by this member must be removed"}'
    node = healthy().nodes[CPS[2]]
    evidence = with_node(
        healthy(), CPS[2], services=services(node, etcd=etcd), logs={"etcd": ("starting", removed, must)}
    )
    found = only(failing(evidence, health.ETCD_HEALTHY, f"node {CPS[2]}: unavailable"))
    assert (found.id, found.node) == ("etcd-stale-data", CPS[2])
    assert "stale data" in found.cause and "joins again as a new member" in found.cause
    assert f"log etcd: {removed}" in found.evidence and f"log etcd: {must}" in found.evidence
    assert found.commands == (
        f"kubeplane -n {CPS[2]} reset --graceful=false --wipe etcd --reboot",
        f"kubeplane -n {CPS[0]} etcd members",
    )


def test_etcd_on_another_control_plane_node_waits_for_the_kubernetes_api() -> None:
    etcd = Service(
        id="etcd",
        state="Waiting",
        running=False,
        events=(
            "[Failed]: Failed to run pre state: control plane endpoint not up yet: connection refused",
            "[Waiting]: Retrying pre state in 4.00s",
        ),
    )
    evidence = with_node(healthy(), CPS[2], services=services(healthy().nodes[CPS[2]], etcd=etcd))
    found = only(evidence)
    assert (found.id, found.node) == ("etcd-waiting-to-join", CPS[2])
    assert "Endpoints default/kubernetes" in found.cause
    assert "kubectl get endpoints kubernetes" in found.commands


def test_etcd_stopped_after_joining_is_stopped_not_waiting_to_join() -> None:
    etcd = Service(
        id="etcd",
        state="Finished",
        running=False,
        events=(
            "[Preparing]: joining etcd through https://10.5.0.2:2379",
            "[Running]: Health check successful",
            "[Finished]: Service stopped",
        ),
    )
    evidence = with_node(healthy(), CPS[2], services=services(healthy().nodes[CPS[2]], etcd=etcd))
    found = only(evidence)
    assert (found.id, found.node) == ("etcd-not-running", CPS[2])
    assert "was stopped" in found.cause


def test_no_bootstrapped_node_means_etcd_runs_nowhere() -> None:
    waiting = Service(
        id="etcd",
        state="Waiting",
        running=False,
        events=("[Failed]: Failed to run pre state: control plane endpoint not up yet: refused",),
    )
    evidence = healthy()
    for address in CPS:
        node = evidence.nodes[address]
        evidence = with_node(evidence, address, bootstrap_node=False, services=services(node, etcd=waiting))
    evidence = with_kube(evidence, error="GET /readyz: connection refused", readyz=None)
    found = [d for d in diagnose.diagnose(evidence) if d.id.startswith("etcd")]
    assert [d.id for d in found] == ["etcd-not-bootstrapped"]
    assert found[0].commands == (f"kubeplane -n {CPS[0]} bootstrap",)


def test_static_pod_definitions_not_generated_cite_the_controller_log() -> None:
    evidence = with_node(
        healthy(),
        CPS[0],
        static_pods=(),
        manifest_files=(),
        controller_errors=(ControllerError("k8s.ControlPlaneStaticPodController", "missing secrets", 3.0),),
    )
    found = only(failing(evidence, health.STATIC_PODS_READY, f"node {CPS[0]}: no kube-apiserver pod"))
    assert (found.id, found.node) == ("static-pods-not-rendered", CPS[0])
    assert "controller-runtime log" in found.cause
    assert "StaticPods resources: none" in found.evidence
    assert "controller k8s.ControlPlaneStaticPodController: missing secrets" in found.evidence
    assert f"kubeplane -n {CPS[0]} logs controller-runtime" in found.commands


def test_an_error_on_the_server_with_kube_apiserver_exited() -> None:
    stopped = Container("kube-system", "kube-apiserver-cp-1", "kube-apiserver", "STOPPED")
    others = tuple(c for c in healthy().nodes[CPS[0]].containers if c.name != "kube-apiserver")
    ref = stopped.ref
    evidence = with_node(
        healthy(), CPS[0], containers=(*others, stopped), logs={ref: ("Error: unknown flag: --bogus",)}
    )
    evidence = with_kube(evidence, readyz=500, readyz_body="[-]etcd failed")
    evidence = failing(evidence, health.API_ENDPOINT, "https://10.5.0.1:6443/readyz answered HTTP 500")
    # The cluster DNS check fails too (it asks the API): explained by the same diagnosis.
    evidence = failing(evidence, health.CLUSTER_DNS, "KubeUnavailable: GET .../services/kube-dns")
    found = only(evidence)
    assert (found.id, found.node) == ("apiserver-not-running", CPS[0])
    assert health.CLUSTER_DNS in found.checks
    assert f"container {ref}: STOPPED" in found.evidence
    assert f"log {ref}: Error: unknown flag: --bogus" in found.evidence
    assert f"kubeplane -n {CPS[0]} logs -k {ref}" in found.commands


def test_an_error_on_the_server_with_every_kube_apiserver_running_blames_the_endpoint() -> None:
    evidence = with_kube(healthy(), error="GET /readyz: an error on the server", readyz=None)
    found = only(failing(evidence, health.API_ENDPOINT, "KubeUnavailable: an error on the server"))
    assert found.id == "endpoint-not-answering"
    assert (
        "Kubernetes API through https://10.5.0.1:6443: GET /readyz: an error on the server" in found.evidence
    )


def unregistered(**kube: object) -> Evidence:
    nodes = tuple(n for n in healthy().kube.nodes if n.address != WORKER)
    csrs = tuple(c for c in healthy().kube.csrs if c.node_name != "worker-1")
    evidence = with_kube(healthy(), nodes=nodes, csrs=csrs)
    evidence = with_kube(evidence, **kube)
    return failing(evidence, health.NODES_READY, f"node {WORKER}: not registered in Kubernetes")


def test_node_not_found_without_a_csr_blames_the_endpoint() -> None:
    evidence = with_node(unregistered(), WORKER, logs={"kubelet": ("Unauthorized",)})
    found = only(evidence)
    assert (found.id, found.node) == ("node-not-registered", WORKER)
    assert 'nodes "worker-1" not found' in found.cause
    assert "has not asked for a client certificate" in found.cause
    assert "no CSR for system:node:worker-1" in found.evidence
    assert "log kubelet: Unauthorized" in found.evidence
    assert "kubectl get csr" in found.commands


def test_node_not_found_with_a_pending_csr_and_no_controller_manager() -> None:
    pending = Csr("csr-x", "worker-1", "system:bootstrap:abc", "Pending")
    pods = tuple(p for p in healthy().kube.pods if p.app != diagnose.CONTROLLER_MANAGER)
    found = [
        d
        for d in diagnose.diagnose(unregistered(csrs=(pending,), pods=pods))
        if d.id == "node-not-registered"
    ]
    assert len(found) == 1
    assert "kube-controller-manager" in found[0].cause and "pending" in found[0].cause
    assert "CSR csr-x by system:bootstrap:abc: Pending" in found[0].evidence
    assert "kube-controller-manager Ready on: no node" in found[0].evidence


def test_node_not_found_with_a_pending_csr_and_no_approval_manifests() -> None:
    pending = Csr("csr-x", "worker-1", "system:bootstrap:abc", "Pending")
    evidence = unregistered(csrs=(pending,))
    for address in CPS:
        evidence = with_node(
            evidence, address, manifests_applied=("00-kubelet-bootstrapping-token",), manifest_errors={}
        )
    found = only(evidence)
    assert found.id == "node-not-registered"
    assert "01-csr-approver-role-binding" in found.cause and "not applied" in found.cause
    assert f"node {CPS[0]} ManifestStatuses: no CSR manifest applied" in found.evidence


def test_node_not_found_with_a_pending_csr_and_the_approver_binding_deleted() -> None:
    # The manifests were applied (ManifestStatuses says so) but the binding is gone from the cluster.
    pending = Csr("csr-x", "worker-1", "system:bootstrap:abc", "Pending")
    found = only(unregistered(csrs=(pending,), csr_bindings=("create-csrs-for-bootstrapping",)))
    assert found.id == "node-not-registered"
    assert "ClusterRoleBinding auto-approve-csrs-for-group" in found.cause and "missing" in found.cause
    assert (
        "kubelet TLS bootstrap ClusterRoleBindings: create-csrs-for-bootstrapping present, "
        "auto-approve-csrs-for-group missing"
    ) in found.evidence
    assert "kubectl certificate approve csr-x" in found.commands
    assert f"kubeplane -n {CPS[0]} get manifests 01-csr-approver-role-binding -o yaml" in found.commands


def test_a_kubelet_waiting_for_its_certificate_is_not_called_not_running() -> None:
    # Until its CSR is signed the kubelet runs without serving its health endpoint.
    pending = Csr("csr-x", "worker-1", "system:bootstrap:abc", "Pending")
    waiting = dataclasses.replace(up("kubelet"), healthy=False, health_message="connection refused")
    evidence = unregistered(csrs=(pending,), csr_bindings=("create-csrs-for-bootstrapping",))
    evidence = with_node(evidence, WORKER, services=services(evidence.nodes[WORKER], kubelet=waiting))
    found = only(evidence)
    assert (found.id, found.node) == ("node-not-registered", WORKER)


def test_node_not_found_without_a_csr_and_the_creator_binding_deleted() -> None:
    found = only(unregistered(csr_bindings=("auto-approve-csrs-for-group",)))
    assert "may not create one" in found.cause and "create-csrs-for-bootstrapping" in found.cause
    assert f"kubeplane -n {CPS[0]} get manifests 01-csr-node-bootstrap -o yaml" in found.commands


def test_node_not_ready_points_at_the_cni_pods() -> None:
    nodes = tuple(
        dataclasses.replace(n, ready="False", reason="KubeletNotReady", message="cni config uninitialized")
        if n.address == WORKER
        else n
        for n in healthy().kube.nodes
    )
    pods = tuple(
        dataclasses.replace(p, ready=False, phase="Pending", reason="ContainerCreating")
        if p.name == "kube-flannel-3"
        else p
        for p in healthy().kube.pods
    )
    found = only(with_kube(healthy(), nodes=nodes, pods=pods))
    assert (found.id, found.node) == ("node-not-ready", WORKER)
    assert "CNI" in found.cause
    assert "Ready False: KubeletNotReady cni config uninitialized" in found.evidence
    assert "pod kube-system/kube-flannel-3: Pending (ContainerCreating), 0 restarts" in found.evidence


def test_x509_unknown_authority_compares_the_endpoint_issuer_with_the_cluster_ca() -> None:
    evidence = with_kube(
        healthy(),
        error="GET /readyz: TLS failed: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed",
        tls_error=True,
        readyz=None,
        endpoint_issuer="other-cluster-ca",
        cluster_ca="kubernetes",
    )
    found = only(failing(evidence, health.API_ENDPOINT, "KubeForbidden: TLS failed"))
    assert found.id == "endpoint-other-cluster"
    assert "points at another cluster" in found.cause
    assert "certificate issuer 'other-cluster-ca', cluster CA 'kubernetes'" in found.evidence
    assert "openssl s_client -connect 10.5.0.1:6443 -showcerts </dev/null" in found.commands


def test_x509_unknown_authority_in_a_node_controller_errors() -> None:
    error = ControllerError(
        "k8s.ManifestApplyController", "x509: certificate signed by unknown authority", 2.0
    )
    found = only(with_node(healthy(), CPS[1], controller_errors=(error,)))
    assert (found.id, found.node) == ("endpoint-other-cluster", CPS[1])


X509_LINE = (
    "E1124 14:55:01.123456    4242 certificate_manager.go:437] Failed while requesting a signed "
    "certificate from the master: cannot create certificate signing request: Post "
    '"https://10.6.0.1:6443/apis/certificates.k8s.io/v1/certificatesigningrequests": x509: '
    "certificate signed by unknown authority"
)


def not_ready(evidence: Evidence, address: str) -> Evidence:
    nodes = tuple(
        dataclasses.replace(n, ready="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting")
        if n.address == address
        else n
        for n in evidence.kube.nodes
    )
    return with_kube(evidence, nodes=nodes)


def test_x509_unknown_authority_in_the_kubelet_log_of_a_node_that_stopped_reporting() -> None:
    # The node's kubelet was given another cluster's endpoint: its Node goes NotReady, and the
    # cause is the kubelet's x509 error, not the pod network.
    logs = {"kubelet": ("I1124 14:55:00.000001 4242 server.go:416] Version: v1.20.2", X509_LINE)}
    evidence = with_node(not_ready(healthy(), WORKER), WORKER, logs=logs)
    found = only(failing(evidence, health.NODES_READY, "worker-1: Ready Unknown"))
    assert (found.id, found.node) == ("endpoint-other-cluster", WORKER)
    assert "kubelet" in found.cause and "another cluster" in found.cause
    assert f"log kubelet: {X509_LINE}" in found.evidence
    assert f"kubeplane -n {WORKER} get machineconfig -o yaml" in found.commands


def test_an_x509_error_the_kubelet_got_past_is_no_alarm() -> None:
    # The error was fixed: newer lines pushed it out of the recent part of the log, so the
    # NotReady node is the pod network's (node-not-ready), not another cluster's.
    logs = {"kubelet": (X509_LINE, *(["I1124 14:56:00.000001 4242 kubelet.go:1] fine"] * 20))}
    evidence = with_node(not_ready(healthy(), WORKER), WORKER, logs=logs)
    found = only(failing(evidence, health.NODES_READY, "worker-1: Ready Unknown"))
    assert (found.id, found.node) == ("node-not-ready", WORKER)


@pytest.mark.parametrize("component", [diagnose.SCHEDULER, diagnose.CONTROLLER_MANAGER])
def test_a_control_plane_component_not_running(component: str) -> None:
    pods = tuple(
        dataclasses.replace(p, ready=False, reason="CrashLoopBackOff", restarts=4)
        if (p.app, p.host_ip) == (component, CPS[1])
        else p
        for p in healthy().kube.pods
    )
    containers = tuple(
        dataclasses.replace(c, state="STOPPED") if c.name == component else c
        for c in healthy().nodes[CPS[1]].containers
    )
    ref = f"kube-system/{component}-cp-2:{component}"
    usage = (
        "Error: unknown flag: --bogus",
        "Usage:",
        "      --alsologtostderr                  log to standard error as well as files",
        *(f"      --flag-{i} string   a flag, failures are not fatal" for i in range(40)),
    )
    evidence = with_node(with_kube(healthy(), pods=pods), CPS[1], containers=containers, logs={ref: usage})
    found = only(
        failing(evidence, health.STATIC_PODS_READY, f"node {CPS[1]}: {component} is Running, not Ready")
    )
    assert (found.id, found.node) == ("component-not-running", CPS[1])
    assert component in found.cause
    assert (
        f"pod kube-system/{component}-cp-2: Running (CrashLoopBackOff), not Ready, 4 restarts"
        in found.evidence
    )
    assert f"kubeplane -n {CPS[1]} logs -k {ref}" in found.commands
    # The error printed before the usage text, not the usage text's last lines.
    assert [line for line in found.evidence if line.startswith("log ")] == [
        f"log {ref}: Error: unknown flag: --bogus"
    ]


def test_a_controller_still_failing_is_reported_with_the_guides_meaning() -> None:
    errors = tuple(
        ControllerError("secrets.KubernetesController", "missing cluster.aggregatorCA secret", age)
        for age in (90.0, 60.0, 30.0)
    )
    found = only(with_node(healthy(), CPS[0], controller_errors=errors))
    assert (found.id, found.node) == ("controller-failing", CPS[0])
    assert "convert" in found.cause


def test_controller_failures_that_stopped_are_no_alarm() -> None:
    errors = tuple(
        ControllerError("k8s.ManifestApplyController", "an error on the server", a) for a in (110, 100, 90)
    )
    assert diagnose.diagnose(with_node(healthy(), CPS[0], controller_errors=errors)) == []


def test_bootstrap_manifests_that_failed_to_apply() -> None:
    evidence = with_node(
        healthy(), CPS[0], manifest_errors={"10-kube-proxy": "creating DaemonSet: forbidden"}
    )
    found = only(evidence)
    assert (found.id, found.node) == ("manifests-failed", CPS[0])
    assert "ManifestStatus error 10-kube-proxy: creating DaemonSet: forbidden" in found.evidence


def test_a_failed_check_that_no_branch_explains_still_gets_a_diagnosis() -> None:
    problem = "node 10.5.0.3: sees members ['a'], others see ['a', 'b']"
    found = only(failing(healthy(), health.ETCD_CONSISTENT, problem))
    assert found.id == "check-failed"
    assert found.evidence == (problem,)
    assert found.checks == (health.ETCD_CONSISTENT,)


def test_a_self_hosted_control_plane_has_no_static_pods_to_miss() -> None:
    evidence = healthy()
    for address in CPS:
        evidence = with_node(evidence, address, self_hosted=True, static_pods=(), manifest_files=())
    assert diagnose.diagnose(evidence) == []


def test_an_api_down_because_kube_apiserver_is_not_rendered_blames_the_rendering() -> None:
    evidence = healthy()
    for address in CPS:
        evidence = with_node(evidence, address, static_pods=(), manifest_files=(), containers=())
    evidence = with_kube(evidence, error="GET /readyz: connection refused", readyz=None)
    evidence = failing(evidence, health.API_ENDPOINT, "KubeUnavailable: connection refused")
    found = diagnose.diagnose(evidence)
    assert {d.id for d in found} == {"static-pods-not-rendered"}
    assert all(health.API_ENDPOINT in d.checks for d in found)


def test_a_control_plane_node_down_explains_the_checks_it_fails() -> None:
    evidence = with_node(healthy(), CPS[1], unreachable="connection refused", services={})
    for name in (health.ETCD_HEALTHY, health.NODES_READY, health.STATIC_PODS_READY):
        evidence = failing(evidence, name, f"node {CPS[1]}: down")
    assert [d.id for d in diagnose.diagnose(evidence)] == ["node-api-unreachable"]


def test_etcd_stopped_by_hand_is_not_blamed_on_its_flags() -> None:
    etcd = Service(id="etcd", state="Finished", running=False, events=("[Finished]: Service stopped",))
    evidence = with_node(healthy(), CPS[2], services=services(healthy().nodes[CPS[2]], etcd=etcd))
    found = only(evidence)
    assert (found.id, found.node) == ("etcd-not-running", CPS[2])
    assert "was stopped" in found.cause and "extraArgs" not in found.cause


def test_kubelet_stopped_by_hand_says_so() -> None:
    kubelet = Service(id="kubelet", state="Finished", running=False, events=("[Finished]: Service stopped",))
    evidence = with_node(healthy(), WORKER, services=services(healthy().nodes[WORKER], kubelet=kubelet))
    found = only(evidence)
    assert found.id == "kubelet-not-running"
    assert "was stopped" in found.cause and "configuration" not in found.cause


def test_etcd_down_explains_the_kubernetes_checks_its_kube_apiserver_fails() -> None:
    etcd = Service(id="etcd", state="Finished", running=False, events=("[Finished]: Service stopped",))
    evidence = with_node(healthy(), CPS[2], services=services(healthy().nodes[CPS[2]], etcd=etcd))
    evidence = failing(evidence, health.ETCD_HEALTHY, f"node {CPS[2]}: unavailable")
    evidence = failing(evidence, health.API_ENDPOINT, "https://10.5.0.1:6443/readyz answered HTTP 500")
    # That node's kube-apiserver is not Ready without its etcd: one cause, not two diagnoses.
    pods = tuple(
        dataclasses.replace(p, ready=False) if (p.app, p.host_ip) == (diagnose.APISERVER, CPS[2]) else p
        for p in evidence.kube.pods
    )
    evidence = with_kube(evidence, pods=pods)
    assert [d.id for d in diagnose.diagnose(evidence)] == ["etcd-not-running"]


def test_log_lines_that_report_an_error_come_before_those_that_mention_one() -> None:
    kubelet = Service(
        id="kubelet", state="Failed", running=False, events=("[Failed]: Service exited with code 1",)
    )
    lines = (
        "I1124 11:00:00.000000 1 server.go:1] starting",
        "E1124 11:00:01.000000 1 server.go:2] failed to run Kubelet: bad config",
        "I1124 11:00:02.000000 1 server.go:3] a retry failed once",
        "I1124 11:00:03.000000 1 server.go:4] exiting",
    )
    evidence = with_node(
        healthy(),
        WORKER,
        services=services(healthy().nodes[WORKER], kubelet=kubelet),
        logs={"kubelet": lines},
    )
    logged = [line for line in only(evidence).evidence if line.startswith("log ")]
    assert logged == [f"log kubelet: {lines[1]}"]
