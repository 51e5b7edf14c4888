"""The CLI's client config file (the original's ``talosconfig``): contexts of endpoints, nodes, credentials.

File shape (YAML)::

    context: demo
    contexts:
      demo:
        endpoints: [10.5.0.2]
        nodes: [10.5.0.2, 10.5.0.3]     # omitted when empty
        ca: <base64 of the OS CA certificate PEM>
        crt: <base64 of the client certificate PEM>
        key: <base64 of the client private key PEM>

The default path is ``~/.kubeplane/config``; the ``KUBEPLANECONFIG`` environment variable overrides
it. Everything here is pure except :func:`load` and :func:`save`: operations take a
:class:`ClientConfig` and return a new one, so the CLI decides when to write. Every problem is
reported as :class:`ClientConfigError` naming the file, the context or the field path and what to do.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kubeplane import fileio, pki

ENV_VAR = "KUBEPLANECONFIG"
DEFAULT_PATH = Path("~/.kubeplane/config")
_TOP_KEYS = ("context", "contexts")
_CONTEXT_KEYS = ("endpoints", "nodes", "ca", "crt", "key")


class ClientConfigError(ValueError):
    """The client config file is unreadable or invalid, or names a context that does not exist."""


@dataclasses.dataclass(frozen=True)
class Context:
    """One context: where to connect, which nodes to target, and the credentials (base64 of PEM)."""

    endpoints: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    ca: str = ""
    crt: str = ""
    key: str = ""

    @classmethod
    def from_pem(
        cls, *, endpoints: Iterable[str], nodes: Iterable[str] = (), ca: bytes, client: pki.CertKey
    ) -> Context:
        """Build a context from PEM credentials (the file stores them base64-encoded)."""
        return cls(
            endpoints=tuple(endpoints),
            nodes=tuple(nodes),
            ca=_b64(ca),
            crt=_b64(client.cert),
            key=_b64(client.key),
        )

    @property
    def ca_pem(self) -> bytes:
        """The CA certificate the node API's server certificate must chain to."""
        return base64.b64decode(self.ca)

    @property
    def client(self) -> pki.CertKey:
        """The client certificate and key presented to the node API."""
        return pki.CertKey(cert=base64.b64decode(self.crt), key=base64.b64decode(self.key))


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """The whole file: the current context name (may be unset) and the contexts by name."""

    context: str | None = None
    contexts: Mapping[str, Context] = dataclasses.field(default_factory=dict)


