"""``kubeplane health --explain``: the troubleshooting guide's decision tree, as a pure function.

:func:`diagnose` takes what :mod:`kubeplane.ops.evidence` gathered from every node and from the
Kubernetes API (an :class:`Evidence`, plain data) and returns one :class:`Diagnosis` per problem
it recognises: the cause in one sentence, the evidence it rests on (a service event, a log line,
a resource, a CSR, a certificate issuer versus the cluster CA) and the commands that fix it or dig
further. Nothing here does I/O, so every branch is unit-tested with hand-built evidence.

The branches, in the guide's order (``id`` of the diagnosis in brackets):

- a node whose node API does not answer: a worker waits for trustd [``worker-node-api-unreachable``],
  a control plane node is down [``node-api-unreachable``];
- a node whose boot has not finished (a worker waiting for its node API certificate, usually
  because of a wrong control plane endpoint) [``boot-unfinished``];
- kubelet not running [``kubelet-not-running``];
- etcd: not running (crashing, or stuck preparing) [``etcd-not-running``]; starting from stale
  data, a member the cluster removed or another cluster's, as its log says [``etcd-stale-data``];
  a non-bootstrap node waiting to join through the Kubernetes API [``etcd-waiting-to-join``]; no
  node bootstrapped at all [``etcd-not-bootstrapped``];
- static pod definitions not generated [``static-pods-not-rendered``];
- "an error on the server": the endpoint does not answer; kube-apiserver exited on a node
  [``apiserver-not-running``] or runs everywhere and the endpoint still fails
  [``endpoint-not-answering``];
- ``nodes "X" not found``: a kubelet without its client certificate — no CSR (endpoint), CSR
  pending while kube-controller-manager is down, the CSR approval manifests are not applied or
  their ClusterRoleBinding is gone from the cluster, CSR denied [``node-not-registered``];
- node not ready: the CNI [``node-not-ready``];
- ``x509: certificate signed by unknown authority``: the endpoint points at another cluster
  [``endpoint-other-cluster``], seen by this client or in a node's controller errors;
- kube-apiserver / kube-controller-manager / kube-scheduler not running on a node
  [``component-not-running``];
- controllers still failing (the controller-runtime log) [``controller-failing``];
- bootstrap manifests that failed to apply (``ManifestStatuses`` errors) [``manifests-failed``];
- a health check that failed for a reason none of the above names [``check-failed``]: its
  problems are the evidence, so every failing check gets a diagnosis.

A diagnosis names the health checks it explains (``checks``). Evidence and diagnoses are frozen
dataclasses with an ``as_dict`` for ``-o json``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubeplane.controllers.k8s.manifests import CSR_BINDINGS
from kubeplane.ops import health

APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
#: The bootstrap manifests a kubelet's client certificate request depends on (auto-approval).
CSR_MANIFESTS = tuple(CSR_BINDINGS)
CREATOR, APPROVER = CSR_MANIFESTS
#: What etcd logs when its data dir holds a member its peers no longer know: one the cluster
#: removed (a reset that kept etcd's data, a member removed by hand) or one of another cluster.
_STALE_ETCD = re.compile(
    r"permanently removed from the cluster|data-dir used by this member must be removed|"
    r"cluster ID mismatch|member count is unequal",
    re.IGNORECASE,
)
#: A controller counts as still failing with this many failures in the evidence window ...
CONTROLLER_FAILURES = 3
#: ... the last one at most this many seconds before the evidence was taken (the controller
#: runtime retries a failing controller at least every 30 s).
CONTROLLER_RECENT = 45.0
#: How a TLS failure of an unknown issuer reads (Go's wording and Python's).
_UNKNOWN_AUTHORITY = ("certificate signed by unknown authority", "CERTIFICATE_VERIFY_FAILED")
#: A log line that reports a failure: klog's E/F severity or an ``Error:`` first (preferred), else
#: any line with an error word.
_ERROR_START = re.compile(r"[EF]\d{4} |(error|fatal|panic)\b", re.IGNORECASE)
_ERROR_WORD = re.compile(r"\b(error|fatal|panic|failed|unknown flag|refused)\b", re.IGNORECASE)
_KUBE_CHECKS = (health.NODES_READY, health.STATIC_PODS_READY, health.API_ENDPOINT, health.CLUSTER_DNS)


@dataclasses.dataclass(frozen=True)
class Service:
    """A supervised service of a node: state, health, its latest events (``[State]: message``)."""

    id: str
    state: str
    running: bool
    healthy: bool | None = None
    health_message: str = ""
    events: tuple[str, ...] = ()

    @property
    def up(self) -> bool:
        """Running and not known unhealthy (a health check that has not run yet is no alarm)."""
        return self.running and self.healthy is not False


@dataclasses.dataclass(frozen=True)
class Container:
    """A CRI container of a node (``kubeplane containers -k``); ``state`` RUNNING, STOPPED, ..."""

    namespace: str
    pod: str
    name: str
    state: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.pod}:{self.name}"


@dataclasses.dataclass(frozen=True)
class ControllerError:
    """A controller's failed reconcile (a ``controller`` event of the node)."""

    controller: str
    message: str
    age: float  # seconds before the evidence was taken


