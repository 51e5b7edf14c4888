"""Resource definitions (type names, aliases, print columns, sensitivity), namespaces and their registry.

A :class:`ResourceDefinition` says everything the CLI and the API need to know about a type: its full
name (``StaticPods.kubernetes.kubeplane.dev``, what ``metadata.type`` holds), the name tables show
(``StaticPod``), the aliases ``get`` accepts, its default namespace, extra table columns, its spec
class and whether it carries secrets (then only the admin role may read it).

Aliases are matched case-insensitively. Every definition answers to its full name, its plural
(``staticpods``), its singular display name (``staticpod``), the acronym of a multi-word plural
(``sp``, ``kcpc``) and any extra aliases it declares; the registry refuses two types sharing one.

Definitions and namespaces are themselves resources in the ``meta`` namespace (``get rd``,
``get ns``); the spec classes of those two meta types live here for that reason.
"""

from __future__ import annotations

import builtins
import dataclasses
import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kubeplane.resources.errors import DefinitionError, UnknownTypeError
from kubeplane.resources.resource import Resource, from_output_dict
from kubeplane.resources.specs import Spec

META_NAMESPACE = "meta"
RESOURCE_DEFINITIONS = "ResourceDefinitions.meta.kubeplane.dev"
NAMESPACES = "Namespaces.meta.kubeplane.dev"


def format_cell(value: Any) -> str:
    """How a table cell shows a spec value: booleans as ``true``/``false``, lists comma-joined."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(format_cell(item) for item in value)
    return str(value)


@dataclasses.dataclass(frozen=True)
class PrintColumn:
    """An extra table column: a header and either a dotted path into the spec dict or a function."""

    name: str
    json_path: str | None = None
    func: Callable[[Resource], str] | None = None

    def __post_init__(self) -> None:
        if (self.json_path is None) == (self.func is None):
            raise DefinitionError(f"print column {self.name!r}: give exactly one of json_path and func")

    def value(self, resource: Resource) -> str:
        """The cell text for one resource (empty when the path does not exist)."""
        if self.func is not None:
            return self.func(resource)
        current: Any = resource.spec.to_dict()
        for key in (self.json_path or "").split("."):
            if not isinstance(current, Mapping) or key not in current:
                return ""
            current = current[key]
        return format_cell(current)


@dataclasses.dataclass(frozen=True)
class ResourceDefinitionSpec(Spec):
    """Spec of ``meta/ResourceDefinitions/<type>`` resources (what ``get rd -o yaml`` shows)."""

    type: str
    display_type: str
    default_namespace: str
    aliases: Sequence[str] = ()
    print_columns: Sequence[Mapping[str, Any]] = ()
    sensitive: bool = False


@dataclasses.dataclass(frozen=True)
class NamespaceSpec(Spec):
    """Spec of ``meta/Namespaces/<name>`` resources."""

    description: str = ""


@dataclasses.dataclass(frozen=True)
class Namespace:
    """A namespace: resources live in exactly one."""

    name: str
    description: str = ""


def _acronym(plural: str) -> str | None:
    capitals = re.findall(r"[A-Z]", plural)
    return "".join(capitals).lower() if len(capitals) > 1 else None


@dataclasses.dataclass(frozen=True)
class ResourceDefinition:
    """Everything the CLI and API need to know about one resource type (see the module docstring)."""

    type: str
    display_type: str
    default_namespace: str
    # builtins.type because the ``type`` field above shadows the builtin in this class body.
    spec_type: builtins.type[Spec]
    aliases: tuple[str, ...] = ()
    print_columns: tuple[PrintColumn, ...] = ()
    sensitive: bool = False

    def __post_init__(self) -> None:
        plural, _, domain = self.type.partition(".")
        if not plural or not domain:
            raise DefinitionError(
                f"resource type {self.type!r}: expected a full name like StaticPods.kubernetes.kubeplane.dev"
            )

    @property
    def plural(self) -> str:
        """First label of the full name, e.g. ``StaticPods``."""
        return self.type.partition(".")[0]

    @property
    def all_aliases(self) -> tuple[str, ...]:
        """Every lower-case name this type answers to (full name first, then the short ones)."""
        names = [self.type.lower(), self.plural.lower(), self.display_type.lower()]
        acronym = _acronym(self.plural)
        if acronym:
            names.append(acronym)
        names.extend(alias.lower() for alias in self.aliases)
        return tuple(dict.fromkeys(names))

    def to_spec(self) -> ResourceDefinitionSpec:
        """The spec of this definition's ``meta/ResourceDefinitions`` resource."""
        return ResourceDefinitionSpec(
            type=self.type,
            display_type=self.display_type,
            default_namespace=self.default_namespace,
            aliases=self.all_aliases[1:],
            print_columns=[
                {"name": column.name, "jsonPath": column.json_path or ""} for column in self.print_columns
            ],
            sensitive=self.sensitive,
        )


