"""``kubeplane kubeadm ha``: a kubeadm cluster with one control plane node made highly available.

The fifth seed ("Converting Kubernetes to an HA Control Plane") walks an operator through it by
hand; kubeadm's maintainers call changing the endpoint after ``kubeadm init`` unsupported. This
operation does every step of the guide, in the guide's order, over SSH to the nodes and through the
Kubernetes API, and each step reads the live state first and does nothing when it already holds,
so a re-run after a failure or a SIGKILL finishes the job:

1. ``load balancer``: the endpoint, TCP with SSL health checks (the guide's two requirements), in
   front of the control plane node; a local cluster gets haproxy on the host, a real one names the
   load balancer it runs (``--endpoint``), which must answer with the cluster's API.
2. ``apiserver certificate``: re-signed by the cluster's own CA with the endpoint's host added and
   every SAN of the old certificate kept (``kubeadm init phase certs apiserver`` into a scratch
   directory, then moved into place, the old pair kept as ``*.pre-ha``). kube-apiserver reloads
   its serving certificate from disk (within a minute), so it is not restarted: done when the
   endpoint serves a certificate that verifies against the cluster CA for the endpoint's name.
3. ``control plane kubeconfigs``: ``kubelet.conf``, ``controller-manager.conf``,
   ``scheduler.conf`` and ``admin.conf`` point at the endpoint; the kubelet is restarted
   (``systemctl restart kubelet``) and the controller manager's and scheduler's pods
   (``crictl stopp`` + ``rmp``, the kubelet starts them again) when they started before their file
   changed.
4. ``kube-proxy``: the ``kube-proxy`` ConfigMap's server, then its pods replaced (together: a
   node's Service rules stay in iptables meanwhile) when they are older than the change (recorded
   in the annotation :data:`CHANGED_ANNOTATION`).
5. ``worker kubelet`` on each worker: its ``kubelet.conf``, then the kubelet restarted.
6. ``kubeadm-config``: ``controlPlaneEndpoint`` and ``apiServer.certSANs`` of the stored
   ClusterConfiguration (``kubeadm init phase upload-config kubeadm``: ``kubeadm config upload``
   of the guide is gone from kubeadm v1.20), and etcd's ``--pre-vote`` for the members that join
   (:data:`ETCD_ARGS`).
7. ``cluster-info``: the server of the kubeconfig in ``kube-public/cluster-info``.
8. ``control plane node`` for each new one: a fresh bootstrap token, the CA hash and a freshly
   uploaded certificate key, then ``kubeadm join ENDPOINT --control-plane`` run on the node
   detached from the SSH session (:class:`RemoteJob`), so killing this command does not kill
   kubeadm; a re-run waits for a join still running and never starts a second one. Its etcd
   member joins as a learner and is promoted once caught up (:meth:`KubeadmHA._etcd_member`):
   kubeadm v1.20 would add a voting member before it runs, and the API stalls until it does.
   Done when the node is a registered control plane node, its etcd pod is Ready and its member
   votes.
9. ``load balancer members``: every joined node in the rotation once its API server answers.

The cluster is reached through :class:`Infrastructure` (machines and the load balancer, which the
CLI implements for local clusters and for real machines) and SSH sessions to :class:`Machine`\\s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any, Protocol

import yaml

from kubeplane import pki, retry
from kubeplane import plan as plan_module
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube as kube_client
from kubeplane.clients import ssh
from kubeplane.config import kubeadm as kubeadm_config
from kubeplane.ops.errors import OpsError, PreflightError

PKI = "/etc/kubernetes/pki"
APISERVER_CERT = f"{PKI}/apiserver.crt"
APISERVER_KEY = f"{PKI}/apiserver.key"
CA_CERT = f"{PKI}/ca.crt"
#: The kubeconfigs of a control plane node that name the API server, and what reads each.
CONTROL_PLANE_KUBECONFIGS = {
    "/etc/kubernetes/kubelet.conf": "kubelet",
    "/etc/kubernetes/controller-manager.conf": "kube-controller-manager",
    "/etc/kubernetes/scheduler.conf": "kube-scheduler",
    "/etc/kubernetes/admin.conf": "",
}
KUBELET_CONF = "/etc/kubernetes/kubelet.conf"
#: The configuration file this operation keeps on the first control plane node.
HA_CONFIG = f"{kubeadm_config.CONFIG_DIR}/kubeadm-ha.yaml"
#: The same with the scratch certificate directory, for re-signing (removed afterwards).
CERTS_CONFIG = f"{kubeadm_config.CONFIG_DIR}/kubeadm-ha-certs.yaml"
#: On a joining node: what ``kubeadm init phase etcd local`` writes its etcd member's pod from.
ETCD_CONFIG = f"{kubeadm_config.CONFIG_DIR}/kubeadm-etcd.yaml"
#: Where a detached remote job keeps its output, exit status and PID (on the node: a directory a
#: local node owns, not the host's).
JOBS_DIR = "/var/lib/kubeplane/kubeadm-ha"
CHANGED_ANNOTATION = "kubeplane.dev/server-changed-at"
#: etcd flags of the members that join (kubeadm-config's ``etcd.local.extraArgs``): with pre-vote, a
#: new member that has not heard from the leader yet asks before it campaigns, instead of deposing
#: it; without, the join of the second member cost an in-flight write "etcdserver: leader changed"
#: (an HTTP 500) in the e2e test. The first member keeps its flags (changing them restarts it).
ETCD_ARGS = {"pre-vote": "true"}
#: etcdctl in the etcd pod of a kubeadm control plane node, with the pod's own client certificate.
ETCDCTL = (
    "etcdctl",
    "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
    "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
    "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key",
)
CRI_SOCKET = "/run/containerd/containerd.sock"
IGNORED_PREFLIGHT = ("SystemVerification",)
#: kube-apiserver re-reads its serving certificate every minute; allow two rounds.
CERT_RELOAD_TIMEOUT = 150.0
JOIN_TIMEOUT = 600.0
POD_TIMEOUT = 180.0


class EtcdctlFailed(OpsError):
    """An etcdctl call in the control plane node's etcd pod failed (its message says why)."""