@dataclasses.dataclass(frozen=True)
class NodeEvidence:
    """What one node's API said. ``unreachable`` set: nothing else could be read."""

    address: str
    control_plane: bool
    unreachable: str | None = None
    hostname: str = ""
    #: What the node's boot still waits for (``version``'s ``waiting``); empty once it finished.
    boot_wait: str = ""
    services: Mapping[str, Service] = dataclasses.field(default_factory=dict)
    bootstrap_node: bool = False
    self_hosted: bool = False
    static_pods: tuple[str, ...] = ()
    manifest_files: tuple[str, ...] = ()
    manifests_applied: tuple[str, ...] = ()
    manifest_errors: Mapping[str, str] = dataclasses.field(default_factory=dict)
    containers: tuple[Container, ...] = ()
    controller_errors: tuple[ControllerError, ...] = ()
    #: Last lines of logs read because something failed: service id or container ref → lines.
    logs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class KubeNode:
    """A Kubernetes Node: name, InternalIP, its Ready condition."""

    name: str
    address: str
    ready: str = "Unknown"
    reason: str = ""
    message: str = ""


@dataclasses.dataclass(frozen=True)
class Pod:
    """A kube-system pod: where it runs, its ``k8s-app`` label, readiness."""

    name: str
    node_name: str
    host_ip: str
    app: str
    phase: str
    ready: bool
    restarts: int = 0
    reason: str = ""  # a waiting or terminated container's reason (CrashLoopBackOff, ...)


@dataclasses.dataclass(frozen=True)
class Csr:
    """A CertificateSigningRequest: for which node (from its subject), its condition."""

    name: str
    node_name: str
    requestor: str
    condition: str  # Approved,Issued | Approved | Denied | Failed | Pending


@dataclasses.dataclass(frozen=True)
class KubeEvidence:
    """What the Kubernetes API said through the endpoint (``error`` set: it could not be read)."""

    server: str
    error: str | None = None
    tls_error: bool = False
    readyz: int | None = None
    readyz_body: str = ""
    nodes: tuple[KubeNode, ...] = ()
    pods: tuple[Pod, ...] = ()
    csrs: tuple[Csr, ...] = ()
    #: The names of the kubelet TLS bootstrap's ClusterRoleBindings (:data:`CSR_BINDINGS`) that
    #: exist in the cluster; None when they could not be read.
    csr_bindings: tuple[str, ...] | None = None
    #: The issuer of the certificate the endpoint serves, and the subject of the cluster CA the
    #: kubeconfig trusts (read only when TLS failed).
    endpoint_issuer: str | None = None
    cluster_ca: str | None = None

    @property
    def answers(self) -> bool:
        return self.error is None and self.readyz == 200


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Everything :func:`diagnose` looks at."""

    controlplanes: tuple[str, ...]
    workers: tuple[str, ...]
    nodes: Mapping[str, NodeEvidence]
    kube: KubeEvidence
    #: The health checks that ran, with the problems each found.
    checks: tuple[health.Result, ...] = ()


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """One problem: what is wrong (``cause``), why we think so, and what to run next."""

    id: str
    node: str | None
    cause: str
    evidence: tuple[str, ...]
    commands: tuple[str, ...]
    checks: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (lists, not tuples)."""
        return {
            "id": self.id,
            "node": self.node,
            "cause": self.cause,
            "evidence": list(self.evidence),
            "commands": list(self.commands),
            "checks": list(self.checks),
        }

    def text(self) -> str:
        lines = [f"[{self.id}]{f' node {self.node}' if self.node else ''}: {self.cause}"]
        lines += [f"  evidence: {item}" for item in self.evidence]
        lines += [f"  run: {command}" for command in self.commands]
        return "\n".join(lines)


def diagnose(evidence: Evidence) -> list[Diagnosis]:
    """Every diagnosis the evidence supports (see the module docstring), then one per failing
    check that none of them explains."""
    found: list[Diagnosis] = []
    for branch in _BRANCHES:
        found += branch(evidence)
    explained = {check for diagnosis in found for check in diagnosis.checks}
    for result in evidence.checks:
        if not result.ok and result.name not in explained:
            found.append(
                Diagnosis(
                    id="check-failed",
                    node=None,
                    cause=f"the check {result.name!r} failed for a reason the guide's tree does not name",
                    evidence=result.problems,
                    commands=("kubeplane health",),
                    checks=(result.name,),
                )
            )
    return found


# -- helpers -------------------------------------------------------------------------------------


