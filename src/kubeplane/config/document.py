"""The machine configuration document: the YAML tree as written (comments, key order, quoting)
together with its validated model.

A :class:`MachineConfig` is immutable by convention: patches and edits produce new documents, so
the model can never drift from the tree. Saving a document that was loaded and not changed returns
the loaded text byte for byte; a changed document is written by ruamel.yaml in the indentation style
guessed from the original text, so untouched parts (and their comments) read as before.
"""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from io import StringIO
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.scalarint import ScalarInt

from kubeplane.config import models
from kubeplane.config.errors import DOCUMENT_PATH, ConfigError, FieldError, join_path
from kubeplane.config.validate import Mode, validate


@dataclass(frozen=True)
class Style:
    """Block indentation of a YAML text, in ruamel.yaml's terms."""

    mapping: int = 2
    sequence: int = 4
    offset: int = 2
    explicit_start: bool = False

    @classmethod
    def guess(cls, text: str) -> Style:
        """Guess the style from the first nested mapping and the first block sequence under a key."""
        mapping: int | None = None
        sequence: tuple[int, int] | None = None
        previous_key_indent: int | None = None
        for line in text.splitlines():
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            indent = len(line) - len(line.lstrip(" "))
            if previous_key_indent is not None:
                if stripped.startswith("- ") or stripped == "-":
                    if sequence is None:
                        dash = indent - previous_key_indent
                        after = len(stripped[1:]) - len(stripped[1:].lstrip(" "))
                        sequence = (dash + 1 + max(after, 1), dash)
                elif mapping is None and indent > previous_key_indent:
                    mapping = indent - previous_key_indent
            if mapping is not None and sequence is not None:
                break
            previous_key_indent = indent if stripped.endswith(":") and not stripped.startswith("- ") else None
        style = cls(explicit_start=text.lstrip().startswith("---"))
        if mapping is not None:
            style = cls(
                mapping=mapping, sequence=mapping + 2, offset=mapping, explicit_start=style.explicit_start
            )
        if sequence is not None:
            style = cls(
                mapping=style.mapping,
                sequence=sequence[0],
                offset=sequence[1],
                explicit_start=style.explicit_start,
            )
        return style

    def yaml(self) -> YAML:
        """A round-trip ruamel.yaml instance that writes in this style."""
        yaml = YAML(typ="rt")
        yaml.preserve_quotes = True
        # Long base64 certificates must stay on one line, as they were written.
        yaml.width = 1 << 16
        yaml.indent(mapping=self.mapping, sequence=self.sequence, offset=self.offset)
        yaml.explicit_start = self.explicit_start
        return yaml


class MachineConfig:
    """A loaded (or generated) machine configuration: ``tree`` (ruamel.yaml nodes, comments included)
    and ``model`` (the validated :class:`~kubeplane.config.models.Config`).

    Treat both as read-only; :func:`kubeplane.config.apply_json_patch` and
    :func:`kubeplane.config.apply_merge_patch` return new documents.
    """

    def __init__(
        self,
        *,
        tree: CommentedMap,
        model: models.Config,
        style: Style,
        source: str | None = None,
        warnings: Sequence[FieldError] = (),
    ) -> None:
        self.tree = tree
        self.model = model
        self.style = style
        self.warnings: list[FieldError] = list(warnings)
        self._source = source

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, mode: Mode | None = None, style: Style | None = None
    ) -> MachineConfig:
        """Build and validate a document from plain data (as a generator would)."""
        return cls.from_tree(to_tree(data), mode=mode, style=style or Style())

    @classmethod
    def from_tree(cls, tree: Any, *, mode: Mode | None = None, style: Style) -> MachineConfig:
        """Validate a ruamel.yaml tree and wrap it; raises ``ConfigError``."""
        model, warnings = validate(to_plain(tree), mode=mode)
        return cls(tree=tree, model=model, style=style, warnings=warnings)

    def to_yaml(self) -> str:
        """The document as YAML text: the loaded text itself when nothing changed."""
        if self._source is not None:
            return self._source
        return dump(self.tree, self.style)

    def to_dict(self) -> dict[str, Any]:
        """A plain (JSON-compatible) deep copy of the document."""
        plain = to_plain(self.tree)
        assert isinstance(plain, dict)
        return plain

    def copy(self) -> MachineConfig:
        """An independent copy (its tree can be changed without touching this one)."""
        return MachineConfig(
            tree=copy.deepcopy(self.tree),
            model=self.model,
            style=self.style,
            source=self._source,
            warnings=self.warnings,
        )

    def __repr__(self) -> str:
        machine, cluster = self.model.machine, self.model.cluster
        return f"<MachineConfig type={machine.type} endpoint={cluster.control_plane.endpoint}>"


