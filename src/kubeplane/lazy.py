"""Modules imported on first use, for code whose import must stay small.

``kubeplaned`` in maintenance mode (no machine config yet) needs the node API and little else; the
controllers, services and clients a booted node runs, and the libraries they bring (pydantic,
ruamel.yaml, httpx, pyroute2), would make up most of its resident memory while it waits
(docs/architecture.md, Memory). A module that refers to them holds a :func:`module` instead,
and declares the real import for type checkers::

    if TYPE_CHECKING:
        from kubeplane.agent import controllers
    else:
        controllers = lazy.module("kubeplane.agent.controllers")

The first attribute read (``controllers.for_node``) imports the module; later reads cost a method
call more than a plain module's. The import goes through :func:`importlib.import_module`, so it takes the
import system's per-module lock: two threads reading at once get one fully executed module (which
``importlib.util.LazyLoader`` does not promise before Python 3.12). Attributes set on the proxy
(``monkeypatch.setattr``) are set on the module itself.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _Module:
    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def _load(self) -> ModuleType:
        module: ModuleType | None = self._module
        if module is None:
            # import_module, not sys.modules: a module another thread is still executing is in
            # there already; import_module waits until it is done.
            module = importlib.import_module(self._name)
            object.__setattr__(self, "_module", module)
        return module

    def __getattr__(self, attribute: str) -> Any:
        if attribute in _Module.__slots__ or attribute.startswith("__"):
            # Not the module's: a slot read before __init__ ran (copy, pickle) or a protocol lookup.
            raise AttributeError(attribute)
        return getattr(self._load(), attribute)

    def __setattr__(self, attribute: str, value: Any) -> None:
        setattr(self._load(), attribute, value)

    def __delattr__(self, attribute: str) -> None:
        delattr(self._load(), attribute)

    def __copy__(self) -> _Module:
        return self  # one proxy per module, as there is one module

    def __deepcopy__(self, memo: dict[int, Any]) -> _Module:
        return self

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"


#: Every module a proxy was made for, in order (:func:`load_all`).
_NAMES: list[str] = []


def module(name: str) -> Any:
    """The module ``name``, imported when one of its attributes is first read."""
    if name not in _NAMES:
        _NAMES.append(name)
    return _Module(name)


def load_all() -> None:
    """Import every module a proxy was made for so far: to move the imports off a latency-bound
    thread, or to find out that one of them does not import at all."""
    for name in list(_NAMES):
        importlib.import_module(name)
