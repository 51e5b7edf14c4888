"""kubeplane.controllers: the reconciling controllers of a node (see docs/architecture.md for the layer).

One subpackage per area (``k8s`` for the Kubernetes control plane, later ``config``, ``secrets``,
``etcd``, ``network``); each controller is one small module with declared inputs and outputs and a
single reconcile function, and the pure rendering it relies on lives beside it so it can be tested
without a runtime.

Exceptions raised by this package::

    ControllerError                 base of everything a controller raises on purpose
    └── k8s.RenderError             inputs cannot be rendered into pods, manifests or files
"""

from __future__ import annotations

__all__ = ["ControllerError"]


class ControllerError(Exception):
    """Base class of the errors a controller raises on purpose (never a bug)."""
