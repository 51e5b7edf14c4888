"""Nothing blocks the agent's event loop and no reconcile waits for long, against a real etcd and
the toolchain's kube-apiserver.

The long waits (BootstrapStatusController's watch of the initialized key, ManifestApplyController's
wait for the apply mutex another node holds) run as background tasks of their controllers: every
reconcile returns promptly, input changes reach the controllers while those waits are pending,
and a 10 ms ticker on the same loop keeps ticking.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pytest
from test_manifest_apply import (
    BOOTSTRAP,
    eventually,
    publish_etcd_secrets,
    put,
    run,
    status_of,
)

from kubeplane.controllers.k8s import etcd_access
from kubeplane.controllers.k8s.bootstrap_status import BootstrapStatusController
from kubeplane.controllers.k8s.manifest_apply import ManifestApplyController
from kubeplane.resources import State, catalog
from kubeplane.runtime import Controller, Input, Output, ReconcileContext

if TYPE_CHECKING:
    from conftest import ApiServer, EtcdServer

pytestmark = pytest.mark.integration

#: Longest a reconcile may take here: the work is a few local requests, never a wait. A reconcile
#: that waited would take the watch window (60 s) or as long as the test holds the mutex (it
#: never lets go while it waits for the reconcile), so the bound can leave room for a loaded CI
#: machine (three test runs on 2 cores; a full garbage collection of the big test process).
PROMPT = 3.0
#: Longest the loop may go without running the ticker; a blocking call would hold it for the
#: whole wait, as above.
MAX_TICK_GAP = 2.0


@dataclasses.dataclass
class Timed:
    """Runs a controller and records how long each of its reconciles took."""

    inner: Controller
    durations: list[float] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def inputs(self) -> Sequence[Input]:
        return self.inner.inputs

    @property
    def outputs(self) -> Sequence[Output]:
        return self.inner.outputs

    async def reconcile(self, ctx: ReconcileContext) -> None:
        start = time.monotonic()
        try:
            await self.inner.reconcile(ctx)
        finally:
            self.durations.append(time.monotonic() - start)


class Ticker:
    """Measures the longest gap between runs of a 10 ms sleep loop: how long the loop was blocked."""

    def __init__(self) -> None:
        self.max_gap = 0.0
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.max_gap = max(self.max_gap, now - last - 0.01)
            last = now


def self_hosted(state: State) -> bool | None:
    resource = state.find(*BOOTSTRAP)
    spec = resource.spec if resource else None
    return spec.self_hosted_control_plane if isinstance(spec, catalog.BootstrapStatusSpec) else None


def rotate_etcd_secrets(state: State, etcd: EtcdServer, generation: int) -> None:
    """A new version of the etcd secrets (same certificates): the controllers must rebuild clients."""
    client = {"crt": etcd.client.cert.decode(), "key": etcd.client.key.decode()}
    spec = catalog.EtcdSecretSpec(data={"ca": etcd.ca.cert.decode(), "client": client, "gen": generation})
    put(state, catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID, spec)


async def runs_after(controller: Timed, action: Callable[[], None], *, what: str) -> float:
    """Do ``action`` and return how long until ``controller`` finished a reconcile started after it."""
    before = len(controller.durations)
    start = time.monotonic()
    action()
    await eventually(lambda: len(controller.durations) > before, timeout=PROMPT * 5, what=what)
    return time.monotonic() - start


def test_the_bootstrap_status_watch_never_holds_up_a_reconcile(etcd_server: EtcdServer) -> None:
    # A 60 s watch window: a watch inside the reconcile would hold every run for a minute.
    controller = Timed(BootstrapStatusController(etcd_endpoints=[etcd_server.endpoint], watch_window=60))
    latencies: list[float] = []

    async def body(state: State) -> None:
        with Ticker() as ticker:
            publish_etcd_secrets(state, etcd_server)
            await eventually(lambda: self_hosted(state) is False, timeout=10, what="the first status")
            await asyncio.sleep(0.5)  # the watch is pending now
            # A new etcd secrets version reaches the controller at once, not when the watch ends.
            latencies.append(
                await runs_after(
                    controller,
                    lambda: rotate_etcd_secrets(state, etcd_server, 1),
                    what="a reconcile after the secrets changed",
                )
            )
            # And the watch started on the new client still sees the key change.
            async with etcd_server.client_for() as etcd:
                await etcd.put(etcd_access.INITIALIZED_KEY, b"true")
                await eventually(lambda: self_hosted(state) is True, timeout=5, what="the flag flip")
                await etcd.delete(etcd_access.INITIALIZED_KEY)
                await eventually(lambda: self_hosted(state) is False, timeout=5, what="the flag back")
        assert ticker.max_gap < MAX_TICK_GAP, f"the event loop was blocked for {ticker.max_gap:.2f}s"

    run([controller], body)
    assert latencies[0] < PROMPT, f"a secrets change waited {latencies[0]:.2f}s for the watch"
    assert max(controller.durations) < PROMPT, f"reconciles took up to {max(controller.durations):.2f}s"


def test_the_manifest_apply_lock_wait_never_holds_up_a_reconcile(
    start_apiserver: Callable[..., ApiServer], etcd_server: EtcdServer
) -> None:
    server = start_apiserver("127.0.0.1")
    controller = Timed(ManifestApplyController(etcd_endpoints=[etcd_server.endpoint], retry_interval=0.5))
    latencies: list[float] = []

    def manifest(name: str) -> catalog.ManifestSpec:
        item = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}}
        return catalog.ManifestSpec(items=[item])

    async def body(state: State) -> None:
        certs = catalog.KubernetesSecretSpec(data={"localAdminKubeconfig": server.admin_kubeconfig})
        put(state, catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, "k8s-certs", certs)
        publish_etcd_secrets(state, etcd_server)
        with Ticker() as ticker:
            async with (
                etcd_server.client_for() as etcd,
                etcd.lock(etcd_access.MANIFEST_APPLY_MUTEX, ttl=10),
            ):
                put(state, *BOOTSTRAP, catalog.BootstrapStatusSpec(self_hosted_control_plane=False))
                put(state, catalog.EXTRAS_NAMESPACE, catalog.MANIFESTS, "90-first", manifest("first"))
                for _ in range(100):
                    contenders = await etcd.get(etcd_access.MANIFEST_APPLY_MUTEX + b"/", prefix=True)
                    if contenders.count == 2:
                        break
                    await asyncio.sleep(0.05)
                assert contenders.count == 2, "the controller did not ask for the mutex"
                # While it waits for the mutex, changes still reach the controller at once.
                latencies.append(
                    await runs_after(
                        controller,
                        lambda: put(
                            state,
                            catalog.EXTRAS_NAMESPACE,
                            catalog.MANIFESTS,
                            "91-second",
                            manifest("second"),
                        ),
                        what="a reconcile after a manifest was added",
                    )
                )
                await asyncio.sleep(0.5)
                assert status_of(state) is None, "nothing is applied while another holder has the mutex"
            # The apply that waited publishes its status, then the change seen meanwhile is applied.
            await eventually(
                lambda: status_of(state) == {"manifestsApplied": ["90-first", "91-second"], "errors": {}},
                timeout=20,
                what="both manifests applied after the mutex is released",
            )
        assert ticker.max_gap < MAX_TICK_GAP, f"the event loop was blocked for {ticker.max_gap:.2f}s"

    run([controller], body)
    assert latencies[0] < PROMPT, f"a manifest change waited {latencies[0]:.2f}s for the mutex"
    assert max(controller.durations) < PROMPT, f"reconciles took up to {max(controller.durations):.2f}s"
