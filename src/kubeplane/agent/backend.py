"""The agent's implementation of :class:`kubeplane.api.NodeBackend`.

It translates API calls into reads of the node's resource state, files under the node root, the
service supervisor and the node lifecycle (:class:`kubeplane.agent.node.Node`), and maps their
errors to API errors with messages that name the resource, path or field.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import stat
import time
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kubeplane
from kubeplane import api, lazy, resources, runtime
from kubeplane.agent import upgrade as node_upgrade

if TYPE_CHECKING:
    from kubeplane.agent import certs as node_certs
    from kubeplane.agent import etcd, owned, selfhosted, services
    from kubeplane.agent.node import Node
    from kubeplane.controllers.timesync import time_sync
else:  # what only a booted node's calls use (kubeplane.lazy)
    node_certs = lazy.module("kubeplane.agent.certs")
    etcd = lazy.module("kubeplane.agent.etcd")
    owned = lazy.module("kubeplane.agent.owned")
    selfhosted = lazy.module("kubeplane.agent.selfhosted")
    services = lazy.module("kubeplane.agent.services")
    time_sync = lazy.module("kubeplane.controllers.timesync.time_sync")

_CHUNK = 64 * 1024

#: Log streams the agent writes itself (:mod:`kubeplane.agent.main`), besides one per service.
AGENT_LOGS = ("kubeplaned", runtime.LOGGER_NAME)


def service_logs() -> tuple[str, ...]:
    """Services a node may run (the supervised ones and the time sync's ``chronyd``); each writes
    ``<id>.log`` next to the agent's streams."""
    return (services.CONTAINERD, services.KUBELET, etcd.SERVICE_ID, time_sync.LOG)


#: What a log id looks like: a DNS-1123 label, so it can never be a path.
_LOG_ID = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def check_log_id(service: str, known: Collection[str], *, node: str) -> None:
    """Refuse a log id that is not a known stream: InvalidArgumentError for anything that is not
    a plain name (a path, ``..``), NotFoundError naming the known ones for an unknown name.

    The logs call is open to the reader role and its id becomes a file name under the node's
    log directory, so only names from ``known`` ever reach the file system.
    """
    if not _LOG_ID.fullmatch(service):
        message = (
            f"{service!r} is not a service id: use one of {', '.join(sorted(known))} "
            "(lower-case letters, digits and '-'), not a path"
        )
        raise api.InvalidArgumentError(message, fields=[("service", message)])
    if service not in known:
        raise api.NotFoundError(
            f"no service or log stream {service!r} on node {node}; known: {', '.join(sorted(known))}"
        )


class AgentBackend:
    """Serves the node API from a :class:`~kubeplane.agent.node.Node`."""

    def __init__(self, node: Node) -> None:
        self._node = node

    # -- resources ----------------------------------------------------------------------------

    def _definition(self, type_name: str) -> resources.ResourceDefinition:
        try:
            return self._node.registry.resolve(type_name)
        except resources.UnknownTypeError as exc:
            raise api.NotFoundError(str(exc)) from exc

    def _namespace(self, definition: resources.ResourceDefinition, namespace: str | None) -> str:
        name = namespace or definition.default_namespace
        try:
            self._node.registry.namespace(name)
        except resources.UnknownTypeError as exc:
            raise api.NotFoundError(str(exc)) from exc
        return name

    def _state(self) -> resources.State:
        state = self._node.state
        if state is None:
            raise api.UnavailableError(f"node {self._node.name} is starting: no resources yet, retry shortly")
        return state

    async def version(self) -> dict[str, Any]:
        node = self._node
        found: dict[str, Any] = {
            "tag": kubeplane.__version__,
            "node": node.name,
            # A worker waiting for its first node API certificate serves the maintenance API too.
            "maintenance": node.maintenance or node.insecure_api,
            "phase": node.phase,
            # New at every start of the agent process (an upgrade re-execs it).
            "instance": node_upgrade.INSTANCE,
            "kubernetes": await node.kubernetes_version(),
        }
        if node.boot_wait is not None:
            found["waiting"] = node.boot_wait
        return found

    async def resource_sensitive(self, *, type: str) -> bool:
        return self._definition(type).sensitive

    async def resource_get(self, *, type: str, id: str, namespace: str | None) -> dict[str, Any]:
        definition = self._definition(type)
        ns = self._namespace(definition, namespace)
        resource = self._state().find(ns, definition.type, id)
        if resource is None:
            ref = f"{ns}/{definition.display_type}/{id}"
            raise api.NotFoundError(f"resource {ref} not found on {self._node.name}")
        return resources.to_output_dict(resource, node=self._node.name)

    async def resource_list(self, *, type: str, namespace: str | None) -> list[dict[str, Any]]:
        definition = self._definition(type)
        ns = self._namespace(definition, namespace)
        return [
            resources.to_output_dict(resource, node=self._node.name)
            for resource in self._state().list(ns, definition.type)
        ]

    async def resource_watch(
        self,
        *,
        type: str,
        namespace: str | None,
        id: str | None,
    ) -> AsyncIterator[dict[str, Any]]:
        definition = self._definition(type)
        ns = self._namespace(definition, namespace)
        watch = self._state().watch(ns, definition.type, id)
        try:
            async for event in watch:
                document: dict[str, Any] = {"event": str(event.kind)}
                if event.resource is not None:
                    document["resource"] = resources.to_output_dict(event.resource, node=self._node.name)
                yield document
        except resources.FellBehindError as exc:
            raise api.UnavailableError(f"watch fell behind on {self._node.name}: {exc}; watch again") from exc

    # -- configuration ------------------------------------------------------------------------

    async def apply_configuration(
        self, *, data: str, mode: str, dry_run: bool, try_seconds: int | None = None
    ) -> dict[str, Any]:
        return await self._node.apply_configuration(
            data=data,
            mode=mode,
            dry_run=dry_run,
            try_seconds=try_seconds,
        )

    async def machine_config(self) -> dict[str, Any]:
        current = await asyncio.to_thread(self._node.store.current)
        staged = await asyncio.to_thread(self._node.store.staged)
        return {
            "current": current.to_yaml() if current else None,
            "staged": staged.to_yaml() if staged else None,
        }

    # -- files --------------------------------------------------------------------------------

    def _path(self, relative: str) -> Path:
        """A caller-supplied path under the node root; escaping it (``..``, symlinks) is refused."""
        root = self._node.paths.root.resolve()
        try:
            candidate = (root / relative.lstrip("/")).resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
            raise _path_error(relative, exc) from exc
        if candidate != root and root not in candidate.parents:
            message = f"path {relative!r} is outside the node root"
            raise api.InvalidArgumentError(message, fields=[("path", message)])
        return candidate

    async def read_file(self, *, path: str) -> AsyncIterator[bytes]:
        target = self._path(path)
        try:
            handle = await asyncio.to_thread(open, target, "rb")
        except FileNotFoundError as exc:
            raise api.NotFoundError(f"{path}: no such file on {self._node.name}") from exc
        except IsADirectoryError as exc:
            raise api.InvalidArgumentError(f"{path} is a directory; use ls") from exc
        except OSError as exc:  # through a file, a name too long, a symlink loop, ...
            raise _path_error(path, exc) from exc
        try:
            while chunk := await asyncio.to_thread(handle.read, _CHUNK):
                yield chunk
        finally:
            handle.close()

    async def list_dir(self, *, path: str, recurse: bool) -> list[dict[str, Any]]:
        target = self._path(path)
        try:
            exists = target.exists()
        except OSError as exc:
            raise _path_error(path, exc) from exc
        if not exists:
            raise api.NotFoundError(f"{path}: no such file or directory on {self._node.name}")
        return await asyncio.to_thread(_list, target, self._node.paths.root.resolve(), recurse)

    # -- logs and services ----------------------------------------------------------------

    def known_logs(self) -> set[str]:
        """Every log id the logs call accepts: the agent's streams and the node's services."""
        running = self._node.services.supervisor.ids() if self._node.services is not None else []
        return {*AGENT_LOGS, *service_logs(), *running}

    async def logs(self, *, service: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        check_log_id(service, self.known_logs(), node=self._node.name)
        async for line in self._node.logs(service=service, tail=tail, follow=follow):
            yield line

    async def events(
        self, *, since_seconds: int | None, tail: int | None, follow: bool
    ) -> AsyncIterator[dict[str, Any]]:
        events = self._node.events
        since = time.time() - since_seconds if since_seconds is not None else None
        if not follow:
            for event in events.history(since=since, tail=tail):
                yield event.as_dict()
            return
        async for event in events.follow(since=since, tail=tail):
            yield event.as_dict()

    async def certificates(self) -> list[dict[str, Any]]:
        found = await asyncio.to_thread(node_certs.scan, self._node.paths)
        return [item.as_dict() for item in found]

    async def service_list(self) -> list[dict[str, Any]]:
        return self._node.service_list()

    async def service_control(self, *, id: str, action: str) -> dict[str, Any]:
        return await self._node.service_control(service=id, action=action)

    async def reboot(self) -> dict[str, Any]:
        return await self._node.request_reboot()

    async def reset(self, *, graceful: bool, reboot: bool, wipe: str | None, dry_run: bool) -> dict[str, Any]:
        return await self._node.reset(graceful=graceful, reboot=reboot, wipe=wipe, dry_run=dry_run)

    async def upgrade(self, *, path: str, stage: bool, preserve: bool | None, force: bool) -> dict[str, Any]:
        return await self._node.upgrade(path=path, stage=stage, preserve=preserve, force=force)

    # -- cluster formation and containers -------------------------------------------------

    async def bootstrap(
        self,
        *,
        snapshot: str | None,
        self_hosted: bool = False,
        checkpointer_image: str | None = None,
        checkpointer_grace_period: int | None = None,
    ) -> dict[str, Any]:
        data = None
        if snapshot is not None:
            try:
                data = base64.b64decode(snapshot, validate=True)
            except ValueError as exc:
                message = "snapshot must be the base64 of an etcd snapshot file"
                raise api.InvalidArgumentError(message, fields=[("snapshot", message)]) from exc
        options = None
        if self_hosted:
            if checkpointer_grace_period is not None and checkpointer_grace_period < 0:
                message = "checkpointer_grace_period must be 0 or more seconds"
                raise api.InvalidArgumentError(message, fields=[("checkpointer_grace_period", message)])
            options = selfhosted.Options(
                checkpointer_image=checkpointer_image or selfhosted.DEFAULT_CHECKPOINTER_IMAGE,
                grace_period_seconds=(
                    selfhosted.DEFAULT_GRACE_PERIOD
                    if checkpointer_grace_period is None
                    else checkpointer_grace_period
                ),
            )
        return await self._node.bootstrap(snapshot=data, self_hosted=options)

    async def etcd_members(self) -> list[dict[str, Any]]:
        members: list[dict[str, Any]] = await self._node.etcd_call("members")
        return members

    async def etcd_leave(self, *, force: bool) -> dict[str, Any]:
        result: dict[str, Any] = await self._node.etcd_call("leave", force=force)
        return result

    async def etcd_remove_member(self, *, member: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._node.etcd_call("remove", member=member)
        return result

    async def etcd_forfeit_leadership(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._node.etcd_call("forfeit")
        return result

    async def etcd_snapshot(self) -> AsyncIterator[bytes]:
        async for chunk in self._node.etcd_snapshot():
            yield chunk

    async def kubeconfig(self) -> dict[str, Any]:
        return self._node.kubeconfig()

    async def kubernetes_certificates_renew(self, *, not_before: int | None) -> dict[str, Any]:
        return self._node.renew_kubernetes_certificates(not_before=not_before)

    async def client_certificate(self, *, csr: str, roles: str, lifetime_seconds: int) -> dict[str, Any]:
        chosen = [role.strip() for role in roles.split(",") if role.strip()]
        return await self._node.client_certificate(csr=csr, roles=chosen, lifetime=lifetime_seconds)

    async def image_pull(self, *, image: str) -> dict[str, Any]:
        return await self._node.image_pull(image)

    async def containers(self) -> list[dict[str, Any]]:
        return await self._node.containers()

    async def container_logs(self, *, id: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        async for line in self._node.container_logs(id=id, tail=tail, follow=follow):
            yield line


def _path_error(path: str, exc: BaseException) -> api.InvalidArgumentError:
    """A caller's path the file system refuses to follow, with its reason and not the node's root."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "symlink loop"
    message = f"path {path!r} cannot be followed: {reason}"
    return api.InvalidArgumentError(message, fields=[("path", message)])


#: Kernel file systems a recursive listing does not descend into: what they hold are processes
#: and kernel objects that come and go while they are read, not the node's files.
KERNEL_FILESYSTEMS = frozenset(
    {
        "proc", "sysfs", "cgroup", "cgroup2", "devpts", "devtmpfs", "mqueue", "debugfs", "tracefs",
        "securityfs", "bpf", "pstore", "configfs", "fusectl", "hugetlbfs", "binfmt_misc", "autofs", "nsfs",
    }
)  # fmt: skip
#: The most entries one listing returns; a recursive listing of more asks for a narrower path.
MAX_ENTRIES = 100_000


def _entry(path: Path, root: Path) -> dict[str, Any] | None:
    """One listing row, or None when ``path`` vanished (or cannot be read) since it was seen."""
    try:
        info = path.lstat()
        link = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
    except OSError:
        return None
    return {
        "name": str(path.relative_to(root)) if path != root else ".",
        "size": info.st_size,
        "mode": stat.filemode(info.st_mode),
        "is_dir": stat.S_ISDIR(info.st_mode),
        "modified": int(info.st_mtime),
        "link": link,
    }


def _walk(target: Path) -> list[Path]:
    """Every path below ``target``: symlinks are not followed, kernel file systems not entered,
    directories that cannot be read (or vanish) are listed but not entered."""
    skip = {m.point for m in owned.mount_table() if m.fstype in KERNEL_FILESYSTEMS}
    found: list[Path] = []
    for directory, dirs, files in os.walk(target, onerror=lambda _: None):
        here = Path(directory)
        found += [here / name for name in [*dirs, *files]]
        dirs[:] = [name for name in dirs if here / name not in skip]
        if len(found) > MAX_ENTRIES:
            break
    return sorted(found)


def _list(target: Path, root: Path, recurse: bool) -> list[dict[str, Any]]:
    if not target.is_dir():
        paths = [target]
    elif recurse:
        paths = _walk(target)
    else:
        paths = sorted(target.iterdir())
    if recurse and len(paths) > MAX_ENTRIES:
        message = f"more than {MAX_ENTRIES} entries below this path; list a narrower one"
        raise api.InvalidArgumentError(message, fields=[("path", message)])
    return [row for row in (_entry(path, root) for path in paths) if row is not None]