@dataclasses.dataclass(frozen=True)
class Machine:
    """A node reached over SSH: its Kubernetes node name and its address."""

    name: str
    address: str
    target: ssh.Target


Connect = Callable[[Machine], AbstractAsyncContextManager[ssh.Session]]


class Infrastructure(Protocol):
    """What is outside the nodes: the load balancer and the machines to join."""

    def describe_load_balancer(self) -> str:
        """One line for the plan: what the load balancer is and where it listens."""

    async def load_balancer_backends(self) -> list[str] | None:
        """Names of the nodes in the rotation; None when the load balancer is not this host's to
        manage (a real cluster's: only checked through the endpoint)."""

    async def set_load_balancer(self, backends: Sequence[Machine]) -> None:
        """Make (or update) the load balancer so exactly ``backends`` are in its rotation."""

    async def wait_backend_healthy(self, machine: Machine) -> None:
        """Wait until the load balancer's health check passes for ``machine``."""

    def new_machines(self) -> list[Machine]:
        """The machines that become control plane nodes (names and addresses; nothing is made)."""

    async def make_machine(self, machine: Machine, existing: Sequence[Machine]) -> None:
        """Make ``machine`` ready for ``kubeadm join`` (idempotent; nothing for a real machine),
        able to reach the nodes ``existing``."""

    async def joined(self, machine: Machine) -> None:
        """Record that ``machine`` is a control plane node now."""


@dataclasses.dataclass(frozen=True)
class Request:
    """The cluster as the user named it."""

    control_plane: Machine
    workers: tuple[Machine, ...]
    endpoint_host: str
    endpoint_port: int = 6443

    @property
    def endpoint(self) -> str:
        host = f"[{self.endpoint_host}]" if ":" in self.endpoint_host else self.endpoint_host
        return f"https://{host}:{self.endpoint_port}"

    @property
    def control_plane_endpoint(self) -> str:
        """``HOST:PORT``, as kubeadm's ``controlPlaneEndpoint`` takes it."""
        return self.endpoint.removeprefix("https://")


# -- pure helpers ------------------------------------------------------------------------------------


kubeconfig_server = kube_client.kubeconfig_server
with_server = kube_client.with_server


def cluster_ca(kubeconfig_text: str) -> bytes:
    """The CA certificate (PEM) the admin kubeconfig trusts; refuses one that names none."""
    ca = kube_client.kubeconfig_ca(kubeconfig_text)
    if ca is None:
        raise OpsError("the admin kubeconfig has no cluster CA (certificate-authority-data)")
    return ca


def default_sans(*, node_name: str, advertise: str, service_subnet: str, dns_domain: str) -> set[str]:
    """The names kubeadm puts in every API server certificate of a node (besides ``certSANs``)."""
    service_ip = str(next(ipaddress.ip_network(service_subnet.split(",", maxsplit=1)[0].strip()).hosts()))
    return {
        node_name,
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{dns_domain}",
        service_ip,
        advertise,
    }


def cert_sans(cert_pem: bytes) -> list[str]:
    info = pki.cert_info(cert_pem)
    return [*info.dns_names, *info.ip_addresses]


def wanted_cert_sans(
    cluster_config: dict[str, Any], *, old_sans: Sequence[str], defaults: set[str], endpoint_host: str
) -> list[str]:
    """``apiServer.certSANs`` for the new certificate: what the config lists, every SAN of the old
    certificate kubeadm would not add by itself, and the endpoint's host; in that order, once each."""
    listed = [str(name) for name in (cluster_config.get("apiServer") or {}).get("certSANs") or ()]
    extra = [name for name in old_sans if name not in defaults]
    return list(dict.fromkeys([*listed, *extra, endpoint_host]))


def ha_cluster_config(
    cluster_config: dict[str, Any], *, cert_sans: Sequence[str], endpoint: str
) -> dict[str, Any]:
    """The ClusterConfiguration with ``controlPlaneEndpoint``, ``apiServer.certSANs`` and
    :data:`ETCD_ARGS` for the members that join set, the rest as it was."""
    updated = dict(cluster_config)
    api_server = dict(updated.get("apiServer") or {})
    api_server["certSANs"] = list(cert_sans)
    updated["apiServer"] = api_server
    updated["controlPlaneEndpoint"] = endpoint
    etcd = dict(updated.get("etcd") or {})
    local = dict(etcd.get("local") or {})
    local["extraArgs"] = {**(local.get("extraArgs") or {}), **ETCD_ARGS}
    etcd["local"] = local
    updated["etcd"] = etcd
    return updated


def has_ha_settings(cluster_config: dict[str, Any], *, endpoint: str, endpoint_host: str) -> bool:
    """Whether the stored ClusterConfiguration already has what :func:`ha_cluster_config` sets."""
    sans = [str(name) for name in (cluster_config.get("apiServer") or {}).get("certSANs") or ()]
    extra = ((cluster_config.get("etcd") or {}).get("local") or {}).get("extraArgs") or {}
    return (
        cluster_config.get("controlPlaneEndpoint") == endpoint
        and endpoint_host in sans
        and all(extra.get(key) == value for key, value in ETCD_ARGS.items())
    )


def ha_config(cluster_config: dict[str, Any], *, node_name: str, advertise: str) -> str:
    """The file kubeadm's phases read: an InitConfiguration for the first node plus ``cluster_config``."""
    init = {
        "apiVersion": cluster_config.get("apiVersion", "kubeadm.k8s.io/v1beta2"),
        "kind": "InitConfiguration",
        "localAPIEndpoint": {"advertiseAddress": advertise, "bindPort": 6443},
        "nodeRegistration": {"name": node_name, "criSocket": CRI_SOCKET},
    }
    return yaml.safe_dump_all([init, {**cluster_config, "kind": "ClusterConfiguration"}], sort_keys=False)


