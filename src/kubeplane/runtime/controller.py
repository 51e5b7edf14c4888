"""What a controller declares: its inputs, its outputs and a reconcile coroutine.

A controller is any object with ``name``, ``inputs``, ``outputs`` and ``async reconcile(ctx)``
(class attributes are fine). The runtime calls ``reconcile`` once at start and again whenever a
resource matching one of its inputs changes; changes that arrive while a reconcile runs are
coalesced into one more call. Reconciles are level-based: read everything needed from ``ctx``,
write the outputs that should exist, ``ctx.cleanup`` the ones that should not.

Input kinds:

- ``weak``: changes trigger a reconcile, nothing more;
- ``strong``: additionally, every input resource the controller reads while it is ``running`` gets
  the controller's name as a finalizer, so its owner cannot destroy it while it is in use. After
  each successful reconcile the runtime removes that finalizer from the input resources the
  reconcile did not read while running — the ones it stopped using and the ones being torn down,
  which the controller has now seen — and queues the owner of a torn-down one so it can destroy it.

Output kinds: ``exclusive`` (only this controller writes the type; registration enforces it) or
``shared`` (several controllers write the type, each its own resources, as owners are enforced).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kubeplane.runtime.context import ReconcileContext


class InputKind(enum.StrEnum):
    """How a controller depends on an input (see the module docstring)."""

    WEAK = "weak"
    STRONG = "strong"


class OutputKind(enum.StrEnum):
    """Whether other controllers may write the same output type."""

    EXCLUSIVE = "exclusive"
    SHARED = "shared"


@dataclasses.dataclass(frozen=True)
class Input:
    """Resources whose changes trigger a reconcile: one type in one namespace, optionally one id."""

    namespace: str
    type: str
    id: str | None = None
    kind: InputKind = InputKind.WEAK

    def matches(self, namespace: str, type_name: str, resource_id: str) -> bool:
        """Whether a resource falls under this input."""
        return self.namespace == namespace and self.type == type_name and self.id in (None, resource_id)


@dataclasses.dataclass(frozen=True)
class Output:
    """A resource type the controller writes (in any namespace)."""

    type: str
    kind: OutputKind = OutputKind.EXCLUSIVE


class Controller(Protocol):
    """The shape the runtime runs (see the module docstring)."""

    @property
    def name(self) -> str:
        """Unique name, e.g. ``k8s.ManifestApplyController``; logs and finalizers use it."""
        ...

    @property
    def inputs(self) -> Sequence[Input]:
        """What triggers a reconcile."""
        ...

    @property
    def outputs(self) -> Sequence[Output]:
        """The resource types this controller may write."""
        ...

    async def reconcile(self, ctx: ReconcileContext) -> None:
        """Bring the outputs in line with the inputs; raise to be retried with backoff."""
        ...
