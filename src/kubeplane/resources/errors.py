"""Exceptions of :mod:`kubeplane.resources` (the tree is drawn in the package docstring).

Every message names the resource (``namespace/Type/id``) or the spec field it is about and says what
to do, because these errors surface unchanged in controller logs and CLI output.
"""

from __future__ import annotations


class ResourceError(Exception):
    """Base class of every error raised by the resources layer."""


class SpecError(ResourceError):
    """A spec is not JSON-able, has the wrong class for its type, or a dict does not decode into it."""


class DefinitionError(ResourceError):
    """A resource definition or namespace clashes with one already registered, or is malformed."""


class UnknownTypeError(ResourceError):
    """A resource type name, alias or namespace is not registered."""


class NotFoundError(ResourceError):
    """The resource does not exist."""


class AlreadyExistsError(ResourceError):
    """``create`` of a resource that already exists."""


class ConflictError(ResourceError):
    """Optimistic concurrency failure: the caller's version is not the current one."""


class OwnerConflictError(ResourceError):
    """The resource is owned by another controller (or by nobody, and a controller tried to take it)."""


class PhaseConflictError(ResourceError):
    """The spec of a resource that is being torn down cannot change."""


class FinalizersPendingError(ResourceError):
    """``destroy`` while finalizers remain on the resource."""


class FellBehindError(ResourceError):
    """A watcher consumed events slower than the collection's bounded history keeps them.

    The watch is over; start a new one to get the current state again.
    """
