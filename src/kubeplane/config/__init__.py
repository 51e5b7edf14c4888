"""Machine configuration (``v1alpha1``): models, loading and validation, round-trip YAML,
patches, apply-mode rules, and generation of new configs.

Public API (import from ``kubeplane.config``)::

    load(text, *, mode=None) -> MachineConfig        # parse + validate; raises ConfigError
    MachineConfig.model / .tree / .warnings / .to_yaml() / .to_dict() / .copy()
    MachineConfig.from_dict(data, *, mode=None)     # build from plain data (generators)
    apply_json_patch(doc, ops) / apply_merge_patch(doc, patch) / apply_patch(doc, text)
    allowed_modes(old, new) -> AllowedModes; changed_paths(old, new); diff(old, new)
    defaults                                        # versions, images, ports, subnets

Exceptions::

    ValueError
     └── ConfigError          every problem of a config or patch at once: .errors is a list of
                              FieldError(path, message), e.g. "machine.network.interfaces[0].cidr"

The layer does no I/O: callers read files and hand over text.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeplane.config import defaults
    from kubeplane.config.document import MachineConfig, Style, load
    from kubeplane.config.errors import ConfigError, FieldError
    from kubeplane.config.models import Config
    from kubeplane.config.modes import (
        APPLY_MODES,
        DEFAULT_APPLY_MODE,
        IMMEDIATE_PREFIXES,
        AllowedModes,
        ApplyMode,
        allowed_modes,
        changed_paths,
        diff,
        kubelet_only,
    )
    from kubeplane.config.patch import apply_json_patch, apply_merge_patch, apply_patch
    from kubeplane.config.validate import MODES, Mode

#: Where each public name lives. They are imported on first use (PEP 562), not with the package:
#: the models need pydantic and the YAML needs ruamel.yaml, which ``kubeplane.config.defaults``
#: and ``kubeplane.config.paths`` do not, so a node agent waiting for its first config (and any
#: module that needs only those two) does not load them (docs/architecture.md, Memory).
_WHERE = {
    "MachineConfig": "document",
    "Style": "document",
    "load": "document",
    "ConfigError": "errors",
    "FieldError": "errors",
    "Config": "models",
    "APPLY_MODES": "modes",
    "DEFAULT_APPLY_MODE": "modes",
    "IMMEDIATE_PREFIXES": "modes",
    "AllowedModes": "modes",
    "ApplyMode": "modes",
    "allowed_modes": "modes",
    "changed_paths": "modes",
    "diff": "modes",
    "kubelet_only": "modes",
    "apply_json_patch": "patch",
    "apply_merge_patch": "patch",
    "apply_patch": "patch",
    "MODES": "validate",
    "Mode": "validate",
}


def __getattr__(name: str) -> Any:
    """A public name (or a submodule, e.g. ``config.models``), imported on first use."""
    if name.startswith("__"):
        raise AttributeError(name)
    module = _WHERE.get(name)
    try:
        if module is None:
            return importlib.import_module(f"{__name__}.{name}")
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE, *__all__})


__all__ = [
    "APPLY_MODES",
    "DEFAULT_APPLY_MODE",
    "IMMEDIATE_PREFIXES",
    "MODES",
    "AllowedModes",
    "ApplyMode",
    "Config",
    "ConfigError",
    "FieldError",
    "MachineConfig",
    "Mode",
    "Style",
    "allowed_modes",
    "apply_json_patch",
    "apply_merge_patch",
    "apply_patch",
    "changed_paths",
    "defaults",
    "diff",
    "kubelet_only",
    "load",
]