def parse_timestamp(text: str) -> float:
    """A systemd timestamp (``Fri 2026-11-27 12:00:00 UTC``) or RFC 3339 time as epoch seconds."""
    text = text.strip()
    for pattern in ("%a %Y-%m-%d %H:%M:%S %Z", "%Y-%m-%dT%H:%M:%SZ"):
        with contextlib.suppress(ValueError):
            return datetime.strptime(text, pattern).replace(tzinfo=UTC).timestamp()
    raise OpsError(f"cannot read the time {text!r}")


def peer_url(address: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"https://{host}:2380"


def initial_cluster(members: Sequence[dict[str, Any]], *, name: str, peer: str) -> str:
    """etcd's ``--initial-cluster`` for the member ``name`` at ``peer`` joining ``members`` (as
    etcdctl lists them; the new one has no name until it starts)."""
    pairs = []
    for member in members:
        urls = member.get("peerURLs") or []
        member_name = name if peer in urls else str(member.get("name") or "")
        pairs += [f"{member_name}={url}" for url in urls if member_name]
    return ",".join(sorted(set(pairs)))


def etcd_join_config(cluster_config: dict[str, Any], *, node_name: str, advertise: str, initial: str) -> str:
    """What ``kubeadm init phase etcd local`` reads to write a joining member's static pod: the
    node's InitConfiguration and the cluster's ClusterConfiguration whose etcd arguments (which
    override kubeadm's own) name the cluster it joins."""
    updated = dict(cluster_config)
    etcd = dict(updated.get("etcd") or {})
    local = dict(etcd.get("local") or {})
    local["extraArgs"] = {
        **(local.get("extraArgs") or {}),
        "initial-cluster": initial,
        "initial-cluster-state": "existing",
    }
    etcd["local"] = local
    updated["etcd"] = etcd
    return ha_config(updated, node_name=node_name, advertise=advertise)


def join_command(
    request: Request, machine: Machine, *, token: str, ca_hash: str, certificate_key: str
) -> str:
    words = [
        "kubeadm", "join", request.control_plane_endpoint,
        "--token", token,
        "--discovery-token-ca-cert-hash", ca_hash,
        "--control-plane",
        "--certificate-key", certificate_key,
        "--apiserver-advertise-address", machine.address,
        "--node-name", machine.name,
        "--cri-socket", CRI_SOCKET,
        kubeadm_config.PATCHES_FLAG,
        # The etcd member is added as a learner afterwards (KubeadmHA._etcd_member), not by kubeadm.
        "--skip-phases=control-plane-join/etcd",
        *(f"--ignore-preflight-errors={check}" for check in IGNORED_PREFLIGHT),
    ]  # fmt: skip
    return shlex.join(words)


def is_control_plane(node: dict[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return "node-role.kubernetes.io/master" in labels or "node-role.kubernetes.io/control-plane" in labels


# -- a command that outlives the SSH session ----------------------------------------------------------


class RemoteJob:
    """A command run on a machine detached from the SSH session (``setsid``), with its output, exit
    status and PID in :data:`JOBS_DIR`, so it survives this process being killed and a re-run can
    find it: finished (its status), still running (wait for it) or never started."""

    def __init__(self, session: ssh.Session, name: str) -> None:
        self.session = session
        self.name = name
        base = f"{JOBS_DIR}/{name}"
        self.log, self.rc, self.pid = f"{base}.log", f"{base}.rc", f"{base}.pid"

    async def state(self) -> str:
        """``done:<status>``, ``running`` or ``absent``."""
        script = (
            f"if [ -f {self.rc} ]; then echo done:$(cat {self.rc}); "
            f"elif [ -f {self.pid} ] && kill -0 $(cat {self.pid}) 2>/dev/null; then echo running; "
            "else echo absent; fi"
        )
        return (await self.session.run(script)).stdout.strip()

    async def start(self, command: str) -> None:
        """Start ``command`` detached. It goes to the node in a script (0700), so its arguments
        (a join's token and certificate key) are in no SSH command line or error message here."""
        script = f"{JOBS_DIR}/{self.name}.sh"
        inner = f"{command} > {self.log} 2>&1\necho $? > {self.rc}.tmp && mv {self.rc}.tmp {self.rc}\n"
        await self.session.write(script, "#!/bin/sh\n" + inner, mode=0o700)
        await self.session.run(
            f"rm -f {self.rc} {self.log} && "
            f"{{ setsid sh {script} < /dev/null > /dev/null 2>&1 & echo $! > {self.pid}; }}"
        )

    async def clear(self) -> None:
        await self.session.run(f"rm -f {self.rc} {self.pid}")

    async def wait(self, *, timeout: float, on_line: Callable[[str], None]) -> int:
        """Follow the log until the job ends; its exit status."""
        deadline = time.monotonic() + timeout
        shown = 0
        while True:
            state = await self.state()
            output = (await self.session.run(f"cat {self.log} 2>/dev/null || true")).stdout.splitlines()
            for line in output[shown:]:
                on_line(line)
            shown = max(shown, len(output))
            if state.startswith("done:"):
                return int(state.removeprefix("done:") or 1)
            if state == "absent":
                raise OpsError(
                    f"{self.session.target}: {self.name} ended without an exit status (was it killed?)"
                )
            if time.monotonic() > deadline:
                raise OpsError(
                    f"{self.session.target}: {self.name} still runs after {timeout:.0f}s; see {self.log}"
                )
            await asyncio.sleep(2.0)

    async def tail(self, lines: int = 20) -> str:
        return (await self.session.run(f"tail -n {lines} {self.log} 2>/dev/null || true")).stdout


# -- the operation ------------------------------------------------------------------------------------


STEP_LB = "load balancer"
STEP_CERT = "apiserver certificate"
STEP_CP_KUBECONFIGS = "control plane kubeconfigs"
STEP_PROXY = "kube-proxy"
STEP_WORKER = "worker kubelet"
STEP_KUBEADM_CONFIG = "kubeadm-config"
STEP_CLUSTER_INFO = "cluster-info"
STEP_JOIN = "control plane node"
STEP_MEMBERS = "load balancer members"


class KubeadmHA:
    """The plan (``--dry-run``) and the steps; ``admin`` is the admin kubeconfig's text."""

    def __init__(
        self,
        request: Request,
        *,
        infrastructure: Infrastructure,
        connect: Connect,
        admin: str,
        progress: plan_module.Progress,
    ) -> None:
        self.request = request
        self.infra = infrastructure
        self.connect = connect
        self.admin = admin
        self.ca = cluster_ca(admin)
        self.progress = progress
        self.new = tuple(infrastructure.new_machines())

    # -- access --

    def kube(self, server: str | None = None) -> kube_client.KubeClient:
        """The API through ``server`` (default: the control plane node itself, which answers from
        the first step on; the endpoint verifies only once its certificate is in place)."""
        text = with_server(self.admin, server or f"https://{self.request.control_plane.address}:6443")
        return kube_client.KubeClient(text, timeout=10.0)

    @contextlib.asynccontextmanager
    async def on(self, machine: Machine) -> AsyncIterator[ssh.Session]:
        async with self.connect(machine) as session:
            yield session

    # -- plan --

    def plan(self) -> plan_module.Plan:
        cp = self.request.control_plane
        endpoint = self.request.endpoint
        step = plan_module.Step
        steps = [
            step("ensure", STEP_LB, "", "", self.infra.describe_load_balancer()),
            step(
                "re-sign",
                STEP_CERT,
                cp.address,
                "",
                f"the cluster CA, old SANs kept, + {self.request.endpoint_host}",
            ),
            step(
                "point",
                STEP_CP_KUBECONFIGS,
                cp.address,
                "",
                f"kubelet, controller-manager, scheduler, admin -> {endpoint}; restart what reads them",
            ),
            step(
                "point",
                STEP_PROXY,
                "",
                "",
                f"ConfigMap kube-system/kube-proxy -> {endpoint}; its pods replaced",
            ),
            *(
                step("point", STEP_WORKER, w.address, "", f"kubelet.conf -> {endpoint}; kubelet restarted")
                for w in self.request.workers
            ),
            step(
                "set",
                STEP_KUBEADM_CONFIG,
                "",
                "",
                f"controlPlaneEndpoint {self.request.control_plane_endpoint}, certSANs",
            ),
            step("point", STEP_CLUSTER_INFO, "", "", f"kube-public/cluster-info -> {endpoint}"),
            *(
                step(
                    "join",
                    STEP_JOIN,
                    m.address,
                    "",
                    f"{m.name}: kubeadm join {self.request.control_plane_endpoint} --control-plane",
                )
                for m in self.new
            ),
            step(
                "ensure",
                STEP_MEMBERS,
                "",
                "",
                ", ".join([cp.name, *(m.name for m in self.new)]) + " in the rotation",
            ),
        ]
        return plan_module.Plan(
            title=f"make the kubeadm control plane of {cp.name} highly available behind {endpoint}",
            steps=tuple(steps),
            notes=(
                "every step reads the live state first: re-running after a failure or a kill finishes it",
                "kube-apiserver is never restarted: it reloads the re-signed serving certificate itself",
            ),
        )

    async def run_step(self, step: plan_module.Step) -> plan_module.Outcome:
        if step.component == STEP_LB:
            return await self.load_balancer()
        if step.component == STEP_CERT:
            return await self.certificate()
        if step.component == STEP_CP_KUBECONFIGS:
            return await self.control_plane_kubeconfigs()
        if step.component == STEP_PROXY:
            return await self.kube_proxy()
        if step.component == STEP_WORKER:
            worker = next(w for w in self.request.workers if w.address == step.node)
            return await self.worker_kubelet(worker)
        if step.component == STEP_KUBEADM_CONFIG:
            return await self.kubeadm_config()
        if step.component == STEP_CLUSTER_INFO:
            return await self.cluster_info()
        if step.component == STEP_JOIN:
            machine = next(m for m in self.new if m.address == step.node)
            return await self.join(machine)
        if step.component == STEP_MEMBERS:
            return await self.members()
        raise OpsError(f"unknown step {step.component!r}")

    async def preflight(self) -> None:
        """Refuse, before any change, a cluster the guide does not cover: external etcd."""
        config = await self._cluster_configuration()
        if "external" in (config.get("etcd") or {}):
            raise PreflightError(
                "the cluster's etcd is external (kubeadm-config etcd.external): the guide and this "
                "command are for stacked etcd, where each control plane node runs an etcd member"
            )

    # -- 1: load balancer --

    async def load_balancer(self) -> plan_module.Outcome:
        cp = self.request.control_plane
        backends = await self.infra.load_balancer_backends()
        changed = False
        if backends is not None and cp.name not in backends:
            joined = [m for m in self.new if m.name in backends]
            await self.infra.set_load_balancer([cp, *joined])
            await self.infra.wait_backend_healthy(cp)
            changed = True
        # Whatever the load balancer is, it must reach this cluster's API server.
        await self._wait_endpoint_reaches_cluster()
        return plan_module.CHANGED if changed else plan_module.SKIPPED

    async def _wait_endpoint_reaches_cluster(self) -> None:
        host, port = self.request.endpoint_host, self.request.endpoint_port

        async def attempt() -> bool:
            served = await asyncio.to_thread(peer_certificate, host, port)
            if not pki.is_issued_by(served, self.ca):
                raise PreflightError(
                    f"{host}:{port} answers with a certificate the cluster's CA did not issue: "
                    "the load balancer does not lead to this cluster's API server"
                )
            return True

        await poll(
            f"the load balancer {host}:{port} to reach the API server",
            attempt,
            retry_on=(OSError,),
            timeout=60,
        )

    # -- 2: the API server's certificate --

    async def _cluster_configuration(self) -> dict[str, Any]:
        async with self.kube() as api:
            item = await api.get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")
        return dict(yaml.safe_load((item.get("data") or {}).get("ClusterConfiguration") or "") or {})

    def _default_sans(self, config: dict[str, Any]) -> set[str]:
        """The SANs kubeadm gave the first control plane node's API server certificate."""
        cp = self.request.control_plane
        networking = config.get("networking") or {}
        return default_sans(
            node_name=cp.name,
            advertise=cp.address,
            service_subnet=str(networking.get("serviceSubnet") or "10.96.0.0/12"),
            dns_domain=str(networking.get("dnsDomain") or "cluster.local"),
        )

    async def _endpoint_verifies(self) -> bool:
        """Whether the endpoint serves a certificate of the cluster CA for its own name."""
        try:
            await asyncio.to_thread(
                verify_tls, self.request.endpoint_host, self.request.endpoint_port, self.ca
            )
        except OSError:
            return False
        return True

    async def certificate(self) -> plan_module.Outcome:
        cp = self.request.control_plane
        host = self.request.endpoint_host
        async with self.on(cp) as session:
            on_disk = await session.read(APISERVER_CERT)
            if host in cert_sans(on_disk):
                if await self._endpoint_verifies():
                    return plan_module.SKIPPED
                self.progress.info(f"{APISERVER_CERT} names {host}; waiting for kube-apiserver to serve it")
                await self._wait_served()
                return plan_module.CHANGED
            config = await self._cluster_configuration()
            defaults = self._default_sans(config)
            old = cert_sans(on_disk)
            sans = wanted_cert_sans(config, old_sans=old, defaults=defaults, endpoint_host=host)
            scratch = f"{JOBS_DIR}/pki"
            # kubeadm takes the certificate directory from the config only (not with --config):
            # it writes the new pair next to a copy of the CA, never over the one in use.
            with_sans = dict(config)
            with_sans["apiServer"] = {**(config.get("apiServer") or {}), "certSANs": sans}
            with_sans["certificatesDir"] = scratch
            await session.write(CERTS_CONFIG, ha_config(with_sans, node_name=cp.name, advertise=cp.address))
            script = " && ".join(
                [
                    f"rm -rf {scratch}",
                    f"install -d -m 0700 {scratch}",
                    f"cp -p {PKI}/ca.crt {PKI}/ca.key {scratch}/",
                    f"kubeadm init phase certs apiserver --config {CERTS_CONFIG}",
                    # The old pair stays beside the new one (once: a re-run keeps the first backup).
                    f"(test -f {APISERVER_CERT}.pre-ha || cp -p {APISERVER_CERT} {APISERVER_CERT}.pre-ha)",
                    f"(test -f {APISERVER_KEY}.pre-ha || cp -p {APISERVER_KEY} {APISERVER_KEY}.pre-ha)",
                    f"mv -f {scratch}/apiserver.key {APISERVER_KEY}",
                    f"mv -f {scratch}/apiserver.crt {APISERVER_CERT}",
                    f"rm -rf {scratch} {CERTS_CONFIG}",
                ]
            )
            await session.run(script, timeout=120)
            new = await session.read(APISERVER_CERT)
        missing = [name for name in [*old, host] if name not in cert_sans(new)]
        if missing:
            raise OpsError(f"the re-signed {APISERVER_CERT} lacks {', '.join(missing)}")
        if not pki.is_issued_by(new, self.ca):
            raise OpsError(f"the re-signed {APISERVER_CERT} is not issued by the cluster CA")
        self.progress.info(
            f"{APISERVER_CERT}: {len(old)} SANs kept, {host} added; waiting for it to be served"
        )
        await self._wait_served()
        return plan_module.CHANGED

    async def _wait_served(self) -> None:
        async def attempt() -> bool:
            if not await self._endpoint_verifies():
                raise retry.NotYet(f"{self.request.endpoint} does not serve a certificate for its name yet")
            return True

        await poll(
            "kube-apiserver to serve the re-signed certificate (it re-reads it every minute)",
            attempt,
            timeout=CERT_RELOAD_TIMEOUT,
            every=2.0,
        )

    # -- 3, 5: kubeconfigs and what reads them --

    async def _point(self, session: ssh.Session, path: str) -> bool:
        text = (await session.read(path)).decode()
        if kubeconfig_server(text) == self.request.endpoint:
            return False
        await session.write(path, with_server(text, self.request.endpoint), mode=0o600)
        self.progress.info(f"{session.target.name or session.target.host}: {path} -> {self.request.endpoint}")
        return True

    async def _mtime(self, session: ssh.Session, path: str) -> float:
        return float((await session.run(f"stat -c %Y {shlex.quote(path)}")).stdout.strip())

    async def _restart_kubelet_if_older(self, session: ssh.Session, node: str) -> bool:
        """Restart the kubelet if it started before ``kubelet.conf`` changed, then wait until it
        posted its Node's status again, through its new kubeconfig."""
        changed_at = await self._mtime(session, KUBELET_CONF)
        started = (await session.run("systemctl show kubelet -p ActiveEnterTimestamp --value")).stdout
        if started.strip() and parse_timestamp(started) > changed_at:
            return False
        # Both times have whole seconds: a restart in the second of the change would look older
        # than the change to a re-run, which would restart the kubelet again.
        await asyncio.sleep(max(0.0, changed_at + 1 - time.time()))
        restarted_at = time.time()
        await session.run("systemctl restart kubelet")
        self.progress.info(f"{session.target.name or session.target.host}: kubelet restarted")

        async def attempt() -> bool:
            async with self.kube() as api:
                item = await api.get(kube_client.node_path(node))
            conditions: list[dict[str, Any]] = (item.get("status") or {}).get("conditions") or []
            ready = next((c for c in conditions if c.get("type") == "Ready"), {})
            heartbeat = str(ready.get("lastHeartbeatTime") or "")
            if (
                ready.get("status") != "True"
                or not heartbeat
                or parse_timestamp(heartbeat) < int(restarted_at)
            ):
                raise retry.NotYet(f"the kubelet of {node} has not reported since its restart")
            return True

        await poll(f"the kubelet of {node} to report again", attempt, retry_on=(client_errors.KubeError,))
        return True

    async def _restart_static_pods_if_older(self, session: ssh.Session, kubeconfigs: dict[str, str]) -> bool:
        """Restart (``crictl stopp`` + ``rmp``; the kubelet starts them again) the static pods of
        ``kubeconfigs`` (file → component) that started before their file changed, all at once,
        then wait until each runs a container started since that passes the liveness probe of
        its manifest. (Not the mirror pod's Ready: a kubelet restarted a moment before takes a
        minute or more to report its static pods' startup probes, while they already serve.)"""
        restarted: list[tuple[str, float]] = []
        for path, component in kubeconfigs.items():
            changed_at = await self._mtime(session, path)
            listing = json.loads(
                (await session.run(f"crictl pods --name {component} --state ready -o json")).stdout
            )
            pods = [
                pod for pod in listing.get("items") or () if pod["metadata"]["name"].startswith(component)
            ]
            if pods and all(int(pod["createdAt"]) / 1e9 > changed_at for pod in pods):
                continue
            for pod in pods:
                await session.run(f"crictl stopp {pod['id']} && crictl rmp {pod['id']}")
            self.progress.info(f"{session.target.name or session.target.host}: {component} pod restarted")
            restarted.append((component, changed_at))
        for component, changed_at in restarted:
            await self._wait_serving(session, component, after=changed_at)
        return bool(restarted)

    async def _wait_serving(self, session: ssh.Session, component: str, *, after: float) -> None:
        """Wait until ``component``'s static pod runs a container created after ``after`` that
        answers the liveness probe of its manifest (``/etc/kubernetes/manifests/<component>.yaml``)."""
        manifest = yaml.safe_load(await session.read(f"/etc/kubernetes/manifests/{component}.yaml"))
        probe = (manifest["spec"]["containers"][0].get("livenessProbe") or {}).get("httpGet") or {}
        url = (
            f"{str(probe.get('scheme') or 'HTTP').lower()}://{probe.get('host') or '127.0.0.1'}:"
            f"{probe.get('port')}{probe.get('path') or '/healthz'}"
        )

        async def attempt() -> bool:
            listing = json.loads((await session.run(f"crictl ps --name '^{component}$' -o json")).stdout)
            fresh = [c for c in listing.get("containers") or () if int(c.get("createdAt") or 0) / 1e9 > after]
            if not fresh:
                raise retry.NotYet(f"no {component} container started since the change yet")
            answer = await session.run(
                f"curl -sk --max-time 3 -o /dev/null -w '%{{http_code}}' {shlex.quote(url)}", check=False
            )
            if answer.stdout.strip() != "200":
                raise retry.NotYet(
                    f"{component} does not answer {url} yet ({answer.stdout.strip() or 'no answer'})"
                )
            return True

        await poll(f"{component} to serve again", attempt, retry_on=(ssh.SSHError,))

    async def control_plane_kubeconfigs(self) -> plan_module.Outcome:
        changed = False
        async with self.on(self.request.control_plane) as session:
            for path in CONTROL_PLANE_KUBECONFIGS:
                changed |= await self._point(session, path)
            changed |= await self._restart_kubelet_if_older(session, self.request.control_plane.name)
            static = {path: c for path, c in CONTROL_PLANE_KUBECONFIGS.items() if c.startswith("kube-")}
            changed |= await self._restart_static_pods_if_older(session, static)
        return plan_module.CHANGED if changed else plan_module.SKIPPED

    async def worker_kubelet(self, worker: Machine) -> plan_module.Outcome:
        async with self.on(worker) as session:
            changed = await self._point(session, KUBELET_CONF)
            changed |= await self._restart_kubelet_if_older(session, worker.name)
        return plan_module.CHANGED if changed else plan_module.SKIPPED

    # -- 4: kube-proxy --

    async def kube_proxy(self) -> plan_module.Outcome:
        path = "/api/v1/namespaces/kube-system/configmaps/kube-proxy"
        changed = False
        async with self.kube() as api:
            item = await api.get(path)
            data = item.get("data") or {}
            key = "kubeconfig.conf"
            if kubeconfig_server(str(data.get(key) or "")) != self.request.endpoint:
                stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                body = {
                    "metadata": {
                        "resourceVersion": item["metadata"]["resourceVersion"],
                        "annotations": {CHANGED_ANNOTATION: stamp},
                    },
                    "data": {key: with_server(str(data.get(key) or ""), self.request.endpoint)},
                }
                await api.patch(path, body, patch_type="merge")
                item = await api.get(path)
                changed = True
            changed_at = parse_timestamp(
                str(
                    (item["metadata"].get("annotations") or {}).get(CHANGED_ANNOTATION)
                    or "1970-01-01T00:00:00Z"
                )
            )
            pods = await api.list("/api/v1/namespaces/kube-system/pods", label_selector="k8s-app=kube-proxy")
        # All outdated pods at once: a node without kube-proxy for a moment keeps its rules (they
        # are iptables state), so replacing them together costs Services nothing.
        old = [pod for pod in pods if parse_timestamp(pod["metadata"]["creationTimestamp"]) < changed_at]
        async with self.kube() as api:
            for pod in old:
                await api.delete(f"/api/v1/namespaces/kube-system/pods/{pod['metadata']['name']}")
        nodes = sorted({(pod.get("spec") or {}).get("nodeName", "") for pod in old})
        await asyncio.gather(*(self._wait_proxy_ready(node, after=changed_at) for node in nodes))
        for node in nodes:
            self.progress.info(f"kube-proxy on {node}: pod replaced")
        return plan_module.CHANGED if changed or old else plan_module.SKIPPED

    async def _wait_proxy_ready(self, node: str, *, after: float) -> None:
        async def attempt() -> bool:
            async with self.kube() as api:
                pods = await api.list(
                    "/api/v1/namespaces/kube-system/pods", label_selector="k8s-app=kube-proxy"
                )
            fresh = [
                p for p in pods
                if (p.get("spec") or {}).get("nodeName") == node
                and parse_timestamp(p["metadata"]["creationTimestamp"]) >= after
                and kube_client.is_ready(p)
            ]  # fmt: skip
            if not fresh:
                raise retry.NotYet(f"no new kube-proxy pod is Ready on {node} yet")
            return True

        await poll(f"kube-proxy on {node}", attempt, retry_on=(client_errors.KubeError,))

    # -- 6, 7: the in-cluster configuration --

    async def kubeadm_config(self) -> plan_module.Outcome:
        config = await self._cluster_configuration()
        host = self.request.endpoint_host
        if has_ha_settings(config, endpoint=self.request.control_plane_endpoint, endpoint_host=host):
            return plan_module.SKIPPED
        cp = self.request.control_plane
        async with self.on(cp) as session:
            old = cert_sans(await session.read(APISERVER_CERT))
            defaults = self._default_sans(config)
            wanted = wanted_cert_sans(config, old_sans=old, defaults=defaults, endpoint_host=host)
            updated = ha_cluster_config(
                config, cert_sans=wanted, endpoint=self.request.control_plane_endpoint
            )
            await session.write(HA_CONFIG, ha_config(updated, node_name=cp.name, advertise=cp.address))
            await session.run(f"kubeadm init phase upload-config kubeadm --config {HA_CONFIG}", timeout=120)
        self.progress.info(
            f"kubeadm-config: controlPlaneEndpoint {self.request.control_plane_endpoint}, certSANs {wanted}"
        )
        return plan_module.CHANGED

    async def cluster_info(self) -> plan_module.Outcome:
        path = "/api/v1/namespaces/kube-public/configmaps/cluster-info"
        async with self.kube() as api:
            item = await api.get(path)
            text = str((item.get("data") or {}).get("kubeconfig") or "")
            if kubeconfig_server(text) == self.request.endpoint:
                return plan_module.SKIPPED
            body = {
                "metadata": {"resourceVersion": item["metadata"]["resourceVersion"]},
                "data": {"kubeconfig": with_server(text, self.request.endpoint)},
            }
            await api.patch(path, body, patch_type="merge")
        return plan_module.CHANGED

    # -- 8: joins --

    async def _join_credentials(self) -> tuple[str, str, str]:
        """A new bootstrap token (1 h), the CA hash and a freshly uploaded certificate key (2 h)."""
        async with self.on(self.request.control_plane) as session:
            token = (
                (
                    await session.run(
                        'kubeadm token create --ttl 1h --description "kubeplane kubeadm ha"', timeout=60
                    )
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            ca_hash = pki.ca_cert_hash(await session.read(CA_CERT))
            uploaded = await session.run(
                f"kubeadm init phase upload-certs --upload-certs --config {HA_CONFIG}", timeout=120
            )
        key = uploaded.stdout.strip().splitlines()[-1].strip()
        if len(key) != 64:
            raise OpsError(
                f"kubeadm init phase upload-certs printed no certificate key: {uploaded.stdout[-300:]!r}"
            )
        return token, ca_hash, key

    async def etcdctl(self, *args: str, endpoint: str = "https://127.0.0.1:2379") -> Any:
        """``etcdctl ARGS -w json`` in the first control plane node's etcd pod (``kubectl exec``
        with its admin.conf, over SSH: no etcd port needs to be reachable from here), against
        ``endpoint`` (default: that pod's own member)."""
        cp = self.request.control_plane
        command = shlex.join(
            [
                "kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", "-n", "kube-system",
                "exec", f"etcd-{cp.name}", "--", *ETCDCTL, f"--endpoints={endpoint}", *args, "-w", "json",
            ]
        )  # fmt: skip
        async with self.on(cp) as session:
            result = await session.run(command, timeout=60, check=False)
        if result.code != 0:
            raise EtcdctlFailed(
                f"etcdctl {' '.join(args)}: {(result.stderr or result.stdout).strip()[-300:]}"
            )
        return json.loads(result.stdout)

    async def _member(self, machine: Machine) -> dict[str, Any] | None:
        """The etcd member whose peer URL is the machine's, if any."""
        peer = peer_url(machine.address)
        members = (await self.etcdctl("member", "list")).get("members") or []
        return next((m for m in members if peer in (m.get("peerURLs") or [])), None)

    async def _joined(self, machine: Machine) -> bool:
        """Whether ``machine`` is a registered control plane node whose etcd member votes and
        answers (asked directly: its pod's Ready can lag behind by a minute on a fresh kubelet)."""
        async with self.kube(self.request.endpoint) as api:
            node = await api.get_or_none(kube_client.node_path(machine.name))
        if node is None or not is_control_plane(node):
            return False
        member = await self._member(machine)
        if member is None or member.get("isLearner"):
            return False
        client = (
            f"https://{machine.address}:2379"
            if ":" not in machine.address
            else f"https://[{machine.address}]:2379"
        )
        try:
            health = await self.etcdctl("endpoint", "health", endpoint=client)
        except EtcdctlFailed:
            return False
        return bool(health) and all(entry.get("health") for entry in health)

    async def join(self, machine: Machine) -> plan_module.Outcome:
        if await self._joined(machine):
            await self.infra.joined(machine)
            return plan_module.SKIPPED
        existing = [self.request.control_plane, *self.request.workers, *(m for m in self.new if m != machine)]
        await self.infra.make_machine(machine, existing)

        def line(text: str) -> None:
            self.progress.info(f"{machine.name}: {text}")

        async with self.on(machine) as session:
            job = RemoteJob(session, "join")
            state = await job.state()
            if state.startswith("done:") and state != "done:0":
                # A join that failed (not one that was killed: it runs detached) is undone by
                # kubeadm reset before the next attempt, as kubeadm asks. Its etcd member, if it
                # got one, is a learner that never counted for the quorum: removed first.
                self.progress.info(f"{machine.name}: the last join failed:\n{await job.tail()}")
                member = await self._member(machine)
                if member is not None and member.get("isLearner"):
                    await self.etcdctl("member", "remove", f"{int(member['ID']):x}")
                await session.run("kubeadm reset -f", timeout=300, on_line=line, check=False)
                await job.clear()
                state = "absent"
            if state == "absent":
                for name, text in kubeadm_config.PATCHES.items():
                    await session.write(f"{kubeadm_config.PATCHES_DIR}/{name}", text, mode=0o644)
                token, ca_hash, key = await self._join_credentials()
                self.progress.info(
                    f"{machine.name}: joining with a new token, the CA hash {ca_hash} and a certificate key"
                )
                await job.start(
                    join_command(self.request, machine, token=token, ca_hash=ca_hash, certificate_key=key)
                )
            status = await job.wait(timeout=JOIN_TIMEOUT, on_line=line)
            if status != 0:
                raise OpsError(f"kubeadm join on {machine.name} failed ({status}):\n{await job.tail()}")
            await self._etcd_member(session, machine)

        async def attempt() -> bool:
            if not await self._joined(machine):
                raise retry.NotYet(
                    f"{machine.name} is not a Ready control plane node with a voting etcd member yet"
                )
            return True

        await poll(
            f"{machine.name} to be a control plane node",
            attempt,
            retry_on=(client_errors.KubeError, OSError, EtcdctlFailed),
            every=2.0,
        )
        await self.infra.joined(machine)
        return plan_module.CHANGED

    async def _etcd_member(self, session: ssh.Session, machine: Machine) -> None:
        """The machine's etcd member, joined as a learner.

        Not as kubeadm v1.20's join adds it: a voting member announced before it runs, so a
        one-member cluster has two members and no quorum until the new one has started (6 s in a
        measured run, every API request meanwhile stalled; kubeadm's own code says so). Instead,
        after ``kubeadm join --skip-phases=control-plane-join/etcd``: ``etcdctl member add
        --learner`` (a learner does not count for the quorum), the member's static pod written by
        ``kubeadm init phase etcd local`` with the cluster it joins (``initial-cluster``,
        ``initial-cluster-state=existing``, which override kubeadm's own arguments), and
        ``etcdctl member promote`` once it has caught up. Each part reads the member list first,
        so a re-run goes on where a killed one stopped; a learner never started is harmless."""
        member = await self._member(machine)
        if member is not None and not member.get("isLearner"):
            return
        if member is None:
            added = await self.etcdctl(
                "member", "add", machine.name, f"--peer-urls={peer_url(machine.address)}", "--learner"
            )
            member = added["member"]
            members = added.get("members") or []
            self.progress.info(f"{machine.name}: etcd member {int(member['ID']):x} added as a learner")
        else:
            members = (await self.etcdctl("member", "list")).get("members") or []
        initial = initial_cluster(members, name=machine.name, peer=peer_url(machine.address))
        config = await self._cluster_configuration()
        await session.write(
            ETCD_CONFIG,
            etcd_join_config(config, node_name=machine.name, advertise=machine.address, initial=initial),
            mode=0o600,
        )
        await session.run(
            "install -d -m 0700 /var/lib/etcd && "
            f"kubeadm init phase etcd local --config {ETCD_CONFIG} {kubeadm_config.PATCHES_FLAG}",
            timeout=120,
        )
        member_id = f"{int(member['ID']):x}"

        async def promoted() -> bool:
            try:
                await self.etcdctl("member", "promote", member_id)
            except EtcdctlFailed as exc:
                # Refused while the learner is behind ("...in sync with leader"); refused too
                # for a member that already votes (an earlier, killed run promoted it): the list says.
                current = await self._member(machine)
                if current is not None and not current.get("isLearner"):
                    return True
                raise retry.NotYet(str(exc)) from exc
            return True

        await poll(f"{machine.name}'s etcd learner to catch up and be promoted", promoted)
        self.progress.info(f"{machine.name}: etcd member {member_id} promoted to a voting member")

    # -- 9: load balancer members --

    async def members(self) -> plan_module.Outcome:
        backends = await self.infra.load_balancer_backends()
        wanted = [self.request.control_plane, *self.new]
        if backends is None:
            return plan_module.SKIPPED
        if set(backends) == {m.name for m in wanted}:
            return plan_module.SKIPPED
        await self.infra.set_load_balancer(wanted)
        for machine in self.new:
            await self.infra.wait_backend_healthy(machine)
        return plan_module.CHANGED


async def poll(
    what: str,
    attempt: Callable[[], Awaitable[bool]],
    *,
    retry_on: tuple[type[BaseException], ...] = (),
    timeout: float = POD_TIMEOUT,
    every: float = 1.0,
) -> None:
    """``attempt()`` every ``every`` s until it is done (see :mod:`kubeplane.retry`), at most
    ``timeout`` s; then :class:`OpsError` naming ``what``."""
    await retry.Wait(
        what=what, timeout=timeout, backoff=retry.fixed(every), retry_on=retry_on, error=OpsError
    ).poll_async(attempt)


def peer_certificate(host: str, port: int) -> bytes:
    """The PEM certificate ``host:port`` presents (not verified: the caller checks it)."""
    import socket  # noqa: PLC0415
    import ssl  # noqa: PLC0415

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=5) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    if der is None:
        raise OSError(f"{host}:{port} presented no certificate")
    return ssl.DER_cert_to_PEM_cert(der).encode()


def verify_tls(host: str, port: int, ca: bytes) -> None:
    """A TLS handshake with ``host:port`` that verifies its certificate against ``ca`` for ``host``;
    raises OSError (ssl.SSLError) when it does not."""
    import socket  # noqa: PLC0415
    import ssl  # noqa: PLC0415

    context = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection((host, port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host),
    ):
        pass