def _reachable(evidence: Evidence, *, control_plane: bool | None = None) -> list[NodeEvidence]:
    return [
        node
        for node in evidence.nodes.values()
        if node.unreachable is None and (control_plane is None or node.control_plane == control_plane)
    ]


def _service_evidence(service: Service | None, name: str) -> list[str]:
    if service is None:
        return [f"service {name}: not supervised on this node"]
    health_text = "" if service.healthy is None else f", healthy {str(service.healthy).lower()}"
    lines = [f"service {service.id}: state {service.state}{health_text}"]
    if service.health_message:
        lines.append(f"health check: {service.health_message}")
    lines += [f"event {event}" for event in service.events[-3:]]
    return lines


def _log_evidence(node: NodeEvidence, key: str, *, lines: int = 3) -> list[str]:
    """The last ``lines`` lines of a log that report an error (see :data:`_ERROR_START`), else that
    mention one, else its last lines. A process that exits on a bad flag prints the error first
    and then its whole usage text, so the last lines alone would show only the usage."""
    text = [line.strip() for line in node.logs.get(key, ())]
    # Usage text names errors too ("--alsologtostderr  log to standard error"): flag lines never count.
    reports = [line for line in text if not line.startswith("-")]
    leading = [line for line in reports if _ERROR_START.match(line)]
    mentions = [line for line in reports if _ERROR_WORD.search(line)]
    return [f"log {key}: {line}" for line in (leading or mentions or text)[-lines:]]


def _kube_node(evidence: Evidence, address: str) -> KubeNode | None:
    return next((node for node in evidence.kube.nodes if node.address == address), None)


def _cmd(node: str, *args: str) -> str:
    return " ".join(("kubeplane", "-n", node, *args))


def _api_state(kube: KubeEvidence) -> str:
    if kube.error is not None:
        return f"Kubernetes API through {kube.server}: {kube.error}"
    return f"Kubernetes API through {kube.server}: /readyz answered HTTP {kube.readyz}"


# -- branches ------------------------------------------------------------------------------------


def _node_api(evidence: Evidence) -> list[Diagnosis]:
    found = []
    for node in evidence.nodes.values():
        if node.unreachable is None:
            continue
        if node.control_plane:
            found.append(
                Diagnosis(
                    id="node-api-unreachable",
                    node=node.address,
                    cause="the node API of this control plane node does not answer (agent down, node off or "
                    "unreachable), so nothing on it could be checked",
                    evidence=(f"node API: {node.unreachable}",),
                    commands=(f"kubeplane -e {node.address} version",),
                    checks=(
                        health.ETCD_HEALTHY,
                        health.ETCD_CONSISTENT,
                        health.NODES_READY,
                        health.STATIC_PODS_READY,
                    ),
                )
            )
            continue
        registered = _kube_node(evidence, node.address)
        joined = (
            f"Kubernetes node {registered.name} is registered (Ready {registered.ready})"
            if registered is not None
            else "no Kubernetes node has this address: its kubelet has not joined"
        )
        found.append(
            Diagnosis(
                id="worker-node-api-unreachable",
                node=node.address,
                cause="the worker's node API does not answer: a worker gets its node API certificate from "
                "trustd on the control plane nodes, which it finds through the control plane endpoint "
                "once its kubelet joined, so check both",
                evidence=(f"node API: {node.unreachable}", _api_state(evidence.kube), joined),
                # A worker that never got its certificate serves the maintenance API meanwhile.
                commands=(
                    "kubectl get nodes -o wide",
                    f"kubeplane -e {node.address} version",
                    _cmd(node.address, "version", "--insecure"),
                ),
                checks=(health.NODES_READY,),
            )
        )
    return found


def _boot_unfinished(evidence: Evidence) -> list[Diagnosis]:
    return [
        Diagnosis(
            id="boot-unfinished",
            node=node.address,
            cause="this node has not finished booting; when it waits for trustd, its "
            "cluster.controlPlane.endpoint is usually wrong: fix the config with --immediate (or "
            "--on-reboot, then reboot); the default apply mode is refused until the boot finishes",
            evidence=(f"the boot waits for {node.boot_wait}",),
            commands=(
                _cmd(node.address, "get", "mc", "-o", "yaml"),
                _cmd(node.address, "apply-config", "--immediate", "-f", "FIXED-CONFIG.yaml"),
            ),
            checks=(health.NODES_READY,),
        )
        for node in _reachable(evidence)
        if node.boot_wait
    ]