def resolve_path(
    explicit: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Path:
    """The file to use: ``explicit`` if given, else ``$KUBEPLANECONFIG``, else ``~/.kubeplane/config``."""
    environ = os.environ if env is None else env
    chosen = explicit or environ.get(ENV_VAR) or DEFAULT_PATH
    return Path(chosen).expanduser()


# --- file I/O ---------------------------------------------------------------------------------


def load(path: str | os.PathLike[str]) -> ClientConfig:
    """Read a client config; a missing file is an empty config (nothing generated or merged yet)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return ClientConfig()
    except OSError as exc:
        raise ClientConfigError(f"cannot read client config {path}: {exc.strerror}") from exc
    return loads(text, source=str(path))


def save(config: ClientConfig, path: str | os.PathLike[str]) -> None:
    """Write atomically with mode 0600 (it holds a private key); the directory is created 0700 if missing."""
    target = Path(path)
    target.parent.mkdir(mode=fileio.PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    # 0600 from the first byte, and readers see either the old or the new file, never a torn one.
    fileio.write_atomic(target, dumps(config), mode=fileio.SECRET_MODE)


# --- (de)serialisation ------------------------------------------------------------------------


def loads(text: str, *, source: str = "client config") -> ClientConfig:
    """Parse YAML text; every problem is reported at once with its field path."""
    try:
        raw: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClientConfigError(f"{source} is not valid YAML: {exc}") from exc
    if raw is None:
        return ClientConfig()
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ClientConfigError(f"{source}: expected a mapping with 'context' and 'contexts'")
    problems.extend(f"{key}: unknown key (expected context, contexts)" for key in raw if key not in _TOP_KEYS)
    current = raw.get("context")
    if current is not None and not isinstance(current, str):
        problems.append("context: expected a context name (string)")
        current = None
    contexts: dict[str, Context] = {}
    raw_contexts = raw.get("contexts") or {}
    if not isinstance(raw_contexts, dict):
        problems.append("contexts: expected a mapping of context name to context")
        raw_contexts = {}
    for name, body in raw_contexts.items():
        parsed = _parse_context(f"contexts.{name}", body, problems)
        if parsed is not None:
            contexts[str(name)] = parsed
    if problems:
        raise ClientConfigError(
            f"{len(problems)} problem(s) in {source}:\n" + "\n".join(f"  {p}" for p in problems)
        )
    return ClientConfig(context=current, contexts=contexts)


def _parse_context(path: str, body: object, problems: list[str]) -> Context | None:
    if not isinstance(body, dict):
        problems.append(f"{path}: expected a mapping with {', '.join(_CONTEXT_KEYS)}")
        return None
    problems.extend(
        f"{path}.{key}: unknown key (expected {', '.join(_CONTEXT_KEYS)})"
        for key in body
        if key not in _CONTEXT_KEYS
    )
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("endpoints", "nodes"):
        value = body.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(f"{path}.{key}: expected a list of addresses (strings)")
            value = []
        lists[key] = tuple(value)
    secrets: dict[str, str] = {}
    for key in ("ca", "crt", "key"):
        value = body.get(key) or ""
        if not isinstance(value, str):
            problems.append(f"{path}.{key}: expected base64 of a PEM document (string)")
            value = ""
        elif value:
            try:
                base64.b64decode(value, validate=True)
            except binascii.Error:
                problems.append(f"{path}.{key}: not valid base64: store the PEM base64-encoded")
        secrets[key] = value
    return Context(endpoints=lists["endpoints"], nodes=lists["nodes"], **secrets)


def dumps(config: ClientConfig) -> str:
    """Render the YAML file, keys in the documented order."""
    contexts: dict[str, dict[str, object]] = {}
    for name, ctx in config.contexts.items():
        body: dict[str, object] = {"endpoints": list(ctx.endpoints)}
        if ctx.nodes:
            body["nodes"] = list(ctx.nodes)
        body.update(ca=ctx.ca, crt=ctx.crt, key=ctx.key)
        contexts[name] = body
    return yaml.safe_dump({"context": config.context, "contexts": contexts}, sort_keys=False)


# --- pure operations --------------------------------------------------------------------------


def current(config: ClientConfig, name: str | None = None) -> tuple[str, Context]:
    """The context to use: ``name`` if given (``--context``), else the file's current context."""
    chosen = name or config.context
    available = ", ".join(sorted(config.contexts)) or "none"
    if not config.contexts:
        raise ClientConfigError(
            "the client config has no contexts: run `kubeplane gen config` and merge its kubeplaneconfig, "
            "or pass --kubeplaneconfig"
        )
    if not chosen:
        raise ClientConfigError(f"no current context is set: pass --context (available: {available})")
    if chosen not in config.contexts:
        raise ClientConfigError(f"context {chosen!r} is not in the client config (available: {available})")
    return chosen, config.contexts[chosen]


def add_context(
    config: ClientConfig, name: str, context: Context, *, make_current: bool = True
) -> ClientConfig:
    """Add a new context; refuses to replace one of the same name."""
    if not name:
        raise ClientConfigError("context name is empty: give the context a name")
    if name in config.contexts:
        raise ClientConfigError(
            f"context {name!r} already exists: remove it first or merge to get a new name"
        )
    contexts = {**config.contexts, name: context}
    return ClientConfig(
        context=name if make_current or config.context is None else config.context, contexts=contexts
    )


def remove_context(config: ClientConfig, name: str) -> ClientConfig:
    """Remove a context; if it was the current one, no context is current afterwards."""
    current(config, name)  # raises a clear error when it does not exist
    contexts = {k: v for k, v in config.contexts.items() if k != name}
    return ClientConfig(context=None if config.context == name else config.context, contexts=contexts)


def use_context(config: ClientConfig, name: str) -> ClientConfig:
    """Make ``name`` the current context."""
    current(config, name)
    return dataclasses.replace(config, context=name)


def set_endpoints(
    config: ClientConfig, endpoints: Iterable[str], *, context: str | None = None
) -> ClientConfig:
    """Replace the endpoints of ``context`` (default: the current one)."""
    name, ctx = current(config, context)
    return _replace_context(config, name, dataclasses.replace(ctx, endpoints=tuple(endpoints)))


def set_nodes(config: ClientConfig, nodes: Iterable[str], *, context: str | None = None) -> ClientConfig:
    """Replace the default target nodes of ``context`` (default: the current one)."""
    name, ctx = current(config, context)
    return _replace_context(config, name, dataclasses.replace(ctx, nodes=tuple(nodes)))


def _replace_context(config: ClientConfig, name: str, context: Context) -> ClientConfig:
    return dataclasses.replace(config, contexts={**config.contexts, name: context})


def merge(base: ClientConfig, other: ClientConfig) -> tuple[ClientConfig, dict[str, str]]:
    """Add every context of ``other`` to ``base``; ``other``'s current context becomes current.

    A context whose name is taken gets the first free ``NAME-1``, ``NAME-2``...; the returned
    mapping (old name -> new name) lists those renames so the CLI can tell the user.
    """
    contexts = dict(base.contexts)
    renames: dict[str, str] = {}
    for name, ctx in other.contexts.items():
        new_name = name
        suffix = 0
        while new_name in contexts:
            suffix += 1
            new_name = f"{name}-{suffix}"
        if new_name != name:
            renames[name] = new_name
        contexts[new_name] = ctx
    chosen = renames.get(other.context, other.context) if other.context else base.context
    return ClientConfig(context=chosen, contexts=contexts), renames


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
