""":class:`NodeClient`: the asyncio client of the node API, used by the CLI and by operations.

Every method returns replies labelled by node — one :class:`Reply` for a direct call, one per
node when the client was given ``nodes`` (the receiving endpoint forwards the call to each). A
call that fails on the receiving endpoint raises :class:`~kubeplane.api.errors.CallError`; a
failure of one forwarded node is that node's ``Reply.error`` and does not affect the others.

Endpoints are tried in order, starting from the last one that answered; a call moves on only
when an endpoint could not be reached (so it never runs twice), and when none can be reached
:class:`~kubeplane.api.errors.ConnectError` names each endpoint and why it failed.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

from kubeplane.api import auth, errors, transport, wire

T = TypeVar("T")

#: Deadline of unary calls (seconds) unless the client or the call says otherwise.
DEFAULT_TIMEOUT = 15.0
#: Applying a config validates, diffs and persists it; give it longer than a read.
APPLY_TIMEOUT = 60.0
#: A reset leaves etcd and stops every service (containers killed) before it answers.
RESET_TIMEOUT = 180.0
#: An upgrade unpacks and checks the build (a fresh interpreter importing it), then may leave etcd.
UPGRADE_TIMEOUT = 180.0


@dataclass(frozen=True)
class Reply(Generic[T]):
    """One node's answer: ``result`` on success, ``error`` when that node failed."""

    node: str
    result: T | None = None
    error: errors.CallError | None = None

    def unwrap(self) -> T:
        """The result, or raise the node's error."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


def _reply(document: Mapping[str, Any]) -> Reply[Any]:
    node = str(document.get("node", ""))
    if "error" in document:
        return Reply(node=node, error=transport.reply_error(document["error"], node))
    return Reply(node=node, result=document.get("result"))


class NodeClient:
    """Client of one or more equivalent endpoints; use as ``async with NodeClient(...) as client``.

    ``credentials`` hold the OS CA and the client certificate/key (PEM bytes); ``nodes`` makes
    every call go to those nodes through the endpoint. :meth:`insecure` builds the maintenance-mode
    client (no server verification, no client certificate).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        credentials: auth.Credentials | None,
        nodes: Sequence[str] = (),
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not endpoints:
            raise errors.APIError(
                "no endpoints given: pass -e ENDPOINT or set endpoints in the client config"
            )
        self.endpoints = tuple(endpoints)
        self.nodes = tuple(nodes)
        self.timeout = timeout
        self._credentials = credentials
        self._connections: dict[int, transport.Connection] = {}
        self._current = 0

    @classmethod
    def insecure(cls, endpoints: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> NodeClient:
        """A client for nodes in maintenance mode; only Version and ApplyConfiguration will work."""
        return cls(endpoints, credentials=None, timeout=timeout)

    async def __aenter__(self) -> NodeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel."""
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            await connection.close()

    # -- generic calls -------------------------------------------------------------------------

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return ((wire.MD_NODES, ",".join(self.nodes)),) if self.nodes else ()

    def _order(self) -> list[int]:
        return [self._current, *(i for i in range(len(self.endpoints)) if i != self._current)]

    async def _connection(self, index: int) -> transport.Connection:
        if index not in self._connections:
            endpoint = self.endpoints[index]
            if self._credentials is None:
                self._connections[index] = await transport.Connection.open_insecure(
                    endpoint, timeout=self.timeout
                )
            else:
                self._connections[index] = transport.Connection.open(endpoint, self._credentials)
        return self._connections[index]

    async def call(
        self, name: str, request: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> list[Reply[Any]]:
        """Make the unary call ``name`` of :data:`~kubeplane.api.wire.CALLS`."""
        call = wire.CALLS_BY_NAME[name]
        attempts: list[tuple[str, str]] = []
        for index in self._order():
            try:
                connection = await self._connection(index)
                document = await connection.unary(
                    call, request or {}, metadata=self._metadata(), timeout=timeout or self.timeout
                )
            except transport.Unreachable as exc:
                attempts.append((exc.endpoint, exc.reason))
                continue
            self._current = index
            return [_reply(reply) for reply in document["replies"]]
        raise errors.ConnectError(attempts)

    async def stream(
        self, name: str, request: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> AsyncIterator[Reply[Any]]:
        """Make the streaming call ``name``; ``timeout`` bounds the whole stream (none by default)."""
        call = wire.CALLS_BY_NAME[name]
        attempts: list[tuple[str, str]] = []
        for index in self._order():
            received = False
            try:
                connection = await self._connection(index)
                async for message in connection.stream(
                    call, request or {}, metadata=self._metadata(), timeout=timeout
                ):
                    received = True
                    self._current = index
                    yield _reply(message)
                return
            except transport.Unreachable as exc:
                if received:
                    raise errors.CallError(
                        "UNAVAILABLE", f"lost the connection to {exc.endpoint} mid-stream: {exc.reason}"
                    ) from None
                attempts.append((exc.endpoint, exc.reason))
        raise errors.ConnectError(attempts)

    # -- one method per call -------------------------------------------------------------------

    async def version(self) -> list[Reply[wire.Document]]:
        """Versions of each node's agent and components."""
        return await self.call("Version")

    async def resource_get(
        self,
        type: str,
        id: str,
        *,
        namespace: str | None = None,
    ) -> list[Reply[wire.Document]]:
        """One resource (``type`` may be any alias)."""
        return await self.call("ResourceGet", {"type": type, "id": id, "namespace": namespace})

    async def resource_list(
        self,
        type: str,
        *,
        namespace: str | None = None,
    ) -> list[Reply[list[wire.Document]]]:
        """All resources of a type."""
        return await self.call("ResourceList", {"type": type, "namespace": namespace})

    def resource_watch(
        self,
        type: str,
        *,
        namespace: str | None = None,
        id: str | None = None,
    ) -> AsyncIterator[Reply[wire.Document]]:
        """Current state then changes, as ``{"event", "resource"}`` documents."""
        return self.stream("ResourceWatch", {"type": type, "namespace": namespace, "id": id})

    async def apply_configuration(
        self, data: str, *, mode: str = "reboot", dry_run: bool = False, try_seconds: int | None = None
    ) -> list[Reply[wire.Document]]:
        """Apply a machine config; results are ``{"mode", "diff", "message"}``."""
        request: dict[str, Any] = {"data": data, "mode": mode, "dry_run": dry_run}
        if try_seconds is not None:
            request["try_seconds"] = try_seconds
        return await self.call("ApplyConfiguration", request, timeout=APPLY_TIMEOUT)

    async def machine_config(self) -> list[Reply[wire.Document]]:
        """``{"current", "staged"}`` machine config YAML (admin only)."""
        return await self.call("MachineConfig")

    async def read_file(self, path: str) -> AsyncIterator[Reply[bytes]]:
        """Chunks of a file under the node root (admin only)."""
        async for reply in self.stream("ReadFile", {"path": path}):
            yield reply

    async def list_dir(self, path: str = ".", *, recurse: bool = False) -> list[Reply[list[wire.Document]]]:
        """Directory entries under the node root."""
        return await self.call("ListDir", {"path": path, "recurse": recurse})

    def logs(
        self, service: str, *, tail: int | None = None, follow: bool = False
    ) -> AsyncIterator[Reply[str]]:
        """Log lines of a service."""
        return self.stream("Logs", {"service": service, "tail": tail, "follow": follow})

    def events(
        self, *, since_seconds: int | None = None, tail: int | None = None, follow: bool = False
    ) -> AsyncIterator[Reply[wire.Document]]:
        """The node's events (service changes, config applies, controller errors, boot phases)."""
        return self.stream("Events", {"since_seconds": since_seconds, "tail": tail, "follow": follow})

    async def client_certificate(
        self, csr: bytes, *, roles: Sequence[str], lifetime_seconds: int
    ) -> list[Reply[wire.Document]]:
        """A client certificate for ``csr`` with ``roles``, signed by the node's OS CA (admin)."""
        return await self.call(
            "ClientCertificate",
            {"csr": csr.decode(), "roles": ",".join(roles), "lifetime_seconds": lifetime_seconds},
        )

    async def certificates(self) -> list[Reply[list[wire.Document]]]:
        """The certificates the node keeps on disk, soonest expiry first (public parts only)."""
        return await self.call("Certificates", {})

    async def service_list(self) -> list[Reply[list[wire.Document]]]:
        """Services with state, health and events."""
        return await self.call("ServiceList")

    async def service_start(self, id: str) -> list[Reply[wire.Document]]:
        """Start a service (admin only)."""
        return await self.call("ServiceStart", {"id": id})

    async def service_stop(self, id: str) -> list[Reply[wire.Document]]:
        """Stop a service (admin only)."""
        return await self.call("ServiceStop", {"id": id})

    async def service_restart(self, id: str) -> list[Reply[wire.Document]]:
        """Restart a service (admin only)."""
        return await self.call("ServiceRestart", {"id": id})

    async def reboot(self) -> list[Reply[wire.Document]]:
        """Restart the node's services, applying a staged config (admin only)."""
        return await self.call("Reboot", timeout=APPLY_TIMEOUT)

    async def reset(
        self, *, graceful: bool = True, reboot: bool = False, wipe: str | None = None, dry_run: bool = False
    ) -> list[Reply[wire.Document]]:
        """Leave the cluster and wipe the node (admin only); see :meth:`kubeplane.agent.node.Node.reset`."""
        params: dict[str, Any] = {"graceful": graceful, "reboot": reboot, "dry_run": dry_run}
        if wipe is not None:
            params["wipe"] = wipe
        return await self.call("Reset", params, timeout=RESET_TIMEOUT)

    async def upgrade(
        self, *, path: str, stage: bool = False, preserve: bool | None = None, force: bool = False
    ) -> list[Reply[wire.Document]]:
        """Replace the agent with the build at ``path`` on the node (admin only); see
        :meth:`kubeplane.agent.node.Node.upgrade`. It answers before the agent restarts."""
        params: dict[str, Any] = {"path": path, "stage": stage, "force": force}
        if preserve is not None:
            params["preserve"] = preserve
        return await self.call("Upgrade", params, timeout=UPGRADE_TIMEOUT)

    async def bootstrap(
        self,
        *,
        snapshot: bytes | None = None,
        self_hosted: bool = False,
        checkpointer_image: str | None = None,
        checkpointer_grace_period: int | None = None,
    ) -> list[Reply[wire.Document]]:
        """Found the etcd cluster on the node, optionally from an etcd snapshot (admin only);
        ``self_hosted`` then brings up a self-hosted control plane (bootkube style)."""
        request: dict[str, object] = {
            "snapshot": base64.b64encode(snapshot).decode("ascii") if snapshot is not None else None
        }
        if self_hosted:
            request.update(
                self_hosted=True,
                checkpointer_image=checkpointer_image,
                checkpointer_grace_period=checkpointer_grace_period,
            )
        return await self.call("Bootstrap", request, timeout=APPLY_TIMEOUT)

    async def etcd_members(self) -> list[Reply[list[wire.Document]]]:
        """etcd members as the node sees them (admin only)."""
        return await self.call("EtcdMembers")

    async def etcd_leave(self, *, force: bool = False) -> list[Reply[wire.Document]]:
        """Leave etcd and wipe its data (admin only)."""
        return await self.call("EtcdLeave", {"force": force}, timeout=APPLY_TIMEOUT)

    async def etcd_remove_member(self, member: str) -> list[Reply[wire.Document]]:
        """Remove another etcd member by name or hex ID (admin only)."""
        return await self.call("EtcdRemoveMember", {"member": member}, timeout=APPLY_TIMEOUT)

    async def etcd_forfeit_leadership(self) -> list[Reply[wire.Document]]:
        """Move etcd leadership away from the node (admin only)."""
        return await self.call("EtcdForfeitLeadership", timeout=APPLY_TIMEOUT)

    async def etcd_snapshot(self) -> AsyncIterator[Reply[bytes]]:
        """Chunks of an etcd snapshot (admin only)."""
        async for reply in self.stream("EtcdSnapshot"):
            yield reply

    async def kubeconfig(self) -> list[Reply[wire.Document]]:
        """``{"kubeconfig": YAML}`` admin kubeconfig of the cluster (admin only)."""
        return await self.call("Kubeconfig")

    async def kubernetes_certificates_renew(
        self, *, not_before: int | None = None
    ) -> list[Reply[wire.Document]]:
        """Re-issue the nodes' Kubernetes certificates issued before ``not_before`` (Unix seconds,
        default now), with the same CAs (admin only; control plane nodes)."""
        return await self.call("KubernetesCertificatesRenew", {"not_before": not_before})

    async def image_pull(self, image: str, *, timeout: float | None = None) -> list[Reply[wire.Document]]:
        """Pull ``image`` on the nodes through their registry mirrors (admin only)."""
        return await self.call("ImagePull", {"image": image}, timeout=timeout)

    async def containers(self) -> list[Reply[list[wire.Document]]]:
        """CRI containers of the node (admin only)."""
        return await self.call("Containers")

    def container_logs(
        self, id: str, *, tail: int | None = None, follow: bool = False
    ) -> AsyncIterator[Reply[str]]:
        """Log lines of the CRI container ``NAMESPACE/POD:CONTAINER`` (admin only)."""
        return self.stream("ContainerLogs", {"id": id, "tail": tail, "follow": follow})