def _kubelet(evidence: Evidence) -> list[Diagnosis]:
    found = []
    for node in _reachable(evidence):
        kubelet = node.services.get("kubelet")
        if kubelet is not None and kubelet.up:
            continue
        if kubelet is not None and kubelet.running and _bootstrapping(evidence, node):
            continue  # node-not-registered explains it
        why = kubelet.events[-1] if kubelet is not None and kubelet.events else "no event"
        reason = (
            "it was stopped (kubeplane service kubelet stop, or a reboot): start it again"
            if kubelet is not None and _stopped(kubelet)
            else "a wrong kubelet configuration is the usual reason, its log says which"
        )
        found.append(
            Diagnosis(
                id="kubelet-not-running",
                node=node.address,
                cause=f"kubelet is not running on this node (last event {why}); {reason}",
                evidence=(*_service_evidence(kubelet, "kubelet"), *_log_evidence(node, "kubelet")),
                commands=(_cmd(node.address, "service", "kubelet"), _cmd(node.address, "logs", "kubelet")),
                checks=(health.NODES_READY, health.STATIC_PODS_READY),
            )
        )
    return found


def _bootstrapping(evidence: Evidence, node: NodeEvidence) -> bool:
    """Whether the node's kubelet may still wait for its client certificate: its Node is not
    registered. A kubelet serves its health endpoint only once it has that certificate, so until
    then it runs but looks unhealthy."""
    return evidence.kube.answers and _kube_node(evidence, node.address) is None


def _waiting_to_join(service: Service) -> bool:
    text = " ".join(service.events[-4:])
    return "control plane endpoint not up yet" in text or "joining etcd" in text


def _etcd(evidence: Evidence) -> list[Diagnosis]:
    nodes = _reachable(evidence, control_plane=True)
    down = [(node, node.services.get("etcd")) for node in nodes]
    down = [(node, etcd) for node, etcd in down if etcd is None or not etcd.up]
    if not down:
        return []
    # kube-apiserver reads its own node's etcd: a node without etcd fails the Kubernetes checks too.
    checks = (health.ETCD_HEALTHY, health.ETCD_CONSISTENT, *_KUBE_CHECKS)
    bootstrapped = any(node.bootstrap_node for node in nodes)
    etcd_up = any(etcd is not None and etcd.up for etcd in (node.services.get("etcd") for node in nodes))
    if not bootstrapped and not etcd_up and len(nodes) == len(evidence.controlplanes):
        first = evidence.controlplanes[0]
        return [
            Diagnosis(
                id="etcd-not-bootstrapped",
                node=None,
                cause="no control plane node was bootstrapped, so etcd runs nowhere and the other nodes "
                "wait for it: bootstrap exactly one node",
                evidence=tuple(
                    f"node {node.address}: no etcd bootstrap marker; "
                    + (_service_evidence(etcd, "etcd")[0] if etcd else "no etcd service")
                    for node, etcd in down
                ),
                commands=(_cmd(first, "bootstrap"),),
                checks=checks,
            )
        ]
    found = []
    for node, etcd in down:
        # A stopped etcd's last events may still be those of its join: stopped says more.
        if etcd is not None and not node.bootstrap_node and not _stopped(etcd) and _waiting_to_join(etcd):
            found.append(
                Diagnosis(
                    id="etcd-waiting-to-join",
                    node=node.address,
                    cause="etcd on this non-bootstrap node waits to join: it finds its peers through the "
                    "Kubernetes API (Endpoints default/kubernetes) of the bootstrap node, which does "
                    "not answer yet",
                    evidence=(*_service_evidence(etcd, "etcd"), _api_state(evidence.kube)),
                    commands=("kubectl get endpoints kubernetes", _cmd(node.address, "service", "etcd")),
                    checks=checks,
                )
            )
            continue
        stale = _stale_etcd_lines(node)
        if stale:
            members = [cp for cp in evidence.controlplanes if cp != node.address]
            found.append(
                Diagnosis(
                    id="etcd-stale-data",
                    node=node.address,
                    cause="etcd on this node starts from stale data: its data dir holds a member its "
                    "peers no longer know (removed from the cluster, e.g. by a reset that kept etcd's "
                    "data, or another cluster's), so they refuse it and it exits; wipe the node's etcd "
                    "data and the node joins again as a new member",
                    evidence=(
                        *_service_evidence(etcd, "etcd"),
                        *(f"log etcd: {line}" for line in stale[-2:]),
                    ),
                    commands=(
                        _cmd(node.address, "reset", "--graceful=false", "--wipe", "etcd", "--reboot"),
                        *(_cmd(cp, "etcd", "members") for cp in members[:1]),
                    ),
                    checks=checks,
                )
            )
            continue
        role = "the bootstrap node" if node.bootstrap_node else "this control plane node"
        found.append(
            Diagnosis(
                id="etcd-not-running",
                node=node.address,
                cause=f"etcd is not running on {role}: it {_etcd_reason(etcd)}; kube-apiserver on this "
                "node reads it, so the endpoint may fail when it routes there",
                evidence=(*_service_evidence(etcd, "etcd"), *_log_evidence(node, "etcd")),
                commands=(_cmd(node.address, "service", "etcd"), _cmd(node.address, "logs", "etcd")),
                checks=checks,
            )
        )
    return found


