"""Errors of the config layer: :class:`FieldError` (one problem) and :class:`ConfigError` (all of them)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Path used for problems with the document as a whole (syntax errors, wrong top-level type).
DOCUMENT_PATH = "(document)"


@dataclass(frozen=True, order=True)
class FieldError:
    """One problem with a config: where (a dotted path such as ``machine.network.interfaces[0].cidr``)
    and what was wrong and expected."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(ValueError):
    """A config (or a patch of one) is invalid; ``errors`` lists every problem found, not just the first."""

    def __init__(self, errors: Iterable[FieldError], *, subject: str = "machine config") -> None:
        self.errors: list[FieldError] = list(errors)
        self.subject = subject
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.errors)
        noun = "problem" if count == 1 else "problems"
        lines = [f"{count} {noun} in {self.subject}:"]
        lines.extend(f"  {error}" for error in self.errors)
        return "\n".join(lines)


def join_path(base: str, key: str | int) -> str:
    """Append a map key or list index to a dotted field path (``a.b`` + 0 -> ``a.b[0]``)."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    if not base and key and all(c.isalnum() or c in "_-" for c in key):
        return key
    if key and all(c.isalnum() or c in "_-" for c in key):
        return f"{base}.{key}"
    # Keys such as registry hosts ("*", "docker.io") or sysctl names would make the path ambiguous.
    return f'{base}["{key}"]'
