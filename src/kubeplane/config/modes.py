"""Apply-mode rules: which ways of applying a config change (reboot, immediate, on-reboot) are
allowed, as a pure function of the old and new configs; plus the changed paths and a text diff.

``immediate`` applies without restarting the node, so it is allowed only when every change lies
under a subtree the node can reconfigure live (:data:`IMMEDIATE_PREFIXES`); ``reboot`` (the
default) and ``on-reboot`` (staged for the next restart) are always allowed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubeplane.config.document import MachineConfig
from kubeplane.config.errors import join_path

ApplyMode = Literal["reboot", "immediate", "on-reboot"]
APPLY_MODES: tuple[ApplyMode, ...] = ("reboot", "immediate", "on-reboot")
DEFAULT_APPLY_MODE: ApplyMode = "reboot"

#: Subtrees whose changes can be applied immediately (the original allowed ``cluster`` first and
#: added the machine ones in later releases).
IMMEDIATE_PREFIXES = ("cluster", "machine.time", "machine.certSANs", "machine.network")

Configish = MachineConfig | Mapping[str, Any]


@dataclass(frozen=True)
class AllowedModes:
    """The modes a change allows, the paths that changed, and those that rule out ``immediate``."""

    modes: tuple[ApplyMode, ...]
    changed: tuple[str, ...]
    blocking: tuple[str, ...]

    @property
    def unchanged(self) -> bool:
        return not self.changed

    def allows(self, mode: ApplyMode) -> bool:
        return mode in self.modes

    def refusal(self, mode: ApplyMode) -> str | None:
        """Why ``mode`` is refused (for the user), or ``None`` when it is allowed."""
        if self.allows(mode):
            return None
        shown = ", ".join(self.blocking[:5]) + (
            f" and {len(self.blocking) - 5} more" if len(self.blocking) > 5 else ""
        )
        return (
            f"{shown} changed: --immediate is only allowed for changes under "
            f"{', '.join(IMMEDIATE_PREFIXES)}; apply with a reboot (default) or --on-reboot"
        )


def allowed_modes(old: Configish, new: Configish) -> AllowedModes:
    """Which apply modes the change from ``old`` to ``new`` allows."""
    changed = changed_paths(old, new)
    blocking = tuple(path for path in changed if not is_immediate_path(path))
    modes: tuple[ApplyMode, ...] = ("reboot", "on-reboot") if blocking else APPLY_MODES
    return AllowedModes(modes=modes, changed=tuple(changed), blocking=blocking)


#: A change only under this subtree restarts the kubelet alone in the default (reboot) mode.
KUBELET_PREFIX = "machine.kubelet"


def kubelet_only(changed: Sequence[str]) -> bool:
    """Whether every changed path is under ``machine.kubelet`` (and something changed)."""
    return bool(changed) and all(
        path == KUBELET_PREFIX or path.startswith((KUBELET_PREFIX + ".", KUBELET_PREFIX + "["))
        for path in changed
    )


def is_immediate_path(path: str) -> bool:
    """Whether a change at ``path`` (dotted, e.g. ``machine.network.interfaces[0]``) can apply live."""
    return any(
        path == prefix or path.startswith((prefix + ".", prefix + "[")) for prefix in IMMEDIATE_PREFIXES
    )


def changed_paths(old: Configish, new: Configish) -> list[str]:
    """The most specific paths where ``old`` and ``new`` differ, in document order.

    A key present on one side only is reported at that key; lists are compared item by item, and
    items added or removed at the end are reported by index.
    """
    changed: list[str] = []
    _compare(_plain(old), _plain(new), "", changed)
    return changed


def diff(old: Configish, new: Configish, *, old_label: str = "current", new_label: str = "new") -> str:
    """A unified diff of the two configs as YAML (empty when nothing changed)."""
    lines = difflib.unified_diff(
        _text(old).splitlines(keepends=True),
        _text(new).splitlines(keepends=True),
        fromfile=old_label,
        tofile=new_label,
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _plain(config: Configish) -> Any:
    return config.to_dict() if isinstance(config, MachineConfig) else config


def _text(config: Configish) -> str:
    if isinstance(config, MachineConfig):
        return config.to_yaml()
    return MachineConfig.from_dict(config).to_yaml()


def _compare(old: Any, new: Any, path: str, changed: list[str]) -> None:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in [*old, *(k for k in new if k not in old)]:
            child = join_path(path, str(key))
            if key not in old or key not in new:
                changed.append(child)
            else:
                _compare(old[key], new[key], child, changed)
    elif isinstance(old, list) and isinstance(new, list):
        for index in range(max(len(old), len(new))):
            if index >= len(old) or index >= len(new):
                changed.append(join_path(path, index))
            else:
                _compare(old[index], new[index], join_path(path, index), changed)
    elif type(old) is not type(new) or old != new:
        changed.append(path or "(document)")
