"""The node lifecycle: maintenance mode, boot, apply-config in its three modes, reboot, shutdown.

A node without a machine config runs in maintenance mode: the API serves plain TLS and accepts
only ``apply-config --insecure``. Once a config is persisted the node *boots*: it builds a fresh
resource state from the config, starts the controller runtime and the services, and serves the
secure API (mutual TLS with certificates issued from ``machine.ca``).

A *reboot* (``apply-config`` default mode, ``kubeplane reboot``) stops services and controllers in
order, promotes a staged config, and boots again: the agent process stays, as a machine would
stay powered, but everything the config drives restarts. Only the machine config files survive
(REFERENCE.md §2: state is rebuilt from the config at start).

An agent upgrade (:meth:`Node.upgrade`, :mod:`kubeplane.agent.upgrade`) lets a kube-apiserver
shut down gracefully, stops the node as a reboot does, then replaces the agent's code: the process
re-executes itself into the new build, keeping its PID; a build staged for later is started by
the next reboot or start of the agent.

Config changes are serialised by one lock; a rejected config changes nothing on disk or in the
state.

Recovery: a booted node's API stays reachable through its whole boot, so a wrong config can be
fixed. The one wait of the boot, a worker asking trustd for its node API certificate (which fails
while ``cluster.controlPlane.endpoint`` is wrong), runs in the background without the lock, in
bounded attempts whose progress ``version`` (``phase``, ``waiting``) and the events show.
Meanwhile the worker serves the secure API with the certificate it got last (:mod:`.nodecert`)
or, when it never got one, the maintenance API, where ``apply-config --insecure`` replaces the
config and boots again. On the secure API the default apply mode is refused until the boot
finishes; ``--immediate`` (the boot retries with the new config at once) and ``--on-reboot`` then
``kubeplane reboot`` (which interrupts the wait) work.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import datetime
import fcntl
import functools
import ipaddress
import json
import logging
import os
import re
import socket
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cryptography import x509
from cryptography.x509.oid import NameOID

import kubeplane
from kubeplane import api, config, lazy, pki, resources
from kubeplane.agent import nodecert
from kubeplane.agent import upgrade as node_upgrade
from kubeplane.agent.backend import AgentBackend
from kubeplane.agent.events import EventLog
from kubeplane.agent.store import ConfigStore
from kubeplane.config.paths import NodePaths
from kubeplane.resources import catalog
from kubeplane.runtime import Controller, Runtime
from kubeplane.services import logs as service_logs

# What only a booted node uses is imported when the node boots, not while it waits in maintenance
# mode for its first config (kubeplane.lazy; docs/architecture.md, Memory).
if TYPE_CHECKING:
    from kubeplane.agent import containers as node_containers
    from kubeplane.agent import controllers, selfhosted
    from kubeplane.agent import etcd as node_etcd
    from kubeplane.agent import reset as node_reset
    from kubeplane.agent import services as node_services
    from kubeplane.api import trustd
    from kubeplane.clients import errors as client_errors
    from kubeplane.controllers.network import vip as vip_controller
    from kubeplane.controllers.secrets import common as secrets_common
    from kubeplane.controllers.secrets import kubernetes as kubernetes_secrets
    from kubeplane.services import supervisor, vip, wireguard_io
else:
    node_containers = lazy.module("kubeplane.agent.containers")
    controllers = lazy.module("kubeplane.agent.controllers")
    selfhosted = lazy.module("kubeplane.agent.selfhosted")
    node_etcd = lazy.module("kubeplane.agent.etcd")
    node_reset = lazy.module("kubeplane.agent.reset")
    node_services = lazy.module("kubeplane.agent.services")
    trustd = lazy.module("kubeplane.api.trustd")
    client_errors = lazy.module("kubeplane.clients.errors")
    vip_controller = lazy.module("kubeplane.controllers.network.vip")
    secrets_common = lazy.module("kubeplane.controllers.secrets.common")
    kubernetes_secrets = lazy.module("kubeplane.controllers.secrets.kubernetes")
    supervisor = lazy.module("kubeplane.services.supervisor")
    vip = lazy.module("kubeplane.services.vip")
    wireguard_io = lazy.module("kubeplane.services.wireguard_io")

log = logging.getLogger("kubeplaned")


def load_booted_modules() -> None:
    """Import what the agent otherwise imports on first use: the modules only a booted node runs
    (``kubeplane.lazy``) and the config models. A booting node does it in a thread, so the
    imports do not hold up the API it serves meanwhile; an upgrade's check of a new build does it
    to refuse a build that could not boot (:func:`kubeplane.agent.main.check`)."""
    lazy.load_all()
    for name in config.__all__:
        getattr(config, name)


T = TypeVar("T")

#: Delay between answering a call and acting on it (reboot, leaving maintenance), so the answer
#: reaches the caller before the API server restarts.
_ACT_AFTER = 0.2
#: How long an upgrading node waits for its kube-apiserver's graceful shutdown (requests in flight
#: finish, idle client connections are closed) before its services stop as in a reboot, which
#: kills what is left; the rest of that shutdown is waiting for long-running watches.
APISERVER_STOP_TIMEOUT = 10.0
#: How long an ``--immediate`` endpoint change waits for the restarted kubelet to be healthy before
#: the static pods change (then they change anyway).
KUBELET_RESTART_WAIT = 30.0
#: How long a halting control plane node spends handing its etcd leadership over (then etcd does
#: it as it stops), and of that how long it waits for another node to take the VIPs it gave up.
HALT_HANDOVER_TIMEOUT = 5.0
VIP_TAKEOVER_WAIT = 1.0
#: The CRI label naming a container within its pod.
_CONTAINER_NAME_LABEL = "io.kubernetes.container.name"
#: Lifetime of an admin kubeconfig issued by the node when the secrets have none yet.
_ADMIN_KUBECONFIG_LIFETIME = datetime.timedelta(days=365)
#: Bounds of the wait between a worker's attempts to get its node API certificate, in seconds.
CERTIFICATE_RETRY_MIN = 1.0
CERTIFICATE_RETRY_MAX = 10.0
#: How long a config applied with ``--mode try`` waits for its confirmation by default.
DEFAULT_TRY_SECONDS = 60
#: Bounds of a client certificate's lifetime (``kubeplane config new --crt-ttl``), in seconds.
MIN_CLIENT_LIFETIME = 60
MAX_CLIENT_LIFETIME = 10 * 365 * 86400
_CLIENT_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")


_SIOCGIFCONF = 0x8912
#: ``struct ifreq``: a 16-byte interface name, then a union as large as ``struct ifmap``.
IFREQ_SIZE = 16 + max(16, struct.calcsize("@LLHBBB0L"))


def ifconf_addresses(data: bytes) -> list[str]:
    """The IPv4 addresses in an ``SIOCGIFCONF`` answer (``struct ifreq`` records), loopback excluded."""
    found = []
    for offset in range(0, len(data) - IFREQ_SIZE + 1, IFREQ_SIZE):
        # The union starts with a sockaddr_in: family (2 bytes), port (2), address (4).
        family = struct.unpack_from("@H", data, offset + 16)[0]
        if family != socket.AF_INET:
            continue
        ip = socket.inet_ntoa(data[offset + 20 : offset + 24])
        if not ipaddress.ip_address(ip).is_loopback:
            found.append(ip)
    return found


def local_addresses() -> list[str]:
    """IPv4 addresses of this network namespace's interfaces (loopback excluded), interface by interface.

    Asked of the kernel with the ``SIOCGIFCONF`` ioctl, as ``ip -4 addr`` lists them: no
    subprocess on the event loop, and nothing that waits.
    """
    records = 64
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while True:
                buffer = array.array("B", bytes(records * IFREQ_SIZE))
                request = struct.pack("@iP", len(buffer), buffer.buffer_info()[0])
                used = struct.unpack("@iP", fcntl.ioctl(sock.fileno(), _SIOCGIFCONF, request))[0]
                if used + IFREQ_SIZE <= len(buffer):  # room to spare: nothing was left out
                    return ifconf_addresses(buffer.tobytes()[:used])
                records *= 4
    except OSError:
        return []


class Node:
    """One kubeplaned: owns the config store, the resource state, the runtime and the API server."""

    def __init__(self, *, root: Path, listen: str, name: str | None = None, services: bool = True) -> None:
        self.paths = NodePaths(root)
        self._services_enabled = services
        self.store = ConfigStore(self.paths)
        self.registry = resources.default_registry()
        self.listen = listen
        host = listen.rpartition(":")[0].strip("[]")
        self._listen_host = host if host not in ("", "0.0.0.0", "::") else None  # noqa: S104
        self._name_override = name
        self.name = name or self._listen_host or socket.gethostname()
        self.maintenance = True
        #: Where the boot sequence is: ``maintenance``, ``booting``, ``running`` (``version`` shows it).
        self.phase = "maintenance"
        #: What an unfinished boot waits for, and how it is going (None when it waits for nothing).
        self.boot_wait: str | None = None
        #: Whether the API is the maintenance one although the node has a config: a worker whose
        #: boot waits for its first node API certificate (see "Recovery" in the module docstring).
        self.insecure_api = False
        self.state: resources.State | None = None
        self._runtime: Runtime | None = None
        self._wireguard: wireguard_io.Daemons | None = None
        self._controllers: list[Controller] = []
        #: The shared VIPs of the config: never one of the node's own addresses.
        self._vips: frozenset[str] = frozenset()
        self.services: node_services.NodeServices | None = None
        self._trustd: trustd.TrustdServer | None = None
        self._server: api.NodeAPIServer | None = None
        self._backend = AgentBackend(self)
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.events = EventLog()
        # A config applied with --mode try: the task that rolls it back unless confirmed.
        self._trial: asyncio.Task[None] | None = None
        # A worker's boot asking trustd for its node API certificate, and how to make it retry now.
        self._certificate_wait: asyncio.Task[None] | None = None
        self._retry_now = asyncio.Event()
        # The last supervisor event reported per service (the observer sees every change).
        self._reported: dict[str, supervisor.Event] = {}

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until :meth:`stop`; boots immediately when a config was persisted earlier.

        Starting the agent is the node starting up: a config staged with ``--on-reboot`` takes
        effect now, exactly as it would after ``kubeplane reboot``.
        """
        if await asyncio.to_thread(self.store.promote_staged):
            log.info("applied the machine config staged for this boot")
            self.events.emit("config", "on-reboot", "applied the machine config staged for this boot")
        document = await asyncio.to_thread(self.store.current)
        if document is None:
            log.info(
                "no machine config under %s: maintenance mode, waiting for apply-config --insecure",
                self.paths.root,
            )
            self.events.emit(
                "sequence", "maintenance", "no machine config: waiting for apply-config --insecure"
            )
            self._server = await api.serve_maintenance(
                backend=self._backend, node=self.name, listen=self.listen
            )
        else:
            await self._boot(document)
        try:
            await self._stopped.wait()
        finally:
            await self._shutdown()

    def stop(self) -> None:
        self._stopped.set()

    async def _boot(self, document: config.MachineConfig) -> None:
        """Start state, controllers and the secure API for ``document``."""
        self.maintenance = False
        self.phase = "booting"
        await asyncio.to_thread(load_booted_modules)
        model = document.model
        hostname = model.machine.network.hostname if model.machine.network else None
        self._vips = frozenset(address.ip for address in vip.desired(model.machine.network))
        self.name = self._name_override or hostname or self._listen_host or socket.gethostname()
        self.events.emit("sequence", "boot", f"booting as {model.machine.type}")
        state = resources.State(self.registry)
        self._publish_config(state, document)
        state.create(
            catalog.NETWORK_NAMESPACE,
            catalog.NODE_ADDRESSES,
            catalog.NODE_ADDRESSES_ID,
            spec=catalog.NodeAddressesSpec(hostname=self.name, addresses=self._addresses()),
        )
        runtime = Runtime(state, on_error=self._report_controller_error)
        self._wireguard = wireguard_io.Daemons(log_dir=self.paths.logs)
        self._controllers = controllers.for_node(paths=self.paths, wireguard=self._wireguard)
        for controller in self._controllers:
            runtime.register(controller)
        await runtime.start()
        self.state, self._runtime = state, runtime
        if self._services_enabled:
            addresses = self._addresses()
            # Built in a thread: it reads the machine ID from disk (no event loop is needed to
            # construct it; its locks and events bind to the loop on first use).
            services = await asyncio.to_thread(
                node_services.NodeServices,
                paths=self.paths,
                document=document,
                name=self.name,
                node_ip=addresses[0] if addresses else "127.0.0.1",
                state=state,
                emit=functools.partial(self.events.emit, "sequence", "time"),
            )
            services.supervisor.add_observer(self._report_service)
            await services.start()
            self.services = services
        if self._server is None:
            await self._serve_api(document)
        if self._certificate_wait is not None:
            return  # the boot finishes when the certificate comes (_wait_for_certificate)
        self.phase = "running"
        log.info("node %s booted as %s", self.name, model.machine.type)
        self.events.emit("sequence", "boot", f"node {self.name} booted as {model.machine.type}")

    async def _serve_api(self, document: config.MachineConfig) -> None:
        """Start the secure node API (and trustd on a node holding the OS CA key).

        A worker asks trustd for its certificate without holding up the boot: meanwhile it serves
        with the certificate it got last (:mod:`.nodecert`) or, having none, the maintenance API,
        so the node can always be reached to fix its config.
        """
        model = document.model
        ca = model.machine.ca
        if ca is None or not ca.crt:
            raise RuntimeError("machine.ca is missing: the node API cannot have a certificate")
        if not ca.key:
            held = await asyncio.to_thread(nodecert.load, self.paths, ca.crt_pem())
            if held is not None:
                await self._serve_secure(held, None, model.machine)
            else:
                self.insecure_api = True
                self._server = await api.serve_maintenance(
                    backend=self._backend, node=self.name, listen=self.listen
                )
            self._retry_now.clear()
            self.boot_wait = "the node API certificate from trustd (first attempt under way)"
            self._certificate_wait = self._start_task(self._wait_for_certificate())
            return
        credentials, proxy = self._issued_credentials(document)
        await self._serve_secure(credentials, proxy, model.machine)
        if self._trustd is not None and self._trustd.port != model.machine.trustd_port:
            await self._trustd.stop()  # machine.ports.trustd changed: serve on the new port
            self._trustd = None
        if self._trustd is None:
            trustd_server = trustd.TrustdServer(
                token=model.machine.token or "",
                ca=pki.CertKey(cert=ca.crt_pem(), key=ca.key_pem()),
                credentials=credentials,
                endpoint=model.cluster.control_plane.endpoint,
            )
            host = self._listen_host or "0.0.0.0"  # noqa: S104
            await trustd_server.start(trustd.target(host, model.machine.trustd_port))
            self._trustd = trustd_server

    async def _serve_secure(
        self, credentials: api.Credentials, proxy: api.Credentials | None, machine: config.models.Machine
    ) -> None:
        self.insecure_api = False
        self._server = await api.serve(
            backend=self._backend,
            node=self.name,
            credentials=credentials,
            proxy_credentials=proxy,
            listen=self._secure_listen(machine),
            local_names=self._local_names(),
            proxy_port=machine.node_api_port,
        )

    def _start_task(self, work: Awaitable[None]) -> asyncio.Task[None]:
        """Run ``work`` in the background; shutting the agent down cancels it."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _report_controller_error(self, controller: str, error: Exception) -> None:
        self.events.emit("controller", controller, f"reconcile failed: {error}")

    def _report_service(self, snapshot: supervisor.ServiceSnapshot) -> None:
        event = snapshot.last_event
        if event is None or self._reported.get(snapshot.id) == event:
            return
        self._reported[snapshot.id] = event
        self.events.emit("service", snapshot.id, f"[{event.state.value}] {event.message}")

    async def _halt(self) -> None:
        """Stop services (dependents first) then controllers; the API server stays up."""
        self._end_trial()  # the node comes back with its saved config: nothing to roll back
        if self._certificate_wait is not None:
            self._certificate_wait.cancel()
            self._certificate_wait = None
        self.boot_wait = None
        if self._runtime is not None:
            self.events.emit("sequence", "halt", "stopping services and controllers")
        # The shared VIP goes first, while etcd and the kube-apiserver still run.
        released: list[bytes] = []
        for controller in self._controllers:
            if isinstance(controller, vip_controller.VipController):
                released += await controller.release()
        if self.services is not None:
            if self.services.etcd is not None:
                await self._hand_over_etcd_leadership(self.services.etcd, released)
            await self.services.stop()
            self.services = None
        if self._runtime is not None:
            await self._runtime.stop()
        self._controllers = []
        # After the controllers: none of them can start a device again.
        if self._wireguard is not None:
            await self._wireguard.stop_all()
        self._runtime = None
        self._wireguard = None
        self.state = None

    async def _hand_over_etcd_leadership(self, etcd: node_etcd.EtcdMember, released: list[bytes]) -> None:
        """Before etcd stops, its leadership goes to a voter that holds no shared VIP (etcd's own
        hand-over on SIGTERM picks its most up-to-date follower, which may be the VIP's holder;
        see :meth:`EtcdMember.forfeit_leadership`). Bounded: on failure etcd hands it over itself."""
        try:
            async with asyncio.timeout(HALT_HANDOVER_TIMEOUT):
                wait = VIP_TAKEOVER_WAIT if released else 0.0
                said = await etcd.forfeit_leadership(released=released, wait=wait)
        except (TimeoutError, node_etcd.EtcdRefused, client_errors.EtcdError) as exc:
            log.info("halting: etcd leadership not handed over (%s); etcd does it as it stops", exc)
            return
        log.info("halting: %s", said)

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._halt()
        if self._trustd is not None:
            await self._trustd.stop()
            self._trustd = None
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None

    def _secure_listen(self, machine: config.models.Machine) -> str:
        """Where the secure node API listens: ``--listen``, on ``machine.ports.nodeAPI`` when set.

        Maintenance mode always uses ``--listen``: a node without a config is found on the port
        it was started with; the config then moves its API to the cluster's port.
        """
        if machine.ports is None or machine.ports.node_api is None:
            return self.listen
        return f"{self.listen.rpartition(':')[0]}:{machine.ports.node_api}"

    def _addresses(self) -> list[str]:
        """The node's addresses, the one it listens on first (what peers know it by); never a
        shared VIP, which this node may hold now and another one a moment later (so it is no
        kubelet node IP, no etcd peer address and in no certificate of the node)."""
        first = [self._listen_host] if self._listen_host and pki.is_ip(self._listen_host) else []
        own = (address for address in local_addresses() if address not in self._vips)
        return list(dict.fromkeys([*first, *own]))

    def _local_names(self) -> list[str]:
        return sorted({self.name, "127.0.0.1", "localhost", *self._addresses()})

    def _issued_credentials(self, document: config.MachineConfig) -> tuple[api.Credentials, api.Credentials]:
        """Server and proxy certificates for the node API, issued here from the OS CA (``machine.ca``)."""
        machine = document.model.machine
        ca = machine.ca
        assert ca is not None and ca.key  # only nodes holding the OS CA key issue their own
        dns, ips = pki.split_sans([*self._local_names(), *(machine.cert_sans or [])])
        authority = pki.CertKey(cert=ca.crt_pem(), key=ca.key_pem())
        server = pki.issue(
            ca=authority, common_name=self.name, dns_names=dns, ip_addresses=ips, usages=("server",)
        )
        proxy = pki.issue(
            ca=authority, common_name=self.name, organizations=(api.ROLE_PROXY,), usages=("client",)
        )
        return (
            api.Credentials(ca=authority.cert, cert=server.cert, key=server.key),
            api.Credentials(ca=authority.cert, cert=proxy.cert, key=proxy.key),
        )

    async def _wait_for_certificate(self) -> None:
        """Ask trustd for the node API certificate until it signs one, then serve with it.

        Each attempt is bounded (trustd's answer and the Endpoints lookup time out); between them
        the wait grows to :data:`CERTIFICATE_RETRY_MAX`, and an ``--immediate`` apply ends it at
        once. Every attempt reads the saved config, so a corrected endpoint is used at once. The
        lock is not held while waiting: applying a config, rebooting and resetting all stay
        possible. What the wait is at shows in ``version`` (``waiting``) and in the events.
        """
        delay, attempt, reported = CERTIFICATE_RETRY_MIN, 0, ""
        while True:
            document = await asyncio.to_thread(self.store.current)
            assert document is not None  # a booted node has a config
            attempt += 1
            self._retry_now.clear()
            try:
                credentials = await self._credentials_from_trustd(document)
                break
            except Exception as exc:  # every failed attempt is retried; a non-trustd error is logged whole
                if not isinstance(exc, trustd.TrustdError):
                    log.exception("asking trustd for the node API certificate failed")
                endpoint = document.model.cluster.control_plane.endpoint
                reason = f"the node API certificate from trustd (control plane endpoint {endpoint}): {exc}"
                self.boot_wait = f"{reason} (attempt {attempt}, next in {delay:g}s)"
                log.warning("boot waits for %s", self.boot_wait)
                if reason != reported:  # an event when the reason changes, not one per attempt
                    reported = reason
                    self.events.emit("sequence", "boot", f"waiting for {reason}; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry_now.wait(), delay)
            retried = self._retry_now.is_set()
            delay = CERTIFICATE_RETRY_MIN if retried else min(delay * 2, CERTIFICATE_RETRY_MAX)
        async with self._lock:
            if self._certificate_wait is not asyncio.current_task():
                return  # a reboot or reset started meanwhile
            self._certificate_wait = None
            self.boot_wait = None
            await asyncio.to_thread(nodecert.save, self.paths, credentials)
            if self._server is not None:
                await self._server.stop(grace=1.0)
                self._server = None
            await self._serve_secure(credentials, None, document.model.machine)
            self.phase = "running"
        message = f"got the node API certificate from trustd: node {self.name} booted as worker"
        log.info("%s", message)
        self.events.emit("sequence", "boot", message)

    async def _credentials_from_trustd(self, document: config.MachineConfig) -> api.Credentials:
        """A node certificate (O=kubeplane:node, no role) from trustd; see :mod:`kubeplane.api.trustd`.

        The CSR asks for this node's name and, for each trustd target, the one address that target
        sees the request come from (trustd refuses any other), plus loopback. ``machine.certSANs``
        are left out: trustd cannot check that a worker owns them. One attempt: raises TrustdError.
        """
        model = document.model
        ca = model.machine.ca
        assert ca is not None
        if model.machine.cert_sans:
            log.info(
                "machine.certSANs (%s) are left out of a worker's node API certificate: trustd signs "
                "only the node's own name and the address it sees",
                ", ".join(model.machine.cert_sans),
            )
        key = pki.generate_key()
        csr = functools.partial(node_csr, key, name=self.name, own=self._addresses())
        endpoint = model.cluster.control_plane.endpoint
        token, kubernetes_ca = model.cluster.token, model.cluster.ca

        async def discover() -> list[str]:
            if not token or kubernetes_ca is None or not kubernetes_ca.crt:
                raise trustd.TrustdError(
                    "the config has no cluster.token or cluster.ca to read Endpoints with"
                )
            return await control_plane_addresses(endpoint=endpoint, token=token, ca=kubernetes_ca.crt_pem())

        crt = await trustd.request_certificate(
            targets=trustd.endpoints(endpoint, port=model.machine.trustd_port),
            token=model.machine.token or "",
            csr=csr,
            ca=ca.crt_pem(),
            discover=discover,
            port=model.machine.trustd_port,
        )
        return api.Credentials(ca=ca.crt_pem(), cert=crt, key=key)

    def _after_reply(self, action: Callable[[], Awaitable[None]]) -> None:
        async def later() -> None:
            await asyncio.sleep(_ACT_AFTER)
            try:
                await action()
            except Exception:
                log.exception("node %s: background action failed", self.name)

        task = asyncio.get_running_loop().create_task(later())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- configuration ------------------------------------------------------------------------

    @staticmethod
    def _publish_config(state: resources.State, document: config.MachineConfig) -> None:
        state.modify(
            catalog.CONFIG_NAMESPACE,
            catalog.MACHINE_CONFIGS,
            catalog.MACHINE_CONFIG_ID,
            lambda _: catalog.MachineConfigSpec(data=document.to_dict()),
        )

    async def kubernetes_version(self) -> str | None:
        document = await asyncio.to_thread(self.store.current)
        if document is None:
            return None
        return document.model.cluster.api_server_image.rpartition(":")[2]

    async def apply_configuration(
        self, *, data: str, mode: str, dry_run: bool, try_seconds: int | None = None
    ) -> dict[str, Any]:
        """Validate ``data`` and apply it in ``mode`` (see the module docstring).

        ``try`` applies live like ``immediate`` but saves nothing: unless another apply confirms
        it within ``try_seconds`` (applying it with ``--immediate`` saves it), the node goes back
        to its saved config, as it would after a restart meanwhile.
        """
        try:
            # Parsing a big document takes seconds (and the first one imports the config models):
            # in a thread, the node serves meanwhile. A lambda, so config.load is looked up there.
            new = await asyncio.to_thread(lambda: config.load(data))
        except config.ConfigError as exc:
            raise api.InvalidArgumentError(
                f"invalid machine config: {len(exc.errors)} problem(s)",
                fields=[(error.path, error.message) for error in exc.errors],
            ) from exc
        async with self._lock:
            if (self.maintenance or self.insecure_api) and mode == "try":
                raise api.FailedPreconditionError(
                    "--mode try needs a booted node: a node in maintenance mode has no config to go back to"
                )
            if self.maintenance:
                return await self._apply_in_maintenance(new, dry_run=dry_run)
            old = await asyncio.to_thread(self.store.current)
            assert old is not None  # booted nodes always have a config
            if self.insecure_api:
                return await self._apply_while_insecure(old, new, dry_run=dry_run)
            if mode == "no-reboot":
                mode = "immediate"
            if mode in ("reboot", "try") and self._certificate_wait is not None:
                raise api.FailedPreconditionError(self._unfinished_boot_refusal(mode))
            # A dry run changes nothing, a pending try included; any other apply ends the try.
            trying = not dry_run and self._end_trial()
            allowed = config.allowed_modes(old, new)
            result: dict[str, Any] = {
                "mode": mode,
                "diff": config.diff(old, new),
                "allowed_modes": list(allowed.modes),
                "changed": list(allowed.changed),
            }
            refusal = allowed.refusal("immediate" if mode == "try" else mode)  # type: ignore[arg-type]
            if refusal is not None:
                if trying:
                    self._publish_current(old)  # the refused apply still ends the trial
                raise api.FailedPreconditionError(
                    refusal if mode != "try" else f"--mode try applies live, like --immediate: {refusal}"
                )
            if dry_run:
                result["message"] = f"dry run: the change would be applied in mode {mode!r}; nothing changed"
                return result
            if allowed.unchanged and mode != "on-reboot":
                if trying:
                    self._publish_current(old)
                    result["message"] = "the tried config is dropped: back to the saved config"
                else:
                    result["message"] = "config unchanged, nothing to apply"
                self.events.emit("config", mode, result["message"])
                return result
            if mode == "try":
                self._publish_current(new)
                seconds = try_seconds or DEFAULT_TRY_SECONDS
                self._trial = asyncio.get_running_loop().create_task(self._roll_back_after(seconds, old))
                self._tasks.add(self._trial)
                self._trial.add_done_callback(self._tasks.discard)
                result["message"] = (
                    f"config applied for a try: rolled back in {seconds}s unless applied again "
                    "with --immediate (nothing saved until then)"
                )
            elif mode == "on-reboot":
                await asyncio.to_thread(self.store.stage, new)
                if trying:
                    self._publish_current(old)  # staging ends the trial: the saved config runs
                result["message"] = "config staged; it takes effect at the next reboot"
            elif mode == "immediate":
                endpoint_changed = (
                    old.model.cluster.control_plane.endpoint != new.model.cluster.control_plane.endpoint
                )
                retarget = self._certificate_wait is None and endpoint_changed and self.services is not None
                if retarget and self.services is not None:
                    # The kubelet's kubeconfig names the endpoint: it is rewritten as the kubelet
                    # restarts (its containers keep running). First, and waited for, before the
                    # controllers see the new config and re-render the static pods: a kubelet that
                    # restarts while it replaces a static pod kills the old container at once
                    # (SIGTERM, then SIGKILL a few milliseconds later) instead of granting its
                    # grace period, and a kube-apiserver killed so drops its clients' connections
                    # without the GOAWAY (HTTP/2) or the idle-connection closes of its shutdown.
                    await self.services.reconfigure_kubelet(new, wait=KUBELET_RESTART_WAIT)
                await self._save(new, then=functools.partial(self._publish_current, new))
                if self.services is not None:
                    # What runs now keeps running; a service started again later (a kubelet
                    # restart) starts from the saved config, not the one the node booted with.
                    self.services.document = new
                result["message"] = "config applied immediately"
                if retarget:
                    result["message"] += "; the kubelet restarted to reach the new endpoint"
                if self._certificate_wait is not None:
                    # The boot has not finished: it retries now with the new config, and the
                    # kubelet restarts with it (its bootstrap kubeconfig names the endpoint).
                    self._retry_now.set()
                    if self.services is not None:
                        await self.services.reconfigure_kubelet(new)
                    result["message"] += "; the unfinished boot retries with it now"
            elif self.services is not None and config.kubelet_only(allowed.changed):
                # The change concerns the kubelet alone (its image, args, mounts): restart that
                # one service, never etcd or the static pods' containers.
                await self._save(new, then=functools.partial(self._publish_current, new))
                await self.services.reconfigure_kubelet(new)
                result["message"] = "config applied; only the kubelet restarts to apply it"
            else:
                await self._save(new, then=functools.partial(self._after_reply, self._reboot))
                result["message"] = "config applied; the node is rebooting to apply it"
            log.info("apply-config (%s): %s", mode, result["message"])
            self.events.emit("config", mode, result["message"])
            return result

    def _end_trial(self) -> bool:
        """Cancel a pending try rollback; whether one was pending (the caller settles the state)."""
        trial, self._trial = self._trial, None
        if trial is None:
            return False
        trial.cancel()
        return True

    async def _roll_back_after(self, seconds: float, saved: config.MachineConfig) -> None:
        await asyncio.sleep(seconds)
        async with self._lock:
            if self._trial is not asyncio.current_task():
                return  # another apply ended the trial while this waited for the lock
            self._trial = None
            self._publish_current(saved)
        message = f"the tried config was not confirmed within {seconds:g}s: rolled back to the saved config"
        log.info("apply-config (try): %s", message)
        self.events.emit("config", "try", message)

    async def _save(self, document: config.MachineConfig, *, then: Callable[[], None]) -> None:
        """Persist ``document`` as the applied config, drop a staged one, then call ``then``.

        The writes fsync, so they run in a thread; a caller cancelled meanwhile (the client went
        away) still gets ``then`` run once the config is on disk, as when it all ran at once.
        """

        def save() -> None:
            self.store.save(document)
            self.store.discard_staged()

        async def save_then() -> None:
            await asyncio.to_thread(save)
            then()

        task = asyncio.get_running_loop().create_task(save_then())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.shield(task)

    def _publish_current(self, document: config.MachineConfig) -> None:
        if self.state is not None:
            self._publish_config(self.state, document)

    def _unfinished_boot_refusal(self, mode: str) -> str:
        """Why ``mode`` (reboot, try) is refused while the boot waits, with the modes that work."""
        why = (
            "--mode try would not help: the boot retries with the saved config only"
            if mode == "try"
            else "The default mode applies a config by restarting what the boot started, which it "
            "does not do in the middle of the boot sequence"
        )
        return (
            f"node {self.name} has not finished booting: it is waiting for {self.boot_wait}. {why}. "
            "Apply with --immediate (changes under cluster, such as "
            "cluster.controlPlane.endpoint, take effect now and the boot retries with them), or with "
            f"--on-reboot and then `kubeplane -n {self.name} reboot` (a reboot interrupts the boot)"
        )

    async def _apply_while_insecure(
        self, old: config.MachineConfig, new: config.MachineConfig, *, dry_run: bool
    ) -> dict[str, Any]:
        """An ``--insecure`` apply to a worker that never got a node API certificate: the config
        replaces the saved one and the node boots again with it, whatever the mode (the node has
        not finished booting; nothing it runs can be reconfigured in place)."""
        changed = config.allowed_modes(old, new).changed
        result: dict[str, Any] = {"mode": "reboot", "diff": config.diff(old, new), "changed": list(changed)}
        if not changed:  # the same config again (a retried apply): the boot goes on as it was
            result["message"] = f"config unchanged; the node is still booting, waiting for {self.boot_wait}"
            return result
        if dry_run:
            result["message"] = (
                f"dry run: the node is waiting for {self.boot_wait}; it would boot again with this config"
            )
            return result
        await self._save(new, then=functools.partial(self._after_reply, self._reboot))
        result["message"] = "config applied; the node had not finished booting and boots again with it"
        log.info("apply-config (insecure, boot unfinished): %s", result["message"])
        self.events.emit("config", "maintenance", result["message"])
        return result

    async def _apply_in_maintenance(self, new: config.MachineConfig, *, dry_run: bool) -> dict[str, Any]:
        # There is no current config to diff against: the whole document is new.
        result: dict[str, Any] = {"mode": "reboot", "diff": "", "changed": ["."]}
        if dry_run:
            result["message"] = "dry run: the node would leave maintenance mode with this config"
            return result
        await asyncio.to_thread(self.store.save, new)
        self._after_reply(self._leave_maintenance)
        result["message"] = "config applied; the node leaves maintenance mode and boots"
        self.events.emit("config", "maintenance", result["message"])
        return result

    async def _leave_maintenance(self) -> None:
        async with self._lock:
            if self._server is not None:
                await self._server.stop(grace=1.0)
                self._server = None
            document = await asyncio.to_thread(self.store.current)
            assert document is not None
            await self._boot(document)

    async def request_reboot(self) -> dict[str, Any]:
        if self.maintenance:
            raise api.FailedPreconditionError("node is in maintenance mode: apply a config first")
        self._after_reply(self._reboot)
        return {"message": f"node {self.name} is rebooting"}

    async def _reboot(self) -> None:
        async with self._lock:
            log.info("reboot: stopping services and controllers")
            self.events.emit("sequence", "reboot", "rebooting")
            await self._halt()
            staged = await asyncio.to_thread(node_upgrade.startup_target, self.paths, dict(os.environ))
            if staged is not None:
                # An agent build staged with `upgrade --stage`: the reboot starts it, as a machine's would.
                await self._stop_servers()
                logging.shutdown()
                node_upgrade.exec_into(staged, sys.argv[1:])
            if await asyncio.to_thread(self.store.promote_staged):
                log.info("reboot: applied the staged machine config")
                self.events.emit("config", "on-reboot", "applied the machine config staged for this boot")
            if self._server is not None:
                await self._server.stop(grace=1.0)
                self._server = None
            document = await asyncio.to_thread(self.store.current)
            assert document is not None
            await self._boot(document)

    # -- reset ------------------------------------------------------------------------------

    async def reset(self, *, graceful: bool, reboot: bool, wipe: str | None, dry_run: bool) -> dict[str, Any]:
        """Leave the cluster and wipe the node (see :mod:`kubeplane.agent.reset`).

        Graceful (a control plane node that is an etcd member): the leave is checked first and a
        reset that would cost etcd its quorum is refused before anything changes; then leadership
        moves away and the member is removed. Cordoning and draining the Kubernetes node, and
        deleting its Node object afterwards, are the caller's (the CLI's): they need cluster
        credentials a worker does not hold. Not graceful: no leave, for a node whose cluster is
        broken (remove its member later from a healthy node).

        The services stop and the wipe happens before the reply, so the caller knows the kubelet
        is gone; then the node reboots (back in maintenance mode when its state was wiped) or,
        without ``reboot``, the agent stops.
        """
        if self.maintenance:
            raise api.FailedPreconditionError(
                f"node {self.name} is in maintenance mode: there is nothing to reset"
            )
        try:
            labels = node_reset.parse_labels(wipe)
        except node_reset.UnknownLabel as exc:
            raise api.InvalidArgumentError(str(exc), fields=[("wipe", str(exc))]) from exc
        async with self._lock:
            member_id = await self._etcd_leave_plan("a graceful reset") if graceful else None
            summary = {
                "hostname": self.name,
                "leaves_etcd": member_id is not None,
                "wipe": list(labels),
                "then": "reboot" if reboot else "stop",
            }
            if dry_run:
                return {**summary, "message": f"dry run: {self._reset_text(summary)}"}
            self.events.emit("sequence", "reset", f"resetting: {self._reset_text(summary)}")
            if member_id is not None:
                await self._leave_etcd(member_id)
            await self._halt()
            left = await asyncio.to_thread(node_reset.wipe, node_reset.directories(self.paths, labels))
            for message in left:
                log.warning("reset: %s", message)
        self._after_reply(functools.partial(self._after_reset, reboot=reboot))
        text = self._reset_text(summary)
        self.events.emit("sequence", "reset", f"reset done: {text}")
        return {**summary, "left": left, "message": f"node {self.name} reset: {text}"}

    async def _etcd_leave_plan(self, what: str) -> int | None:
        """This node's etcd member ID when it is one and may leave (None: not a member);
        FailedPreconditionError naming ``what`` when leaving would cost etcd its quorum."""
        etcd = self.services.etcd if self.services is not None else None
        if etcd is None:
            return None
        return await self._etcd_member_check(
            functools.partial(etcd.leave_plan, force=False),
            refused=f"refusing {what} of {self.name}",
            unreachable=f"{what} must leave etcd first; reset with --graceful=false and remove the "
            "member from a healthy node after",
        )

    async def _etcd_member_check(
        self, check: Callable[[], Awaitable[T]], *, refused: str, unreachable: str
    ) -> T | None:
        """Run ``check``, a question to etcd before this node's member goes away or down: None
        when the node is no member; etcd's refusal (its quorum) as FailedPreconditionError after
        ``refused``; etcd not answering as UnavailableError ending with ``unreachable``."""
        try:
            return await check()
        except node_etcd.EtcdRefused as exc:
            if "is not an etcd member" in str(exc):
                return None
            raise api.FailedPreconditionError(f"{refused}: {exc}") from exc
        except client_errors.EtcdError as exc:
            raise api.UnavailableError(f"etcd on {self.name} does not answer ({exc}): {unreachable}") from exc

    async def _leave_etcd(self, member_id: int) -> None:
        """Move etcd leadership away, then remove this node's member (see :meth:`reset`)."""
        etcd = self._etcd()
        with contextlib.suppress(node_etcd.EtcdRefused, client_errors.EtcdError):
            log.info("leaving etcd: %s", await etcd.forfeit_leadership())
        try:
            await etcd.remove_self(member_id)
        except client_errors.EtcdError as exc:
            message = f"etcd on {self.name}: removing member {member_id:x}: {exc}"
            raise api.UnavailableError(message) from exc
        log.info("left etcd (member %x)", member_id)

    # -- agent upgrade ----------------------------------------------------------------------

    async def upgrade(self, *, path: str, stage: bool, preserve: bool | None, force: bool) -> dict[str, Any]:
        """Replace this agent with the build at ``path`` (see :mod:`kubeplane.agent.upgrade`).

        The etcd member (if any) is checked first, then the build is installed and checked: a
        refusal of either changes nothing. Keeping the data (``preserve``, the default on a
        control plane node), the member must be able to go down without etcd losing its quorum;
        not keeping it, it leaves etcd (as a graceful reset does) and the node's etcd, kubelet
        and containerd data are wiped (its config stays: it rejoins). ``force`` skips the etcd
        check (a single control plane node, whose cluster then stops for the restart). With
        ``stage`` the build is only recorded, for the agent's next start (no etcd check). The
        reply comes before the services stop and the agent re-execs itself, keeping its PID.
        """
        document = await asyncio.to_thread(self.store.current)
        control_plane = document is not None and document.model.machine.is_control_plane
        keep = control_plane if preserve is None else preserve
        try:
            source = node_upgrade.source_path(self.paths, path)
        except node_upgrade.UpgradeRefused as exc:
            raise api.InvalidArgumentError(str(exc), fields=[("path", str(exc))]) from exc
        async with self._lock:
            member_id: int | None = None
            etcd = self.services.etcd if self.services is not None else None
            if etcd is not None and not force and not stage:
                if keep:
                    await self._etcd_outage_check(etcd)
                else:
                    member_id = await self._etcd_leave_plan("an upgrade without --preserve")
            try:
                build = await asyncio.to_thread(node_upgrade.install, self.paths, source)
            except node_upgrade.UpgradeRefused as exc:
                raise api.FailedPreconditionError(f"node {self.name}: {exc}; nothing was changed") from exc
            summary: dict[str, Any] = {
                "hostname": self.name,
                "from": kubeplane.__version__,
                "version": build.version,
                "staged": stage,
                "preserve": keep,
                # The CLI waits for a control plane node's kube-apiserver before it is "back".
                "control_plane": control_plane,
            }
            if stage:
                await asyncio.to_thread(node_upgrade.record_active, self.paths, build)
                self.events.emit(
                    "sequence", "upgrade", f"staged kubeplaned {build.version} for the next start"
                )
                return {
                    **summary,
                    "message": f"node {self.name}: kubeplaned {build.version} runs from its next start",
                }
            await asyncio.to_thread(node_upgrade.record_active, self.paths, build)
            self.events.emit("sequence", "upgrade", f"upgrading kubeplaned to {build.version}")
            if member_id is not None:
                await self._leave_etcd(member_id)
            elif etcd is not None:
                with contextlib.suppress(node_etcd.EtcdRefused, client_errors.EtcdError):
                    log.info("upgrade: %s", await etcd.forfeit_leadership())
            if not keep:
                await self._halt()
                labels = [label for label in node_reset.WIPE_LABELS if label != "state"]
                left = await asyncio.to_thread(node_reset.wipe, node_reset.directories(self.paths, labels))
                for message in left:
                    log.warning("upgrade: %s", message)
        self._after_reply(functools.partial(self._restart_into, build))
        kept = "keeping its data" if keep else "after wiping its etcd, kubelet and containerd data"
        return {**summary, "message": f"node {self.name} restarts into kubeplaned {build.version}, {kept}"}

    async def _etcd_outage_check(self, etcd: node_etcd.EtcdMember) -> None:
        await self._etcd_member_check(
            etcd.outage_plan,
            refused=f"refusing to upgrade {self.name}",
            unreachable="cannot tell whether it may go down; --force upgrades anyway",
        )

    async def _restart_into(self, build: node_upgrade.Build) -> None:
        """Stop as a reboot does (services, controllers, trustd, the API), then exec the build;
        a kube-apiserver first shuts down gracefully (:meth:`_stop_apiserver`)."""
        async with self._lock:
            log.info("upgrade: stopping services and controllers, then exec into %s", build.path)
            self.events.emit("sequence", "upgrade", f"restarting into kubeplaned {build.version}")
            await self._stop_apiserver()
            await self._halt()
            await self._stop_servers()
            logging.shutdown()
            node_upgrade.exec_into(build, sys.argv[1:])

    async def _stop_apiserver(self) -> None:
        """Let this node's kube-apiserver end its connections itself before the services stop.

        The halt kills every container at once, which cuts a request in flight on a client's
        connection to this API server: the load balancer sends no new connections to a node
        taken out of its rotation, but keeps those already open. So the kubelet stops first (it
        would start the pod again), the kube-apiserver gets SIGTERM and up to
        :data:`APISERVER_STOP_TIMEOUT` seconds: its graceful shutdown keeps answering for its
        shutdown delay, telling each HTTP/1.x client to reconnect (``Connection: close``), then
        sends HTTP/2 clients a GOAWAY and closes the idle connections, and clients go on with
        another node. Best effort: whatever fails here, the halt still stops everything.
        """
        services = self.services
        supervisor_ids = services.supervisor.ids() if services is not None else []
        if services is None or not {node_services.KUBELET, node_services.CONTAINERD} <= set(supervisor_ids):
            return
        if not services.supervisor.snapshot(node_services.CONTAINERD).running:
            return
        socket = self.paths.containerd_socket
        try:
            await services.supervisor.stop(node_services.KUBELET)
            stopping = []
            for container in (await node_services.ctr(socket, "containers", "ls", "-q")).split():
                info = json.loads(await node_services.ctr(socket, "containers", "info", container))
                if (info.get("Labels") or {}).get(_CONTAINER_NAME_LABEL) == "kube-apiserver":
                    with contextlib.suppress(RuntimeError):  # no task: not running
                        await node_services.ctr(socket, "tasks", "kill", "-s", "SIGTERM", container)
                        stopping.append(container)
            deadline = asyncio.get_running_loop().time() + APISERVER_STOP_TIMEOUT
            while stopping and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)
                running = {
                    words[0]
                    for line in (await node_services.ctr(socket, "tasks", "ls")).splitlines()[1:]
                    if len(words := line.split()) >= 3 and words[2] == "RUNNING"
                }
                stopping = [container for container in stopping if container in running]
            if stopping:
                log.info("upgrade: kube-apiserver still shutting down after %.0fs", APISERVER_STOP_TIMEOUT)
        except Exception as exc:  # best effort: the halt that follows stops everything anyway
            log.warning("upgrade: could not stop kube-apiserver gracefully: %s", exc)

    async def _stop_servers(self) -> None:
        """Stop trustd and the node API (before the agent execs into another build)."""
        if self._trustd is not None:
            await self._trustd.stop()
            self._trustd = None
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None

    @staticmethod
    def _reset_text(summary: Mapping[str, Any]) -> str:
        leave = "leave etcd, " if summary["leaves_etcd"] else ""
        then = "reboot" if summary["then"] == "reboot" else "stop the agent"
        return f"{leave}stop the services, wipe {', '.join(summary['wipe'])}, then {then}"

    async def _after_reset(self, *, reboot: bool) -> None:
        if not reboot:
            self.stop()
            return
        async with self._lock:
            if self._server is not None:
                await self._server.stop(grace=1.0)
                self._server = None
            document = await asyncio.to_thread(self.store.current)
            if document is not None:
                await self._boot(document)
                return
            if self._trustd is not None:
                await self._trustd.stop()
                self._trustd = None
            self.maintenance, self.phase, self.insecure_api = True, "maintenance", False
            self.events.emit("sequence", "maintenance", "reset: waiting for apply-config --insecure")
            self._server = await api.serve_maintenance(
                backend=self._backend, node=self.name, listen=self.listen
            )

    # -- logs and services --------------------------------------------------------------------

    async def logs(self, *, service: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        path = self.paths.log(service)
        if not path.exists() and not follow:
            known = sorted(p.stem for p in self.paths.logs.glob("*.log")) if self.paths.logs.exists() else []
            raise api.NotFoundError(
                f"no log {service!r} on node {self.name}; known logs: {', '.join(known) or 'none'}"
            )
        lines = -1 if tail is None else tail
        if follow:
            async for line in service_logs.follow(path, lines=lines if lines >= 0 else 1_000_000):
                yield line
        else:
            for line in await asyncio.to_thread(service_logs.tail, path, lines):
                yield line

    def _services(self) -> node_services.NodeServices:
        if self.services is None:
            raise api.UnavailableError(f"node {self.name} runs no services (maintenance mode or rebooting)")
        return self.services

    def service_list(self) -> list[dict[str, Any]]:
        return self.services.documents() if self.services is not None else []

    async def service_control(self, *, service: str, action: str) -> dict[str, Any]:
        try:
            message = await self._services().control(service, action)
        except supervisor.UnknownServiceError as exc:
            raise api.NotFoundError(f"node {self.name}: {exc}") from exc
        return {"message": message}

    # -- cluster formation --------------------------------------------------------------------

    def _etcd(self) -> node_etcd.EtcdMember:
        etcd = self._services().etcd
        if etcd is None:
            raise api.FailedPreconditionError(f"node {self.name} is a worker: it runs no etcd")
        return etcd

    async def bootstrap(
        self, *, snapshot: bytes | None, self_hosted: selfhosted.Options | None = None
    ) -> dict[str, Any]:
        """Found etcd; with ``self_hosted`` also run the self-hosted bootstrap (:mod:`.selfhosted`)."""
        async with self._lock:
            services = self._services()
            if services.etcd is None:
                raise api.FailedPreconditionError(
                    f"bootstrap refused on {self.name}: bootstrap is only for control plane nodes; "
                    "this node is a worker"
                )
            refusal = await services.etcd.bootstrap_refusal()
            if refusal is not None:
                raise api.FailedPreconditionError(f"bootstrap refused on {self.name}: {refusal}")
            if self_hosted is not None:
                original = await asyncio.to_thread(self.store.current)
                assert original is not None  # services run only on a booted node
                self._start_self_hosted(services, self_hosted, original)
            await asyncio.to_thread(services.etcd.request_bootstrap, snapshot)
            await services.supervisor.restart("etcd")
        how = "from the snapshot" if snapshot is not None else "as a new single-member cluster"
        log.info("bootstrap: etcd starts %s", how)
        mode = "; self-hosted control plane follows" if self_hosted is not None else ""
        self.events.emit("sequence", "bootstrap", f"etcd starts {how}{mode}")
        return {"message": f"bootstrap started on {self.name}: etcd starts {how}{mode}"}

    def _start_self_hosted(
        self,
        services: node_services.NodeServices,
        options: selfhosted.Options,
        original: config.MachineConfig,
    ) -> None:
        state = self.state
        assert state is not None  # services run only on a booted node
        self._publish_config(state, selfhosted.temporary_config(original))
        runner = selfhosted.SelfHostedBootstrap(
            state=state,
            paths=self.paths,
            node_name=self.name,
            original=original,
            kubeconfig=services.admin_kubeconfig,
            publish_config=lambda document: self._publish_config(state, document),
            options=options,
        )
        self._after_reply(runner.run)

    async def etcd_call(self, operation: str, **kwargs: Any) -> Any:
        etcd = self._etcd()
        try:
            if operation == "members":
                return await etcd.members()
            if operation == "forfeit":
                return {"message": await etcd.forfeit_leadership()}
            if operation == "remove":
                return {"message": await etcd.remove_member(kwargs["member"])}
            if operation == "leave":
                member_id = await etcd.leave_plan(force=kwargs["force"])
                await etcd.remove_self(member_id)
                await self._services().supervisor.stop("etcd")
                await asyncio.to_thread(etcd.wipe)
                return {"message": f"{self.name} left etcd (member {member_id:x}); its etcd data is wiped"}
        except node_etcd.EtcdRefused as exc:
            raise api.FailedPreconditionError(str(exc)) from exc
        except client_errors.EtcdError as exc:
            raise api.UnavailableError(f"etcd on {self.name}: {exc}") from exc
        raise ValueError(operation)

    async def etcd_snapshot(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._etcd().snapshot():
                yield chunk
        except client_errors.EtcdError as exc:
            raise api.UnavailableError(f"etcd on {self.name}: {exc}") from exc

    async def client_certificate(self, *, csr: str, roles: Sequence[str], lifetime: int) -> dict[str, Any]:
        """Sign a node API client certificate for ``csr`` with ``roles``, from the OS CA.

        The key stays with the caller: only its CSR comes here. The certificate's subject is the
        node's choice (the CSR's common name, checked, and exactly ``roles`` as organizations),
        its only usage is client authentication, and ``roles`` may be admin and reader but never
        the proxy role, which only nodes hold. Every certificate minted is logged and is an event.
        """
        wrong = sorted(set(roles) - set(api.auth.CALLER_ROLES))
        if not roles or wrong:
            raise api.InvalidArgumentError(
                f"roles {', '.join(wrong) or '(none)'} cannot be granted: choose from "
                f"{', '.join(api.auth.CALLER_ROLES)}",
                fields=[("roles", "unknown or not grantable")],
            )
        if not MIN_CLIENT_LIFETIME <= lifetime <= MAX_CLIENT_LIFETIME:
            raise api.InvalidArgumentError(
                f"a client certificate lives between {MIN_CLIENT_LIFETIME}s and {MAX_CLIENT_LIFETIME}s, "
                f"not {lifetime}s",
                fields=[("lifetime_seconds", "out of range")],
            )
        document = await asyncio.to_thread(self.store.current)
        ca = document.model.machine.ca if document is not None else None
        if ca is None or not ca.key:
            raise api.FailedPreconditionError(
                f"node {self.name} holds no OS CA key (only control plane nodes do): ask a control plane node"
            )
        try:
            request = x509.load_pem_x509_csr(csr.encode())
            names = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            common_name = str(names[0].value) if names else ""
            if not _CLIENT_NAME.fullmatch(common_name):
                raise api.InvalidArgumentError(
                    "the CSR's common name must be 1-64 letters, digits, '.', '_', '@' or '-'",
                    fields=[("csr", "bad common name")],
                )
            authority = pki.CertKey(cert=ca.crt_pem(), key=ca.key_pem())
            cert = pki.sign_csr(
                ca=authority,
                csr=csr.encode(),
                usages=("client",),
                lifetime=datetime.timedelta(seconds=lifetime),
                common_name=common_name,
                organizations=tuple(roles),
            )
        except (ValueError, pki.PKIError) as exc:
            raise api.InvalidArgumentError(f"cannot sign the CSR: {exc}", fields=[("csr", str(exc))]) from exc
        info = pki.cert_info(cert)
        until = info.not_after.isoformat(timespec="seconds")
        granted = ", ".join(roles)
        message = f"signed a client certificate for {common_name} with {granted}, valid until {until}"
        log.info("%s", message)
        self.events.emit("pki", "client-certificate", message)
        return {"crt": cert.decode(), "ca": ca.crt_pem().decode()}

    def renew_kubernetes_certificates(self, *, not_before: int | None) -> dict[str, Any]:
        """Ask for this node's Kubernetes certificates issued before ``not_before`` to be re-issued.

        ``not_before`` (Unix seconds; default now) is capped at the node's own clock, so a caller
        whose clock runs ahead cannot ask for certificates that no issue can satisfy, and a
        request never moves an earlier, later-reaching one back. The secrets controller answers
        it (:func:`kubeplane.controllers.secrets.common.renewal_requested`); the same request
        twice re-issues once. Only the certificates signed by the cluster's CAs that a node
        issues for itself are renewed: the API server serving certificate, its kubelet and
        front-proxy client certificates and the admin, controller-manager and scheduler
        kubeconfigs; the CAs, etcd's and the kubelet's certificates stay as they are.
        """
        state = self.state
        secret = self._kubernetes_secrets()
        if state is None or secret is None:
            raise api.FailedPreconditionError(
                f"node {self.name} holds no Kubernetes certificates to renew (only control plane "
                "nodes issue them): ask a control plane node"
            )
        now = datetime.datetime.now(datetime.UTC)
        asked = now if not_before is None else datetime.datetime.fromtimestamp(not_before, datetime.UTC)
        requested = min(asked, now)
        previous = state.find(
            catalog.CONTROLPLANE_NAMESPACE,
            catalog.CERTIFICATE_RENEWALS,
            kubernetes_secrets.KUBERNETES_SECRETS_ID,
        )
        if previous is not None:
            earlier = datetime.datetime.fromisoformat(str(previous.spec.to_dict()["notBefore"]))
            requested = max(requested, earlier)
        state.modify(
            catalog.CONTROLPLANE_NAMESPACE,
            catalog.CERTIFICATE_RENEWALS,
            kubernetes_secrets.KUBERNETES_SECRETS_ID,
            lambda _: catalog.CertificateRenewalSpec(not_before=requested.isoformat()),
        )
        certificates = secret.spec.to_dict()
        renewing = (
            secrets_common.renewal_requested(certificates, {"notBefore": requested.isoformat()}) is not None
        )
        if renewing:
            message = (
                f"renewal of the Kubernetes certificates issued before {requested.isoformat()} requested"
            )
            log.info("%s", message)
            self.events.emit("pki", "renew", message)
        return {
            "notBefore": requested.isoformat(),
            "issued": str(certificates.get("issued", "")),
            "renewing": renewing,
        }

    def _kubernetes_secrets(self) -> resources.Resource | None:
        """The node's KubernetesSecrets (control plane nodes only); None without one or a state."""
        state = self.state
        if state is None:
            return None
        return state.find(
            catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, kubernetes_secrets.KUBERNETES_SECRETS_ID
        )

    def kubeconfig(self) -> dict[str, Any]:
        secret = self._kubernetes_secrets()
        text = secret.spec.to_dict().get("adminKubeconfig") if secret is not None else None
        if not text:
            try:
                text = self._services().admin_kubeconfig(lifetime=_ADMIN_KUBECONFIG_LIFETIME)
            except ValueError as exc:
                raise api.FailedPreconditionError(
                    f"node {self.name} cannot issue an admin kubeconfig ({exc}): ask a control plane node"
                ) from exc
        return {"kubeconfig": text}

    async def image_pull(self, image: str) -> dict[str, Any]:
        try:
            pulled = await self._services().pull_image(image)
        except FileNotFoundError as exc:
            raise api.NotFoundError(f"node {self.name}: {exc}") from exc
        return {"image": image, "pulled": pulled}

    async def containers(self) -> list[dict[str, Any]]:
        try:
            return await node_containers.list_containers(self.paths.containerd_socket)
        except RuntimeError as exc:
            raise api.UnavailableError(f"containerd on {self.name}: {exc}") from exc

    async def container_logs(self, *, id: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        try:
            # Without --follow, an attempt that has not written yet shows the last one that did.
            path = node_containers.log_file(id, written=not follow)
        except node_containers.ContainerNotFound as exc:
            raise api.NotFoundError(f"node {self.name}: {exc}") from exc
        except ValueError as exc:
            raise api.InvalidArgumentError(str(exc), fields=[("id", str(exc))]) from exc
        lines = -1 if tail is None else tail
        if follow:
            async for line in service_logs.follow(path, lines=lines if lines >= 0 else 1_000_000):
                yield node_containers.cri_message(line)
        else:
            for line in await asyncio.to_thread(service_logs.tail, path, lines):
                yield node_containers.cri_message(line)


def node_csr(key: bytes, source: str | None, *, name: str, own: Sequence[str]) -> bytes:
    """The CSR a worker sends trustd reached from ``source``: node org, its name, that address.

    trustd signs only the address it sees the request come from (and loopback), so the CSR asks
    for ``source`` alone; all of ``own`` only when the source address is unknown.
    """
    ips = [source] if source else [a for a in own if pki.is_ip(a)]
    return pki.new_csr(
        key=key,
        common_name=name,
        organizations=(pki.NODE_ORG,),
        dns_names=["localhost"] if pki.is_ip(name) else [name, "localhost"],
        ip_addresses=list(dict.fromkeys([*ips, "127.0.0.1"])),
    )


async def control_plane_addresses(*, endpoint: str, token: str, ca: bytes, timeout: float = 5.0) -> list[str]:
    """The control plane nodes' addresses: ``Endpoints default/kubernetes`` read at ``endpoint``.

    Authenticates with the bootstrap token (``cluster.token``); the bootstrap manifest
    ``01-trustd-discovery`` lets bootstrap tokens get that one object. Raises TrustdError.
    """
    kubeconfig = node_services.bootstrap_kubeconfig(
        server=endpoint, ca=ca, token=token, cluster_name="cluster"
    )
    try:
        return await trustd.control_plane_addresses(kubeconfig, timeout=timeout)
    except client_errors.KubeError as exc:
        raise trustd.TrustdError(f"{endpoint.rstrip('/')}: {exc}") from exc
