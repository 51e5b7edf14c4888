"""The service supervisor: dependency order, pre/post hooks, health checks, restarts, event history.

This module owns the life cycle of node services (containerd as ``cri``, kubelet, etcd, …) on one
event loop. What a service *is* comes from a :class:`ServiceSpec`; how its process is spawned and
killed is :mod:`kubeplane.services.process`; where its output goes is
:mod:`kubeplane.services.logs` (``<root>/var/log/kubeplane/<id>.log``).

Life cycle of one started service, with the event each step records (``[State]: message``)::

    [Skipped]   Service skipped: <reason>                 condition() gave a reason not to run
    [Waiting]   Waiting for service "cri" to be "up", service "timed" to be "up"
                                                          re-recorded whenever the unmet set changes
    [Preparing] Running pre state                         pre_start() runs (retried with backoff
    [Failed]    Failed to run pre state: <error>          unless the policy is ``never``:
    [Waiting]   Retrying pre state in 0.50s                then Running pre state again)
    [Preparing] Creating service runner                   the command is built
    [Failed]    Failed to build command: <error> | Failed to start task <id>: <OSError>
    [Running]   Started task <id> (PID <pid>) for process <argv0 name>
    [Running]   Health check successful / Health check failed: <message>   on every change
    [Failed]    Service exited with code 3 | with signal SIGKILL (9)       a crash ...
    [Waiting]   Restarting in 0.50s (restart 1)                            ... and the backoff
    [Finished]  Service finished successfully             exit code 0 and the policy is not ``always``
    [Stopping]  Sending SIGTERM to task <id> (PID <pid>)  stop(), restart() or shutdown()
    [Stopping]  Task <id> (PID <pid>) did not stop within 10s, sending SIGKILL
    [Finished]  Service stopped
    [Failed]    Service runner failed: <error>            a hook or condition raised unexpectedly

A service is **up** when it is Running and, if it has a health check, the last check passed;
dependents wait for exactly that. Restart delays grow exponentially per :class:`Backoff` and
reset once a run lasted ``reset_after`` seconds. ``pre_start`` runs once per start request, not
on every process restart (for etcd it is the join, which must not be repeated per crash);
``post_stop`` runs once the service is finally down (stopped, failed for good, or finished).

Design choices:

- One runner task per service; stop() stops the process group first and only then cancels the
  runner, so a runner is never cancelled between spawning a process and recording it.
- Observers are plain callbacks called on the loop after every change with a fresh
  :class:`ServiceSnapshot`; the agent turns them into ``Services`` resources. This module knows
  nothing about resources.
- Shutdown stops services level by level in reverse dependency order (all dependents of a service
  before it), services of one level concurrently.

Exceptions::

    ServiceError                  base class
    ├── UnknownServiceError       no service with that ID is registered
    ├── ServiceRegistrationError  duplicate ID or a dependency cycle
    └── ServiceTimeoutError       wait_up() ran out of time (carries the last event)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from kubeplane import metrics
from kubeplane.services import logs, process

_log = logging.getLogger(__name__)

DEFAULT_HISTORY = 50


class ServiceError(Exception):
    """Base class of the supervisor's errors."""


class UnknownServiceError(ServiceError, KeyError):
    def __init__(self, service_id: str, known: Sequence[str]) -> None:
        super().__init__(service_id)
        self.service_id = service_id
        self.known = tuple(known)

    def __str__(self) -> str:
        known = ", ".join(sorted(self.known)) or "none"
        return f"unknown service {self.service_id!r}: this node runs {known}"


class ServiceRegistrationError(ServiceError):
    """A spec that cannot be registered: duplicate ID or a dependency cycle."""


class ServiceTimeoutError(ServiceError, TimeoutError):
    """A service did not come up in time; the message names its last event."""


class ServiceState(enum.Enum):
    INITIALIZED = "Initialized"
    WAITING = "Waiting"
    PREPARING = "Preparing"
    RUNNING = "Running"
    STOPPING = "Stopping"
    FINISHED = "Finished"
    FAILED = "Failed"
    SKIPPED = "Skipped"


_STATE_NAMES = tuple(state.value for state in ServiceState)


class RestartPolicy(enum.Enum):
    ALWAYS = "always"
    ON_FAILURE = "on-failure"
    NEVER = "never"


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Restart delays: ``initial * factor**n`` capped at ``maximum``; reset after a long enough run."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    reset_after: float = 30.0

    def delay(self, attempt: int) -> float:
        return float(min(self.initial * self.factor**attempt, self.maximum))


