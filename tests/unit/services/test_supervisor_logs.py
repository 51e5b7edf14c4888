"""Service logs: rotation with a size cap, tail across generations, follow across rotation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubeplane.services import logs, process
from kubeplane.services.supervisor import ServiceSpec, Supervisor

pytestmark = pytest.mark.unit


def test_writer_rotates_at_the_cap_and_keeps_the_configured_generations(tmp_path: Path) -> None:
    path = tmp_path / "etcd.log"
    writer = logs.RotatingLogWriter(path, max_bytes=100, backups=2)
    for number in range(40):
        writer.write(f"line {number:04d}\n".encode())  # 10 bytes each
    writer.close()
    generations = [path, logs.rotated_path(path, 1), logs.rotated_path(path, 2)]
    assert all(p.stat().st_size <= 100 for p in generations)
    assert not logs.rotated_path(path, 3).exists()
    kept = b"".join(p.read_bytes() for p in reversed(generations)).decode().splitlines()
    assert kept == [f"line {n:04d}" for n in range(10, 40)]


def test_writer_appends_to_an_existing_log_and_counts_its_size(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.log"
    path.write_bytes(b"x" * 95 + b"\n")
    writer = logs.RotatingLogWriter(path, max_bytes=100, backups=1)
    writer.write(b"next\n")
    writer.close()
    assert logs.rotated_path(path, 1).read_bytes() == b"x" * 95 + b"\n"
    assert path.read_bytes() == b"next\n"


def test_tail_reaches_into_the_previous_generation(tmp_path: Path) -> None:
    path = tmp_path / "svc.log"
    logs.rotated_path(path, 1).write_text("a\nb\nc\n")
    path.write_text("d\ne\n")
    assert logs.tail(path, 3) == ["c", "d", "e"]
    assert logs.tail(path, 0) == []
    assert logs.tail(path, -1) == ["d", "e"]
    assert logs.tail(tmp_path / "never-started.log", 10) == []


async def collect(lines: AsyncIterator[str], count: int) -> list[str]:
    got: list[str] = []
    async for line in lines:
        got.append(line)
        if len(got) == count:
            break
    return got


def test_follow_yields_the_tail_then_new_lines_across_rotation(tmp_path: Path) -> None:
    path = tmp_path / "svc.log"

    async def scenario() -> list[str]:
        writer = logs.RotatingLogWriter(path, max_bytes=30, backups=1)
        writer.write(b"old 1\nold 2\nold 3\n")
        follower = asyncio.create_task(collect(logs.follow(path, lines=2, poll_interval=0.01), 6))
        await asyncio.sleep(0.05)
        writer.write(b"new 1\npart")
        await asyncio.sleep(0.05)
        writer.write(b"ial\n")  # completes a held-back partial line
        await asyncio.sleep(0.05)
        writer.write(b"after rotation 1\n")  # 18 + 17 bytes > 30: rotates first
        writer.write(b"after 2\n")
        try:
            return await asyncio.wait_for(follower, 5)
        finally:
            writer.close()

    got = asyncio.run(scenario())
    assert got == ["old 2", "old 3", "new 1", "partial", "after rotation 1", "after 2"]
    assert logs.rotated_path(path, 1).exists()


def test_follow_waits_for_a_log_that_does_not_exist_yet(tmp_path: Path) -> None:
    path = tmp_path / "later.log"

    async def scenario() -> list[str]:
        follower = asyncio.create_task(collect(logs.follow(path, lines=5, poll_interval=0.01), 1))
        await asyncio.sleep(0.05)
        path.write_text("hello\n")
        return await asyncio.wait_for(follower, 5)

    assert asyncio.run(scenario()) == ["hello"]


def test_a_service_log_rotates_under_a_running_process(tmp_path: Path) -> None:
    # 200 lines of ~60 bytes through a 2 KiB cap: the live file rotates many times while the
    # process keeps writing into the same pipe.
    script = f"for i in $(seq 1 200); do echo line-$i-{'a' * 50}; done; exec sleep 30"

    async def scenario() -> list[str]:
        async with Supervisor(root=tmp_path, log_max_bytes=2048, log_backups=2) as sup:
            sup.register(ServiceSpec(id="chatty", command=process.Command(argv=["sh", "-c", script])))
            await sup.start("chatty")
            await sup.wait_up("chatty", timeout=5)
            path = sup.log_path("chatty")
            for _ in range(200):
                if logs.tail(path, 1) == ["line-200-" + "a" * 50]:
                    break
                await asyncio.sleep(0.02)
            return logs.tail(path, 5)

    assert asyncio.run(scenario()) == [f"line-{n}-" + "a" * 50 for n in range(196, 201)]
    path = logs.service_log_path(tmp_path, "chatty")
    assert path.stat().st_size <= 2048
    assert logs.rotated_path(path, 2).stat().st_size <= 2048
    assert not logs.rotated_path(path, 3).exists()
