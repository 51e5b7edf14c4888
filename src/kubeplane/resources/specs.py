"""Typed resource specs: immutable values that convert to and from JSON-able dicts.

A spec class is a frozen dataclass deriving from :class:`Spec`. Its field values must be JSON
values (str, int, float, bool, None, lists, dicts with str keys); on construction they are deeply
frozen (dicts become :class:`FrozenDict`, lists become tuples) so that a spec held by the state can
never be changed behind its back — equal-spec updates are no-ops, and that only works if nobody can
mutate the stored value in place. ``to_dict`` thaws them back into plain dicts and lists with
camelCase keys (``machine_type`` → ``machineType``), matching the original system's field names.

Nested dataclasses are deliberately not supported: resources cross the node API as plain dicts,
and one flat layer of typed fields plus JSON payloads (pods, manifests) is all the controllers need.

:class:`DictSpec` is the generic spec whose ``to_dict`` is its payload itself (machine config,
secrets bundles, control plane component configs).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any, Self

from kubeplane.resources.errors import SpecError

_JSON_SCALARS = (str, int, float, bool, type(None))


class FrozenDict(Mapping[str, Any]):
    """An immutable, hashable mapping; compares equal to any mapping with the same items."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)
        self._hash: int | None = None

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"


def freeze(value: Any, *, path: str = "spec") -> Any:
    """Return a deeply immutable copy of a JSON value; ``path`` names the field in errors."""
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, Mapping):
        frozen: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise SpecError(f"{path}: key {key!r} is not a string; JSON objects need string keys")
            frozen[key] = freeze(item, path=f"{path}.{key}")
        return FrozenDict(frozen)
    if isinstance(value, list | tuple):
        return tuple(freeze(item, path=f"{path}[{index}]") for index, item in enumerate(value))
    raise SpecError(
        f"{path}: a {type(value).__name__} is not a JSON value; use str, int, float, bool, None, list or dict"
    )


def thaw(value: Any) -> Any:
    """Return a plain (mutable, JSON-serialisable) copy of a frozen value."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(item) for item in value]
    return value


def camel_case(name: str) -> str:
    """``self_hosted_control_plane`` → ``selfHostedControlPlane``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def snake_case(name: str) -> str:
    """``selfHostedControlPlane`` → ``self_hosted_control_plane``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclasses.dataclass(frozen=True)
class Spec:
    """Base class of typed specs (see the module docstring for the rules on field values)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            frozen = freeze(getattr(self, field.name), path=f"spec.{camel_case(field.name)}")
            object.__setattr__(self, field.name, frozen)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-able dict with camelCase keys."""
        return {camel_case(field.name): thaw(getattr(self, field.name)) for field in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build the spec from ``to_dict`` output; unknown keys and missing required keys are errors."""
        if not isinstance(data, Mapping):
            raise SpecError(f"spec of {cls.__name__}: expected a mapping, got {type(data).__name__}")
        names = {camel_case(field.name): field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise SpecError(
                f"spec of {cls.__name__}: unknown field(s) {', '.join(unknown)}; "
                f"expected some of {', '.join(sorted(names))}"
            )
        try:
            return cls(**{names[key]: value for key, value in data.items()})
        except TypeError as exc:
            raise SpecError(f"spec of {cls.__name__}: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class DictSpec(Spec):
    """A generic spec: any JSON object, serialised as itself (not wrapped in a ``data`` key)."""

    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The payload as a plain dict."""
        return dict(thaw(self.data))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Wrap a JSON object."""
        if not isinstance(data, Mapping):
            raise SpecError(f"spec of {cls.__name__}: expected a mapping, got {type(data).__name__}")
        return cls(data=data)
