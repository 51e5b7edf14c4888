"""Resource metadata and the resource value itself, plus their JSON-safe dict form.

A :class:`Resource` is an immutable snapshot: the state hands out the same object to every
reader and replaces it on each change, so watchers and controllers can keep what they read.
``to_output_dict`` is the shape ``get -o yaml|json`` prints and the node API sends::

    node: NODE
    metadata: {namespace, type, id, version, phase, owner?, finalizers?, created, updated}
    spec: {...}

``owner`` and ``finalizers`` are left out when empty. Timestamps are RFC 3339 strings in UTC.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from typing import Any

from kubeplane.resources.errors import SpecError
from kubeplane.resources.specs import Spec


class Phase(enum.StrEnum):
    """Lifecycle phase: ``tearingDown`` tells consumers to let go before the owner destroys it."""

    RUNNING = "running"
    TEARING_DOWN = "tearingDown"


def now() -> datetime.datetime:
    """The current time in UTC (the clock metadata timestamps use)."""
    return datetime.datetime.now(datetime.UTC)


def format_timestamp(value: datetime.datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` suffix, e.g. ``2021-02-03T04:05:06.789012Z``."""
    return value.astimezone(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_timestamp(value: str) -> datetime.datetime:
    """Inverse of :func:`format_timestamp` (accepts any RFC 3339 offset)."""
    try:
        return datetime.datetime.fromisoformat(value).astimezone(datetime.UTC)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"timestamp {value!r} is not RFC 3339 (e.g. 2021-02-03T04:05:06Z)") from exc


@dataclasses.dataclass(frozen=True)
class Metadata:
    """Identity and bookkeeping of a resource; ``version`` starts at 1 and grows by 1 per change."""

    namespace: str
    type: str
    id: str
    version: int = 1
    phase: Phase = Phase.RUNNING
    finalizers: tuple[str, ...] = ()
    owner: str | None = None
    created: datetime.datetime = dataclasses.field(default_factory=now)
    updated: datetime.datetime = dataclasses.field(default_factory=now)

    @property
    def ref(self) -> str:
        """``namespace/Type/id``: how errors and logs name the resource."""
        return f"{self.namespace}/{self.type}/{self.id}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form; optional keys (owner, finalizers) only when set."""
        data: dict[str, Any] = {
            "namespace": self.namespace,
            "type": self.type,
            "id": self.id,
            "version": self.version,
            "phase": self.phase.value,
        }
        if self.owner is not None:
            data["owner"] = self.owner
        if self.finalizers:
            data["finalizers"] = list(self.finalizers)
        data["created"] = format_timestamp(self.created)
        data["updated"] = format_timestamp(self.updated)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metadata:
        """Inverse of :meth:`to_dict`."""
        try:
            return cls(
                namespace=str(data["namespace"]),
                type=str(data["type"]),
                id=str(data["id"]),
                version=int(data["version"]),
                phase=Phase(data.get("phase", Phase.RUNNING.value)),
                finalizers=tuple(data.get("finalizers", ())),
                owner=data.get("owner"),
                created=parse_timestamp(data["created"]),
                updated=parse_timestamp(data["updated"]),
            )
        except KeyError as exc:
            raise SpecError(f"metadata: missing field {exc.args[0]!r}") from exc
        except ValueError as exc:
            raise SpecError(f"metadata: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class Resource:
    """Metadata plus a typed spec."""

    metadata: Metadata
    spec: Spec

    @property
    def id(self) -> str:
        """Shortcut for ``metadata.id``."""
        return self.metadata.id

    @property
    def version(self) -> int:
        """Shortcut for ``metadata.version``."""
        return self.metadata.version


def to_output_dict(resource: Resource, *, node: str = "") -> dict[str, Any]:
    """The ``get -o yaml|json`` / node API shape of a resource (JSON-safe)."""
    return {"node": node, "metadata": resource.metadata.to_dict(), "spec": resource.spec.to_dict()}


def from_output_dict(data: Mapping[str, Any], spec_type: type[Spec]) -> tuple[str, Resource]:
    """Decode :func:`to_output_dict` output into ``(node, resource)``.

    Callers that only have the dict find ``spec_type`` with
    :meth:`kubeplane.resources.definitions.Registry.decode`.
    """
    metadata = Metadata.from_dict(data.get("metadata", {}))
    return str(data.get("node", "")), Resource(metadata, spec_type.from_dict(data.get("spec", {})))
