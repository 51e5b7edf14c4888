"""kubeplane.runtime: the controller runtime of the node agent.

Modules:

- :mod:`~kubeplane.runtime.controller`: :class:`Controller` (the protocol controllers implement),
  :class:`Input` / :class:`InputKind` (weak, strong), :class:`Output` / :class:`OutputKind`
  (exclusive, shared) — the semantics are documented there;
- :mod:`~kubeplane.runtime.context`: :class:`ReconcileContext`, what ``reconcile(ctx)`` gets: reads,
  writes limited to declared outputs, ``cleanup``, ``requeue_after``, background tasks for long
  waits (``start_task``, ``task``, ``stop_task``: their end queues the controller), a logger on the
  ``controller-runtime`` stream (:data:`LOGGER_NAME`) prefixing every line with the controller name;
- :mod:`~kubeplane.runtime.runtime`: :class:`Runtime` — register, start/stop, coalesced reconciles,
  exponential backoff on failure.

Exceptions (all from :mod:`kubeplane.runtime.errors`)::

    ControllerRuntimeError        base class; catch this to handle any runtime failure
    ├── RegistrationError         duplicate name, clashing exclusive output, runtime already running
    └── OutputNotDeclaredError    a controller wrote a type it did not declare as an output

State errors raised by a controller's reads and writes (``kubeplane.resources.ResourceError``)
propagate unchanged; inside a reconcile they count as a failure and are retried with backoff.
"""

from kubeplane.runtime.context import LOGGER_NAME, ControllerLogger, ReconcileContext, controller_logger
from kubeplane.runtime.controller import Controller, Input, InputKind, Output, OutputKind
from kubeplane.runtime.errors import ControllerRuntimeError, OutputNotDeclaredError, RegistrationError
from kubeplane.runtime.runtime import Runtime

__all__ = [
    "LOGGER_NAME",
    "Controller",
    "ControllerLogger",
    "ControllerRuntimeError",
    "Input",
    "InputKind",
    "Output",
    "OutputKind",
    "OutputNotDeclaredError",
    "ReconcileContext",
    "RegistrationError",
    "Runtime",
    "controller_logger",
]
