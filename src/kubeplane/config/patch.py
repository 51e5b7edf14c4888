"""Patches of machine configuration documents: RFC 6902 JSON patches and RFC 7386 merge patches.

Both work on a deep copy of the document's ruamel.yaml tree, so comments and key order survive
wherever the patch does not touch, and a patch that fails at any operation changes nothing. The
patched tree is validated again: a patch that produces an invalid config raises
:class:`~kubeplane.config.errors.ConfigError` with the field paths of the result.

Merge patches follow RFC 7386: mappings merge recursively, ``null`` deletes a key, and anything
else (lists included) replaces the original value. The source documents describe no list-merging
semantics for v1alpha1, and replacing keeps a patch's effect obvious from its text.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any

from kubeplane.config.document import MachineConfig, parse, to_plain, to_tree
from kubeplane.config.errors import ConfigError, FieldError
from kubeplane.config.validate import Mode

_OPS = ("add", "remove", "replace", "move", "copy", "test")
_JSON_PATCH = "JSON patch"


class _PatchFailed(Exception):
    """One operation could not be applied; carries the message for the user."""


def apply_json_patch(
    doc: MachineConfig, ops: str | Sequence[Mapping[str, Any]], *, mode: Mode | None = None
) -> MachineConfig:
    """Apply an RFC 6902 patch (JSON text or a list of operations) and return the new document.

    Raises ``ConfigError`` (subject ``JSON patch``) naming the failing operation, or the field
    errors of the patched config; ``doc`` is never changed.
    """
    operations = _parse_ops(ops)
    root: list[Any] = [copy.deepcopy(doc.tree)]
    for index, op in enumerate(operations):
        try:
            _apply_op(root, op)
        except _PatchFailed as exc:
            where = f"patch[{index}]"
            raise ConfigError(
                [FieldError(where, f"{op['op']} {op['path']}: {exc}")], subject=_JSON_PATCH
            ) from None
    # Removing "" leaves no document; validation then reports it as empty.
    return MachineConfig.from_tree(root[0] if root else None, mode=mode, style=doc.style)


def apply_merge_patch(
    doc: MachineConfig, patch: str | Mapping[str, Any], *, mode: Mode | None = None
) -> MachineConfig:
    """Apply an RFC 7386 merge patch (YAML/JSON text or a mapping) and return the new document."""
    patch_tree = parse(patch, subject="merge patch") if isinstance(patch, str) else to_tree(patch)
    if not isinstance(patch_tree, Mapping):
        raise ConfigError(
            [
                FieldError(
                    "(patch)", "a merge patch must be a mapping, e.g. {machine: {time: {disabled: true}}}"
                )
            ],
            subject="merge patch",
        )
    tree = copy.deepcopy(doc.tree)
    _merge(tree, patch_tree)
    return MachineConfig.from_tree(tree, mode=mode, style=doc.style)


def apply_patch(doc: MachineConfig, patch: str, *, mode: Mode | None = None) -> MachineConfig:
    """Apply a patch given as text: a JSON/YAML list is a JSON patch, a mapping a merge patch."""
    parsed = to_plain(parse(patch, subject="patch"))
    if isinstance(parsed, list):
        return apply_json_patch(doc, parsed, mode=mode)
    return apply_merge_patch(doc, patch, mode=mode)


def _merge(target: MutableMapping[Any, Any], patch: Mapping[Any, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), MutableMapping):
            _merge(target[key], value)
        elif isinstance(value, Mapping):
            merged = to_tree({})
            _merge(merged, value)
            target[key] = merged
        else:
            target[key] = copy.deepcopy(value)


def _parse_ops(ops: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(ops, str):
        try:
            ops = json.loads(ops)
        except ValueError as exc:
            raise ConfigError(
                [FieldError("(patch)", f"not valid JSON: {exc}")], subject=_JSON_PATCH
            ) from None
    if not isinstance(ops, Sequence) or isinstance(ops, str):
        raise ConfigError(
            [
                FieldError(
                    "(patch)", 'expected a list of operations, e.g. [{"op": "add", "path": "/a", "value": 1}]'
                )
            ],
            subject=_JSON_PATCH,
        )
    errors: list[FieldError] = []
    result: list[dict[str, Any]] = []
    for index, op in enumerate(ops):
        where = f"patch[{index}]"
        if not isinstance(op, Mapping):
            errors.append(FieldError(where, "expected an operation mapping with op and path"))
            continue
        if op.get("op") not in _OPS:
            errors.append(FieldError(f"{where}.op", f"{op.get('op')!r} is not one of {', '.join(_OPS)}"))
            continue
        required = ["path"] + (["value"] if op["op"] in ("add", "replace", "test") else [])
        required += ["from"] if op["op"] in ("move", "copy") else []
        for name in required:
            if name not in op:
                errors.append(FieldError(f"{where}.{name}", f"required for {op['op']}"))
            elif name != "value" and not _is_pointer(op[name]):
                errors.append(
                    FieldError(
                        f"{where}.{name}", f'{op[name]!r} is not a JSON pointer (expected "" or "/a/b")'
                    )
                )
        result.append(dict(op))
    if errors:
        raise ConfigError(errors, subject=_JSON_PATCH)
    return result


def _is_pointer(value: Any) -> bool:
    return isinstance(value, str) and (value == "" or value.startswith("/"))


def _tokens(pointer: str) -> list[str]:
    # The document is held at index 0 of a one-element list so that "" (the whole document) is an
    # ordinary location; every pointer therefore starts with the token "0".
    return ["0"] + [token.replace("~1", "/").replace("~0", "~") for token in pointer.split("/")[1:]]


def _apply_op(root: list[Any], op: Mapping[str, Any]) -> None:
    kind = op["op"]
    path = _tokens(op["path"])
    if kind == "add":
        _add(root, path, to_tree(op["value"]))
    elif kind == "remove":
        _remove(root, path)
    elif kind == "replace":
        _replace(root, path, to_tree(op["value"]))
    elif kind in ("move", "copy"):
        source = _tokens(op["from"])
        value = _get(root, source)
        if kind == "move":
            if path[: len(source)] == source and path != source:
                raise _PatchFailed(f"cannot move {op['from']} into its own child")
            _remove(root, source)
        else:
            value = copy.deepcopy(value)
        _add(root, path, value)
    elif kind == "test":
        actual = to_plain(_get(root, path))
        if not _json_equal(actual, op["value"]):
            raise _PatchFailed(
                f"test failed: value is {json.dumps(actual)}, expected {json.dumps(op['value'])}"
            )


def _get(root: list[Any], tokens: list[str]) -> Any:
    node: Any = root
    for depth, token in enumerate(tokens):
        node = _child(node, token, tokens[:depth])
    return node


def _child(node: Any, token: str, parent: list[str]) -> Any:
    where = _pointer(parent)
    if isinstance(node, Mapping):
        if token not in node:
            raise _PatchFailed(f"{where or 'the document'} has no key {token!r}")
        return node[token]
    if isinstance(node, list):
        index = _index(token, len(node) - 1, where)
        return node[index]
    raise _PatchFailed(f"{where} is a scalar, it has no {token!r}")


def _index(step: str, last: int, where: str) -> int:
    if not step.isascii() or not step.isdigit() or (len(step) > 1 and step.startswith("0")):
        raise _PatchFailed(f"{step!r} is not a list index of {where}")
    index = int(step)
    if index > last:
        raise _PatchFailed(
            f"index {index} is out of range for {where} (length {last + 1 if last >= 0 else 0})"
        )
    return index


def _add(root: list[Any], steps: list[str], value: Any) -> None:
    parent = _get(root, steps[:-1])
    step = steps[-1]
    if isinstance(parent, MutableMapping):
        parent[step] = value
    elif isinstance(parent, MutableSequence):
        if step == "-":
            parent.append(value)
        else:
            parent.insert(_index(step, len(parent), _pointer(steps[:-1])), value)
    else:
        raise _PatchFailed(f"{_pointer(steps[:-1])} is a scalar, cannot add {step!r} to it")


def _replace(root: list[Any], steps: list[str], value: Any) -> None:
    # Assigning in place keeps the key's position (and comments) in the mapping.
    parent = _get(root, steps[:-1])
    _child(parent, steps[-1], steps[:-1])
    if isinstance(parent, MutableMapping):
        parent[steps[-1]] = value
    else:
        parent[int(steps[-1])] = value


def _remove(root: list[Any], steps: list[str]) -> None:
    parent = _get(root, steps[:-1])
    _child(parent, steps[-1], steps[:-1])
    if isinstance(parent, MutableMapping):
        del parent[steps[-1]]
    else:
        del parent[int(steps[-1])]


def _pointer(tokens: list[str]) -> str:
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens[1:])


def _json_equal(left: Any, right: Any) -> bool:
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(_json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_json_equal(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    return type(left) is type(right) and bool(left == right)
