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
