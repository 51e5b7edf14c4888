"""The view of the state a controller gets during one reconcile.

Reads go straight to the state (and record strong-input use, see :mod:`~kubeplane.runtime.controller`);
writes are checked against the controller's declared outputs and carry the controller's name as
owner, so a controller can neither write a type it did not declare nor touch resources it does not own.

A reconcile returns promptly: a wait that lasts (an etcd watch, a distributed lock) runs as one of
the controller's background tasks (:meth:`ReconcileContext.start_task`, kept by
:class:`ControllerTasks`), and the end of that task queues the controller like an input change.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Callable, Collection, Coroutine, MutableMapping, Sequence
from typing import Any

from kubeplane.resources import Phase, Resource, Spec, State, Watch
from kubeplane.runtime.controller import Input, InputKind, Output
from kubeplane.runtime.errors import OutputNotDeclaredError

#: The log stream every controller writes to (``logs controller-runtime``).
LOGGER_NAME = "controller-runtime"


class ControllerLogger(logging.LoggerAdapter[logging.Logger]):
    """Prefixes messages with the controller name and adds it as the ``controller`` record field."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        name = (self.extra or {}).get("controller", "")
        kwargs.setdefault("extra", {}).update(self.extra or {})
        return f"{name}: {msg}", kwargs


def controller_logger(name: str) -> ControllerLogger:
    """The ``controller-runtime`` logger for one controller."""
    return ControllerLogger(logging.getLogger(LOGGER_NAME), {"controller": name})


