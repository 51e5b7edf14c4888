"""kubeplane.resources: resource metadata, typed specs, definitions and the in-memory state.

No I/O happens here. Modules:

- :mod:`~kubeplane.resources.specs`: :class:`Spec` (frozen dataclass ⇄ JSON dict), :class:`DictSpec`;
- :mod:`~kubeplane.resources.resource`: :class:`Metadata`, :class:`Resource`, :class:`Phase`,
  :func:`to_output_dict` (the ``node/metadata/spec`` shape ``get -o yaml`` and the node API use);
- :mod:`~kubeplane.resources.definitions`: :class:`ResourceDefinition`, :class:`PrintColumn`,
  :class:`Namespace`, :class:`Registry` (``resolve`` aliases, ``decode`` API dicts);
- :mod:`~kubeplane.resources.catalog`: the node's namespaces, type names, spec classes and
  :func:`default_registry`;
- :mod:`~kubeplane.resources.state`: :class:`State` (optimistic writes, finalizers, owners) and
  :class:`Watch` / :class:`WatchEvent`.

Exceptions (all from :mod:`kubeplane.resources.errors`)::

    ResourceError                 base class; catch this to handle any resource failure
    ├── SpecError                 spec not JSON-able, wrong spec class for the type, bad dict
    ├── DefinitionError           definition/namespace clashes with a registered one or is malformed
    ├── UnknownTypeError          type name, alias or namespace not registered (lists close matches)
    ├── NotFoundError             resource does not exist
    ├── AlreadyExistsError        create of an existing resource
    ├── ConflictError             update based on a stale version
    ├── OwnerConflictError        write by someone other than the resource's owner
    ├── PhaseConflictError        spec change / new finalizer on a resource being torn down
    ├── FinalizersPendingError    destroy while finalizers remain
    └── FellBehindError           a watcher lagged beyond the collection's history
"""

from kubeplane.resources import catalog
from kubeplane.resources.catalog import default_registry
from kubeplane.resources.definitions import (
    META_NAMESPACE,
    NAMESPACES,
    RESOURCE_DEFINITIONS,
    Namespace,
    PrintColumn,
    Registry,
    ResourceDefinition,
)
from kubeplane.resources.errors import (
    AlreadyExistsError,
    ConflictError,
    DefinitionError,
    FellBehindError,
    FinalizersPendingError,
    NotFoundError,
    OwnerConflictError,
    PhaseConflictError,
    ResourceError,
    SpecError,
    UnknownTypeError,
)
from kubeplane.resources.resource import Metadata, Phase, Resource, from_output_dict, to_output_dict
from kubeplane.resources.specs import DictSpec, FrozenDict, Spec
from kubeplane.resources.state import EventKind, State, Watch, WatchEvent

__all__ = [
    "META_NAMESPACE",
    "NAMESPACES",
    "RESOURCE_DEFINITIONS",
    "AlreadyExistsError",
    "ConflictError",
    "DefinitionError",
    "DictSpec",
    "EventKind",
    "FellBehindError",
    "FinalizersPendingError",
    "FrozenDict",
    "Metadata",
    "Namespace",
    "NotFoundError",
    "OwnerConflictError",
    "Phase",
    "PhaseConflictError",
    "PrintColumn",
    "Registry",
    "Resource",
    "ResourceDefinition",
    "ResourceError",
    "Spec",
    "SpecError",
    "State",
    "UnknownTypeError",
    "Watch",
    "WatchEvent",
    "catalog",
    "default_registry",
    "from_output_dict",
    "to_output_dict",
]
