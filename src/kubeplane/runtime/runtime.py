"""The controller runtime: runs registered controllers in one event loop.

Per controller the runtime keeps one loop task and one watch task per input. A watch event after
the initial snapshot sets the controller's wake-up flag; the loop task clears the flag, reconciles,
and goes back to waiting — so any number of changes during a reconcile cost exactly one more run
(coalescing). A reconcile that raises is logged as ``<name>: controller failed: <error>`` and
retried after an exponential backoff (``backoff_initial`` doubling up to ``backoff_max``), or as
soon as one of its inputs changes, whichever comes first (a new input may be the fix: a config
patch must not wait out a 30 s backoff); the delay resets after a success. A watch that falls
behind is restarted and queues a reconcile, which is enough because reconciles read the current
state rather than the events.

Nothing a controller does may block the event loop, and no reconcile waits for long: a wait that
lasts runs as a background task of the controller (``ctx.start_task``), whose end queues the
controller like an input change; :meth:`Runtime.stop` cancels those tasks too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable
from types import TracebackType

from kubeplane import metrics
from kubeplane.resources import EventKind, FellBehindError, Phase, State, Watch
from kubeplane.runtime.context import ControllerLogger, ControllerTasks, ReconcileContext, controller_logger
from kubeplane.runtime.controller import Controller, Input, InputKind, OutputKind
from kubeplane.runtime.errors import RegistrationError


@dataclasses.dataclass
class _Entry:
    controller: Controller
    logger: ControllerLogger
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    timer: asyncio.TimerHandle | None = None
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    background: ControllerTasks = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.background = ControllerTasks(self.controller.name, self.wake.set)

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Runtime:
    """Registers controllers, runs them, restarts failing ones with backoff (see module docstring)."""

    def __init__(
        self,
        state: State,
        *,
        backoff_initial: float = 0.1,
        backoff_max: float = 30.0,
        on_error: Callable[[str, Exception], None] | None = None,
    ) -> None:
        self.state = state
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        #: Called with the controller's name and the error each time a reconcile fails.
        self.on_error = on_error
        self._entries: dict[str, _Entry] = {}
        self._started = False

    def register(self, controller: Controller) -> None:
        """Add a controller; names must be unique and an exclusive output type belongs to one controller."""
        if self._started:
            raise RegistrationError(f"cannot register {controller.name}: the runtime is already running")
        if controller.name in self._entries:
            raise RegistrationError(f"a controller named {controller.name} is already registered")
        for output in controller.outputs:
            for other in self._entries.values():
                for theirs in other.controller.outputs:
                    if theirs.type == output.type and OutputKind.EXCLUSIVE in (output.kind, theirs.kind):
                        raise RegistrationError(
                            f"controller {controller.name} declares output {output.type} ({output.kind}), "
                            f"but {other.controller.name} already declares it ({theirs.kind}); an exclusive "
                            "output has one writer — make both shared or drop one"
                        )
        self._entries[controller.name] = _Entry(controller, controller_logger(controller.name))

    @property
    def controller_names(self) -> list[str]:
        """Names of the registered controllers, in registration order."""
        return list(self._entries)

    def queue(self, name: str) -> None:
        """Ask for a reconcile of one controller (coalesced with any pending one)."""
        self._entries[name].wake.set()

    async def start(self) -> None:
        """Start every controller; each reconciles once right away."""
        if self._started:
            raise RegistrationError("the runtime is already running")
        self._started = True
        for entry in self._entries.values():
            for item in entry.controller.inputs:
                # The watch is opened here, not in the task, so no change after start() is missed.
                watch = self.state.watch(item.namespace, item.type, item.id)
                entry.tasks.append(asyncio.create_task(self._watch_input(entry, item, watch)))
            entry.tasks.append(asyncio.create_task(self._run(entry)))
            entry.wake.set()

    async def stop(self) -> None:
        """Cancel every controller and wait for them to finish."""
        tasks = [task for entry in self._entries.values() for task in entry.tasks]
        for entry in self._entries.values():
            entry.cancel_timer()
            entry.tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(
            *tasks, *(entry.background.stop_all() for entry in self._entries.values()), return_exceptions=True
        )
        self._started = False

    async def run(self) -> None:
        """Start, run until cancelled, then stop."""
        await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- internals ---------------------------------------------------------------------------

    async def _watch_input(self, entry: _Entry, item: Input, watch: Watch) -> None:
        while True:
            bootstrapped = False
            try:
                async for event in watch:
                    if bootstrapped:
                        entry.wake.set()
                    elif event.kind is EventKind.BOOTSTRAPPED:
                        bootstrapped = True
            except FellBehindError as exc:
                entry.logger.warning("%s; re-watching", exc)
                watch = self.state.watch(item.namespace, item.type, item.id)
                entry.wake.set()

    async def _run(self, entry: _Entry) -> None:
        controller = entry.controller
        delay = self.backoff_initial
        while True:
            await entry.wake.wait()
            entry.wake.clear()
            entry.cancel_timer()
            ctx = ReconcileContext(
                state=self.state,
                name=controller.name,
                inputs=controller.inputs,
                outputs=controller.outputs,
                logger=entry.logger,
                requeue=functools.partial(self._requeue, entry),
                tasks=entry.background,
            )
            started = time.monotonic()
            try:
                await controller.reconcile(ctx)
                self._release_strong_inputs(ctx, controller)
            except Exception as exc:
                metrics.observe_reconcile(controller.name, time.monotonic() - started, ok=False)
                entry.logger.error("controller failed: %s", exc)
                if self.on_error is not None:
                    self.on_error(controller.name, exc)
                entry.logger.debug("controller failure traceback", exc_info=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry.wake.wait(), delay)
                delay = min(delay * 2, self.backoff_max)
                entry.wake.set()
                continue
            metrics.observe_reconcile(controller.name, time.monotonic() - started, ok=True)
            delay = self.backoff_initial

    def _requeue(self, entry: _Entry, seconds: float) -> None:
        entry.cancel_timer()
        entry.timer = asyncio.get_running_loop().call_later(seconds, entry.wake.set)

    def _release_strong_inputs(self, ctx: ReconcileContext, controller: Controller) -> None:
        for item in controller.inputs:
            if item.kind is not InputKind.STRONG:
                continue
            for resource in self.state.list(item.namespace, item.type):
                metadata = resource.metadata
                key = (metadata.namespace, metadata.type, metadata.id)
                held = controller.name in metadata.finalizers
                if not held or not item.matches(*key) or key in ctx.used:
                    continue
                self.state.remove_finalizers(*key, controller.name)
                if metadata.phase is Phase.TEARING_DOWN and metadata.owner in self._entries:
                    self.queue(metadata.owner)