class ControllerTasks:
    """One controller's background tasks by name; the end of one calls ``on_end`` (queues it).

    A task that was replaced or stopped no longer counts: its end queues nothing. The runtime
    cancels them all when it stops (:meth:`stop_all`).
    """

    def __init__(self, owner: str, on_end: Callable[[], None]) -> None:
        self.owner = owner
        self._on_end = on_end
        self._tasks: dict[str, asyncio.Task[Any]] = {}

    def get(self, name: str) -> asyncio.Task[Any] | None:
        return self._tasks.get(name)

    def start(self, name: str, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        previous = self._tasks.pop(name, None)
        if previous is not None:
            previous.cancel()
        task = asyncio.get_running_loop().create_task(work, name=f"{self.owner}: {name}")
        self._tasks[name] = task
        task.add_done_callback(lambda done: self._ended(name, done))
        return task

    async def stop(self, name: str) -> asyncio.Task[Any] | None:
        task = self._tasks.pop(name, None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})
        return task

    async def stop_all(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _ended(self, name: str, task: asyncio.Task[Any]) -> None:
        if self._tasks.get(name) is task:
            self._on_end()


class ReconcileContext:
    """State access for one reconcile of one controller (created by the runtime)."""

    def __init__(
        self,
        *,
        state: State,
        name: str,
        inputs: Sequence[Input],
        outputs: Sequence[Output],
        logger: ControllerLogger,
        requeue: Callable[[float], None],
        tasks: ControllerTasks,
    ) -> None:
        self.state = state
        self.name = name
        self.logger = logger
        self._strong = [item for item in inputs if item.kind is InputKind.STRONG]
        self._output_types = {output.type for output in outputs}
        self._requeue = requeue
        self._tasks = tasks
        #: (namespace, type, id) of strong-input resources read while running in this reconcile.
        self.used: set[tuple[str, str, str]] = set()

    # -- reads -------------------------------------------------------------------------------

    def get(self, namespace: str, type_name: str, resource_id: str) -> Resource:
        """Read a resource (NotFoundError when missing)."""
        return self._track(self.state.get(namespace, type_name, resource_id))

    def find(self, namespace: str, type_name: str, resource_id: str) -> Resource | None:
        """Read a resource, None when missing."""
        resource = self.state.find(namespace, type_name, resource_id)
        return None if resource is None else self._track(resource)

    def list(self, namespace: str, type_name: str) -> list[Resource]:
        """Read all resources of a type in a namespace, sorted by id."""
        return [self._track(resource) for resource in self.state.list(namespace, type_name)]

    def watch(self, namespace: str, type_name: str, resource_id: str | None = None) -> Watch:
        """Watch a collection directly (no strong-input tracking)."""
        return self.state.watch(namespace, type_name, resource_id)

    # -- writes (declared outputs only, owned by this controller) ----------------------------

    def create(self, namespace: str, type_name: str, resource_id: str, *, spec: Spec) -> Resource:
        """Create an output resource owned by this controller."""
        self._check_output(type_name)
        return self.state.create(namespace, type_name, resource_id, spec=spec, owner=self.name)

    def update(
        self, namespace: str, type_name: str, resource_id: str, *, spec: Spec, version: int
    ) -> Resource:
        """Update an output resource read at ``version`` (equal spec: no-op)."""
        self._check_output(type_name)
        return self.state.update(
            namespace, type_name, resource_id, spec=spec, version=version, owner=self.name
        )

    def modify(
        self, namespace: str, type_name: str, resource_id: str, fn: Callable[[Spec | None], Spec]
    ) -> Resource:
        """Create or update an output resource from its current spec (None when missing)."""
        self._check_output(type_name)
        return self.state.modify(namespace, type_name, resource_id, fn, owner=self.name)

    def teardown(self, namespace: str, type_name: str, resource_id: str) -> Resource:
        """Start tearing down an output resource."""
        self._check_output(type_name)
        return self.state.teardown(namespace, type_name, resource_id, owner=self.name)

    def destroy(self, namespace: str, type_name: str, resource_id: str) -> Resource:
        """Destroy an output resource (FinalizersPendingError while finalizers remain)."""
        self._check_output(type_name)
        return self.state.destroy(namespace, type_name, resource_id, owner=self.name)

    def cleanup(self, namespace: str, type_name: str, keep_ids: Collection[str]) -> builtins.list[str]:
        """Tear down and destroy this controller's outputs of a type whose id is not in ``keep_ids``.

        Resources still held by finalizers stay ``tearingDown``; when their holders let go the runtime
        queues this controller again and the next ``cleanup`` destroys them. Returns those ids.
        """
        self._check_output(type_name)
        pending: builtins.list[str] = []
        for resource in self.state.list(namespace, type_name):
            if resource.metadata.owner != self.name or resource.id in keep_ids:
                continue
            torn_down = self.state.teardown(namespace, type_name, resource.id, owner=self.name)
            if torn_down.metadata.finalizers:
                pending.append(resource.id)
            else:
                self.state.destroy(namespace, type_name, resource.id, owner=self.name)
        return pending

    def requeue_after(self, seconds: float) -> None:
        """Reconcile again after ``seconds`` even without input changes (replaces an earlier request).

        A reconcile that starts for any reason cancels the pending request, so a polling controller
        asks again on each run.
        """
        self._requeue(seconds)

    # -- background tasks: long waits never hold up a reconcile ------------------------------

    def task(self, name: str) -> asyncio.Task[Any] | None:
        """This controller's background task ``name``, running or finished; None when there is none.

        A finished task stays until :meth:`start_task` replaces it or :meth:`stop_task` takes it,
        so the reconcile its end queued can read its result.
        """
        return self._tasks.get(name)

    def start_task(self, name: str, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``work`` as this controller's background task ``name``; its end queues a reconcile.

        For a wait that lasts (a watch, a lock): the reconcile returns at once, input changes keep
        reaching the controller meanwhile, and the reconcile that the end queues reads the outcome
        through :meth:`task`. A task of that name still running is cancelled (its end then queues
        nothing). Every task is cancelled when the runtime stops. Like a reconcile, the task runs
        on the event loop: blocking calls go to a thread (``asyncio.to_thread``).
        """
        return self._tasks.start(name, work)

    async def stop_task(self, name: str) -> asyncio.Task[Any] | None:
        """Take task ``name`` away: cancel it when it still runs and wait until it has ended.

        Returns the task (None when there was none); a finished one's outcome is read from it.
        """
        return await self._tasks.stop(name)

    # -- internals ---------------------------------------------------------------------------

    def _check_output(self, type_name: str) -> None:
        if type_name not in self._output_types:
            declared = ", ".join(sorted(self._output_types)) or "none"
            raise OutputNotDeclaredError(
                f"controller {self.name} wrote {type_name}, which is not among its declared outputs "
                f"({declared}); add it to the controller's outputs"
            )

    def _track(self, resource: Resource) -> Resource:
        metadata = resource.metadata
        if metadata.phase is not Phase.RUNNING:
            return resource
        if not any(item.matches(metadata.namespace, metadata.type, metadata.id) for item in self._strong):
            return resource
        self.used.add((metadata.namespace, metadata.type, metadata.id))
        return self.state.add_finalizers(metadata.namespace, metadata.type, metadata.id, self.name)
