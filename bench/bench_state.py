"""Benchmark of the in-memory state and controller runtime; prints figures, asserts nothing.

(a) listing 1,000 resources (bare, and rendered to the node API's JSON shape),
(b) watch fan-out latency from one write to each of 10 watchers, p50/p99,
(c) reconcile latency through a 2-controller chain (input write → A → B → output seen), p50/p99.

Run: .venv/bin/python bench/bench_state.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import time

from kubeplane.resources import (
    EventKind,
    Namespace,
    Registry,
    ResourceDefinition,
    Spec,
    State,
    catalog,
    to_output_dict,
)
from kubeplane.runtime import Input, Output, ReconcileContext, Runtime

NS = "bench"
SOURCES = "Sources.bench.kubeplane.dev"
MIDDLES = "Middles.bench.kubeplane.dev"
SINKS = "Sinks.bench.kubeplane.dev"


@dataclasses.dataclass(frozen=True)
class ValueSpec(Spec):
    value: int = 0


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def bench_list() -> None:
    state = State()
    for index in range(1000):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"pod-{index}", "labels": {"k8s-app": "x"}},
        }
        state.create(
            catalog.CONTROLPLANE_NAMESPACE,
            catalog.STATIC_PODS,
            f"pod-{index:04}",
            spec=catalog.StaticPodSpec(pod),
        )
    bare, rendered = [], []
    for _ in range(20):
        start = time.perf_counter()
        resources = state.list(catalog.CONTROLPLANE_NAMESPACE, catalog.STATIC_PODS)
        bare.append(time.perf_counter() - start)
        start = time.perf_counter()
        json.dumps([to_output_dict(resource, node="n1") for resource in resources])
        rendered.append(time.perf_counter() - start)
    print(
        f"(a) list 1,000 resources: {ms(statistics.median(bare))} (median of 20); "
        f"+ to_output_dict + json.dumps: {ms(statistics.median(rendered))}"
    )


async def bench_fanout(*, watchers: int = 10, writes: int = 1000) -> None:
    state = bench_state()
    latencies: list[float] = []
    last: list[float] = []
    sent = 0.0
    received = 0
    all_received = asyncio.Event()

    async def watcher() -> None:
        nonlocal received
        async for event in state.watch(NS, SOURCES):
            if event.kind is EventKind.UPDATED or (event.kind is EventKind.CREATED and sent):
                latencies.append(time.perf_counter() - sent)
                received += 1
                if received == watchers:
                    last.append(latencies[-1])
                    all_received.set()

    tasks = [asyncio.create_task(watcher()) for _ in range(watchers)]
    await asyncio.sleep(0)
    for value in range(writes):
        received = 0
        all_received.clear()
        sent = time.perf_counter()
        state.modify(NS, SOURCES, "x", lambda _, v=value: ValueSpec(v))  # type: ignore[misc]
        await all_received.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(
        f"(b) watch fan-out to {watchers} watchers ({writes} writes): per delivery p50 "
        f"{ms(percentile(latencies, 0.5))} p99 {ms(percentile(latencies, 0.99))}; "
        f"last watcher p50 {ms(percentile(last, 0.5))} p99 {ms(percentile(last, 0.99))}"
    )


async def bench_chain(*, rounds: int = 1000) -> None:
    state = bench_state()

    def copy(source: str, target: str):  # type: ignore[no-untyped-def]
        @dataclasses.dataclass
        class Copy:
            name: str
            inputs: tuple[Input, ...] = (Input(NS, source),)
            outputs: tuple[Output, ...] = (Output(target),)

            async def reconcile(self, ctx: ReconcileContext) -> None:
                for resource in ctx.list(NS, source):
                    value = resource.spec.value  # type: ignore[attr-defined]
                    ctx.modify(NS, target, resource.id, lambda _, v=value: ValueSpec(v))  # type: ignore[misc]

        return Copy(f"bench.{source.split('.', maxsplit=1)[0]}To{target.split('.', maxsplit=1)[0]}")

    runtime = Runtime(state)
    runtime.register(copy(SOURCES, MIDDLES))
    runtime.register(copy(MIDDLES, SINKS))
    latencies: list[float] = []
    async with runtime:
        watch = state.watch(NS, SINKS, "x")
        for value in range(1, rounds + 1):
            start = time.perf_counter()
            state.modify(NS, SOURCES, "x", lambda _, v=value: ValueSpec(v))  # type: ignore[misc]
            async for event in watch:
                if event.resource is not None and event.resource.spec == ValueSpec(value):
                    break
            latencies.append(time.perf_counter() - start)
    print(
        f"(c) reconcile latency through a 2-controller chain ({rounds} rounds): "
        f"p50 {ms(percentile(latencies, 0.5))} p99 {ms(percentile(latencies, 0.99))}"
    )


def bench_state() -> State:
    registry = Registry(
        namespaces=[Namespace(NS)],
        definitions=[
            ResourceDefinition(
                type=name, display_type=name.split(".")[0][:-1], default_namespace=NS, spec_type=ValueSpec
            )
            for name in (SOURCES, MIDDLES, SINKS)
        ],
    )
    return State(registry)


def main() -> None:
    bench_list()
    asyncio.run(bench_fanout())
    asyncio.run(bench_chain())


if __name__ == "__main__":
    main()