@dataclasses.dataclass(frozen=True)
class HealthCheck:
    """``check()`` returns on success and raises on failure (``str(error)`` becomes the message).

    The first check runs right after the process starts, then every ``interval`` seconds; a check
    running longer than ``timeout`` counts as failed. With ``startup_interval``, the gaps after a
    start begin at that and double up to ``interval`` until the first success (a starting service
    is awaited closely, one that never comes up is not polled hard for long).
    """

    check: Callable[[], Awaitable[None]]
    interval: float = 5.0
    timeout: float = 3.0
    startup_interval: float | None = None


Hook = Callable[[], Awaitable[None]]
CommandBuilder = Callable[[], Awaitable[process.Command]]


@dataclasses.dataclass(frozen=True)
class ServiceSpec:
    """What a service is. ``command`` is fixed or an async builder, called before every spawn so a
    restart picks up changed configuration. ``condition`` returns a reason to skip the service, or
    ``None`` to run it (e.g. etcd on a worker)."""

    id: str
    command: process.Command | CommandBuilder
    depends_on: tuple[str, ...] = ()
    pre_start: Hook | None = None
    post_stop: Hook | None = None
    condition: Callable[[], Awaitable[str | None]] | None = None
    health: HealthCheck | None = None
    restart: RestartPolicy = RestartPolicy.ALWAYS
    backoff: Backoff = Backoff()
    #: Delays between failed ``pre_start`` tries; ``backoff`` (the restart delays) when None.
    pre_start_backoff: Backoff | None = None
    stop_timeout: float = 10.0


@dataclasses.dataclass(frozen=True)
class Event:
    state: ServiceState
    message: str
    timestamp: float

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state.value, "message": self.message, "timestamp": self.timestamp}


@dataclasses.dataclass(frozen=True)
class Health:
    """``healthy`` is None while unknown (no check yet, not running, or no health check at all)."""

    healthy: bool | None = None
    message: str = ""
    last_change: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "message": self.message, "last_change": self.last_change}


@dataclasses.dataclass(frozen=True)
class ServiceSnapshot:
    """A consistent view of one service for the node API and the ``Services`` resources.

    ``events`` are oldest first; ``up`` is the condition dependents wait for.
    """

    id: str
    state: ServiceState
    pid: int | None
    health: Health
    events: tuple[Event, ...]
    up: bool

    @property
    def running(self) -> bool:
        return self.state is ServiceState.RUNNING

    @property
    def last_event(self) -> Event | None:
        return self.events[-1] if self.events else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.value,
            "running": self.running,
            "up": self.up,
            "pid": self.pid,
            "health": self.health.as_dict(),
            "events": [event.as_dict() for event in self.events],
        }


Observer = Callable[[ServiceSnapshot], None]


class _Service:
    def __init__(self, spec: ServiceSpec, *, history: int) -> None:
        self.spec = spec
        self.state = ServiceState.INITIALIZED
        self.events: deque[Event] = deque(maxlen=history)
        self.health = Health()
        self.process: process.Process | None = None
        self.runner: asyncio.Task[None] | None = None
        self.prepared = False
        self.stopping = False
        self.lock = asyncio.Lock()

    @property
    def up(self) -> bool:
        if self.state is not ServiceState.RUNNING:
            return False
        return self.spec.health is None or self.health.healthy is True


