"""The service supervisor with real tiny processes: order, events, health, restarts, stopping groups.

Every test runs its supervisor in ``async with`` so that every process group it started is gone
when the test ends, pass or fail; processes are only ever signalled by the PID we spawned.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kubeplane.services import logs, process, supervisor
from kubeplane.services.supervisor import (
    Backoff,
    HealthCheck,
    RestartPolicy,
    ServiceSnapshot,
    ServiceSpec,
    ServiceState,
    Supervisor,
)

pytestmark = pytest.mark.unit

T = TypeVar("T")
FAST = Backoff(initial=0.05, maximum=0.2, factor=2.0, reset_after=30.0)


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, 10)

    return asyncio.run(bounded())


def sh(script: str, **kwargs: Any) -> process.Command:
    return process.Command(argv=["sh", "-c", script], **kwargs)


def messages(snapshot: ServiceSnapshot) -> list[str]:
    return [f"[{event.state.value}] {event.message}" for event in snapshot.events]


def file_check(path: Path) -> HealthCheck:
    async def check() -> None:
        if not path.exists():
            raise RuntimeError(f"{path.name} not found")

    return HealthCheck(check=check, interval=0.03, timeout=1.0)


def new_pid(old: int) -> Callable[[ServiceSnapshot], bool]:
    return lambda snapshot: snapshot.running and snapshot.pid not in (None, old)


def test_dependents_wait_until_dependencies_are_up(tmp_path: Path) -> None:
    ready = tmp_path / "cri-ready"

    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(ServiceSpec(id="cri", command=sh("exec sleep 30"), health=file_check(ready)))
            sup.register(ServiceSpec(id="timed", command=sh("exec sleep 30")))
            sup.register(ServiceSpec(id="kubelet", command=sh("exec sleep 30"), depends_on=("cri", "timed")))
            await sup.start("kubelet")
            await asyncio.sleep(0.05)
            await sup.start("timed")
            await sup.wait_up("timed", timeout=5)
            await sup.start("cri")
            await sup.wait_for("cri", lambda s: s.health.healthy is False, timeout=5)
            await asyncio.sleep(0.1)
            assert not sup.snapshot("kubelet").running
            ready.touch()
            kubelet = await sup.wait_up("kubelet", timeout=5)
            cri = sup.snapshot("cri")

            assert messages(kubelet) == [
                '[Waiting] Waiting for service "cri" to be "up", service "timed" to be "up"',
                '[Waiting] Waiting for service "cri" to be "up"',
                "[Preparing] Running pre state",
                "[Preparing] Creating service runner",
                f"[Running] Started task kubelet (PID {kubelet.pid}) for process sh",
            ]
            assert messages(cri)[-2:] == [
                "[Running] Health check failed: cri-ready not found",
                "[Running] Health check successful",
            ]
            assert kubelet.events[-1].timestamp >= cri.events[-1].timestamp
            assert cri.up and cri.health.healthy is True and cri.health.last_change is not None

    run(scenario())


def test_startup_interval_checks_closely_until_the_first_success_only(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    checked: list[float] = []

    async def check() -> None:
        checked.append(asyncio.get_running_loop().time())
        if not ready.exists():
            raise RuntimeError("not ready")

    async def scenario() -> None:
        health = HealthCheck(check=check, interval=0.5, timeout=1.0, startup_interval=0.02)
        async with Supervisor(root=tmp_path) as sup:
            sup.register(ServiceSpec(id="etcd", command=sh("exec sleep 30"), health=health))
            await sup.start("etcd")
            deadline = asyncio.get_running_loop().time() + 5
            while len(checked) < 5:  # failing checks with the same message record no event
                assert asyncio.get_running_loop().time() < deadline, checked
                await asyncio.sleep(0.01)
            ready.touch()
            await sup.wait_up("etcd", timeout=5)
            ready.unlink()
            before = len(checked)
            await asyncio.sleep(0.3)
            # Once it succeeded the service is checked at its interval, even while failing again.
            assert len(checked) - before <= 1, checked

    run(scenario())
    starting_gaps = [b - a for a, b in itertools.pairwise(checked)][:4]
    assert max(starting_gaps) < 0.25, starting_gaps


def test_health_transitions_are_recorded_once_per_change(tmp_path: Path) -> None:
    ready = tmp_path / "ready"

    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            # The process itself creates the file after a while, like a daemon finishing its startup.
            command = sh("sleep 0.3; touch ready; exec sleep 30", cwd=tmp_path)
            sup.register(ServiceSpec(id="etcd", command=command, health=file_check(ready)))
            await sup.start("etcd")
            await sup.wait_up("etcd", timeout=5)
            ready.unlink()
            await sup.wait_for("etcd", lambda s: s.health.healthy is False, timeout=5)
            await asyncio.sleep(0.15)  # several more failing checks must not add events
            health_events = [m for m in messages(sup.snapshot("etcd")) if "Health check" in m]
            assert health_events == [
                "[Running] Health check failed: ready not found",
                "[Running] Health check successful",
                "[Running] Health check failed: ready not found",
            ]
            assert not sup.snapshot("etcd").up

    run(scenario())


def test_a_hanging_health_check_counts_as_failed(tmp_path: Path) -> None:
    async def hang() -> None:
        await asyncio.sleep(10)

    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            check = HealthCheck(check=hang, interval=0.05, timeout=0.1)
            sup.register(ServiceSpec(id="slow", command=sh("exec sleep 30"), health=check))
            await sup.start("slow")
            snapshot = await sup.wait_for("slow", lambda s: s.health.healthy is False, timeout=5)
            assert snapshot.health.message == "health check timed out after 0.1s"

    run(scenario())


def test_a_killed_process_is_restarted_and_the_history_shows_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(ServiceSpec(id="etcd", command=sh("exec sleep 30"), backoff=FAST))
            await sup.start("etcd")
            first = await sup.wait_up("etcd", timeout=5)
            assert first.pid is not None
            os.kill(first.pid, signal.SIGKILL)
            second = await sup.wait_for("etcd", new_pid(first.pid), timeout=5)
            assert messages(second)[-4:] == [
                f"[Running] Started task etcd (PID {first.pid}) for process sh",
                "[Failed] Service exited with signal SIGKILL (9)",
                "[Waiting] Restarting in 0.05s (restart 1)",
                f"[Running] Started task etcd (PID {second.pid}) for process sh",
            ]
            # The pre state belongs to the start request, not to every process restart.
            assert messages(second).count("[Preparing] Running pre state") == 1

    run(scenario())


def test_crash_loop_backs_off_exponentially_up_to_the_cap(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(ServiceSpec(id="bad", command=sh("exit 3"), backoff=FAST))
            await sup.start("bad")
            snapshot = await sup.wait_for(
                "bad", lambda s: any("(restart 4)" in e.message for e in s.events), timeout=5
            )
            restarts = [e.message for e in snapshot.events if e.message.startswith("Restarting")]
            assert restarts[:4] == [
                "Restarting in 0.05s (restart 1)",
                "Restarting in 0.10s (restart 2)",
                "Restarting in 0.20s (restart 3)",
                "Restarting in 0.20s (restart 4)",
            ]
            assert "[Failed] Service exited with code 3" in messages(snapshot)

    run(scenario())


@pytest.mark.parametrize(
    ("policy", "script", "final"),
    [
        (RestartPolicy.NEVER, "exit 3", "[Failed] Service exited with code 3"),
        (RestartPolicy.ON_FAILURE, "exit 0", "[Finished] Service finished successfully"),
        (RestartPolicy.NEVER, "exit 0", "[Finished] Service finished successfully"),
    ],
)
def test_restart_policies_that_let_a_service_end(
    tmp_path: Path, policy: RestartPolicy, script: str, final: str
) -> None:
    post_stops: list[str] = []

    async def post_stop() -> None:
        post_stops.append("done")

    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            spec = ServiceSpec(
                id="once", command=sh(script), restart=policy, backoff=FAST, post_stop=post_stop
            )
            sup.register(spec)
            await sup.start("once")
            snapshot = await sup.wait_for(
                "once", lambda s: s.state.value in ("Failed", "Finished"), timeout=5
            )
            await asyncio.sleep(0.2)
            snapshot = sup.snapshot("once")
            assert messages(snapshot)[-1] == final
            assert sum(m.startswith("[Running] Started task") for m in messages(snapshot)) == 1
            assert post_stops == ["done"]

    run(scenario())


def test_on_failure_restarts_a_failing_process(tmp_path: Path) -> None:
    marker = tmp_path / "ran-once"

    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            # Fails the first time, succeeds the second: on-failure restarts once and then stops.
            command = sh(f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 1")
            sup.register(
                ServiceSpec(id="job", command=command, restart=RestartPolicy.ON_FAILURE, backoff=FAST)
            )
            await sup.start("job")
            snapshot = await sup.wait_for("job", lambda s: s.state is ServiceState.FINISHED, timeout=5)
            assert "[Failed] Service exited with code 1" in messages(snapshot)
            assert sum(m.startswith("[Running] Started task") for m in messages(snapshot)) == 2

    run(scenario())


def test_stop_sends_sigterm_to_the_whole_group(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(ServiceSpec(id="tree", command=sh("sleep 300 & sleep 300 & wait")))
            await sup.start("tree")
            snapshot = await sup.wait_up("tree", timeout=5)
            assert snapshot.pid is not None
            await wait_members(snapshot.pid, 3)
            await sup.stop("tree")
            assert process.group_members(snapshot.pid) == []
            after = sup.snapshot("tree")
            assert messages(after)[-2:] == [
                f"[Stopping] Sending SIGTERM to task tree (PID {snapshot.pid})",
                "[Finished] Service stopped",
            ]
            assert after.pid is None and not after.running

    run(scenario())


def test_stop_escalates_to_sigkill_for_a_group_ignoring_sigterm(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            # An ignored signal stays ignored across fork and exec: the grandchildren ignore it too.
            command = sh('trap "" TERM; sleep 300 & sleep 300 & wait')
            sup.register(ServiceSpec(id="stubborn", command=command, stop_timeout=0.3))
            await sup.start("stubborn")
            snapshot = await sup.wait_up("stubborn", timeout=5)
            assert snapshot.pid is not None
            await wait_members(snapshot.pid, 3)
            await sup.stop("stubborn")
            assert process.group_members(snapshot.pid) == []
            assert messages(sup.snapshot("stubborn"))[-2:] == [
                f"[Stopping] Task stubborn (PID {snapshot.pid}) did not stop within 0.3s, sending SIGKILL",
                "[Finished] Service stopped",
            ]

    run(scenario())


def test_a_crash_takes_the_leftover_grandchildren_with_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            command = sh("sleep 300 & sleep 0.2; exit 3")
            sup.register(ServiceSpec(id="leaky", command=command, restart=RestartPolicy.NEVER))
            await sup.start("leaky")
            snapshot = await sup.wait_for("leaky", lambda s: s.state is ServiceState.FAILED, timeout=5)
            started = next(e.message for e in snapshot.events if e.message.startswith("Started task"))
            pgid = int(started.split("(PID ")[1].split(")")[0])
            assert process.group_members(pgid) == []
            assert messages(snapshot)[-1] == "[Failed] Service exited with code 3"

    run(scenario())


def test_shutdown_stops_dependents_first_and_leaves_no_group(tmp_path: Path) -> None:
    stopped: list[str] = []
    seen: list[tuple[str, str]] = []

    def hook(name: str) -> Callable[[], Coroutine[Any, Any, None]]:
        async def post_stop() -> None:
            stopped.append(name)

        return post_stop

    async def scenario() -> list[int]:
        sup = Supervisor(root=tmp_path)
        sup.add_observer(lambda s: seen.append((s.id, s.state.value)))
        for service_id, deps in [
            ("cri", ()),
            ("kubelet", ("cri",)),
            ("etcd", ("cri",)),
            ("apid", ("kubelet",)),
        ]:
            sup.register(
                ServiceSpec(
                    id=service_id, command=sh("exec sleep 30"), depends_on=deps, post_stop=hook(service_id)
                )
            )
        async with sup:
            await sup.start_all()
            pids = [(await sup.wait_up(service_id, timeout=5)).pid for service_id in sup.ids()]
        return [pid for pid in pids if pid is not None]

    pids = run(scenario())
    assert len(pids) == 4
    assert all(process.group_members(pid) == [] for pid in pids)
    assert stopped.index("apid") < stopped.index("kubelet") < stopped.index("cri")
    assert stopped.index("etcd") < stopped.index("cri")
    assert ("kubelet", "Running") in seen and ("kubelet", "Finished") in seen


def test_restart_request_gives_a_new_process(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(ServiceSpec(id="kubelet", command=sh("exec sleep 30")))
            await sup.start("kubelet")
            first = await sup.wait_up("kubelet", timeout=5)
            await sup.restart("kubelet")
            second = await sup.wait_up("kubelet", timeout=5)
            assert first.pid != second.pid
            assert first.pid is not None and process.group_members(first.pid) == []
            assert messages(second).count("[Finished] Service stopped") == 1

    run(scenario())


def test_stopping_a_waiting_service_and_starting_it_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(ServiceSpec(id="kubelet", command=sh("exec sleep 30"), depends_on=("cri",)))
            await sup.start("kubelet")
            await sup.wait_for("kubelet", lambda s: s.state is ServiceState.WAITING, timeout=5)
            await sup.stop("kubelet")
            assert messages(sup.snapshot("kubelet"))[-1] == "[Finished] Service stopped"
            sup.register(ServiceSpec(id="cri", command=sh("exec sleep 30")))
            await sup.start("cri")
            await sup.start("kubelet")
            await sup.wait_up("kubelet", timeout=5)

    run(scenario())


def test_pre_state_failures_are_retried_and_condition_can_skip(tmp_path: Path) -> None:
    attempts: list[int] = []

    async def flaky_pre() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("endpoints not reachable yet")

    async def worker() -> str | None:
        return "not a control plane node"

    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(
                ServiceSpec(id="etcd", command=sh("exec sleep 30"), pre_start=flaky_pre, backoff=FAST)
            )
            sup.register(ServiceSpec(id="skipme", command=sh("exec sleep 30"), condition=worker))
            await sup.start_all()
            etcd = await sup.wait_up("etcd", timeout=5)
            assert messages(etcd)[:4] == [
                "[Preparing] Running pre state",
                "[Failed] Failed to run pre state: endpoints not reachable yet",
                "[Waiting] Retrying pre state in 0.05s",
                "[Preparing] Running pre state",
            ]
            skipped = await sup.wait_for("skipme", lambda s: s.state is ServiceState.SKIPPED, timeout=5)
            assert messages(skipped) == ["[Skipped] Service skipped: not a control plane node"]

    run(scenario())


def test_a_missing_binary_is_a_failed_start_with_the_reason(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            command = process.Command(argv=[str(tmp_path / "no-such-binary")])
            sup.register(ServiceSpec(id="ghost", command=command, restart=RestartPolicy.NEVER))
            await sup.start("ghost")
            snapshot = await sup.wait_for("ghost", lambda s: s.state is ServiceState.FAILED, timeout=5)
            assert snapshot.events[-1].message.startswith("Failed to start task ghost: [Errno 2]")

    run(scenario())


def test_command_builder_prefix_env_and_log_capture(tmp_path: Path) -> None:
    async def build() -> process.Command:
        return sh('echo "prefix=$KP_PREFIX own=$KP_OWN"; echo oops >&2; exec sleep 30', env={"KP_OWN": "yes"})

    async def scenario() -> None:
        async with Supervisor(root=tmp_path, argv_prefix=["env", "KP_PREFIX=ns"]) as sup:
            sup.register(ServiceSpec(id="cmd", command=build))
            await sup.start("cmd")
            snapshot = await sup.wait_up("cmd", timeout=5)
            assert messages(snapshot)[-1].endswith("for process sh")
            log = sup.log_path("cmd")
            assert log == tmp_path / "var" / "log" / "kubeplane" / "cmd.log"
            for _ in range(100):
                if "oops" in log.read_text():
                    break
                await asyncio.sleep(0.02)
            assert log.read_text().splitlines() == ["prefix=ns own=yes", "oops"]

    run(scenario())


def test_registration_errors_name_the_problem(tmp_path: Path) -> None:
    sup = Supervisor(root=tmp_path)
    sup.register(ServiceSpec(id="a", command=sh("true"), depends_on=("b",)))
    with pytest.raises(supervisor.ServiceRegistrationError, match="'a' is already registered"):
        sup.register(ServiceSpec(id="a", command=sh("true")))
    with pytest.raises(supervisor.ServiceRegistrationError, match=r"cycle \(a -> b -> a\)"):
        sup.register(ServiceSpec(id="b", command=sh("true"), depends_on=("a",)))
    assert sup.ids() == ["a"]
    with pytest.raises(supervisor.UnknownServiceError, match="unknown service 'kubelet': this node runs a"):
        sup.snapshot("kubelet")


def test_wait_up_timeout_names_the_last_event(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(ServiceSpec(id="kubelet", command=sh("exec sleep 30"), depends_on=("cri",)))
            await sup.start("kubelet")
            with pytest.raises(
                supervisor.ServiceTimeoutError, match=r'\[Waiting\]: Waiting for service "cri"'
            ):
                await sup.wait_up("kubelet", timeout=0.2)

    run(scenario())


def test_event_history_is_bounded_and_snapshots_serialise(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Supervisor(root=tmp_path, history=5) as sup:
            sup.register(
                ServiceSpec(id="bad", command=sh("exit 3"), backoff=Backoff(initial=0.01, maximum=0.01))
            )
            await sup.start("bad")
            snapshot = await sup.wait_for(
                "bad", lambda s: any("(restart 5)" in e.message for e in s.events), timeout=5
            )
            assert len(snapshot.events) == 5
            data = snapshot.as_dict()
            assert set(data) == {"id", "state", "running", "up", "pid", "health", "events"}
            assert data["health"] == {"healthy": None, "message": "", "last_change": None}
            assert {"state", "message", "timestamp"} == set(data["events"][0])

    run(scenario())


async def wait_members(pgid: int, count: int) -> None:
    for _ in range(200):
        if len(process.group_members(pgid)) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"process group {pgid} never reached {count} members")


def test_a_failing_condition_shows_in_the_history(tmp_path: Path) -> None:
    async def broken() -> str | None:
        raise RuntimeError("machine config not loaded")

    async def scenario() -> None:
        async with Supervisor(root=tmp_path) as sup:
            sup.register(ServiceSpec(id="etcd", command=sh("exec sleep 30"), condition=broken))
            await sup.start("etcd")
            snapshot = await sup.wait_for("etcd", lambda s: s.state is ServiceState.FAILED, timeout=5)
            assert messages(snapshot) == ["[Failed] Service runner failed: machine config not loaded"]

    run(scenario())


def test_a_process_that_dies_unawaited_says_so(tmp_path: Path) -> None:
    # wireguard_io asks `exit` without awaiting wait(): a killed daemon used to stay a zombie that
    # still counted as running, and was never started again.
    async def scenario() -> process.Exit:
        writer = logs.RotatingLogWriter(tmp_path / "sleeper.log")
        try:
            spawned = await process.Process.spawn(sh("sleep 60"), log=writer)
            assert spawned.exit is None
            os.kill(spawned.pid, signal.SIGKILL)
            async with asyncio.timeout(10):
                while spawned.exit is None:
                    await asyncio.sleep(0.02)
            return spawned.exit
        finally:
            writer.close()

    assert asyncio.run(scenario()).signal == signal.SIGKILL
