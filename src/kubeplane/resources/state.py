"""The in-memory resource state of a node: reads, optimistic writes, finalizers and watches.

All methods except iterating a watch are synchronous. The state lives in one asyncio event loop and
a synchronous call cannot be interleaved with another, so every write is atomic without locks; the
watch iterator is the only place that awaits.

Rules the state enforces:

- ``version`` starts at 1 and grows by 1 on every change (spec, phase or finalizers); an update must
  name the version it was based on (:class:`ConflictError` otherwise) and an update with an equal
  spec is a no-op that keeps the version (waits elsewhere compare versions and rely on that);
- a resource owned by a controller can only be changed or destroyed by that owner (``owner`` is the
  controller name, ``None`` for user/API writes);
- a resource being torn down keeps its spec; ``destroy`` waits for all finalizers to be removed;
- types, namespaces and spec classes must match the registry.

Watches: each (namespace, type) collection numbers its events and keeps the last ``history_size``
of them. A :class:`Watch` snapshots the collection when it is created, yields that snapshot as
``created`` events, then one ``bootstrapped`` event, then every later change in order. A watcher
that lags so far that events it has not read were dropped from the history gets
:class:`FellBehindError` instead of a gap; it starts a new watch to resynchronise. Sharing one
history per collection, rather than a queue per watcher, keeps a write O(1) however many watch.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
from collections.abc import Callable, Iterable

from kubeplane.resources.catalog import default_registry
from kubeplane.resources.definitions import (
    META_NAMESPACE,
    NAMESPACES,
    RESOURCE_DEFINITIONS,
    NamespaceSpec,
    Registry,
)
from kubeplane.resources.errors import (
    AlreadyExistsError,
    ConflictError,
    FellBehindError,
    FinalizersPendingError,
    NotFoundError,
    OwnerConflictError,
    PhaseConflictError,
    SpecError,
)
from kubeplane.resources.resource import Metadata, Phase, Resource, now
from kubeplane.resources.specs import Spec

#: Owner of the ``meta`` resources the state creates itself, so that nobody else changes them.
META_OWNER = "kubeplane.state"


class EventKind(enum.StrEnum):
    """What a :class:`WatchEvent` reports."""

    CREATED = "created"
    UPDATED = "updated"
    DESTROYED = "destroyed"
    #: The initial snapshot has been delivered; everything after is a live change.
    BOOTSTRAPPED = "bootstrapped"


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One watch event; ``resource`` is None only for ``bootstrapped``, ``old`` set only for ``updated``."""

    kind: EventKind
    resource: Resource | None = None
    old: Resource | None = None


_BOOTSTRAPPED = WatchEvent(EventKind.BOOTSTRAPPED)


class _Collection:
    """The resources of one (namespace, type) and their numbered event history."""

    def __init__(self, *, namespace: str, type_name: str, history_size: int) -> None:
        self.namespace = namespace
        self.type = type_name
        self.resources: dict[str, Resource] = {}
        self.history: collections.deque[WatchEvent] = collections.deque(maxlen=history_size)
        #: Sequence number of the newest event; the oldest kept one is ``seq - len(history) + 1``.
        self.seq = 0
        self.waiters: list[asyncio.Future[None]] = []

    def emit(self, event: WatchEvent) -> None:
        self.seq += 1
        self.history.append(event)
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class Watch:
    """Async iterator of :class:`WatchEvent` for one collection, optionally one id (see module docstring)."""

    def __init__(self, collection: _Collection, resource_id: str | None) -> None:
        self._collection = collection
        self._id = resource_id
        snapshot = sorted(
            (r for r in collection.resources.values() if resource_id is None or r.id == resource_id),
            key=lambda resource: resource.id,
        )
        self._pending = collections.deque(WatchEvent(EventKind.CREATED, r) for r in snapshot)
        self._pending.append(_BOOTSTRAPPED)
        self._next_seq = collection.seq + 1

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._pending:
            return self._pending.popleft()
        collection = self._collection
        while True:
            if self._next_seq <= collection.seq:
                oldest = collection.seq - len(collection.history) + 1
                if self._next_seq < oldest:
                    raise FellBehindError(
                        f"watch of {collection.namespace}/{collection.type} fell behind: "
                        f"{oldest - self._next_seq} event(s) were dropped from the history of "
                        f"{collection.history.maxlen}; start a new watch to get the current state"
                    )
                event = collection.history[self._next_seq - oldest]
                self._next_seq += 1
                if self._id is None or (event.resource is not None and event.resource.id == self._id):
                    return event
                continue
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            collection.waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in collection.waiters:
                    collection.waiters.remove(waiter)


