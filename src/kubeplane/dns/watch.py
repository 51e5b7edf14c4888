"""Reflectors: the cluster's Services and EndpointSlices kept current in a records :class:`Table`.

Each reflector lists its collection through :class:`~kubeplane.clients.kube.KubeClient`, then
watches from the list's ``resourceVersion`` (with bookmarks, so a resumed watch starts from a
recent version):

- every event rebuilds that one Service's records (``Table.with_service``/``without_service``) and
  swaps :attr:`Mirror.table` in one assignment (one event loop, no lock), then calls ``on_change``.
  The server's wire cache sees the new table object and drops its entries; a query in flight
  keeps the snapshot it started with;
- ``KubeGone`` (the version was compacted away) lists again and replaces that whole set;
- ``KubeUnavailable`` (no answer, a broken stream) waits a :class:`kubeplane.retry.Backoff`
  delay (0.2 s doubling to 5 s, reset by any progress) and watches again from the last version
  seen, or lists again if the list failed. A stream the server ended on time is resumed at once;
- any other error (403: the RBAC rules are missing) ends the reflector: the process exits and
  the pod restarts, visibly, instead of serving stale records forever.

EndpointSlices are read from ``discovery.k8s.io/v1`` when discovery lists it there, else from
``v1beta1`` (Kubernetes 1.20 has only that; the fields used are the same). Where the pod may not
list EndpointSlices (a 403: the RBAC rules CoreDNS 1.7 came with, which kubeadm v1.20 creates,
grant only ``v1`` Endpoints), it reads Endpoints instead, each turned into the slices it stands
for (:func:`slices_of_endpoints`). :attr:`Mirror.ready` turns true once both initial lists are
applied: the server's ``/ready`` answers 200 from then on. Namespaces are not watched (CoreDNS 1.7
neither, by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from kubeplane import retry
from kubeplane.clients import errors
from kubeplane.clients.kube import KubeClient
from kubeplane.dns.records import SERVICE_NAME_LABEL, ServiceKey, Table

__all__ = [
    "BACKOFF",
    "ENDPOINTS",
    "SERVICES",
    "Mirror",
    "endpoint_slices_path",
    "reflect",
    "run",
    "slices_of_endpoints",
]

log = logging.getLogger(__name__)

SERVICES = "/api/v1/services"
ENDPOINTS = "/api/v1/endpoints"
#: Waits after the API server could not answer: 0.2 s doubling to 5 s.
BACKOFF = retry.Backoff(initial=0.2, factor=2.0, maximum=5.0)
#: How long one watch request lasts before the server ends it (and the reflector watches again).
WATCH_SECONDS = 300

T = TypeVar("T")
Object = dict[str, Any]
ObjectKey = tuple[str, str]


def _key(obj: Mapping[str, Any]) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _owner(endpoint_slice: Mapping[str, Any]) -> ServiceKey | None:
    meta = endpoint_slice.get("metadata") or {}
    name = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    return (str(meta.get("namespace")), str(name)) if name else None


class Mirror:
    """The latest Services and EndpointSlices, and the :class:`Table` built from them."""

    def __init__(self, on_change: Callable[[Table], object] = lambda table: None) -> None:
        self.table = Table()
        self._on_change = on_change
        self._services: dict[ServiceKey, Object] = {}
        self._slices: dict[ObjectKey, Object] = {}
        self._listed: set[str] = set()

    @property
    def ready(self) -> bool:
        """Whether both initial lists (Services and EndpointSlices) are applied."""
        return self._listed >= {"services", "endpointslices"}

    def replace_services(self, items: list[Object]) -> None:
        """A (re)list of Services: replace them all."""
        self._services = {_key(item): item for item in items}
        self._listed.add("services")
        self._rebuild()

    @property
    def slices_listed(self) -> bool:
        return "endpointslices" in self._listed

    def replace_slices(self, items: list[Object]) -> None:
        """A (re)list of EndpointSlices: replace them all."""
        self._slices = {_key(item): item for item in items}
        self._listed.add("endpointslices")
        self._rebuild()

    def service_event(self, kind: str, obj: Object) -> None:
        """A watch event of a Service: rebuild its records."""
        key = _key(obj)
        if kind == "DELETED":
            self._services.pop(key, None)
        else:
            self._services[key] = obj
        self._update(key)

    def slice_event(self, kind: str, obj: Object) -> None:
        """A watch event of an EndpointSlice: rebuild the records of its Service (old and new)."""
        key = _key(obj)
        before = self._slices.get(key)
        if kind == "DELETED":
            self._slices.pop(key, None)
        else:
            self._slices[key] = obj
        owners = {_owner(obj), _owner(before) if before is not None else None} - {None}
        for owner in owners:
            assert owner is not None
            self._update(owner)

    def _update(self, key: ServiceKey) -> None:
        service = self._services.get(key)
        if service is None:
            self._publish(self.table.without_service(key))
        else:
            slices = [item for item in self._slices.values() if _owner(item) == key]
            self._publish(self.table.with_service(key, service, slices))

    def _rebuild(self) -> None:
        table = Table.from_objects(self._services.values(), self._slices.values())
        table.generation = self.table.generation + 1
        self._publish(table)

    def _publish(self, table: Table) -> None:
        if table is not self.table:
            self.table = table
            self._on_change(table)


async def _retrying(delays: Iterator[float], what: str, call: Callable[[], Awaitable[T]]) -> T:
    """``call()`` until it does not raise ``KubeUnavailable``, waiting ``delays`` between tries."""
    while True:
        try:
            return await call()
        except errors.KubeUnavailable as exc:
            delay = next(delays)
            log.warning("%s: %s; again in %.1fs", what, retry.one_line(exc), delay)
            await asyncio.sleep(delay)


async def endpoint_slices_path(client: KubeClient, backoff: retry.Backoff = BACKOFF) -> str:
    """The EndpointSlice collection: ``discovery.k8s.io/v1`` if served, else ``v1beta1``."""

    async def find() -> str:
        try:
            found = await client.resource("discovery.k8s.io/v1", "EndpointSlice")
        except errors.KubeNotFound:
            found = await client.resource("discovery.k8s.io/v1beta1", "EndpointSlice")
        return found.path(namespace=None)

    return await _retrying(backoff.delays(), "discovering EndpointSlices", find)


async def reflect(
    client: KubeClient,
    path: str,
    replace: Callable[[list[Object]], None],
    apply: Callable[[str, Object], None],
    *,
    backoff: retry.Backoff = BACKOFF,
    watch_seconds: int = WATCH_SECONDS,
) -> None:
    """List ``path`` into ``replace``, then feed its watch events to ``apply``, forever."""
    while True:
        delays = backoff.delays()
        items, version = await _retrying(delays, f"listing {path}", lambda: client.list_with_version(path))
        replace(items)
        log.info("listed %d objects at %s (version %s)", len(items), path, version)
        while True:
            try:
                async with contextlib.aclosing(
                    client.watch(path, version, timeout_seconds=watch_seconds)
                ) as events:
                    async for kind, obj in events:
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        delays = backoff.delays()
                        if kind != "BOOKMARK":
                            apply(kind, obj)
            except errors.KubeGone as exc:
                log.info("%s; listing again", retry.one_line(exc))
                break
            except errors.KubeUnavailable as exc:
                delay = next(delays)
                log.warning("watch %s: %s; again in %.1fs", path, retry.one_line(exc), delay)
                await asyncio.sleep(delay)


def slices_of_endpoints(endpoints: Mapping[str, Any]) -> list[Object]:
    """The EndpointSlices a ``v1`` Endpoints object stands for: one per subset and address
    family, labelled with its Service, ready and not-ready addresses marked as such."""
    meta = endpoints.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    found: list[Object] = []
    for index, subset in enumerate(endpoints.get("subsets") or []):
        by_family: dict[str, list[Object]] = {}
        for key, ready in (("addresses", True), ("notReadyAddresses", False)):
            for address in subset.get(key) or []:
                ip = str(address.get("ip") or "")
                endpoint: Object = {"addresses": [ip], "conditions": {"ready": ready}}
                for field in ("hostname", "targetRef", "nodeName"):
                    if address.get(field):
                        endpoint[field] = address[field]
                by_family.setdefault("IPv6" if ":" in ip else "IPv4", []).append(endpoint)
        for family, items in sorted(by_family.items()):
            found.append(
                {
                    "metadata": {
                        "namespace": namespace,
                        "name": f"{name}-{index}-{family.lower()}",
                        "labels": {SERVICE_NAME_LABEL: name},
                    },
                    "addressType": family,
                    "endpoints": items,
                    "ports": list(subset.get("ports") or []),
                }
            )
    return found


class _EndpointsAsSlices:
    """Feeds Endpoints (list and watch events) to a :class:`Mirror` as the slices they stand for."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self._names: dict[ObjectKey, list[ObjectKey]] = {}

    def replace(self, items: list[Object]) -> None:
        slices = [item for endpoints in items for item in slices_of_endpoints(endpoints)]
        self._names = {
            _key(endpoints): [_key(s) for s in slices_of_endpoints(endpoints)] for endpoints in items
        }
        self.mirror.replace_slices(slices)

    def apply(self, kind: str, endpoints: Object) -> None:
        key = _key(endpoints)
        fresh = [] if kind == "DELETED" else slices_of_endpoints(endpoints)
        fresh_keys = {_key(item) for item in fresh}
        for namespace, name in self._names.get(key, []):
            if (namespace, name) not in fresh_keys:
                gone = {
                    "metadata": {"namespace": namespace, "name": name, "labels": {SERVICE_NAME_LABEL: key[1]}}
                }
                self.mirror.slice_event("DELETED", gone)
        for item in fresh:
            self.mirror.slice_event("MODIFIED", item)
        self._names[key] = [_key(item) for item in fresh]


async def _slices_or_endpoints(client: KubeClient, path: str, mirror: Mirror, backoff: retry.Backoff) -> None:
    """Reflect the EndpointSlices at ``path``; if the very first list is forbidden, Endpoints."""
    try:
        await reflect(client, path, mirror.replace_slices, mirror.slice_event, backoff=backoff)
    except errors.KubeForbidden as exc:
        if mirror.slices_listed:
            raise  # allowed before, refused now: exit and restart, visibly
        log.info("may not list %s (%s): reading %s instead", path, retry.one_line(exc), ENDPOINTS)
    adapter = _EndpointsAsSlices(mirror)
    await reflect(client, ENDPOINTS, adapter.replace, adapter.apply, backoff=backoff)


async def run(client: KubeClient, mirror: Mirror, *, backoff: retry.Backoff = BACKOFF) -> None:
    """Keep ``mirror`` current from the cluster until cancelled (or a non-retryable error)."""
    slices = await endpoint_slices_path(client, backoff)
    async with asyncio.TaskGroup() as group:
        group.create_task(
            reflect(client, SERVICES, mirror.replace_services, mirror.service_event, backoff=backoff)
        )
        group.create_task(_slices_or_endpoints(client, slices, mirror, backoff))
