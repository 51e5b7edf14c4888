"""The one wait/retry helper: deadline, back-off, progress, typed retryable errors, the timeout message."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane import retry

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


class Unavailable(Exception):
    pass


def outcomes(*items: object) -> object:
    queue = list(items)

    def attempt() -> object:
        item = queue.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    return attempt


def test_returns_the_first_truthy_value_retrying_falsy_results_not_yet_and_typed_errors() -> None:
    clock = FakeClock()
    seen: list[retry.Attempt] = []
    attempt = outcomes(None, retry.NotYet("pod not Ready"), Unavailable("503"), [], "done")
    result = retry.Wait(
        what="the pod",
        timeout=60,
        backoff=retry.fixed(1),
        retry_on=(Unavailable,),
        progress=seen.append,
        clock=clock,
    ).poll(attempt, sleep=clock.sleep)  # type: ignore[arg-type]
    assert result == "done"
    assert [a.reason for a in seen] == ["last result: None", "pod not Ready", "503", "last result: []"]
    assert [a.number for a in seen] == [1, 2, 3, 4]
    assert [a.elapsed for a in seen] == [0, 1, 2, 3]
    assert [a.not_yet for a in seen] == [False, True, False, False]
    assert isinstance(seen[2].error, Unavailable) and seen[1].error is None
    assert all(a.what == "the pod" for a in seen)


def test_backoff_grows_by_its_factor_up_to_its_maximum_and_never_past_the_deadline() -> None:
    clock = FakeClock()
    with pytest.raises(retry.WaitTimeout):
        retry.Wait(
            what="x", timeout=20, backoff=retry.Backoff(initial=1, factor=2, maximum=5), clock=clock
        ).poll(lambda: None, sleep=clock.sleep)
    # 1, 2, 4, 5, 5 (= 17 s), then only the 3 s left before the deadline.
    assert clock.slept == [1, 2, 4, 5, 5, 3]
    assert clock.now == 20


def test_non_retryable_errors_propagate_at_once() -> None:
    clock = FakeClock()
    calls = []

    def attempt() -> None:
        calls.append(1)
        raise PermissionError("forbidden")

    with pytest.raises(PermissionError, match="forbidden"):
        retry.Wait(what="x", timeout=10, retry_on=(Unavailable,), clock=clock).poll(
            attempt, sleep=clock.sleep
        )
    assert calls == [1] and clock.now == 0


def test_the_timeout_names_what_was_awaited_the_last_error_and_the_hint() -> None:
    clock = FakeClock()
    with pytest.raises(retry.WaitTimeout) as caught:
        retry.Wait(
            what="node n1 to be Ready",
            timeout=1,
            backoff=retry.fixed(1),
            retry_on=(Unavailable,),
            hint="see the kubelet log",
            clock=clock,
        ).poll(
            outcomes(retry.NotYet("first"), Unavailable("connection   refused\n(503)")),  # type: ignore[arg-type]
            sleep=clock.sleep,
        )
    assert str(caught.value) == (
        "timed out after 1s waiting for node n1 to be Ready "
        "(last error: connection refused (503)); see the kubelet log"
    )
    assert isinstance(caught.value.__cause__, Unavailable)


def test_a_not_yet_reason_is_the_timeout_detail_and_the_error_class_is_the_callers() -> None:
    class StepTimeout(Exception):
        pass

    clock = FakeClock()
    with pytest.raises(StepTimeout, match=r"^timed out after 2s waiting for x \(config version 2, want 3\)$"):
        retry.Wait(what="x", timeout=2, backoff=retry.fixed(1), error=StepTimeout, clock=clock).poll(
            outcomes(*[retry.NotYet("config version 2, want 3")] * 3),  # type: ignore[arg-type]
            sleep=clock.sleep,
        )


def test_poll_async_behaves_the_same() -> None:
    clock = FakeClock()
    seen: list[str] = []
    queue: list[object] = [Unavailable("reset"), False, 7]

    async def attempt() -> object:
        item = queue.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    result = asyncio.run(
        retry.Wait(
            what="x",
            timeout=10,
            backoff=retry.Backoff(initial=0.5, factor=2, maximum=10),
            retry_on=(Unavailable,),
            progress=lambda a: seen.append(f"{a.reason} ({a.elapsed:g}s)"),
            clock=clock,
        ).poll_async(attempt, sleep=clock.asleep)
    )
    assert result == 7
    assert seen == ["reset (0s)", "last result: False (0.5s)"]
    assert clock.slept == [0.5, 1.0]

    async def forbidden() -> None:
        raise KeyError("metadata")

    with pytest.raises(KeyError):
        asyncio.run(retry.Wait(what="x", timeout=10, clock=clock).poll_async(forbidden, sleep=clock.asleep))