#: How many of etcd's last log lines count as its latest runs (one failed start logs about 50).
RECENT_ETCD_LINES = 150


def _stale_etcd_lines(node: NodeEvidence) -> list[str]:
    """etcd's recent log lines that say its data belongs to a member its peers do not know."""
    return _recent_lines(node, "etcd", RECENT_ETCD_LINES, lambda line: bool(_STALE_ETCD.search(line)))


def _recent_lines(node: NodeEvidence, key: str, count: int, matches: Callable[[str], bool]) -> list[str]:
    """The lines among the last ``count`` of log ``key`` that ``matches`` accepts, stripped."""
    return [line.strip() for line in node.logs.get(key, ())[-count:] if matches(line)]


def _stopped(service: Service) -> bool:
    """Whether the service's last event is a requested stop (not a crash)."""
    return not service.running and bool(service.events) and "Service stopped" in service.events[-1]


def _etcd_reason(etcd: Service | None) -> str:
    crash = "most often wrong cluster.etcd.extraArgs, or /var/lib/etcd holding an old cluster's data"
    if etcd is None:
        return "is not supervised (the node's machine type is not a control plane type?)"
    if _stopped(etcd):
        return "was stopped (kubeplane service etcd stop, a reboot or a leave): start it again"
    if any("Service exited" in event for event in etcd.events[-4:]):
        return f"keeps exiting: {crash}"
    if etcd.running:
        return f"runs but its health check fails ({etcd.health_message or 'no message'})"
    if etcd.state in ("Preparing", "Waiting"):
        return "is stuck preparing (pulling its image, or waiting for its certificates)"
    return f"is {etcd.state}: {crash}"


def _static_pods(evidence: Evidence) -> list[Diagnosis]:
    found = []
    for node in _reachable(evidence, control_plane=True):
        if node.self_hosted:
            continue
        missing = [
            component
            for component in health.CONTROL_PLANE_COMPONENTS
            if component not in node.static_pods or not any(component in f for f in node.manifest_files)
        ]
        if not missing:
            continue
        blocked = [name for name in ("etcd", "kubelet") if not _is_up(node, name)]
        cause = f"the static pod definitions of {', '.join(missing)} are not generated: " + (
            f"{' and '.join(blocked)} must be up first (see their diagnosis)"
            if blocked
            else "etcd and kubelet are up, so the controller-runtime log says why"
        )
        found.append(
            Diagnosis(
                id="static-pods-not-rendered",
                node=node.address,
                cause=cause,
                evidence=(
                    f"StaticPods resources: {', '.join(node.static_pods) or 'none'}",
                    f"files in /etc/kubernetes/manifests: {', '.join(node.manifest_files) or 'none'}",
                    *_controller_lines(node),
                ),
                commands=(
                    _cmd(node.address, "get", "staticpods"),
                    _cmd(node.address, "ls", "etc/kubernetes/manifests"),
                    _cmd(node.address, "logs", "controller-runtime"),
                ),
                checks=(health.STATIC_PODS_READY, *(_KUBE_CHECKS if APISERVER in missing else ())),
            )
        )
    return found


def _is_up(node: NodeEvidence, service_id: str) -> bool:
    service = node.services.get(service_id)
    return service is not None and service.up


def _controller_lines(node: NodeEvidence, *, lines: int = 3) -> list[str]:
    return [f"controller {e.controller}: {e.message}" for e in node.controller_errors[-lines:]]


def _unknown_authority(text: str) -> bool:
    return any(marker in text for marker in _UNKNOWN_AUTHORITY)


#: How many of the kubelet's last log lines count as "now": it retries a failing request every few
#: seconds, while an error that was fixed stays in the log until newer lines push it out.
RECENT_KUBELET_LINES = 20


def _kubelet_unknown_authority(node: NodeEvidence) -> list[str]:
    """The kubelet's recent log lines that report TLS to the API failing on an unknown CA."""
    return _recent_lines(node, "kubelet", RECENT_KUBELET_LINES, _unknown_authority)


