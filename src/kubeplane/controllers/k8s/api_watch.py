"""A background task that follows one Kubernetes API collection through the node's own API server,
for the control plane controllers that act on it (:mod:`.kubelet_csr`, :mod:`.node_cidr`).

:func:`follow` lists the collection, hands the items to the controller, then hands it every watch
event, watching again from the last version seen; any break (the API server not up yet or
restarting, a version compacted away, etcd unreachable for a controller that takes a lock) lists
again after ``retry_interval``. :class:`WatchingController` is the reconcile side: one task for
the current settings, stopped when they change, and one that failed started again only after
``retry_interval`` (the failure may repeat).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.runtime import ControllerLogger, ReconcileContext

Items = list[dict[str, Any]]


S = TypeVar("S")


class WatchingController(Generic[S]):
    """The reconcile of a controller whose work is one background task (``_watch``) for its
    current settings (``_read_settings``; None: nothing to do); see the module docstring."""

    #: The task's name, and what it does (for the warning when it failed).
    task_name = "watch"
    task_what = "watching"
    retry_interval = 2.0

    def __init__(self) -> None:
        self._settings: S | None = None

    def _read_settings(self, ctx: ReconcileContext) -> S | None:
        raise NotImplementedError

    async def _watch(self, settings: S, logger: ControllerLogger) -> None:
        raise NotImplementedError

    async def reconcile(self, ctx: ReconcileContext) -> None:
        settings = self._read_settings(ctx)
        if settings != self._settings:
            await ctx.stop_task(self.task_name)
            self._settings = settings
        if settings is None:
            return
        running = ctx.task(self.task_name)
        if running is not None and running.done():
            await ctx.stop_task(self.task_name)
            if not running.cancelled() and running.exception() is not None:
                ctx.logger.warning("%s failed, will retry: %s", self.task_what, running.exception())
                ctx.requeue_after(self.retry_interval)  # not at once: the failure may repeat
                return
        if ctx.task(self.task_name) is None:
            ctx.start_task(self.task_name, self._watch(settings, ctx.logger))


async def follow(
    connect: Callable[[], kube.KubeClient],
    path: str,
    *,
    listed: Callable[[kube.KubeClient, Items], Awaitable[None]],
    changed: Callable[[kube.KubeClient, str, dict[str, Any]], Awaitable[None]],
    logger: ControllerLogger,
    retry_interval: float,
    watch_timeout: int = 300,
    what: str,
) -> None:
    """List ``path`` (``listed``), then pass each watch event (``changed``: type, object); for
    ever, listing again ``retry_interval`` after any break (see the module docstring)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            async with connect() as api:
                items, version = await api.list_with_version(path)
                await listed(api, items)
                while True:
                    started = loop.time()
                    stream = api.watch(path, version, timeout_seconds=watch_timeout)
                    async with contextlib.aclosing(stream) as events:
                        async for kind, obj in events:
                            version = (obj.get("metadata") or {}).get("resourceVersion") or version
                            if kind != "BOOKMARK":
                                await changed(api, kind, obj)
                    # A watch the server ends at once (a proxy that cuts streams) must not
                    # become a busy loop.
                    if loop.time() - started < retry_interval:
                        await asyncio.sleep(retry_interval)
        except (client_errors.KubeError, client_errors.EtcdError) as exc:
            logger.debug("%s: %s; again in %.0f s", what, exc, retry_interval)
        await asyncio.sleep(retry_interval)
