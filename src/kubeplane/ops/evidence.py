"""Gathering the evidence :mod:`kubeplane.ops.diagnose` reasons on, from every node in one run.

All I/O of ``kubeplane health --explain`` is here, through the same two seams as the health
checks (:data:`~kubeplane.ops.health.NodeClientFactory`, :data:`~kubeplane.ops.health.KubeFactory`)
plus one probe of the certificate the control plane endpoint serves, made only when TLS to it
failed. Everything is read once, concurrently: a node task per node and one Kubernetes API task;
nothing waits for a problem to clear, so a run takes as long as its slowest read (a node API call
that cannot connect fails within the client's timeout).

Per node: services, hostname, recent controller failures (the node's ``controller`` events of the
last :data:`EVENT_WINDOW` seconds), CRI containers; on a control plane node also the StaticPods,
the kubelet manifest directory, the ManifestStatuses, the BootstrapStatus and whether the etcd
bootstrap marker is there. From the Kubernetes API: readyz, Nodes, kube-system pods, CSRs and
whether the kubelet TLS bootstrap's ClusterRoleBindings still exist. Then, once the Kubernetes
answer is in, the last :data:`LOG_TAIL` lines of the logs that explain a failure: kubelet's when
it is down or its node is not registered or not Ready, etcd's when it is down, a control plane
container's when it is not running. A read that fails leaves its part empty; only a node whose
first call fails is reported ``unreachable``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.x509.oid import NameOID

from kubeplane import api, pki
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube as kube_client
from kubeplane.controllers.k8s.manifests import CSR_BINDINGS
from kubeplane.ops import diagnose, health

#: Seconds of controller events read per node.
EVENT_WINDOW = 120
#: Log lines read per failing service or container: enough to reach back past a usage text to
#: the error a process printed before it (the diagnosis picks the error lines); v1.20's
#: kube-controller-manager prints 334 lines of usage after a bad flag.
LOG_TAIL = 1000
#: Relative to the node root: the kubelet manifest directory and the etcd bootstrap marker.
MANIFEST_DIR = "etc/kubernetes/manifests"
BOOTSTRAP_MARKER = "system/etcd-bootstrap"
#: Seconds the probe of the endpoint's certificate may take.
PROBE_TIMEOUT = 5.0

#: Reads the issuer common name of the certificate served at an ``https://host:port`` URL.
IssuerProbe = Callable[[str], str | None]


def gather(
    topology: health.Topology,
    *,
    node_client: health.NodeClientFactory,
    kube: health.KubeFactory,
    cluster_ca: bytes | None,
    checks: Sequence[health.Result] = (),
    probe_issuer: IssuerProbe | None = None,
    clock: Callable[[], float] = time.time,
) -> diagnose.Evidence:
    """Read everything :func:`kubeplane.ops.diagnose.diagnose` looks at (see the module docstring)."""
    probe = probe_issuer or served_issuer

    async def run() -> diagnose.Evidence:
        kube_task = asyncio.create_task(_kube(kube, cluster_ca=cluster_ca, probe=probe))
        nodes = await asyncio.gather(
            *(
                _node(
                    node_client,
                    address,
                    control_plane=address in topology.controlplanes,
                    kube=kube_task,
                    clock=clock,
                )
                for address in topology.nodes
            )
        )
        return diagnose.Evidence(
            controlplanes=topology.controlplanes,
            workers=topology.workers,
            nodes={node.address: node for node in nodes},
            kube=await kube_task,
            checks=tuple(checks),
        )

    return asyncio.run(run())


# -- Kubernetes API --------------------------------------------------------------------------


async def _kube(
    factory: health.KubeFactory, *, cluster_ca: bytes | None, probe: IssuerProbe
) -> diagnose.KubeEvidence:
    found: dict[str, Any] = {}
    try:
        async with factory() as client:
            found["server"] = client.server
            found["readyz"], body = await client.raw_get("/readyz")
            found["readyz_body"] = " ".join(body.split())[:200]
            found["nodes"] = tuple(_kube_node(n) for n in await client.list(kube_client.NODES_PATH))
            pods = await client.list(f"/api/v1/namespaces/{health.SYSTEM_NAMESPACE}/pods")
            found["pods"] = tuple(_pod(p) for p in pods)
            csrs = await client.list("/apis/certificates.k8s.io/v1/certificatesigningrequests")
            found["csrs"] = tuple(_csr(c) for c in csrs)
            bindings = await client.list("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")
            wanted = set(CSR_BINDINGS.values())
            found["csr_bindings"] = tuple(
                sorted(name for b in bindings if (name := b["metadata"]["name"]) in wanted)
            )
    except (client_errors.KubeError, OSError) as exc:
        found["error"] = " ".join(str(exc).split())[:300] or type(exc).__name__
        tls = isinstance(exc, client_errors.KubeForbidden) and "TLS failed" in str(exc)
        found["tls_error"] = tls
        if tls and "server" in found:
            found["endpoint_issuer"] = await asyncio.to_thread(probe, found["server"])
            found["cluster_ca"] = pki.cert_info(cluster_ca).subject_cn if cluster_ca else None
    found.setdefault("server", "")
    return diagnose.KubeEvidence(**found)


def served_issuer(server: str) -> str | None:
    """The issuer common name of the certificate ``server`` (an https URL) presents, unverified:
    how to tell that an endpoint belongs to another cluster. None when it cannot be read."""
    parts = urlsplit(server)
    if not parts.hostname:
        return None
    try:
        pem = ssl.get_server_certificate((parts.hostname, parts.port or 443), timeout=PROBE_TIMEOUT)
        return pki.cert_info(pem.encode()).issuer_cn
    except (OSError, ValueError):
        return None


def _kube_node(node: Mapping[str, Any]) -> diagnose.KubeNode:
    status = node.get("status") or {}
    address = next(
        (a.get("address", "") for a in status.get("addresses") or [] if a.get("type") == "InternalIP"), ""
    )
    ready: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    return diagnose.KubeNode(
        name=node["metadata"]["name"],
        address=address,
        ready=str(ready.get("status", "Unknown")),
        reason=str(ready.get("reason") or ""),
        message=str(ready.get("message") or ""),
    )


def _pod(pod: Mapping[str, Any]) -> diagnose.Pod:
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    reasons = [
        (c.get("state") or {}).get(kind, {}).get("reason", "")
        for c in containers
        for kind in ("waiting", "terminated")
    ]
    return diagnose.Pod(
        name=pod["metadata"]["name"],
        node_name=(pod.get("spec") or {}).get("nodeName", ""),
        host_ip=status.get("hostIP", ""),
        app=(pod["metadata"].get("labels") or {}).get("k8s-app", ""),
        phase=status.get("phase", ""),
        ready=kube_client.is_ready(pod),
        restarts=sum(int(c.get("restartCount", 0)) for c in containers),
        reason=next((r for r in reasons if r), ""),
    )


def _csr(csr: Mapping[str, Any]) -> diagnose.Csr:
    spec, status = csr.get("spec") or {}, csr.get("status") or {}
    types = [c.get("type", "") for c in status.get("conditions") or []]
    condition = ",".join(types) or "Pending"
    if "Approved" in types and status.get("certificate"):
        condition = "Approved,Issued"
    return diagnose.Csr(
        name=csr["metadata"]["name"],
        node_name=_csr_node(spec.get("request", "")),
        requestor=spec.get("username", ""),
        condition=condition,
    )


def _csr_node(request: str) -> str:
    """``NAME`` of a CSR for ``system:node:NAME`` (empty for any other or an unreadable request)."""
    with contextlib.suppress(ValueError):
        subject = x509.load_pem_x509_csr(base64.b64decode(request)).subject
        for attribute in subject.get_attributes_for_oid(NameOID.COMMON_NAME):
            value = str(attribute.value)
            if value.startswith("system:node:"):
                return value.removeprefix("system:node:")
    return ""


# -- one node --------------------------------------------------------------------------------


async def _node(
    factory: health.NodeClientFactory,
    address: str,
    *,
    control_plane: bool,
    kube: asyncio.Task[diagnose.KubeEvidence],
    clock: Callable[[], float],
) -> diagnose.NodeEvidence:
    found: dict[str, Any] = {"address": address, "control_plane": control_plane}
    try:
        async with factory([address]) as client:
            try:
                found["services"] = {s.id: s for s in map(_service, await _one(client.service_list()))}
            except api.APIError as exc:
                return diagnose.NodeEvidence(**found, unreachable=" ".join(str(exc).split())[:300])
            await _read_node(client, found, clock=clock)
            evidence = diagnose.NodeEvidence(**found)
            found["logs"] = await _logs(client, evidence, await kube)
    except api.APIError as exc:  # the client itself (closing, connecting) failed
        found.setdefault("unreachable", " ".join(str(exc).split())[:300])
    return diagnose.NodeEvidence(**found)


async def _one(call: Any) -> Any:
    """The result of a single-node call (raises that node's error)."""
    replies = await call
    return replies[0].unwrap()


async def _read_node(client: api.NodeClient, found: dict[str, Any], *, clock: Callable[[], float]) -> None:
    with contextlib.suppress(api.APIError):
        found["boot_wait"] = str((await _one(client.version())).get("waiting") or "")
    with contextlib.suppress(api.APIError):
        addresses = await _one(client.resource_get("NodeAddresses", "current"))
        found["hostname"] = str((addresses.get("spec") or {}).get("hostname", ""))
    with contextlib.suppress(api.APIError):
        now = clock()
        errors = []
        async for reply in client.events(since_seconds=EVENT_WINDOW):
            event = reply.unwrap()
            if event.get("kind") == "controller":
                errors.append(
                    diagnose.ControllerError(
                        controller=str(event.get("subject", "")),
                        message=str(event.get("message", "")),
                        age=max(now - float(event.get("timestamp", now)), 0.0),
                    )
                )
        found["controller_errors"] = tuple(errors)
    with contextlib.suppress(api.APIError):
        found["containers"] = tuple(
            diagnose.Container(
                namespace=c.get("namespace", ""),
                pod=c.get("pod", ""),
                name=c.get("name", ""),
                state=c.get("state", ""),
            )
            for c in await _one(client.containers())
        )
    if not found["control_plane"]:
        return
    with contextlib.suppress(api.APIError):
        found["static_pods"] = tuple(
            r["metadata"]["id"] for r in await _one(client.resource_list("StaticPods"))
        )
    with contextlib.suppress(api.APIError):
        found["manifest_files"] = tuple(
            e["name"].rpartition("/")[2]
            for e in await _one(client.list_dir(MANIFEST_DIR))
            if not e.get("is_dir")
        )
    with contextlib.suppress(api.APIError):
        status = (await _one(client.resource_get("ManifestStatuses", "manifests"))).get("spec") or {}
        found["manifests_applied"] = tuple(status.get("manifestsApplied") or ())
        found["manifest_errors"] = dict(status.get("errors") or {})
    with contextlib.suppress(api.APIError):
        bootstrap = (await _one(client.resource_get("BootstrapStatuses", "control-plane"))).get("spec") or {}
        found["self_hosted"] = bool(bootstrap.get("selfHostedControlPlane"))
    with contextlib.suppress(api.APIError):
        async for chunk in client.read_file(BOOTSTRAP_MARKER):
            chunk.unwrap()
            found["bootstrap_node"] = True


def _service(document: Mapping[str, Any]) -> diagnose.Service:
    health_doc = document.get("health") or {}
    return diagnose.Service(
        id=str(document.get("id", "")),
        state=str(document.get("state", "")),
        running=bool(document.get("running")),
        healthy=None if health_doc.get("unknown", True) else bool(health_doc.get("healthy")),
        health_message=str(health_doc.get("message") or ""),
        events=tuple(f"[{e.get('state')}]: {e.get('message')}" for e in document.get("events") or []),
    )


async def _logs(
    client: api.NodeClient, node: diagnose.NodeEvidence, kube: diagnose.KubeEvidence
) -> dict[str, tuple[str, ...]]:
    """The last lines of what failed on ``node`` (see the module docstring)."""
    wanted: list[tuple[str, bool]] = []
    registered = [n for n in kube.nodes if n.address == node.address]
    ready = any(n.ready == "True" for n in registered)
    kubelet = node.services.get("kubelet")
    # A kubelet that is down, never registered, or stopped reporting (NotReady) tells why in its log.
    if kubelet is None or not kubelet.up or (kube.error is None and not ready):
        wanted.append(("kubelet", False))
    etcd = node.services.get("etcd")
    if node.control_plane and (etcd is None or not etcd.up):
        wanted.append(("etcd", False))
    for container in node.containers:
        if container.name in health.CONTROL_PLANE_COMPONENTS and container.state != "RUNNING":
            wanted.append((container.ref, True))
    found: dict[str, tuple[str, ...]] = {}
    for key, is_container in wanted:
        lines: list[str] = []
        with contextlib.suppress(api.APIError):
            stream = (
                client.container_logs(key, tail=LOG_TAIL) if is_container else client.logs(key, tail=LOG_TAIL)
            )
            async for reply in stream:
                lines += str(reply.unwrap()).splitlines()
        if lines:
            found[key] = tuple(lines[-LOG_TAIL:])
    return found
