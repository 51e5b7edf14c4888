"""BootstrapStatusController: the etcd key ``kubeplane:v1:initialized`` →
``runtime/BootstrapStatuses/control-plane`` {selfHostedControlPlane}.

The control plane counts as self-hosted while the key holds ``"true"``; any other value, or no key,
means static pods. Each reconcile reads the key, publishes the flag and returns; a background task
of the controller (``ctx.start_task``) watches the key from the revision read, for up to
``watch_window`` seconds, and its end queues the next reconcile — so a put or delete is seen
within a watch round-trip. A change of the etcd secrets (the only input) reconciles at once: the
watch on the old client is stopped before that client is replaced.

While etcd cannot be reached the published value is kept as it is, and nothing is published
before etcd answered once. Rejected alternative: publishing ``false`` when etcd is down — on a
self-hosted plane that would make KubeletStaticPodController start static pods next to the
self-hosted ones, which is exactly what the flag exists to prevent; "unknown" must not read as
"not self-hosted". Errors are retried after ``retry_interval`` seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kubeplane.clients import errors as client_errors
from kubeplane.clients import etcd as etcd_client
from kubeplane.controllers.k8s import etcd_access, outputs
from kubeplane.resources import catalog
from kubeplane.runtime import ControllerLogger, Input, Output, ReconcileContext

#: The controller's background task that watches the key.
WATCH_TASK = "watch"


class BootstrapStatusController:
    """Publishes whether the control plane is self-hosted (see module docstring)."""

    name = "k8s.BootstrapStatusController"
    inputs = (Input(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID),)
    outputs = (Output(catalog.BOOTSTRAP_STATUSES),)

    def __init__(
        self,
        *,
        etcd_endpoints: Sequence[str] = etcd_access.DEFAULT_ENDPOINTS,
        watch_window: float = 30.0,
        retry_interval: float = 2.0,
    ) -> None:
        self.etcd = etcd_access.EtcdConnection(etcd_endpoints)
        self.watch_window = watch_window
        self.retry_interval = retry_interval

    async def reconcile(self, ctx: ReconcileContext) -> None:
        secrets = ctx.find(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID)
        # Whatever queued this run (the watch ended, the secrets changed, a retry), the key is read
        # afresh and watched anew; the old watch goes first, so it never outlives its client.
        await ctx.stop_task(WATCH_TASK)
        if secrets is None:
            await self.etcd.aclose()
            return
        client = await self.etcd.client(secrets)
        try:
            result = await client.get(etcd_access.INITIALIZED_KEY)
        except client_errors.EtcdError as exc:
            ctx.logger.info("etcd not reachable yet, keeping the bootstrap status as it is: %s", exc)
            ctx.requeue_after(self.retry_interval)
            return
        value = result.kvs[0].value if result.kvs else None
        spec = catalog.BootstrapStatusSpec(self_hosted_control_plane=value == b"true")
        namespace, type_name = catalog.RUNTIME_NAMESPACE, catalog.BOOTSTRAP_STATUSES
        before = ctx.find(namespace, type_name, catalog.BOOTSTRAP_STATUS_ID)
        outputs.publish(ctx, namespace, type_name, catalog.BOOTSTRAP_STATUS_ID, spec)
        if before is None or before.spec != spec:
            if value is None:
                ctx.logger.info(
                    "initialized status not found: control plane is not self-hosted, running with static pods"
                )
            else:
                ctx.logger.info(
                    "initialized status is %r: self-hosted control plane %s",
                    value.decode(errors="replace"),
                    spec.self_hosted_control_plane,
                )
        ctx.start_task(WATCH_TASK, self._watch(client, start_revision=result.revision + 1, logger=ctx.logger))

    async def _watch(
        self, client: etcd_client.EtcdClient, *, start_revision: int, logger: ControllerLogger
    ) -> None:
        """Return at the key's first change or after the window; after ``retry_interval`` when it fails."""
        try:
            await etcd_access.wait_for_change(
                client, etcd_access.INITIALIZED_KEY, start_revision=start_revision, timeout=self.watch_window
            )
        except client_errors.EtcdError as exc:
            logger.info("watching the initialized status failed, retrying: %s", exc)
            await asyncio.sleep(self.retry_interval)
