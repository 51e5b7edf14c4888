"""The boot's wait for the time sync: kubelet and etcd start once the node's time is in sync.

The original's kubelet and etcd wait for its time service to be up ("Waiting for service
"timed" to be "up"") because they issue and check certificates; the time service counts as up
once the time is in sync, or once ``machine.time.bootTimeout`` passed, whichever comes first, so
an unreachable server delays the boot but never blocks it. kubeplane does the same in the pre
state of both services (:class:`kubeplane.agent.services.NodeServices`), reading the sync state
the time sync controller publishes (``runtime/TimeStatuses/node``,
:mod:`kubeplane.controllers.timesync.time_sync`). The wait happens once per boot: a service
restarted later does not wait again. A node without servers, or with ``disabled: true``, does not
wait at all. The start and the end of a wait are ``sequence`` events of the node (subject
``time``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kubeplane import resources
from kubeplane.resources import catalog
from kubeplane.services import timesync

#: Seconds between two looks at the sync state.
POLL_INTERVAL = 0.5

#: ``emit(message)`` records a node event.
Emit = Callable[[str], object]


def _synced(state: resources.State) -> tuple[bool, str]:
    """Whether the wait is over by the published sync state, and the selected source."""
    found = state.find(catalog.RUNTIME_NAMESPACE, catalog.TIME_STATUSES, catalog.TIME_STATUS_ID)
    spec = found.spec if found is not None else None
    if not isinstance(spec, catalog.TimeStatusSpec):
        return False, ""  # the controller has not published yet
    # A live apply that removed the servers or disabled the sync ends the wait too.
    return spec.synced or spec.sync_disabled, spec.source


async def wait_for_sync(
    state: resources.State,
    wanted: timesync.Desired,
    *,
    emit: Emit,
    poll_interval: float = POLL_INTERVAL,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Until the node's time is in sync, at most ``wanted.boot_timeout`` seconds; False when the
    time ran out (the boot goes on, the daemon keeps trying)."""
    if not wanted.runs:
        return True
    servers = ", ".join(str(server) for server in wanted.servers)
    emit(f"kubelet and etcd wait for the time sync with {servers} (at most {wanted.boot_timeout:g}s)")
    deadline = clock() + wanted.boot_timeout
    while True:
        synced, source = _synced(state)
        if synced:
            emit(f"time in sync{f' with {source}' if source else ''}: kubelet and etcd start")
            return True
        if clock() >= deadline:
            emit(
                f"time not in sync after {wanted.boot_timeout:g}s (machine.time.bootTimeout): kubelet "
                "and etcd start anyway; the time sync goes on"
            )
            return False
        await asyncio.sleep(min(poll_interval, max(deadline - clock(), 0.0)))
