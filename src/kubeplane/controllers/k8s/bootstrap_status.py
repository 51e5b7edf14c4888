"""BootstrapStatusController: the etcd key ``kubeplane:v1:initialized`` →
``runtime/BootstrapStatuses/control-plane`` {selfHostedControlPlane}.

The control plane counts as self-hosted while the key holds ``"true"``; any other value, or no key,
means static pods. Each reconcile reads the key, publishes the flag, then watches the key for up
to ``watch_window`` seconds and asks to run again at once when the watch ends — so a put or delete
is seen within a watch round-trip, and a change of the etcd secrets (the only input) is picked
up within one window at the latest, without a background task outliving the reconcile.

While etcd cannot be reached the published value is kept as it is, and nothing is published
before etcd answered once. Rejected alternative: publishing ``false`` when etcd is down — on a
self-hosted plane that would make KubeletStaticPodController start static pods next to the
self-hosted ones, which is exactly what the flag exists to prevent; "unknown" must not read as
"not self-hosted". Errors are retried after ``retry_interval`` seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubeplane.clients import errors as client_errors
from kubeplane.controllers.k8s import etcd_access, outputs
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, ReconcileContext


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
        try:
            await etcd_access.wait_for_change(
                client,
                etcd_access.INITIALIZED_KEY,
                start_revision=result.revision + 1,
                timeout=self.watch_window,
            )
        except client_errors.EtcdError as exc:
            ctx.logger.info("watching the initialized status failed, retrying: %s", exc)
            ctx.requeue_after(self.retry_interval)
            return
        ctx.requeue_after(0)
