"""The etcd service of a control plane node: bootstrap, join, restart, leave, health, snapshots.

The rules are pure and live in :mod:`kubeplane.services.etcd`; this module gathers the facts
(data dir, bootstrap marker, member list, the Kubernetes ``Endpoints``) and acts on them.

How the service starts (``pre_start``, once per start request; crashes just respawn etcd):

1. wait until the etcd secrets controller wrote the certificates (``waiting for etcd
   certificates``);
2. the data dir holds a member already → start from it, nothing else (a restart);
3. bootstrap was requested (``kubeplane bootstrap``, or ``machine.type: init``) → a new
   single-member cluster, first restoring a snapshot when the bootstrap asked to recover one;
4. otherwise join: ask the control plane endpoint for ``Endpoints default/kubernetes`` with a
   one-hour ``system:masters`` certificate signed by the cluster CA, open an etcd client to
   those addresses, add our member as a learner (:func:`join`), start with
   ``initial-cluster-state=existing``. Every failed attempt is a service event and is retried;
   while etcd only says the cluster is settling (another learner joining), the join is asked
   again every half second first (:meth:`EtcdMember._join`).

Membership rules (the pure decision is :func:`kubeplane.services.etcd.plan_join`):

- **New members join as learners** (``MemberAdd`` with ``isLearner``): a learner receives the
  log but does not vote, so a member that is slow to start or catch up never costs the cluster
  its quorum. The health check promotes it (``MemberPromote``, sent to the members it joined
  through, since a learner serves no cluster calls): etcd refuses while the learner is behind
  (``EtcdLearnerNotReady``), the check reports "catching up" and the next one asks again, until
  etcd accepts. After a start the checks come half a second apart at first, the gaps doubling
  up to 5 s until one passes, so a learner votes about a second after it started. The node's
  etcd counts as healthy only once it votes.
- **A member whose data dir was lost is removed and re-added.** A joining node's data dir is
  empty by definition, so a member listed under our name has lost the raft log it acknowledged;
  started again under that ID with an empty log, etcd panics or diverges. It is removed and we
  join again as a new learner. Only a member with our peer URL that never started (no name: an
  earlier attempt died before etcd ran) is reused, having never held a log.

The bootstrap marker (``system/etcd-bootstrap``: ``requested`` then ``done`` once etcd answered
a quorum read) is what makes bootstrap happen once: a node that was bootstrapped and lost its
data joins like any other node rather than founding a second cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from kubeplane import config, metrics, pki, retry
from kubeplane.api import trustd
from kubeplane.clients import errors as client_errors
from kubeplane.clients import etcd as etcd_client
from kubeplane.config.paths import NodePaths
from kubeplane.fileio import write_atomic
from kubeplane.services import etcd as etcd_rules
from kubeplane.services import process, supervisor, vip

log = logging.getLogger("kubeplaned.etcd")

SERVICE_ID = "etcd"
#: How long a joining node keeps trying before its events say it gave up waiting (it still retries).
JOIN_PATIENCE = 600.0
#: A joining node asks again this often (seconds) while the cluster is settling, for up to
#: JOIN_POLL_WINDOW seconds per pre-start attempt (see :meth:`EtcdMember._join`).
JOIN_POLL = 0.5
JOIN_POLL_WINDOW = 15.0
#: Seconds between the first two health checks after a start (a learner asks for its promotion
#: in them); the gaps then double up to the usual 5 s until a check passes.
STARTUP_CHECK_INTERVAL = 0.5
_PROBE_TIMEOUT = 3.0


class EtcdNotReady(Exception):
    """A pre-start step cannot proceed yet; the message is the service event."""


class EtcdRefused(Exception):
    """An etcd operation was refused; the message says why and what to do."""


def cluster_admin_client(
    document: config.MachineConfig, *, common_name: str, lifetime: datetime.timedelta
) -> tuple[pki.CertKey, pki.CertKey]:
    """The cluster CA and a short-lived ``system:masters`` client certificate it signed.

    Raises ValueError on a node whose config has no cluster CA key (workers).
    """
    ca = document.model.cluster.ca
    if ca is None or not ca.key:
        raise ValueError("cluster.ca has no key on this node")
    authority = pki.CertKey(cert=ca.crt_pem(), key=ca.key_pem())
    client = pki.issue(
        ca=authority,
        common_name=common_name,
        organizations=("system:masters",),
        usages=("client",),
        lifetime=lifetime,
    )
    return authority, client


def _file_stamp(path: Path) -> tuple[int, int, int]:
    """What tells a replaced file apart: inode, size and modification time (ns)."""
    status = path.stat()
    return status.st_ino, status.st_size, status.st_mtime_ns


#: How long leaving etcd retries a removal etcd refuses for now (see :meth:`EtcdMember.remove_self`).
MEMBER_REMOVE_TIMEOUT = 15.0


async def vip_holders(
    client: etcd_client.EtcdClient, *, me: str, released: Sequence[bytes] = (), wait: float = 0.0
) -> set[str]:
    """The nodes other than ``me`` holding a shared VIP, after waiting up to ``wait`` seconds for
    every key in ``released`` (VIPs ``me`` just gave up) to be held by another node."""
    held: dict[bytes, str] = {}

    async def taken() -> bool:
        nonlocal held
        found = await client.get(vip.KEY_PREFIX, prefix=True)
        held = {kv.key: kv.value.decode(errors="replace") for kv in found.kvs}
        return all(held.get(key, me) != me for key in released)

    # Past the wait, the holders known by then do: nobody may have taken a VIP yet.
    with contextlib.suppress(retry.WaitTimeout):
        await retry.Wait(
            what="another node to take the VIPs given up", timeout=wait, backoff=retry.fixed(0.05)
        ).poll_async(taken)
    return set(held.values()) - {me}


class EtcdMember:
    """This node's etcd: the service spec and the operations the node API exposes."""

    def __init__(self, *, paths: NodePaths, document: config.MachineConfig, name: str, node_ip: str) -> None:
        self.paths = paths
        self.document = document
        self.name = name
        self.node_ip = node_ip
        self.certs = etcd_rules.EtcdCerts.under(paths.secrets / "etcd")
        self._args: list[str] | None = None
        self._join_started: float | None = None
        # Client URLs of the members we joined through: where a learner asks for its promotion.
        self._voters: list[str] | None = None
        # The client TLS context and the (inode, size, mtime) of the files it was built from.
        self._tls: tuple[tuple[tuple[int, int, int], ...], ssl.SSLContext] | None = None

    # -- files ------------------------------------------------------------------------------

    @property
    def marker(self) -> Path:
        return self.paths.system / "etcd-bootstrap"

    @property
    def recovery_snapshot(self) -> Path:
        return self.paths.system / "etcd-recover.snapshot"

    def bootstrap_state(self) -> str | None:
        """``requested``, ``done`` or None (never bootstrapped here)."""
        try:
            return self.marker.read_text().strip() or None
        except FileNotFoundError:
            return None

    def has_data(self) -> bool:
        return (self.paths.etcd_data / "member").exists()

    # -- the service ------------------------------------------------------------------------

    def spec(self) -> supervisor.ServiceSpec:
        return supervisor.ServiceSpec(
            id=SERVICE_ID,
            command=self._command,
            pre_start=self._prepare,
            health=supervisor.HealthCheck(
                self._health, interval=5.0, timeout=5.0, startup_interval=STARTUP_CHECK_INTERVAL
            ),
            backoff=supervisor.Backoff(initial=1.0, maximum=5.0),
            # At most 2 s between pre-start tries: a joining node waits for the endpoint there.
            pre_start_backoff=supervisor.Backoff(initial=1.0, maximum=2.0),
        )

    async def _command(self) -> process.Command:
        binary = shutil.which("etcd")
        if binary is None:
            raise FileNotFoundError("etcd is not installed (Debian package etcd-server)")
        if self._args is None:
            raise RuntimeError("etcd pre state did not run")
        return process.Command([binary, *self._args])

    def _render(self, initial: dict[str, str] | None, state: etcd_rules.ClusterState) -> list[str]:
        etcd_config = self.document.model.cluster.etcd
        return etcd_rules.render_args(
            name=self.name,
            node_ip=self.node_ip,
            data_dir=self.paths.etcd_data,
            certs=self.certs,
            initial_cluster=initial,
            initial_cluster_state=state,
            extra_args=(etcd_config.extra_args if etcd_config else None) or None,
        )

    async def _prepare(self) -> None:
        missing = [path.name for path in self.certs.all() if not path.exists()]
        if missing:
            raise EtcdNotReady(
                f"waiting for etcd certificates ({', '.join(missing)} not yet in {self.certs.ca.parent})"
            )
        self.paths.etcd_data.mkdir(parents=True, exist_ok=True)
        self.paths.etcd_data.chmod(0o700)
        peer = etcd_rules.peer_url(self.node_ip)
        if self.has_data():
            log.info("etcd: starting from the existing data in %s", self.paths.etcd_data)
            self._args = self._render(None, "existing")
            return
        state = self.bootstrap_state()
        if state is None and self.document.model.machine.type == "init":
            await asyncio.to_thread(write_atomic, self.marker, "requested\n")
            state = "requested"
        if state == "requested":
            if self.recovery_snapshot.exists():
                await self._restore(peer)
            log.info("etcd: bootstrapping a new single-member cluster")
            self._args = self._render({self.name: peer}, "new")
            return
        plan = await self._join(peer)
        self._args = self._render(plan.initial_cluster, "existing")

    async def _restore(self, peer: str) -> None:
        etcdctl = shutil.which("etcdctl") or "etcdctl"
        data = self.paths.etcd_data
        # etcdctl wants to create the data dir itself.
        await asyncio.to_thread(shutil.rmtree, data)
        argv = [
            etcdctl,
            "snapshot",
            "restore",
            str(self.recovery_snapshot),
            f"--name={self.name}",
            f"--initial-cluster={self.name}={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--data-dir={data}",
        ]
        result = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, check=False, env={"ETCDCTL_API": "3"}
        )
        if result.returncode != 0:
            data.mkdir(parents=True, exist_ok=True)
            raise EtcdRefused(
                f"etcdctl snapshot restore failed: {result.stderr.strip() or result.stdout.strip()}"
            )
        data.chmod(0o700)
        self.recovery_snapshot.unlink()
        log.info("etcd: restored the snapshot into %s", data)

    async def _join(self, peer: str) -> etcd_rules.JoinPlan:
        """Join through the control plane endpoint. While etcd refuses the change only because the
        cluster is settling (a learner already joining, a member not started yet, not connected
        to every voter for long enough) the join is asked again every :data:`JOIN_POLL` seconds
        for up to :data:`JOIN_POLL_WINDOW`: that clears within seconds, and waiting out the
        supervisor's back-off instead made a third control plane node start up to 10 s after
        the second one's promotion. Anything else (the endpoint not up yet, etcd unreachable, a
        refusal), or a window that ran out, fails the pre-start step: a service event, tried
        again after the back-off with the endpoints looked up anew."""
        if self._join_started is None:
            self._join_started = time.monotonic()
        waited = time.monotonic() - self._join_started
        patience = "" if waited < JOIN_PATIENCE else f" (still failing after {waited / 60:.0f} min)"
        try:
            endpoints = await self.discover()
        except Exception as exc:
            raise EtcdNotReady(f"control plane endpoint not up yet{patience}: {_describe(exc)}") from exc
        where = f"joining etcd at {', '.join(endpoints)}"

        async def attempt() -> etcd_rules.JoinPlan:
            async with self.client(endpoints) as client:
                try:
                    return await join(client, name=self.name, peer=peer)
                except client_errors.EtcdError as exc:
                    if isinstance(exc, client_errors.EtcdConflict) and exc.retryable:
                        raise retry.NotYet(str(exc)) from exc
                    raise EtcdNotReady(f"{where}{patience}: {exc}") from exc

        wait = retry.Wait(
            what="etcd to let this node join", timeout=JOIN_POLL_WINDOW, backoff=retry.fixed(JOIN_POLL)
        )
        try:
            plan = await wait.poll_async(attempt)
        except retry.WaitTimeout as exc:
            raise EtcdNotReady(f"{where}{patience}: {exc}") from exc
        self._join_started = None
        self._voters = endpoints
        return plan

    async def discover(self) -> list[str]:
        """etcd client URLs of the control plane nodes, from ``Endpoints default/kubernetes``."""
        cluster = self.document.model.cluster
        try:
            authority, admin = cluster_admin_client(
                self.document,
                common_name=f"kubeplane:etcd-join:{self.name}",
                lifetime=datetime.timedelta(hours=1),
            )
        except ValueError as exc:
            raise EtcdRefused(f"{exc}: it cannot discover etcd peers") from exc
        kubeconfig = pki.kubeconfig(
            cluster_name=cluster.cluster_name or "kubernetes",
            server=cluster.control_plane.endpoint,
            ca_cert=authority.cert,
            user=f"kubeplane:etcd-join:{self.name}",
            client=admin,
        )
        try:
            addresses = await trustd.control_plane_addresses(kubeconfig, timeout=_PROBE_TIMEOUT)
        except client_errors.KubeError as exc:
            raise EtcdNotReady(f"{cluster.control_plane.endpoint.rstrip('/')}: {exc}") from exc
        ips = [ip for ip in addresses if ip != self.node_ip]
        if not ips:
            raise EtcdNotReady("Endpoints default/kubernetes lists no other control plane node yet")
        return [etcd_rules.client_url(ip) for ip in ips]

    def tls(self) -> ssl.SSLContext:
        """The node's etcd client TLS context, rebuilt only when one of its files changed.

        The health check asks for a client every few seconds; building a context parses the CA
        and stages the key pair through a temporary directory, so it is kept until a rotation
        replaces a file (a new inode, size or modification time), and three ``stat`` calls are
        all a health check costs on the event loop.
        """
        files = (self.certs.ca, self.certs.client_crt, self.certs.client_key)
        stamp = tuple(_file_stamp(path) for path in files)
        if self._tls is None or self._tls[0] != stamp:
            context = etcd_client.tls_context(
                ca=self.certs.ca.read_bytes(),
                cert=self.certs.client_crt.read_bytes(),
                key=self.certs.client_key.read_bytes(),
            )
            self._tls = (stamp, context)
        return self._tls[1]

    def client(self, endpoints: list[str] | None = None) -> etcd_client.EtcdClient:
        """A client of this node's etcd (or of ``endpoints``) with the node's etcd client certificate."""
        return etcd_client.EtcdClient(
            endpoints or [etcd_rules.client_url("127.0.0.1")], tls=self.tls(), timeout=5.0
        )

    async def _health(self) -> None:
        try:
            async with self.client() as client:
                status = await client.status()
                metrics.set_etcd_member(learner=status.is_learner)
                if status.is_learner:
                    await self._promote(status.member_id)
                # A range request is linearizable by default: it needs the leader and a quorum.
                await client.get(b"kubeplane:v1:health")
        except Exception:
            metrics.ETCD_HEALTH_CHECKS.labels(result="error").inc()
            raise
        metrics.ETCD_HEALTH_CHECKS.labels(result="ok").inc()
        if self.bootstrap_state() == "requested":
            await asyncio.to_thread(write_atomic, self.marker, "done\n")

    async def _promote(self, member_id: int) -> None:
        """Ask the voting members to promote our learner; EtcdNotReady while it catches up."""
        endpoints = self._voters or await self.discover()
        async with self.client(endpoints) as voters:
            try:
                await promote(voters, member_id)
            except client_errors.EtcdLearnerNotReady as exc:
                raise EtcdNotReady(
                    f"etcd learner {member_id:x} is catching up with the leader; promotion is retried: {exc}"
                ) from exc
            except client_errors.EtcdUnavailable:
                # The members we joined through may be gone: ask the control plane next time.
                self._voters = None
                raise
        log.info("etcd: learner %x promoted to a voting member", member_id)

    # -- operations -------------------------------------------------------------------------

    async def bootstrap_refusal(self) -> str | None:
        return etcd_rules.bootstrap_refusal(
            control_plane=self.document.model.machine.is_control_plane,
            bootstrapped=self.bootstrap_state() is not None,
            has_data=self.has_data(),
            other_cluster=await self.probe_other_cluster(),
        )

    async def probe_other_cluster(self) -> str | None:
        """What answers at the control plane endpoint (an API server means a bootstrapped cluster).

        Not a Kubernetes API call, so not through :class:`kubeplane.clients.kube.KubeClient`: any
        HTTP answer counts, from a server whose certificate this node may not trust yet and
        without credentials (a 401 says just as well that a cluster is there).
        """
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        endpoint = self.document.model.cluster.control_plane.endpoint.rstrip("/")
        try:
            async with httpx.AsyncClient(verify=False, timeout=_PROBE_TIMEOUT, trust_env=False) as http:  # noqa: S501
                response = await http.get(f"{endpoint}/version")
        except httpx.HTTPError:
            return None
        return f"the control plane endpoint {endpoint} answers (HTTP {response.status_code})"

    def request_bootstrap(self, snapshot: bytes | None) -> None:
        if snapshot is not None:
            self.recovery_snapshot.parent.mkdir(parents=True, exist_ok=True)
            self.recovery_snapshot.write_bytes(snapshot)
        write_atomic(self.marker, "requested\n")

    async def members(self) -> list[dict[str, Any]]:
        """The cluster's members, as this node's etcd sees them; a learner (which serves no
        member list) asks the voting members it joined through, or the ones the control plane
        lists."""
        try:
            return await self._members(self.client())
        except client_errors.EtcdLearnerRefused:
            return await self._members(self.client(self._voters or await self.discover()))

    @staticmethod
    async def _members(etcd: etcd_client.EtcdClient) -> list[dict[str, Any]]:
        async with etcd as client:
            members = await client.member_list()
            leader = 0
            with contextlib.suppress(client_errors.EtcdError):
                leader = (await client.status()).leader
        return [
            {
                "id": f"{m.id:x}",
                "name": m.name,
                "peer_urls": m.peer_urls,
                "client_urls": m.client_urls,
                "learner": m.is_learner,
                "leader": m.id == leader,
            }
            for m in members
        ]

    async def leave_plan(self, *, force: bool) -> int:
        """Our member ID, after checking that leaving keeps a quorum (unless ``force``)."""
        async with self.client() as client:
            members = await client.member_list()
            ours = next((m for m in members if m.name == self.name), None)
            if ours is None:
                raise EtcdRefused(f"node {self.name} is not an etcd member")
            healthy = await _healthy(client, members)
            refusal = etcd_rules.leave_refusal(members, leaving=ours.id, healthy=healthy)
            if refusal is not None and not force:
                raise EtcdRefused(f"refusing to leave etcd: {refusal}; pass --force to leave anyway")
        return ours.id

    async def outage_plan(self) -> None:
        """Check that this member may go down for a while (an agent upgrade keeping its data):
        EtcdRefused naming the reason when etcd would lose its quorum meanwhile."""
        async with self.client() as client:
            members = await client.member_list()
            ours = next((m for m in members if m.name == self.name), None)
            if ours is None:
                raise EtcdRefused(f"node {self.name} is not an etcd member")
            refusal = etcd_rules.outage_refusal(
                members, stopping=ours.id, healthy=await _healthy(client, members)
            )
        if refusal is not None:
            raise EtcdRefused(f"refusing to stop etcd on {self.name}: {refusal}")

    async def remove_member(self, member: str) -> str:
        """Remove another member, by name or hex ID: the cleanup after a node was reset without
        leaving (``reset --graceful=false``) or was lost. Refused when it would cost the quorum."""
        async with self.client() as client:
            members = await client.member_list()
            wanted = member.strip().lower()
            target = next((m for m in members if m.name == member or f"{m.id:x}" == wanted), None)
            if target is None:
                known = ", ".join(f"{m.name or '(unstarted)'} ({m.id:x})" for m in members)
                raise EtcdRefused(f"no etcd member {member!r}; the members are {known}")
            if target.name == self.name:
                raise EtcdRefused(f"{member} is this node: use `etcd leave` on it instead")
            refusal = etcd_rules.leave_refusal(
                members, leaving=target.id, healthy=await _healthy(client, members)
            )
            if refusal is not None:
                raise EtcdRefused(f"refusing to remove member {member}: {refusal}")
            await client.member_remove(target.id)
        return f"removed etcd member {target.name or '(unstarted)'} ({target.id:x})"

    async def remove_self(self, member_id: int) -> None:
        async with self.client() as client:
            members = await client.member_list()
        others = [url for m in members if m.id != member_id for url in m.client_urls[:1]]
        # Ask another member: the leaving one may be the leader and must not remove itself mid-answer.
        async with self.client(others or None) as client:

            async def remove() -> bool:
                # NotFound: an earlier attempt removed it and its answer was lost.
                with contextlib.suppress(client_errors.EtcdNotFound):
                    await client.member_remove(member_id)
                return True

            # etcd answers "unhealthy cluster" (UNAVAILABLE) while a member that just came back
            # has been connected to the leader for less than its health interval (5 s), although
            # the quorum check above counted it: a moment later the removal goes through.
            await retry.Wait(
                what=f"etcd to remove member {member_id:x}",
                timeout=MEMBER_REMOVE_TIMEOUT,
                backoff=retry.fixed(0.5),
                retry_on=(client_errors.EtcdUnavailable,),
                error=client_errors.EtcdUnavailable,
            ).poll_async(remove)

    def wipe(self) -> None:
        shutil.rmtree(self.paths.etcd_data, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.marker.unlink()

    async def forfeit_leadership(self, *, released: Sequence[bytes] = (), wait: float = 0.0) -> str:
        """Hand this member's leadership to another voter, if it leads; nodes holding a shared VIP
        are asked last.

        A VIP holder that also leads etcd makes its own loss slow: an etcd election first, then
        the new leader extends every lease, the VIP's too, before another node can take the VIP
        (:mod:`kubeplane.services.vip_election`). Left to itself, etcd would hand leadership to
        its most up-to-date follower on the way down, holder or not. ``released``: VIP keys this
        node has just given up; up to ``wait`` seconds go to letting another node take each
        first, so that its new holder is known here.
        """
        async with self.client() as client:
            endpoint = client.endpoints[0]
            if not (await client.status(endpoint)).is_leader:
                return f"{self.name} is not the etcd leader; nothing to do"
            holders = await vip_holders(client, me=self.name, released=released, wait=wait)
            try:
                target = await client.hand_over_leadership(endpoint, last=holders)
            except client_errors.EtcdUnavailable as exc:
                raise EtcdRefused(f"moving the etcd leadership failed: {exc}") from exc
        if target is None:
            return f"{self.name} is the only etcd member; it stays leader"
        return f"leadership moved from {self.name} to {target.name}"

    async def snapshot(self) -> AsyncIterator[bytes]:
        """A consistent snapshot of this member's database, in chunks."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        class _Sink:
            def write(self, data: bytes) -> int:
                queue.put_nowait(data)
                return len(data)

        sink: Any = _Sink()
        async with self.client() as client:
            task = asyncio.create_task(client.snapshot(sink))
            task.add_done_callback(lambda _: queue.put_nowait(None))
            while (chunk := await queue.get()) is not None:
                yield chunk
            await task


async def join(client: etcd_client.EtcdClient, *, name: str, peer: str) -> etcd_rules.JoinPlan:
    """Make room for the node ``name`` (empty data dir, peer URL ``peer``) in the cluster.

    Carries out :func:`~kubeplane.services.etcd.plan_join`: removes a member of ours that lost
    its data, adds us as a learner unless an unstarted member of ours can be reused. Safe to
    repeat after any failure: each step re-reads the member list.
    """
    plan = etcd_rules.plan_join(await client.member_list(), name=name, peer=peer)
    if plan.remove is not None:
        log.warning(
            "etcd: member %x is named %s but this node's data dir is empty: removing it to join anew",
            plan.remove,
            name,
        )
        with contextlib.suppress(client_errors.EtcdNotFound):
            await client.member_remove(plan.remove)
    if plan.add:
        try:
            added = await client.member_add([peer], learner=True)
        except client_errors.EtcdNotFound as exc:
            # Seen right after removing a member that was just killed (it may have led): the
            # cluster is still settling its membership, and a new plan from a fresh list works.
            raise client_errors.EtcdUnavailable(
                f"etcd could not add {name} yet, its membership is changing: {exc.message}",
                endpoint=exc.endpoint,
            ) from exc
        log.info("etcd: added learner %x with peer URL %s", added.id, peer)
    else:
        log.info("etcd: reusing member %x, which never started", plan.reuse or 0)
    return plan


async def promote(client: etcd_client.EtcdClient, member_id: int) -> None:
    """Promote learner ``member_id`` to a voting member (a member that votes already is done).

    Raises :class:`~kubeplane.clients.errors.EtcdLearnerNotReady` (retryable) while the learner
    has not caught up with the leader.
    """
    with contextlib.suppress(client_errors.EtcdMemberNotLearner):
        await client.member_promote(member_id)


def _describe(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


async def _healthy(client: etcd_client.EtcdClient, members: Sequence[etcd_client.Member]) -> set[int]:
    """The IDs of the members that answer a status request on their first client URL."""
    healthy = set()
    for member in members:
        for url in member.client_urls[:1]:
            with contextlib.suppress(client_errors.EtcdError):
                healthy.add((await client.status(url)).member_id)
    return healthy