class Supervisor:
    """Runs the services of one node below ``root``; use as ``async with`` to shut down on exit.

    ``argv_prefix`` is put in front of every command (e.g. ``nsenter --net=…`` to run services in
    a node's network namespace when the agent itself runs outside it).
    """

    def __init__(
        self,
        *,
        root: Path,
        argv_prefix: Sequence[str] = (),
        history: int = DEFAULT_HISTORY,
        log_max_bytes: int = logs.DEFAULT_MAX_BYTES,
        log_backups: int = logs.DEFAULT_BACKUPS,
    ) -> None:
        self.root = root
        self._argv_prefix = tuple(argv_prefix)
        self._history = history
        self._log_max_bytes = log_max_bytes
        self._log_backups = log_backups
        self._services: dict[str, _Service] = {}
        self._observers: list[Observer] = []
        self._changed = asyncio.Event()

    # -- registration and queries -------------------------------------------------------------

    def register(self, spec: ServiceSpec) -> None:
        """Add a service (not started). Dependencies may be registered later, cycles are refused."""
        if spec.id in self._services:
            raise ServiceRegistrationError(f"service {spec.id!r} is already registered on this node")
        self._services[spec.id] = _Service(spec, history=self._history)
        cycle = self._find_cycle()
        if cycle:
            del self._services[spec.id]
            path = " -> ".join(cycle)
            raise ServiceRegistrationError(
                f"service {spec.id!r} would close a dependency cycle ({path}); remove one of these depends_on"
            )
        metrics.set_service_state(spec.id, ServiceState.INITIALIZED.value, _STATE_NAMES)
        self._notify(self._services[spec.id])

    def ids(self) -> list[str]:
        return list(self._services)

    def log_path(self, service_id: str) -> Path:
        self._get(service_id)
        return logs.service_log_path(self.root, service_id)

    def snapshot(self, service_id: str) -> ServiceSnapshot:
        return self._snapshot(self._get(service_id))

    def snapshots(self) -> list[ServiceSnapshot]:
        return [self._snapshot(service) for service in self._services.values()]

    def add_observer(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer`` with a snapshot after every change; returns a function to remove it."""
        self._observers.append(observer)
        return lambda: self._observers.remove(observer)

    async def wait_up(self, service_id: str, *, timeout: float) -> ServiceSnapshot:
        """Wait until the service is up (running and, if checked, healthy)."""
        return await self._wait_for(service_id, lambda snapshot: snapshot.up, timeout=timeout, what="up")

    async def wait_for(
        self, service_id: str, predicate: Callable[[ServiceSnapshot], bool], *, timeout: float
    ) -> ServiceSnapshot:
        """Wait until ``predicate(snapshot)`` holds (for callers and tests watching transitions)."""
        return await self._wait_for(service_id, predicate, timeout=timeout, what="in the awaited condition")

    # -- control ---------------------------------------------------------------------------------

    async def start(self, service_id: str) -> None:
        """Start the service's runner; returns at once. No-op if it is already started."""
        service = self._get(service_id)
        async with service.lock:
            if service.runner is not None and not service.runner.done():
                return
            service.prepared = False
            service.stopping = False
            service.runner = asyncio.create_task(self._run_guarded(service), name=f"service {service_id}")

    async def start_all(self) -> None:
        for service_id in self._services:
            await self.start(service_id)

    async def stop(self, service_id: str) -> None:
        """Stop the service (its whole process group) and wait until it is down. Dependents stay."""
        service = self._get(service_id)
        async with service.lock:
            await self._stop(service)

    async def restart(self, service_id: str) -> None:
        await self.stop(service_id)
        await self.start(service_id)

    async def shutdown(self) -> None:
        """Stop every service, dependents before their dependencies. No process group survives."""
        levels: dict[int, list[_Service]] = {}
        for service in self._services.values():
            levels.setdefault(self._depth(service.spec.id), []).append(service)
        for depth in sorted(levels, reverse=True):
            await asyncio.gather(*(self.stop(service.spec.id) for service in levels[depth]))

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.shutdown()

    # -- the runner ------------------------------------------------------------------------------

    async def _run_guarded(self, service: _Service) -> None:
        # A bug in a hook or in the runner must show in the service's history, not vanish as an
        # unretrieved task exception.
        try:
            await self._run(service)
        except Exception as error:
            _log.exception("service %s: runner failed", service.spec.id)
            self._record(service, ServiceState.FAILED, f"Service runner failed: {_describe(error)}")

    async def _run(self, service: _Service) -> None:
        spec = service.spec
        if spec.condition is not None:
            reason = await spec.condition()
            if reason is not None:
                self._record(service, ServiceState.SKIPPED, f"Service skipped: {reason}")
                return
        await self._wait_for_dependencies(service)
        if not await self._prepare(service):
            return
        attempt = 0
        while True:
            started = time.monotonic()
            exit_ = await self._run_once(service)
            if service.stopping:
                # stop() ended this process on purpose and records the outcome itself.
                return
            ran_for = time.monotonic() - started
            if exit_ is not None and exit_.success and spec.restart is not RestartPolicy.ALWAYS:
                self._record(service, ServiceState.FINISHED, "Service finished successfully")
                break
            if exit_ is not None:
                self._record(service, ServiceState.FAILED, f"Service exited {exit_.describe()}")
            if spec.restart is RestartPolicy.NEVER:
                break
            if ran_for >= spec.backoff.reset_after:
                attempt = 0
            delay = spec.backoff.delay(attempt)
            attempt += 1
            metrics.SERVICE_RESTARTS.labels(service=spec.id).inc()
            self._record(service, ServiceState.WAITING, f"Restarting in {delay:.2f}s (restart {attempt})")
            await asyncio.sleep(delay)
        await self._post_stop(service)

    async def _wait_for_dependencies(self, service: _Service) -> None:
        reported: list[str] = []
        while True:
            unmet = sorted(dep for dep in service.spec.depends_on if not self._is_up(dep))
            if not unmet:
                return
            if unmet != reported:
                waits = ", ".join(f'service "{dep}" to be "up"' for dep in unmet)
                self._record(service, ServiceState.WAITING, f"Waiting for {waits}")
                reported = unmet
            await self._changed.wait()

    async def _prepare(self, service: _Service) -> bool:
        """Run the pre state until it succeeds; False when it failed and the policy forbids retrying."""
        spec = service.spec
        attempt = 0
        while True:
            self._record(service, ServiceState.PREPARING, "Running pre state")
            try:
                if spec.pre_start is not None:
                    await spec.pre_start()
                break
            except Exception as error:
                self._record(service, ServiceState.FAILED, f"Failed to run pre state: {_describe(error)}")
                if spec.restart is RestartPolicy.NEVER:
                    return False
                delay = (spec.pre_start_backoff or spec.backoff).delay(attempt)
                attempt += 1
                self._record(service, ServiceState.WAITING, f"Retrying pre state in {delay:.2f}s")
                await asyncio.sleep(delay)
        service.prepared = True
        self._record(service, ServiceState.PREPARING, "Creating service runner")
        return True

    async def _run_once(self, service: _Service) -> process.Exit | None:
        """Spawn, watch health, wait for the exit. None when the process could not even start."""
        spec = service.spec
        try:
            command = spec.command if isinstance(spec.command, process.Command) else await spec.command()
        except Exception as error:
            self._record(service, ServiceState.FAILED, f"Failed to build command: {_describe(error)}")
            return None
        writer = logs.RotatingLogWriter(
            logs.service_log_path(self.root, spec.id),
            max_bytes=self._log_max_bytes,
            backups=self._log_backups,
        )
        try:
            spawning = asyncio.ensure_future(
                process.Process.spawn(command.with_prefix(self._argv_prefix), log=writer)
            )
            try:
                proc = await asyncio.shield(spawning)
            except asyncio.CancelledError:
                # Cancelled mid-spawn: the process may exist already and must not outlive us.
                with contextlib.suppress(OSError):
                    await (await spawning).stop(timeout=spec.stop_timeout)
                raise
            except OSError as error:
                self._record(service, ServiceState.FAILED, f"Failed to start task {spec.id}: {error}")
                return None
            service.process = proc
            name = Path(command.argv[0]).name if command.argv else "?"
            self._record(
                service, ServiceState.RUNNING, f"Started task {spec.id} (PID {proc.pid}) for process {name}"
            )
            checker = asyncio.create_task(self._check_health(service, spec.health)) if spec.health else None
            try:
                return await proc.wait()
            finally:
                if checker is not None:
                    checker.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await checker
                service.process = None
                service.health = (
                    Health(last_change=time.time()) if service.health.healthy is not None else Health()
                )
        finally:
            writer.close()

    async def _check_health(self, service: _Service, health: HealthCheck) -> None:
        #: The next gap while starting (no success since this start yet), doubling; None after.
        startup_gap = health.startup_interval
        while True:
            try:
                await asyncio.wait_for(health.check(), health.timeout)
                healthy, message = True, ""
            except TimeoutError:
                healthy, message = False, f"health check timed out after {health.timeout:g}s"
            except Exception as error:
                healthy, message = False, _describe(error)
            if (healthy, message) != (service.health.healthy, service.health.message):
                service.health = Health(healthy=healthy, message=message, last_change=time.time())
                text = "Health check successful" if healthy else f"Health check failed: {message}"
                self._record(service, ServiceState.RUNNING, text)
            if healthy:
                startup_gap = None
            if startup_gap is not None and startup_gap < health.interval:
                await asyncio.sleep(startup_gap)
                startup_gap *= 2
            else:
                await asyncio.sleep(health.interval)

    async def _stop(self, service: _Service) -> None:
        runner = service.runner
        if runner is None:
            return
        spec = service.spec
        was_running = not runner.done()
        service.stopping = True
        proc = service.process
        if proc is not None and proc.exit is None:
            self._record(
                service, ServiceState.STOPPING, f"Sending SIGTERM to task {spec.id} (PID {proc.pid})"
            )

            def escalate() -> None:
                text = (
                    f"Task {spec.id} (PID {proc.pid}) did not stop within {spec.stop_timeout:g}s, "
                    "sending SIGKILL"
                )
                self._record(service, ServiceState.STOPPING, text)

            await proc.stop(timeout=spec.stop_timeout, on_escalate=escalate)
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        service.runner = None
        if was_running:
            await self._post_stop(service)
            self._record(service, ServiceState.FINISHED, "Service stopped")

    async def _post_stop(self, service: _Service) -> None:
        hook = service.spec.post_stop
        if not service.prepared or hook is None:
            return
        service.prepared = False
        try:
            await hook()
        except Exception as error:
            self._record(service, service.state, f"Failed to run post stop: {_describe(error)}")

    # -- bookkeeping -----------------------------------------------------------------------------

    def _record(self, service: _Service, state: ServiceState, message: str) -> None:
        service.state = state
        service.events.append(Event(state=state, message=message, timestamp=time.time()))
        metrics.set_service_state(service.spec.id, state.value, _STATE_NAMES)
        _log.info("service %s: [%s] %s", service.spec.id, state.value, message)
        self._notify(service)

    def _notify(self, service: _Service) -> None:
        # Wake every waiter, then arm a fresh event for the next change.
        self._changed.set()
        self._changed = asyncio.Event()
        snapshot = self._snapshot(service)
        for observer in list(self._observers):
            try:
                observer(snapshot)
            except Exception:
                _log.exception("service observer failed on %s", service.spec.id)

    def _snapshot(self, service: _Service) -> ServiceSnapshot:
        return ServiceSnapshot(
            id=service.spec.id,
            state=service.state,
            pid=service.process.pid if service.process is not None else None,
            health=service.health,
            events=tuple(service.events),
            up=service.up,
        )

    async def _wait_for(
        self, service_id: str, predicate: Callable[[ServiceSnapshot], bool], *, timeout: float, what: str
    ) -> ServiceSnapshot:
        service = self._get(service_id)
        deadline = time.monotonic() + timeout
        while not predicate(snapshot := self._snapshot(service)):
            remaining = deadline - time.monotonic()
            try:
                await asyncio.wait_for(self._changed.wait(), max(remaining, 0))
            except TimeoutError:
                last = snapshot.last_event
                detail = f"[{last.state.value}]: {last.message}" if last else "no events yet"
                raise ServiceTimeoutError(
                    f"service {service_id!r} was not {what} within {timeout:g}s; last event {detail}; "
                    f"see its log at {self.log_path(service_id)}"
                ) from None
        return snapshot

    def _get(self, service_id: str) -> _Service:
        try:
            return self._services[service_id]
        except KeyError:
            raise UnknownServiceError(service_id, list(self._services)) from None

    def _is_up(self, service_id: str) -> bool:
        service = self._services.get(service_id)
        return service is not None and service.up

    def _depth(self, service_id: str) -> int:
        """Length of the longest chain of registered dependencies below ``service_id``."""
        deps = [dep for dep in self._services[service_id].spec.depends_on if dep in self._services]
        return 1 + max((self._depth(dep) for dep in deps), default=-1)

    def _find_cycle(self) -> list[str]:
        visiting: list[str] = []
        done: set[str] = set()

        def visit(service_id: str) -> list[str]:
            if service_id in visiting:
                return [*visiting[visiting.index(service_id) :], service_id]
            if service_id in done or service_id not in self._services:
                return []
            visiting.append(service_id)
            for dep in self._services[service_id].spec.depends_on:
                if cycle := visit(dep):
                    return cycle
            visiting.pop()
            done.add(service_id)
            return []

        for service_id in self._services:
            if cycle := visit(service_id):
                return cycle
        return []


def _describe(error: BaseException) -> str:
    return str(error) or type(error).__name__
