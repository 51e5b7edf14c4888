"""TimeSyncController: ``machine.time`` as a running ``chronyd``, and its sync state as a resource.

On every config change it reads what ``machine.time`` asks for
(:func:`kubeplane.services.timesync.desired`):

- servers set and not ``disabled``: a ``chronyd`` for exactly those servers runs as the
  controller's background task (:func:`kubeplane.services.timesync_io.run`); when the servers
  change (an ``--immediate`` apply) the daemon is stopped and one for the new servers started;
  when it exits by itself it is started again, at most once per ``retry_interval``;
- no servers, ``disabled: true`` or no ``time`` section: no daemon runs (a running one is stopped).

It asks the daemon (``chronyc tracking``) every ``poll_interval`` seconds until the time is in
sync, then every ``synced_poll_interval``, and publishes ``runtime/TimeStatuses/node``
(:class:`kubeplane.resources.catalog.TimeStatusSpec`): ``synced``, the configured servers, the
selected source, its stratum, the offset, and the last error (a server that is not
``HOST[:PORT]``, chrony not installed, the daemon's exit with the end of its log: shown until the
daemon started again is in sync). The kubelet
and etcd wait at boot for ``synced`` (or ``syncDisabled``), at most ``bootTimeout``
(:mod:`kubeplane.agent.timegate`).

The daemon is a child of the agent: the runtime cancels the controller's tasks when it stops, and
with them the daemon goes (a reboot or shutdown of the node leaves no ``chronyd`` behind).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Protocol

from kubeplane.config import MachineConfig
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import outputs
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, ReconcileContext
from kubeplane.services import timesync, timesync_io

#: The controller's background task: the running daemon.
DAEMON_TASK = "chronyd"
#: The node log the daemon writes (``kubeplane logs timed``).
LOG = "timed"
#: Seconds after a start during which a daemon that does not answer yet is no error.
STARTUP_GRACE = 5.0


class Daemon(Protocol):
    """Runs the node's NTP client (:class:`Chrony` in production)."""

    async def run(self, servers: tuple[timesync.Server, ...]) -> None:
        """Run a daemon for ``servers`` until cancelled; raises when it cannot start or exits."""
        ...

    def tracking(self) -> timesync.Tracking:
        """What the running daemon says (blocking); raises TimeSyncError when it does not answer."""
        ...


class Chrony:
    """:class:`Daemon` as ``chronyd -x`` with its files under the node's root."""

    def __init__(self, paths: NodePaths) -> None:
        self.files = timesync.files(paths.root)
        self.log = paths.log(LOG)

    async def run(self, servers: tuple[timesync.Server, ...]) -> None:
        await timesync_io.run(servers, self.files, self.log)

    def tracking(self) -> timesync.Tracking:
        return timesync_io.tracking(self.files)