def _endpoint_down(evidence: Evidence) -> list[Diagnosis]:
    """ "an error on the server": the endpoint does not answer (a TLS failure is its own branch)."""
    kube = evidence.kube
    if kube.answers or kube.tls_error:
        return []
    found = []
    controlplanes = _reachable(evidence, control_plane=True)
    running = 0
    for node in controlplanes:
        apiserver = [c for c in node.containers if c.name == APISERVER]
        if node.self_hosted or (apiserver and any(c.state == "RUNNING" for c in apiserver)):
            running += 1
            continue
        if APISERVER not in node.static_pods:
            continue  # not rendered: static-pods-not-rendered says so
        state = (
            f"container {apiserver[-1].ref}: {apiserver[-1].state}"
            if apiserver
            else "no kube-apiserver container on this node"
        )
        ref = apiserver[-1].ref if apiserver else f"kube-system/kube-apiserver-{node.hostname}:{APISERVER}"
        found.append(
            Diagnosis(
                id="apiserver-not-running",
                node=node.address,
                cause="kube-apiserver is not running on this node, so the control plane endpoint gets "
                "no answer from it; an exit right after start is a configuration error (extraArgs)",
                evidence=(_api_state(kube), state, *_log_evidence(node, ref)),
                commands=(_cmd(node.address, "containers", "-k"), _cmd(node.address, "logs", "-k", ref)),
                checks=_KUBE_CHECKS,
            )
        )
    if controlplanes and running == len(controlplanes):
        found.append(
            Diagnosis(
                id="endpoint-not-answering",
                node=None,
                cause="the Kubernetes API does not answer through the control plane endpoint although "
                "kube-apiserver runs on every control plane node that answered: check the endpoint "
                "(load balancer, DNS) and that kube-apiserver finished starting",
                evidence=(
                    _api_state(kube),
                    *([f"/readyz: {kube.readyz_body}"] if kube.readyz_body else []),
                ),
                commands=(
                    f"curl -k {kube.server}/readyz?verbose",
                    *(_cmd(cp, "containers", "-k") for cp in evidence.controlplanes[:1]),
                ),
                checks=_KUBE_CHECKS,
            )
        )
    return found


def _other_cluster(evidence: Evidence) -> list[Diagnosis]:
    kube = evidence.kube
    found = []
    host = kube.server.removeprefix("https://")
    if kube.tls_error:
        if kube.endpoint_issuer is not None and kube.cluster_ca is not None:
            issued = f"certificate issuer {kube.endpoint_issuer!r}, cluster CA {kube.cluster_ca!r}"
        else:
            issued = "the endpoint's certificate could not be read"
        differs = kube.endpoint_issuer is not None and kube.endpoint_issuer != kube.cluster_ca
        found.append(
            Diagnosis(
                id="endpoint-other-cluster",
                node=None,
                cause=(
                    f"the control plane endpoint {kube.server} serves a certificate of another CA "
                    "than this cluster's: it points at another cluster"
                    if differs
                    else f"TLS to the control plane endpoint {kube.server} fails: x509, certificate "
                    "signed by unknown authority"
                ),
                evidence=(_api_state(kube), issued),
                commands=(
                    f"openssl s_client -connect {host} -showcerts </dev/null",
                    *(_cmd(cp, "get", "machineconfig", "-o", "yaml") for cp in evidence.controlplanes[:1]),
                ),
                checks=_KUBE_CHECKS,
            )
        )
    for node in _reachable(evidence):
        kubelet_lines = _kubelet_unknown_authority(node)
        if kubelet_lines:
            found.append(
                Diagnosis(
                    id="endpoint-other-cluster",
                    node=node.address,
                    cause='this node\'s kubelet gets x509 "certificate signed by unknown authority" from '
                    "the control plane endpoint it was given: the endpoint in its machine config points "
                    "at another cluster (or the node has another cluster's CA)",
                    evidence=tuple(f"log kubelet: {line}" for line in kubelet_lines[-2:]),
                    commands=(
                        _cmd(node.address, "get", "machineconfig", "-o", "yaml"),
                        _cmd(node.address, "logs", "kubelet"),
                    ),
                    checks=(health.NODES_READY,),
                )
            )
            continue
        lines = [e for e in node.controller_errors if _unknown_authority(e.message)]
        if not lines:
            continue
        found.append(
            Diagnosis(
                id="endpoint-other-cluster",
                node=node.address,
                cause='this node\'s controllers get x509 "certificate signed by unknown authority" from '
                "the control plane endpoint of its machine config: it points at another cluster",
                evidence=tuple(f"controller {e.controller}: {e.message}" for e in lines[-2:]),
                commands=(_cmd(node.address, "get", "machineconfig", "-o", "yaml"),),
                checks=(),
            )
        )
    return found