META_DEFINITIONS = (
    ResourceDefinition(
        type=RESOURCE_DEFINITIONS,
        display_type="ResourceDefinition",
        default_namespace=META_NAMESPACE,
        spec_type=ResourceDefinitionSpec,
    ),
    ResourceDefinition(
        type=NAMESPACES,
        display_type="Namespace",
        default_namespace=META_NAMESPACE,
        spec_type=NamespaceSpec,
        aliases=("ns",),
    ),
)


class Registry:
    """Known namespaces and resource definitions; always holds the ``meta`` namespace and its types."""

    def __init__(
        self, *, namespaces: Iterable[Namespace] = (), definitions: Iterable[ResourceDefinition] = ()
    ) -> None:
        self._namespaces: dict[str, Namespace] = {}
        self._definitions: dict[str, ResourceDefinition] = {}
        self._aliases: dict[str, ResourceDefinition] = {}
        self.register_namespace(Namespace(META_NAMESPACE, "Resource definitions and namespaces"))
        for namespace in namespaces:
            self.register_namespace(namespace)
        for definition in (*META_DEFINITIONS, *definitions):
            self.register(definition)

    def register_namespace(self, namespace: Namespace) -> None:
        """Add a namespace; registering the same name twice is an error."""
        if namespace.name in self._namespaces:
            raise DefinitionError(f"namespace {namespace.name!r} is already registered")
        self._namespaces[namespace.name] = namespace

    def register(self, definition: ResourceDefinition) -> None:
        """Add a definition; its default namespace must exist and its aliases must be free."""
        if definition.default_namespace not in self._namespaces:
            raise DefinitionError(
                f"resource type {definition.type}: default namespace {definition.default_namespace!r} "
                "is not registered; register the namespace first"
            )
        for alias in definition.all_aliases:
            taken = self._aliases.get(alias)
            if taken is not None:
                raise DefinitionError(
                    f"resource type {definition.type}: alias {alias!r} is already used by {taken.type}"
                )
        self._definitions[definition.type] = definition
        for alias in definition.all_aliases:
            self._aliases[alias] = definition

    def resolve(self, name: str) -> ResourceDefinition:
        """Find a definition by full name or alias, case-insensitively (what ``get TYPE`` accepts)."""
        definition = self._aliases.get(name.lower())
        if definition is not None:
            return definition
        close = difflib.get_close_matches(name.lower(), list(self._aliases), n=5, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UnknownTypeError(
            f"unknown resource type {name!r}; {hint}`kubeplane get rd` lists the known types"
        )

    def get(self, type_name: str) -> ResourceDefinition:
        """Find a definition by its exact full type name (what ``metadata.type`` holds)."""
        try:
            return self._definitions[type_name]
        except KeyError:
            raise UnknownTypeError(
                f"resource type {type_name!r} is not registered; "
                "use a full type name such as StaticPods.kubernetes.kubeplane.dev"
            ) from None

    def namespace(self, name: str) -> Namespace:
        """Find a namespace by name."""
        try:
            return self._namespaces[name]
        except KeyError:
            known = ", ".join(sorted(self._namespaces))
            raise UnknownTypeError(f"unknown namespace {name!r}; known namespaces: {known}") from None

    def definitions(self) -> list[ResourceDefinition]:
        """All definitions, sorted by full type name."""
        return sorted(self._definitions.values(), key=lambda definition: definition.type)

    def namespaces(self) -> list[Namespace]:
        """All namespaces, sorted by name."""
        return sorted(self._namespaces.values(), key=lambda namespace: namespace.name)

    def decode(self, data: Mapping[str, Any]) -> tuple[str, Resource]:
        """Decode a ``to_output_dict`` dict (e.g. from the node API) into ``(node, resource)``."""
        metadata = data.get("metadata")
        if not isinstance(metadata, Mapping) or "type" not in metadata:
            raise UnknownTypeError("resource dict has no metadata.type; expected the node API's shape")
        return from_output_dict(data, self.get(str(metadata["type"])).spec_type)
