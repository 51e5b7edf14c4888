"""Pull-through registry caches on this machine (``kubeplane registry cache start|stop|list``).

The pull through cache guide runs one caching proxy per upstream registry (``registry:2`` with
``REGISTRY_PROXY_REMOTEURL``, host ports 5000 to 5004) and creates clusters with
``--registry-mirror HOST=http://BRIDGE:PORT`` for each: the first cluster pulls through them, the
next ones find the images cached. Here each cache is Debian's ``docker-registry`` in proxy mode
(:class:`kubeplane.provision.registry.Registry` with ``proxy_remote``), a host process like a
cluster's own registry, listening on every address by default so the nodes of any local cluster
reach it at their bridge's host address.

A cache lives in its own directory, ``<root>/<name>`` (``root``: ``~/.kubeplane/registry-caches``
or ``$KUBEPLANE_REGISTRY_CACHES``), apart from any cluster: destroying a cluster keeps it, as the
guide keeps its containers. The directory holds ``cache.json`` (upstream, address, port and the
process record: PID *and* start time, see :mod:`kubeplane.provision.hostproc`), the registry's
config, its storage and its log. So:

- :func:`start` is idempotent: a cache already running with the same settings is left alone; one
  running with other settings is restarted with the new ones (its storage is kept);
- :func:`stop` stops the recorded process only (never by name) and keeps the storage, so a
  restarted cache is still warm; ``purge=True`` also removes the directory, as the guide's
  ``docker rm -f`` does.

Errors: :class:`CacheError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubeplane import fileio
from kubeplane.provision import hostproc
from kubeplane.provision import registry as registry_mod

ROOT_ENV = "KUBEPLANE_REGISTRY_CACHES"
STATE_FILE = "cache.json"
#: The guide's caches: upstream name -> (remote URL, host port).
GUIDE_CACHES = {
    "docker.io": ("https://registry-1.docker.io", 5000),
    "k8s.gcr.io": ("https://k8s.gcr.io", 5001),
    "quay.io": ("https://quay.io", 5002),
    "gcr.io": ("https://gcr.io", 5003),
    "ghcr.io": ("https://ghcr.io", 5004),
}
#: Every address, as the guide's ``docker run -p 5000:5000``: each cluster's bridge address then
#: reaches it, whichever bridges exist when it starts.
DEFAULT_ADDRESS = "0.0.0.0"  # noqa: S104
_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?")


class CacheError(Exception):
    """A cache could not be started, stopped or read; the message says why and where to look."""


def caches_dir() -> Path:
    """Where caches live: ``$KUBEPLANE_REGISTRY_CACHES`` or ``~/.kubeplane/registry-caches``."""
    configured = os.environ.get(ROOT_ENV)
    return Path(configured) if configured else Path.home() / ".kubeplane" / "registry-caches"


@dataclasses.dataclass(frozen=True)
class Cache:
    """One cache as recorded: its name, upstream, listening address and port, and process."""

    name: str
    upstream: str
    address: str
    port: int
    directory: Path
    record: hostproc.ProcessRecord | None = None

    @property
    def running(self) -> bool:
        return self.record is not None and hostproc.is_running(self.record)

    def registry(self) -> registry_mod.Registry:
        return registry_mod.Registry(
            directory=self.directory,
            address=self.address,
            port=self.port,
            record=self.record,
            proxy_remote=self.upstream,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "upstream": self.upstream,
            "address": self.address,
            "port": self.port,
            "record": None if self.record is None else self.record.to_dict(),
        }

    def summary(self) -> dict[str, Any]:
        """What ``registry cache list`` shows."""
        return {
            "name": self.name,
            "upstream": self.upstream,
            "listen": f"{self.address}:{self.port}",
            "running": self.running,
            "pid": self.record.pid if self.running and self.record is not None else None,
            "directory": str(self.directory),
        }


def check_name(name: str) -> None:
    """A cache name becomes a directory name: a registry host such as ``k8s.gcr.io``."""
    if not _NAME.fullmatch(name):
        raise CacheError(
            f"cache name {name!r} is not a lower-case registry host name (letters, digits, '.', '-'), "
            "e.g. docker.io or k8s.gcr.io"
        )


def check_upstream(upstream: str) -> None:
    parts = urlsplit(upstream)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CacheError(f"upstream {upstream!r} is not an http(s) URL, e.g. https://registry-1.docker.io")


def load(name: str, *, root: Path | None = None) -> Cache | None:
    """The recorded cache ``name``, or None if there is none."""
    check_name(name)
    directory = (root if root is not None else caches_dir()) / name
    try:
        data = json.loads((directory / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CacheError(f"cannot read {directory / STATE_FILE}: {exc}") from exc
    record = data.get("record")
    return Cache(
        name=str(data["name"]),
        upstream=str(data["upstream"]),
        address=str(data["address"]),
        port=int(data["port"]),
        directory=directory,
        record=None if record is None else hostproc.ProcessRecord.from_dict(record),
    )


def _save(cache: Cache) -> None:
    cache.directory.mkdir(parents=True, exist_ok=True)
    fileio.write_atomic(cache.directory / STATE_FILE, json.dumps(cache.to_dict(), indent=2) + "\n")


def list_caches(*, root: Path | None = None) -> list[Cache]:
    base = root if root is not None else caches_dir()
    found = []
    for directory in sorted(base.iterdir()) if base.is_dir() else []:
        if (directory / STATE_FILE).is_file():
            cache = load(directory.name, root=base)
            if cache is not None:
                found.append(cache)
    return found


def start(
    name: str,
    *,
    upstream: str,
    port: int,
    address: str = DEFAULT_ADDRESS,
    root: Path | None = None,
    timeout: float = 30.0,
) -> tuple[Cache, bool]:
    """Start cache ``name`` of ``upstream`` on ``address:port``, or leave it running when it
    already runs so; ``(cache, started)``. Raises :class:`CacheError`."""
    check_name(name)
    check_upstream(upstream)
    existing = load(name, root=root)
    if existing is not None and existing.running:
        if (existing.upstream, existing.address, existing.port) == (upstream, address, port):
            return existing, False
        stop(name, root=root)
    directory = (root if root is not None else caches_dir()) / name
    cache = Cache(name=name, upstream=upstream, address=address, port=port, directory=directory)
    _save(cache)
    registry = cache.registry()
    try:
        registry.start(timeout=timeout)
    except (registry_mod.RegistryError, hostproc.HostProcessError) as exc:
        if registry.record is not None:
            hostproc.stop(registry.record)  # started but never answered: by its PID only
        raise CacheError(f"cache {name} did not start: {exc}") from exc
    cache = dataclasses.replace(cache, record=registry.record)
    _save(cache)
    return cache, True


def stop(name: str, *, purge: bool = False, root: Path | None = None) -> bool:
    """Stop cache ``name`` (its recorded process only); with ``purge`` remove its directory and
    cached images too. False when there was nothing to stop or remove. Safe to repeat."""
    cache = load(name, root=root)
    if cache is None:
        return False
    stopped = False
    if cache.record is not None:
        try:
            stopped = hostproc.stop(cache.record)
        except hostproc.HostProcessError as exc:
            raise CacheError(f"cannot stop cache {name}: {exc}") from exc
        _save(dataclasses.replace(cache, record=None))
    if purge:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(cache.directory)
        return True
    return stopped