class State:
    """In-memory resources of one node (see the module docstring for the rules)."""

    def __init__(self, registry: Registry | None = None, *, history_size: int = 1024) -> None:
        if history_size < 1:
            raise ValueError(f"history_size must be at least 1, got {history_size}")
        self.registry = registry if registry is not None else default_registry()
        self._history_size = history_size
        self._collections: dict[tuple[str, str], _Collection] = {}
        for namespace in self.registry.namespaces():
            self.create(
                META_NAMESPACE,
                NAMESPACES,
                namespace.name,
                spec=NamespaceSpec(description=namespace.description),
                owner=META_OWNER,
            )
        for definition in self.registry.definitions():
            self.create(
                META_NAMESPACE,
                RESOURCE_DEFINITIONS,
                definition.type,
                spec=definition.to_spec(),
                owner=META_OWNER,
            )

    # -- reads -------------------------------------------------------------------------------

    def get(self, namespace: str, type_name: str, resource_id: str) -> Resource:
        """The resource, or :class:`NotFoundError`."""
        resource = self.find(namespace, type_name, resource_id)
        if resource is None:
            raise NotFoundError(f"resource {namespace}/{type_name}/{resource_id} does not exist")
        return resource

    def find(self, namespace: str, type_name: str, resource_id: str) -> Resource | None:
        """The resource, or None when it does not exist."""
        return self._collection(namespace, type_name).resources.get(resource_id)

    def list(self, namespace: str, type_name: str) -> list[Resource]:
        """All resources of a type in a namespace, sorted by id."""
        resources = self._collection(namespace, type_name).resources
        return [resources[key] for key in sorted(resources)]

    def watch(self, namespace: str, type_name: str, resource_id: str | None = None) -> Watch:
        """Watch a collection (or one id in it): snapshot now, then changes (see the module docstring)."""
        return Watch(self._collection(namespace, type_name), resource_id)

    # -- writes ------------------------------------------------------------------------------

    def create(
        self,
        namespace: str,
        type_name: str,
        resource_id: str,
        *,
        spec: Spec,
        owner: str | None = None,
        finalizers: Iterable[str] = (),
    ) -> Resource:
        """Create a resource at version 1; :class:`AlreadyExistsError` if it exists."""
        collection = self._collection(namespace, type_name)
        self._check_spec(type_name, spec)
        existing = collection.resources.get(resource_id)
        if existing is not None:
            raise AlreadyExistsError(
                f"resource {existing.metadata.ref} already exists (version {existing.version}); "
                "update it instead"
            )
        timestamp = now()
        resource = Resource(
            Metadata(
                namespace=namespace,
                type=type_name,
                id=resource_id,
                finalizers=tuple(dict.fromkeys(finalizers)),
                owner=owner,
                created=timestamp,
                updated=timestamp,
            ),
            spec,
        )
        collection.resources[resource_id] = resource
        collection.emit(WatchEvent(EventKind.CREATED, resource))
        return resource

    def update(
        self,
        namespace: str,
        type_name: str,
        resource_id: str,
        *,
        spec: Spec,
        version: int,
        owner: str | None = None,
    ) -> Resource:
        """Replace the spec of the resource read at ``version``; an equal spec changes nothing."""
        self._check_spec(type_name, spec)
        current = self._owned(namespace, type_name, resource_id, owner=owner)
        if current.version != version:
            raise ConflictError(
                f"resource {current.metadata.ref} is at version {current.version}, but the update was "
                f"based on version {version}; read it again and retry"
            )
        if current.spec == spec:
            return current
        if current.metadata.phase is Phase.TEARING_DOWN:
            raise PhaseConflictError(
                f"resource {current.metadata.ref} is being torn down; its spec can no longer change"
            )
        return self._replace(current, spec=spec)

    def modify(
        self,
        namespace: str,
        type_name: str,
        resource_id: str,
        fn: Callable[[Spec | None], Spec],
        *,
        owner: str | None = None,
    ) -> Resource:
        """Create or update: ``fn`` gets the current spec (None when missing) and returns the new one."""
        current = self.find(namespace, type_name, resource_id)
        if current is None:
            return self.create(namespace, type_name, resource_id, spec=fn(None), owner=owner)
        current = self._owned(namespace, type_name, resource_id, owner=owner)
        return self.update(
            namespace, type_name, resource_id, spec=fn(current.spec), version=current.version, owner=owner
        )

    def teardown(
        self, namespace: str, type_name: str, resource_id: str, *, owner: str | None = None
    ) -> Resource:
        """Move the resource to ``tearingDown`` so that finalizer holders let go (no-op if already)."""
        current = self._owned(namespace, type_name, resource_id, owner=owner)
        if current.metadata.phase is Phase.TEARING_DOWN:
            return current
        return self._replace(current, phase=Phase.TEARING_DOWN)

    def destroy(
        self, namespace: str, type_name: str, resource_id: str, *, owner: str | None = None
    ) -> Resource:
        """Remove the resource; :class:`FinalizersPendingError` while finalizers remain. Returns it."""
        current = self._owned(namespace, type_name, resource_id, owner=owner)
        if current.metadata.finalizers:
            raise FinalizersPendingError(
                f"cannot destroy {current.metadata.ref}: finalizers pending: "
                f"{', '.join(current.metadata.finalizers)}; tear it down and wait until they are removed"
            )
        collection = self._collection(namespace, type_name)
        del collection.resources[resource_id]
        collection.emit(WatchEvent(EventKind.DESTROYED, current))
        return current

    def add_finalizers(self, namespace: str, type_name: str, resource_id: str, *finalizers: str) -> Resource:
        """Add finalizers (any writer may; a resource being torn down accepts no new ones)."""
        current = self.get(namespace, type_name, resource_id)
        missing = [name for name in dict.fromkeys(finalizers) if name not in current.metadata.finalizers]
        if not missing:
            return current
        if current.metadata.phase is Phase.TEARING_DOWN:
            raise PhaseConflictError(
                f"resource {current.metadata.ref} is being torn down; finalizers {', '.join(missing)} "
                "cannot be added"
            )
        return self._replace(current, finalizers=(*current.metadata.finalizers, *missing))

    def remove_finalizers(
        self, namespace: str, type_name: str, resource_id: str, *finalizers: str
    ) -> Resource:
        """Remove finalizers; names that are not present are ignored."""
        current = self.get(namespace, type_name, resource_id)
        kept = tuple(name for name in current.metadata.finalizers if name not in finalizers)
        if kept == current.metadata.finalizers:
            return current
        return self._replace(current, finalizers=kept)

    # -- internals ---------------------------------------------------------------------------

    def _collection(self, namespace: str, type_name: str) -> _Collection:
        collection = self._collections.get((namespace, type_name))
        if collection is None:
            self.registry.namespace(namespace)
            self.registry.get(type_name)
            collection = _Collection(
                namespace=namespace, type_name=type_name, history_size=self._history_size
            )
            self._collections[(namespace, type_name)] = collection
        return collection

    def _check_spec(self, type_name: str, spec: Spec) -> None:
        expected = self.registry.get(type_name).spec_type
        if not isinstance(spec, expected):
            raise SpecError(
                f"resource type {type_name} takes a {expected.__name__} spec, got {type(spec).__name__}"
            )

    def _owned(self, namespace: str, type_name: str, resource_id: str, *, owner: str | None) -> Resource:
        current = self.get(namespace, type_name, resource_id)
        if current.metadata.owner != owner:
            holder = current.metadata.owner or "no controller (it is user-managed)"
            writer = f"controller {owner}" if owner else "a user"
            raise OwnerConflictError(
                f"resource {current.metadata.ref} is owned by {holder}; {writer} cannot change it"
            )
        return current

    def _replace(
        self,
        current: Resource,
        *,
        spec: Spec | None = None,
        phase: Phase | None = None,
        finalizers: tuple[str, ...] | None = None,
    ) -> Resource:
        metadata = current.metadata
        resource = Resource(
            dataclasses.replace(
                metadata,
                version=metadata.version + 1,
                phase=phase if phase is not None else metadata.phase,
                finalizers=finalizers if finalizers is not None else metadata.finalizers,
                updated=now(),
            ),
            spec if spec is not None else current.spec,
        )
        collection = self._collection(metadata.namespace, metadata.type)
        collection.resources[metadata.id] = resource
        collection.emit(WatchEvent(EventKind.UPDATED, resource, old=current))
        return resource