def _not_registered(evidence: Evidence) -> list[Diagnosis]:
    """``nodes "X" not found``: the API answers but a node never registered."""
    kube = evidence.kube
    if not kube.answers:
        return []
    managers = [pod for pod in kube.pods if pod.app == CONTROLLER_MANAGER and pod.ready]
    controlplanes = _reachable(evidence, control_plane=True)
    applied = [node for node in controlplanes if all(m in node.manifests_applied for m in CSR_MANIFESTS)]
    present = kube.csr_bindings
    missing = [] if present is None else [m for m in CSR_MANIFESTS if CSR_BINDINGS[m] not in present]
    binding_lines = (
        []
        if present is None
        else [
            "kubelet TLS bootstrap ClusterRoleBindings: "
            + ", ".join(f"{b} {'present' if b in present else 'missing'}" for b in CSR_BINDINGS.values())
        ]
    )
    found = []
    for node in evidence.nodes.values():
        if _kube_node(evidence, node.address) is not None or node.unreachable is not None:
            continue
        kubelet = node.services.get("kubelet")
        if kubelet is None or not kubelet.running:
            continue  # kubelet-not-running explains it
        csrs = [csr for csr in kube.csrs if node.hostname and csr.node_name == node.hostname]
        pending = [csr for csr in csrs if csr.condition == "Pending"]
        denied = [csr for csr in csrs if csr.condition in ("Denied", "Failed")]
        if pending and not managers:
            why = (
                "its client certificate request is pending: kube-controller-manager, which approves "
                "and signs it, is not running"
            )
        elif pending and controlplanes and not applied:
            why = (
                "its client certificate request is pending: the bootstrap manifests that auto-approve "
                f"it ({', '.join(CSR_MANIFESTS)}) are not applied"
            )
        elif pending and APPROVER in missing:
            why = (
                "its client certificate request is pending: nothing approves it, because the "
                f"ClusterRoleBinding {CSR_BINDINGS[APPROVER]} (bootstrap manifest {APPROVER}) is missing "
                "from the cluster although the manifest was applied (deleted since)"
            )
        elif pending:
            why = "its client certificate request is pending, not approved"
        elif denied:
            why = "its client certificate request was denied"
        elif not csrs and CREATOR in missing:
            why = (
                "it has not asked for a client certificate: its bootstrap token may not create one, "
                f"because the ClusterRoleBinding {CSR_BINDINGS[CREATOR]} (bootstrap manifest {CREATOR}) "
                "is missing from the cluster although the manifest was applied (deleted since)"
            )
        else:
            why = (
                "it has not asked for a client certificate: its kubelet cannot reach the control plane "
                "endpoint or its bootstrap token is refused"
            )
        manifest_lines = [
            f"node {cp.address} ManifestStatuses: "
            + (", ".join(m for m in CSR_MANIFESTS if m in cp.manifests_applied) or "no CSR manifest")
            + " applied"
            + "".join(f"; {key}: {value}" for key, value in sorted(cp.manifest_errors.items()))
            for cp in controlplanes
        ]
        found.append(
            Diagnosis(
                id="node-not-registered",
                node=node.address,
                cause=f'kubelet runs but the node is not registered in Kubernetes (nodes "{node.hostname}" '
                f"not found): {why}",
                evidence=(
                    *(f"CSR {c.name} by {c.requestor}: {c.condition}" for c in csrs[-3:]),
                    *([] if csrs else [f"no CSR for system:node:{node.hostname}"]),
                    "kube-controller-manager Ready on: "
                    + (", ".join(p.host_ip for p in managers) or "no node"),
                    *manifest_lines,
                    *binding_lines,
                    *_log_evidence(node, "kubelet"),
                ),
                commands=(
                    "kubectl get csr",
                    *(f"kubectl certificate approve {c.name}" for c in pending[-1:]),
                    *(_cmd(cp.address, "get", "manifeststatuses", "-o", "yaml") for cp in controlplanes[:1]),
                    # What to create again (the manifests are create-only, applied once).
                    *(
                        _cmd(cp.address, "get", "manifests", m, "-o", "yaml")
                        for cp in controlplanes[:1]
                        for m in missing
                    ),
                    _cmd(node.address, "logs", "kubelet"),
                ),
                checks=(health.NODES_READY,),
            )
        )
    return found


def _not_ready(evidence: Evidence) -> list[Diagnosis]:
    kube = evidence.kube
    if not kube.answers:
        return []
    found = []
    for address in (*evidence.controlplanes, *evidence.workers):
        registered = _kube_node(evidence, address)
        if registered is None or registered.ready == "True":
            continue
        node = evidence.nodes.get(address)
        if node is not None and (node.unreachable is not None or not _is_up(node, "kubelet")):
            continue  # explained by the node API or kubelet diagnosis
        if node is not None and _kubelet_unknown_authority(node):
            continue  # endpoint-other-cluster: the kubelet cannot report to this cluster
        pods = [pod for pod in kube.pods if pod.node_name == registered.name and not pod.ready]
        found.append(
            Diagnosis(
                id="node-not-ready",
                node=address,
                cause=f"node {registered.name} is registered but not Ready: its pod network (CNI) is not up "
                "yet, or its pods cannot start",
                evidence=(
                    f"Ready {registered.ready}: {registered.reason} {registered.message}".rstrip(),
                    *(
                        f"pod kube-system/{p.name}: {p.phase}{f' ({p.reason})' if p.reason else ''}, "
                        f"{p.restarts} restarts"
                        for p in pods[:4]
                    ),
                ),
                commands=(
                    "kubectl -n kube-system get pods -o wide --field-selector "
                    f"spec.nodeName={registered.name}",
                    f"kubectl describe node {registered.name}",
                ),
                checks=(health.NODES_READY,),
            )
        )
    return found