class TimeSyncController:
    """Runs the node's time sync and publishes its state (see the module docstring)."""

    name = "time.TimeSyncController"
    inputs = (Input(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID),)
    outputs = (Output(catalog.TIME_STATUSES),)

    def __init__(
        self,
        *,
        paths: NodePaths,
        daemon: Daemon | None = None,
        poll_interval: float = 2.0,
        synced_poll_interval: float = 15.0,
        retry_interval: float = 5.0,
    ) -> None:
        self.daemon = daemon or Chrony(paths)
        self.poll_interval = poll_interval
        self.synced_poll_interval = synced_poll_interval
        self.retry_interval = retry_interval
        #: The servers of the daemon task last started, and when (monotonic seconds).
        self._servers: tuple[timesync.Server, ...] | None = None
        self._started_at = 0.0
        #: What was last logged: the sync state and the error, so a steady state is logged once.
        self._logged: tuple[bool, str] = (False, "")
        #: Why the last daemon exited by itself: shown until the daemon started again is in sync
        #: (or another error replaces it), so a status read between the restart and the sync still
        #: says why the time is not synced yet.
        self._exit_error = ""

    async def reconcile(self, ctx: ReconcileContext) -> None:
        resource = ctx.find(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID)
        if resource is None:
            return
        wanted = timesync.desired(MachineConfig.from_dict(resource.spec.to_dict()).model.machine.time)
        servers = [str(server) for server in wanted.servers]
        if not wanted.runs:
            if self._servers is not None:
                await ctx.stop_task(DAEMON_TASK)
                self._servers = None
                ctx.logger.info("time sync stopped (machine.time has no servers or is disabled)")
            self._exit_error = ""
            self._log(ctx, False, "; ".join(wanted.errors))
            self._publish(ctx, catalog.TimeStatusSpec(servers=servers, error="; ".join(wanted.errors)))
            return
        status = catalog.TimeStatusSpec(sync_disabled=False, servers=servers)
        task = ctx.task(DAEMON_TASK)
        ended = task is not None and task.done()
        if task is None or ended or self._servers != wanted.servers:
            error = _failure(task) if ended and task is not None else ""
            self._exit_error = error
            wait = self._started_at + self.retry_interval - time.monotonic()
            if ended and self._servers == wanted.servers and wait > 0:
                # The daemon exited soon after its start: start it again once the interval passed.
                self._log(ctx, False, error)
                self._publish(ctx, dataclasses.replace(status, error=error))
                ctx.requeue_after(wait)
                return
            await ctx.stop_task(DAEMON_TASK)
            ctx.start_task(DAEMON_TASK, self.daemon.run(wanted.servers))
            self._servers, self._started_at = wanted.servers, time.monotonic()
            ctx.logger.info("time sync started: chronyd -x for %s", ", ".join(servers))
            self._publish(ctx, dataclasses.replace(status, error=error))
            ctx.requeue_after(self.poll_interval)
            return
        try:
            tracking = await asyncio.to_thread(self.daemon.tracking)
        except timesync_io.TimeSyncError as exc:
            starting = time.monotonic() - self._started_at < STARTUP_GRACE
            if starting:
                error = self._exit_error
            else:
                error, self._exit_error = str(exc), ""
            self._log(ctx, False, error)
            self._publish(ctx, dataclasses.replace(status, error=error))
            ctx.requeue_after(self.poll_interval)
            return
        if tracking.synced:
            self._exit_error = ""
        self._log(ctx, tracking.synced, self._exit_error, tracking)
        self._publish(
            ctx,
            dataclasses.replace(
                status,
                error=self._exit_error,
                synced=tracking.synced,
                source=tracking.source,
                stratum=tracking.stratum,
                offset=tracking.offset,
                leap_status=tracking.leap_status,
            ),
        )
        ctx.requeue_after(self.synced_poll_interval if tracking.synced else self.poll_interval)

    def _log(
        self, ctx: ReconcileContext, synced: bool, error: str, tracking: timesync.Tracking | None = None
    ) -> None:
        if (synced, error) == self._logged:
            return
        self._logged = (synced, error)
        if error:
            ctx.logger.error("time sync: %s", error)
        elif synced and tracking is not None:
            ctx.logger.info(
                "time in sync with %s (stratum %d, offset %+.6fs)",
                tracking.source,
                tracking.stratum,
                tracking.offset,
            )
        elif tracking is not None:
            ctx.logger.warning("time no longer in sync (%s)", tracking.leap_status)

    @staticmethod
    def _publish(ctx: ReconcileContext, spec: catalog.TimeStatusSpec) -> None:
        outputs.publish(ctx, catalog.RUNTIME_NAMESPACE, catalog.TIME_STATUSES, catalog.TIME_STATUS_ID, spec)


def _failure(task: asyncio.Task[object]) -> str:
    """Why the daemon task ended (it only ends by raising, or by being cancelled)."""
    if task.cancelled():
        return ""
    error = task.exception()
    if error is None:
        return ""
    return str(error) or type(error).__name__
