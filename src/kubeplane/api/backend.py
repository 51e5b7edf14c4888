"""The :class:`NodeBackend` protocol: everything the API server needs from the node it runs on.

The agent implements it (over its resource state, config store, services and files); the server
only validates, authorises, proxies and encodes. Parameter names are the JSON request fields of
:data:`kubeplane.api.wire.CALLS`, and a unit test checks that the table and this protocol agree.

Results must be JSON-able (dicts, lists, strings, numbers, booleans, None); resources are the
dicts the resource layer serialises (``{node?, metadata: {...}, spec: ...}``). Errors meant for
the caller are :class:`kubeplane.api.errors.BackendError` subclasses; anything else becomes
INTERNAL with the exception type and message, and is logged on the node.

Stream methods are async generators; the server stops iterating (closing the generator) when
the caller goes away, so ``finally`` blocks release watches and follow-mode readers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from kubeplane.api.wire import Document


class NodeBackend(Protocol):
    """What a node exposes through the API (see the module docstring for the conventions)."""

    async def version(self) -> Document:
        """Versions of the agent and its components, e.g. ``{"tag": "0.1.0", "kubernetes": ...}``."""
        ...

    async def resource_sensitive(self, *, type: str) -> bool:
        """Whether ``type`` (any alias) holds secrets; readers are refused such types.

        Raises :class:`~kubeplane.api.errors.NotFoundError` for an unknown type.
        """
        ...

    async def resource_get(self, *, type: str, id: str, namespace: str | None) -> Document:
        """One resource; ``namespace=None`` means the type's default namespace."""
        ...

    async def resource_list(self, *, type: str, namespace: str | None) -> list[Document]:
        """All resources of a type in a namespace."""
        ...

    def resource_watch(
        self,
        *,
        type: str,
        namespace: str | None,
        id: str | None,
    ) -> AsyncIterator[Document]:
        """Current state then changes: ``{"event": "created|updated|destroyed|...", "resource": {...}}``."""
        ...

    async def apply_configuration(
        self, *, data: str, mode: str, dry_run: bool, try_seconds: int | None = None
    ) -> Document:
        """Validate and apply a machine config in ``mode`` (one of :data:`~kubeplane.api.wire.APPLY_MODES`;
        ``try`` rolls back after ``try_seconds`` unless applied again).

        Returns ``{"mode": used, "diff": unified diff, "message": what happened}``; a mode the change
        does not allow raises FailedPreconditionError, an invalid config InvalidArgumentError with
        field paths, and nothing changes in either case.
        """
        ...

    async def machine_config(self) -> Document:
        """``{"current": YAML or None, "staged": YAML or None}``."""
        ...

    def read_file(self, *, path: str) -> AsyncIterator[bytes]:
        """Chunks of a file, ``path`` relative to the node root (escaping it is InvalidArgumentError)."""
        ...

    async def list_dir(self, *, path: str, recurse: bool) -> list[Document]:
        """Entries under ``path`` (relative to the node root): ``{"name", "size", "mode", "is_dir", ...}``."""
        ...

    def logs(self, *, service: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        """Log lines of a service; the last ``tail`` lines (all if None), then new ones when following."""
        ...

    def events(self, *, since_seconds: int | None, tail: int | None, follow: bool) -> AsyncIterator[Document]:
        """The node's events (``{"id", "timestamp", "kind", "subject", "message"}``), oldest first:
        those of the last ``since_seconds``, the last ``tail``, then new ones when following."""
        ...

    async def client_certificate(self, *, csr: str, roles: str, lifetime_seconds: int) -> Document:
        """Sign ``csr`` (PEM) as a node API client certificate with ``roles`` (comma-separated) from
        the OS CA: ``{"crt", "ca"}``; FailedPreconditionError on a node without the CA key."""
        ...

    async def certificates(self) -> list[Document]:
        """The certificates the node keeps on disk: ``{"path", "what", "subject", "issuer",
        "not_after", "is_ca"}`` (public parts only), soonest expiry first."""
        ...

    async def service_list(self) -> list[Document]:
        """Services: ``{"id", "state", "health", "events": [...]}``."""
        ...

    async def service_control(self, *, id: str, action: str) -> Document:
        """Start, stop or restart a service (``action`` in :data:`~kubeplane.api.wire.SERVICE_ACTIONS`)."""
        ...

    async def reboot(self) -> Document:
        """Restart the node's services in order, applying a staged config; returns a message."""
        ...

    async def reset(self, *, graceful: bool, reboot: bool, wipe: str | None, dry_run: bool) -> Document:
        """Leave etcd (graceful), stop the services and wipe the labelled state, then reboot or
        stop; refused, changing nothing, when a graceful leave would cost etcd its quorum."""
        ...

    async def upgrade(self, *, path: str, stage: bool, preserve: bool | None, force: bool) -> Document:
        """Install the agent build at ``path`` (under the node's uploads directory), check it, and
        restart into it (``stage``: at the agent's next start); ``preserve`` (None: on control plane
        nodes) keeps the node's data, else it leaves etcd and wipes it first. A build that fails its
        check is FailedPreconditionError, an etcd member that cannot go down without losing the
        quorum too (unless ``force``); nothing changes in either case. Returns ``{"hostname",
        "from", "version", "staged", "preserve", "message"}``, before the restart."""
        ...

    async def bootstrap(
        self,
        *,
        snapshot: str | None,
        self_hosted: bool = False,
        checkpointer_image: str | None = None,
        checkpointer_grace_period: int | None = None,
    ) -> Document:
        """Found the etcd cluster on this control plane node (once per cluster lifetime).

        ``snapshot`` (base64 of an etcd snapshot) rebuilds the cluster from it. Refused with
        FailedPreconditionError naming the reason on workers, on nodes whose etcd has data or was
        bootstrapped, and when another node already answers as the cluster.
        """
        ...

    async def etcd_members(self) -> list[Document]:
        """etcd members: ``{"id" (hex), "name", "peer_urls", "client_urls", "learner", "leader"}``."""
        ...

    async def etcd_leave(self, *, force: bool) -> Document:
        """Remove this node from etcd, stop etcd and wipe its data; refused when it would lose quorum."""
        ...

    async def etcd_remove_member(self, *, member: str) -> Document:
        """Remove another etcd member (name or hex ID); refused when it would lose quorum."""
        ...

    async def etcd_forfeit_leadership(self) -> Document:
        """Move etcd leadership away from this node if it holds it."""
        ...

    def etcd_snapshot(self) -> AsyncIterator[bytes]:
        """A consistent snapshot of the etcd database, in chunks."""
        ...

    async def kubeconfig(self) -> Document:
        """``{"kubeconfig": YAML}``: an admin kubeconfig for the cluster (control plane nodes)."""
        ...

    async def kubernetes_certificates_renew(self, *, not_before: int | None) -> Document:
        """Re-issue the node's Kubernetes certificates issued before ``not_before`` (Unix seconds,
        default now), with the same CAs: ``{"notBefore", "issued", "renewing"}`` where ``issued``
        is the time of the certificates held now and ``renewing`` whether they are re-issued for
        this request; FailedPreconditionError on a node without them (a worker)."""
        ...

    async def image_pull(self, *, image: str) -> Document:
        """Pull ``image`` into the node's containerd through its registry mirrors.

        ``{"image", "pulled"}`` (``pulled`` false when it was already there); NOT_FOUND when no
        mirror or registry has it.
        """
        ...

    async def containers(self) -> list[Document]:
        """CRI containers: ``{"namespace", "pod", "name", "id", "image", "state", "pid"}``."""
        ...

    def container_logs(self, *, id: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        """Log lines of a CRI container ``NAMESPACE/POD:CONTAINER`` (from the kubelet's pod logs)."""
        ...
