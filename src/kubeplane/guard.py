"""Stop the work that relies on a right (an etcd lease, the cluster operation Lease) the moment the
right is lost.

A :class:`LossGuard` is made in the task that does the work. Whoever watches the right (a
keep-alive, a renewal loop) calls :meth:`LossGuard.lose`, which cancels that task, as
:func:`asyncio.timeout` does, so the work stops at its next ``await``. On the way out of the
block, :meth:`LossGuard.release` takes that cancellation back and returns the loss error when the
cancellation was the guard's alone: the caller raises that error, which says why, instead of a
bare :class:`asyncio.CancelledError`. A cancellation from anywhere else stays as it is.
"""

from __future__ import annotations

import asyncio


class LossGuard:
    """Cancels the task that made it when the right it holds is lost (see the module docstring)."""

    def __init__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a loss guard needs a running asyncio task")
        self._task = task
        # Cancellations already pending on the task: ours is taken back only if it is the last.
        self._cancelling = task.cancelling()
        self._cancelled = False
        self._guarding = True
        self.lost: BaseException | None = None

    def lose(self, error: BaseException) -> None:
        """The right is gone: remember why and, while the block runs, cancel it."""
        self.lost = error
        if self._guarding:
            self._cancelled = True
            self._task.cancel(msg=str(error))

    def release(self) -> BaseException | None:
        """The block is over: a loss from now on cancels nothing, and a cancellation of ours still
        pending is taken back. The loss error when the task's cancellation was ours alone (raise
        it instead of the CancelledError), else None. Safe to call more than once."""
        self._guarding = False
        if not self._cancelled:
            return None
        self._cancelled = False
        alone = self._task.uncancel() <= self._cancelling
        return self.lost if alone else None
