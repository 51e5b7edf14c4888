"""Exceptions of :mod:`kubeplane.runtime` (the tree is drawn in the package docstring)."""

from __future__ import annotations


class ControllerRuntimeError(Exception):
    """Base class of every error raised by the controller runtime itself."""


class RegistrationError(ControllerRuntimeError):
    """A controller cannot be registered: duplicate name, clashing exclusive output, runtime started."""


class OutputNotDeclaredError(ControllerRuntimeError):
    """A controller wrote a resource type it did not declare as an output."""