def _components(evidence: Evidence) -> list[Diagnosis]:
    """kube-apiserver, kube-controller-manager, kube-scheduler on each control plane node."""
    kube = evidence.kube
    if not kube.answers:
        return []
    found = []
    for address in evidence.controlplanes:
        node = evidence.nodes.get(address)
        reachable = node is not None and node.unreachable is None
        if reachable and node is not None and (not _is_up(node, "kubelet") or node.self_hosted):
            continue
        for component in health.CONTROL_PLANE_COMPONENTS:
            if node is not None and node.unreachable is None and component not in node.static_pods:
                continue  # static-pods-not-rendered
            if component == APISERVER and reachable and node is not None and not _is_up(node, "etcd"):
                continue  # etcd-not-running: kube-apiserver cannot work without its node's etcd
            pods = [pod for pod in kube.pods if pod.app == component and pod.host_ip == address]
            if any(pod.ready for pod in pods):
                continue
            containers = [c for c in node.containers if c.name == component] if node is not None else []
            lines = [
                *(
                    f"pod kube-system/{p.name}: {p.phase}{f' ({p.reason})' if p.reason else ''}, not Ready, "
                    f"{p.restarts} restarts"
                    for p in pods
                ),
                *([] if pods else [f"no {component} pod on this node"]),
                *(f"container {c.ref}: {c.state}" for c in containers[-1:]),
            ]
            ref = (
                containers[-1].ref if containers else f"kube-system/{component}-{_hostname(node)}:{component}"
            )
            if node is not None:
                lines += _log_evidence(node, ref)
            found.append(
                Diagnosis(
                    id="component-not-running",
                    node=address,
                    cause=f"{component} is not running on this node"
                    + (
                        ": its container is not running (an image still pulling, or a crash its log shows)"
                        if containers
                        else ": kubelet has not started it (the image may still be pulling)"
                    ),
                    evidence=tuple(lines),
                    commands=(
                        f"kubectl -n kube-system get pods -l k8s-app={component} -o wide",
                        _cmd(address, "containers", "-k"),
                        _cmd(address, "logs", "-k", ref),
                    ),
                    checks=(health.STATIC_PODS_READY,),
                )
            )
    return found


def _hostname(node: NodeEvidence | None) -> str:
    return node.hostname if node is not None and node.hostname else "NODE"


#: What a controller error means, after the guide's list (substring → explanation).
_CONTROLLER_MEANINGS = (
    (
        "missing cluster.aggregatorCA",
        "the machine config predates static pods: convert it (kubeplane convert-k8s)",
    ),
    ("an error on the server", "the control plane endpoint is not up yet, the controller retries"),
    ("Authorization error", "kubelet has not reached kube-apiserver yet to push pod status"),
)


def _controllers(evidence: Evidence) -> list[Diagnosis]:
    found = []
    for node in _reachable(evidence):
        by_controller: dict[str, list[ControllerError]] = {}
        for error in node.controller_errors:
            by_controller.setdefault(error.controller, []).append(error)
        for controller, errors in sorted(by_controller.items()):
            latest = min(errors, key=lambda e: e.age)
            if len(errors) < CONTROLLER_FAILURES or latest.age > CONTROLLER_RECENT:
                continue
            if _unknown_authority(latest.message):
                continue  # endpoint-other-cluster
            meaning = next((text for key, text in _CONTROLLER_MEANINGS if key in latest.message), None)
            found.append(
                Diagnosis(
                    id="controller-failing",
                    node=node.address,
                    cause=f"controller {controller} keeps failing ({len(errors)} times lately)"
                    + (f": {meaning}" if meaning else ": its error says why"),
                    evidence=(f"controller {controller}: {latest.message} ({latest.age:.0f}s ago)",),
                    commands=(_cmd(node.address, "logs", "controller-runtime"),),
                )
            )
    return found


def _manifests(evidence: Evidence) -> list[Diagnosis]:
    found = []
    for node in _reachable(evidence, control_plane=True):
        if not node.manifest_errors:
            continue
        found.append(
            Diagnosis(
                id="manifests-failed",
                node=node.address,
                cause=f"{len(node.manifest_errors)} bootstrap manifest(s) failed to apply from this node "
                "(the endpoint was down, or the API refused an object)",
                evidence=tuple(
                    f"ManifestStatus error {key}: {value}"
                    for key, value in sorted(node.manifest_errors.items())
                ),
                commands=(
                    _cmd(node.address, "get", "manifeststatuses", "-o", "yaml"),
                    _cmd(node.address, "logs", "controller-runtime"),
                ),
            )
        )
    return found


_BRANCHES: Sequence[Callable[[Evidence], list[Diagnosis]]] = (
    _node_api,
    _boot_unfinished,
    _kubelet,
    _etcd,
    _static_pods,
    _endpoint_down,
    _not_registered,
    _not_ready,
    _other_cluster,
    _components,
    _controllers,
    _manifests,
)
