"""VipController: the shared VIPs of ``machine.network`` (``interfaces[].vip.ip``), elected among
the control plane nodes in etcd; each one's state in ``network/VipStatuses/<ip>``.

On a control plane node with a VIP in its config, the controller runs one
:class:`~kubeplane.services.vip_election.Election` per VIP as a background task, with the
agent's etcd client (``secrets/EtcdSecrets/etcd``, the local member at 127.0.0.1:2379), the
node's name (``network/NodeAddresses/current``), a health check of the local kube-apiserver
(``/readyz`` on ``cluster.controlPlane.localAPIServerPort``) and, for the holder, a hand-over of
the local etcd member's leadership. How the election keeps the VIP with
one owner at a time is in :mod:`kubeplane.services.vip`.

When the settings change (the VIP, its link, the node's role, the etcd secrets, the port) the
elections are stopped, which gives up a VIP this node holds, and started anew; on a worker or
without a VIP nothing runs and no status is left. Stopping the agent cancels the tasks, so a
graceful stop hands the VIP over at once: the agent calls :meth:`VipController.release` before
it stops its services, so etcd still answers the lease's revocation. An election task that ends
by itself (only an unexpected error ends one) is logged and started again after
``retry_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from typing import Protocol

from kubeplane.clients import etcd as etcd_client
from kubeplane.config import MachineConfig
from kubeplane.controllers.k8s import etcd_access, outputs
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, ReconcileContext
from kubeplane.services import vip, vip_election, vip_io

TASK_PREFIX = "vip "


class Probe(Protocol):
    """A health check of the local kube-apiserver (:class:`kubeplane.services.vip_io.ApiServerProbe`)."""

    async def __call__(self) -> bool: ...

    async def aclose(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class _Settings:
    vips: tuple[vip.Vip, ...]
    node: str
    port: int
    secrets_version: int


class VipController:
    """Runs this node's side of the VIP elections (see the module docstring)."""

    name = "network.VipController"
    inputs = (
        Input(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID),
        Input(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID),
        Input(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID),
    )
    outputs = (Output(catalog.VIP_STATUSES),)

    def __init__(
        self,
        *,
        network: vip_election.VipNetwork | None = None,
        probe: Callable[[int], Probe] = vip_io.ApiServerProbe,
        etcd_endpoints: tuple[str, ...] = etcd_access.DEFAULT_ENDPOINTS,
        timing: vip.Timing | None = None,
        retry_interval: float = 5.0,
    ) -> None:
        self.network = network or vip_io.NetlinkVip()
        self.probe = probe
        self.etcd = etcd_access.EtcdConnection(etcd_endpoints)
        self.timing = timing
        self.retry_interval = retry_interval
        self._settings: _Settings | None = None
        self._elections: dict[str, vip_election.Election] = {}
        self._probe: Probe | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._released = False

    async def reconcile(self, ctx: ReconcileContext) -> None:
        settings = self._read_settings(ctx)
        if self._released:
            settings = None
        if settings != self._settings:
            await self._stop(ctx)
            self._settings = settings
            if settings is not None:
                await self._start(ctx, settings)
        for ip, election in self._elections.items():
            task = ctx.task(TASK_PREFIX + ip)
            if task is not None and task.done() and not self._released:
                await ctx.stop_task(TASK_PREFIX + ip)
                failure = None if task.cancelled() else task.exception()
                ctx.logger.error("the election for VIP %s ended (%s); starting it again", ip, failure)
                ctx.start_task(TASK_PREFIX + ip, self._rerun(election))
        for ip, election in self._elections.items():
            status = election.status
            spec = catalog.VipStatusSpec(
                ip=ip, link=election.address.link, owner=status.owner, held=status.held, reason=status.reason
            )
            outputs.publish(ctx, catalog.NETWORK_NAMESPACE, catalog.VIP_STATUSES, ip, spec)
        ctx.cleanup(catalog.NETWORK_NAMESPACE, catalog.VIP_STATUSES, self._elections.keys())

    @staticmethod
    def _read_settings(ctx: ReconcileContext) -> _Settings | None:
        config = ctx.find(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID)
        secrets = ctx.find(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID)
        addresses = ctx.find(catalog.NETWORK_NAMESPACE, catalog.NODE_ADDRESSES, catalog.NODE_ADDRESSES_ID)
        if config is None or secrets is None or addresses is None:
            return None
        model = MachineConfig.from_dict(config.spec.to_dict()).model
        vips = vip.desired(model.machine.network)
        node = addresses.spec
        if not model.machine.is_control_plane or not vips or not isinstance(node, catalog.NodeAddressesSpec):
            return None
        return _Settings(
            vips=vips,
            node=node.hostname,
            port=model.cluster.local_api_server_port,
            secrets_version=secrets.metadata.version,
        )

    async def _start(self, ctx: ReconcileContext, settings: _Settings) -> None:
        secrets = ctx.get(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, etcd_access.ETCD_SECRETS_ID)
        client: etcd_client.EtcdClient = await self.etcd.client(secrets)
        self._probe = self.probe(settings.port)

        def changed(_: vip_election.Status) -> None:
            ctx.requeue_after(0)

        for address in settings.vips:
            election = vip_election.Election(
                etcd=client,
                address=address,
                node=settings.node,
                network=self.network,
                healthy=self._probe,
                timing=self.timing,
                on_change=changed,
                step_down=functools.partial(client.hand_over_leadership, client.endpoints[0]),
            )
            self._elections[address.ip] = election
            self._tasks.append(ctx.start_task(TASK_PREFIX + address.ip, election.run()))
            ctx.logger.info("campaigning for VIP %s on %s (%s)", address.ip, address.link, address.field)

    async def release(self) -> list[bytes]:
        """Give up every VIP now, for good: the node is halting, and hands the VIP over while its
        etcd still answers (the lease revoked, not left to expire). Returns the etcd keys of the
        VIPs this node held."""
        self._released = True
        held = [election.key for election in self._elections.values() if election.status.held]
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        return held

    async def _stop(self, ctx: ReconcileContext) -> None:
        """Stop every election (each gives up the VIP it holds) and what they used."""
        for ip in self._elections:
            await ctx.stop_task(TASK_PREFIX + ip)
        self._elections.clear()
        self._tasks.clear()
        if self._probe is not None:
            await self._probe.aclose()
            self._probe = None
        await self.etcd.aclose()

    async def _rerun(self, election: vip_election.Election) -> None:
        await asyncio.sleep(self.retry_interval)
        await election.run()