def load(text: str | bytes, *, mode: Mode | None = None) -> MachineConfig:
    """Parse and validate a machine configuration (YAML or JSON text).

    Raises ``ConfigError`` listing every problem; never returns a partly valid document.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                [FieldError(DOCUMENT_PATH, f"not UTF-8 text ({exc.reason} at byte {exc.start})")]
            ) from None
    tree = parse(text)
    style = Style.guess(text)
    document = MachineConfig.from_tree(tree, mode=mode, style=style)
    document._source = text
    return document


def parse(text: str, *, subject: str = "machine config") -> Any:
    """Parse YAML text into a ruamel.yaml tree, raising ``ConfigError`` for anything unparsable."""
    try:
        return Style().yaml().load(text)
    # The parser reads untrusted text and can fail in many ways (syntax, duplicate keys, bad tags,
    # recursion); every one of them is a problem with the document, never a crash.
    except Exception as exc:
        raise ConfigError([FieldError(DOCUMENT_PATH, _parse_message(exc))], subject=subject) from None


def _parse_message(exc: Exception) -> str:
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        message = f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    else:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "duplicate key" in str(exc):
        key = re.search(r'found duplicate key "([^"]*)"', str(exc))
        message = f'duplicate key "{key.group(1) if key else "?"}"' + (
            f" (line {mark.line + 1})" if mark is not None else ""
        )
    return f"not valid YAML: {message}"


def dump(tree: Any, style: Style) -> str:
    """Write a ruamel.yaml tree as text in ``style``."""
    stream = StringIO()
    style.yaml().dump(tree, stream)
    return stream.getvalue()


def to_plain(node: Any) -> Any:
    """Convert a ruamel.yaml tree into plain dicts, lists and scalars, as the original loader reads them.

    Raises ``ConfigError`` for recursive aliases, which have no plain form.
    """
    return _to_plain(node, "", set())


def _to_plain(node: Any, path: str, active: set[int]) -> Any:
    if isinstance(node, Mapping | list):
        if id(node) in active:
            raise ConfigError([FieldError(path or DOCUMENT_PATH, "refers to itself through a YAML alias")])
        active.add(id(node))
        try:
            if isinstance(node, Mapping):
                result: Any = {}
                for key, value in node.items():
                    name = _key(key)
                    result[name] = _to_plain(value, join_path(path, name), active)
                return result
            return [_to_plain(item, join_path(path, index), active) for index, item in enumerate(node)]
        finally:
            active.discard(id(node))
    return _scalar(node)


def _key(key: Any) -> str:
    scalar = _scalar(key)
    if scalar is None:
        return "null"
    if isinstance(scalar, bool):
        return "true" if scalar else "false"
    return str(scalar)


def _scalar(node: Any) -> Any:
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, ScalarInt):
        width = getattr(node, "_width", None)
        digits = str(int(node))
        # YAML 1.2 reads 0644 as 644, but the original (Go) loader, and every example of file
        # permissions in the documents, mean octal.
        if type(node) is ScalarInt and width and width > len(digits) and int(node) >= 0:
            padded = digits.rjust(width, "0")
            if set(padded) <= set("01234567"):
                return int(padded, 8)
        return int(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, TaggedScalar):
        return str(node.value)
    if isinstance(node, datetime.date):
        return node.isoformat()
    if isinstance(node, set):
        return sorted(str(item) for item in node)
    return node


def to_tree(value: Any) -> Any:
    """Convert plain data into ruamel.yaml nodes (so it can be commented, patched and dumped)."""
    if isinstance(value, Mapping):
        mapping = CommentedMap()
        for key, item in value.items():
            mapping[key] = to_tree(item)
        return mapping
    if isinstance(value, list | tuple):
        return CommentedSeq(to_tree(item) for item in value)
    return value
