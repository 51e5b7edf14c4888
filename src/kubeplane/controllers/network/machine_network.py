"""MachineNetworkController: ``machine.network`` applied inside the node, and shown as resources.

On every config change (and every ``resync_interval`` seconds, so an address someone deleted
comes back) it

1. reads the config into what it asks for (:func:`kubeplane.services.machinenet.desired`);
   runs a userspace ``wireguard-go`` for each WireGuard device it asks for and stops the ones it
   no longer does (:class:`kubeplane.services.wireguard_io.Daemons`, which the node stops when it
   stops), and gives each device its keys, port and peers over its UAPI socket, so the device is
   a configured link before it is planned; all this only once the plan checked out against the
   node as it will be with the devices (:func:`kubeplane.services.machinenet.with_devices`), and
   a device that cannot be made (``wireguard-go`` not installed, say) is an error in the status
   and nothing else is changed; then it observes the node's links, addresses and routes over
   netlink, and plans the changes between them (:func:`kubeplane.services.machinenet.plan`):
   pure, and all-or-nothing, so a config with an interface the node lacks changes nothing (no
   WireGuard device is made either) and says why in ``network/MachineNetworkStatuses/current``
   (``errors``, naming the config field); a plan that makes bonds or VLANs also needs the kernel
   to have those link kinds (asked without making anything,
   :func:`kubeplane.services.machinenet_io.supports`): without one, the error names the missing
   kernel feature and nothing is changed;
2. applies the plan over netlink (:mod:`kubeplane.services.machinenet_io`): bonds made and their
   slaves enslaved, VLAN links made (undone again should the apply fail), links up and their
   MTU, addresses and main-table routes marked with protocol 76, removing only what carries that
   mark, so the provisioner's primary address and everyone else's routes are never touched;
3. sets the UTS hostname when ``hostname`` is set and differs (a local cluster node already has
   its name); writes ``nameservers`` to the node's ``/etc/resolv.conf`` (what it replaced is kept
   under the system directory and restored when the nameservers leave the config) and
   ``extraHostEntries`` into a marked block of the node's ``/etc/hosts``;
4. publishes ``MachineLinks`` (per interface), ``MachineAddresses`` and ``MachineRoutes`` (what is
   configured, each ``owned`` when kubeplane added it), ``WireguardDevices`` (each device's public
   key, port and peers with their latest handshake, as the device reports them) and the status.

Like the pod network's routes, all of this but the WireGuard devices (their processes end with
the node) stays when the agent stops. A changed hostname is the UTS hostname at once; the node's
name (kubelet, certificates) follows at the next reboot.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from typing import Protocol

from kubeplane import pki
from kubeplane.config import MachineConfig
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import outputs
from kubeplane.resources import catalog
from kubeplane.runtime import ControllerLogger, Input, Output, ReconcileContext
from kubeplane.services import machinenet, machinenet_io, wireguard, wireguard_io

STATUS_ID = "current"


class NodeNetwork(Protocol):
    """The node's network I/O (blocking; :mod:`kubeplane.services.machinenet_io` in production)."""

    def observe(self) -> machinenet.Observed: ...

    def apply(self, plan: machinenet.Plan, observed: machinenet.Observed) -> None: ...

    def supports(self, kind: str) -> bool: ...

    def hostname(self) -> str: ...

    def set_hostname(self, name: str) -> None: ...

    def configure_wireguard(self, device: wireguard.Device) -> bool: ...

    def wireguard_state(self, name: str) -> wireguard.DeviceState: ...


class WireguardDaemons(Protocol):
    """The processes behind WireGuard devices (:class:`~kubeplane.services.wireguard_io.Daemons`)."""

    async def converge(self, names: Iterable[str]) -> list[str]: ...


class NetlinkNetwork:
    """:class:`NodeNetwork` over netlink in the agent's network and UTS namespaces."""

    def observe(self) -> machinenet.Observed:
        return machinenet_io.observe()

    def apply(self, plan: machinenet.Plan, observed: machinenet.Observed) -> None:
        machinenet_io.apply(plan, observed)

    def supports(self, kind: str) -> bool:
        return machinenet_io.supports(kind)

    def hostname(self) -> str:
        return machinenet_io.hostname()

    def set_hostname(self, name: str) -> None:
        machinenet_io.set_hostname(name)

    def configure_wireguard(self, device: wireguard.Device) -> bool:
        return wireguard_io.configure(device)

    def wireguard_state(self, name: str) -> wireguard.DeviceState:
        return wireguard_io.get(name)


@dataclasses.dataclass(frozen=True)
class _Outcome:
    observed: machinenet.Observed
    errors: tuple[str, ...]
    devices: dict[str, wireguard.DeviceState] = dataclasses.field(default_factory=dict)


class MachineNetworkController:
    """Applies ``machine.network`` to the node (see module docstring)."""

    name = "network.MachineNetworkController"
    inputs = (Input(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID),)
    outputs = (
        Output(catalog.MACHINE_LINKS),
        Output(catalog.MACHINE_ADDRESSES),
        Output(catalog.MACHINE_ROUTES),
        Output(catalog.WIREGUARD_DEVICES),
        Output(catalog.MACHINE_NETWORK_STATUSES),
    )

    def __init__(
        self,
        *,
        paths: NodePaths,
        network: NodeNetwork | None = None,
        wireguard: WireguardDaemons | None = None,
        retry_interval: float = 5.0,
        resync_interval: float = 60.0,
    ) -> None:
        self.paths = paths
        self.network = network or NetlinkNetwork()
        self.wireguard = wireguard or wireguard_io.Daemons(log_dir=paths.logs)
        self.retry_interval = retry_interval
        self.resync_interval = resync_interval
        # The errors last logged: a config that stays broken is retried quietly.
        self._logged: tuple[str, ...] = ()

    async def reconcile(self, ctx: ReconcileContext) -> None:
        resource = ctx.find(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID)
        if resource is None:
            return
        network = MachineConfig.from_dict(resource.spec.to_dict()).model.machine.network
        wanted = machinenet.desired(network)
        try:
            outcome = await asyncio.to_thread(self._check, wanted)
            if not outcome.errors:
                for name in await self.wireguard.converge(device.name for device in wanted.wireguard):
                    ctx.logger.info("started wireguard-go for %s", name)
                outcome = await asyncio.to_thread(self._apply, wanted, ctx.logger)
        except (machinenet_io.MachineNetworkError, wireguard_io.WireguardError, OSError) as exc:
            self._log_errors(ctx.logger, (f"cannot apply machine.network, will retry: {exc}",))
            self._publish_status(ctx, wanted, (str(exc),))
            ctx.requeue_after(self.retry_interval)
            return
        self._log_errors(ctx.logger, tuple(f"machine.network not applied: {e}" for e in outcome.errors))
        # With errors, an interface may yet appear: look again soon.
        ctx.requeue_after(self.retry_interval if outcome.errors else self.resync_interval)
        self._publish(ctx, wanted, outcome)

    def _log_errors(self, logger: ControllerLogger, errors: tuple[str, ...]) -> None:
        if errors != self._logged:
            for error in errors:
                logger.error("%s", error)
        self._logged = errors

    def _check(self, wanted: machinenet.Desired) -> _Outcome:
        """The errors that keep ``wanted`` from being applied, before anything is made: the
        config's own, and the plan's against the node with its WireGuard devices (blocking)."""
        observed = self.network.observe()
        plan = machinenet.plan(wanted, machinenet.with_devices(wanted, observed))
        return _Outcome(observed=observed, errors=plan.errors or self._kernel_errors(plan))

    def _kernel_errors(self, plan: machinenet.Plan) -> tuple[str, ...]:
        """The links ``plan`` would make whose kind the kernel lacks, as errors (blocking)."""
        return machinenet.kernel_errors(
            plan, [kind for kind in plan.new_kinds if not self.network.supports(kind)]
        )

    def _apply(self, wanted: machinenet.Desired, logger: ControllerLogger) -> _Outcome:
        """Configure the WireGuard devices, plan against the node and apply (blocking: runs in a
        thread); the node afterwards."""
        for device in wanted.wireguard:
            if self.network.configure_wireguard(device):
                logger.info("configured %s with %d peers (%s)", device.name, len(device.peers), device.field)
        observed = self.network.observe()
        plan = machinenet.plan(wanted, observed)
        errors = plan.errors or self._kernel_errors(plan)
        if errors:
            return _Outcome(observed=observed, errors=errors)
        if not plan.empty:
            self.network.apply(plan, observed)
            for bond in plan.create_bonds:
                logger.info("made bond %s (%s)", bond.name, bond.field)
            for slave, bond_name in plan.enslave:
                logger.info("made %s a slave of %s", slave, bond_name)
            for vlan in plan.create_vlans:
                logger.info("made VLAN %s (%s)", vlan.name, vlan.field)
            for route in plan.remove_routes:
                logger.info("removed route %s metric %d", route.network, route.metric)
            for address in plan.remove_addresses:
                logger.info("removed address %s from %s", address.cidr, address.link)
            for name in plan.delete_links:
                logger.info("deleted %s, which left the config", name)
            for name, mtu in plan.set_mtu:
                logger.info("set mtu %d on %s", mtu, name)
            for name in plan.set_up:
                logger.info("brought %s up", name)
            for added in plan.add_addresses:
                logger.info("added address %s to %s (%s)", added.cidr, added.link, added.field)
            for wanted_route in plan.replace_routes:
                via = wanted_route.gateway or "on-link"
                logger.info(
                    "routed %s via %s on %s metric %d (%s)",
                    wanted_route.network,
                    via,
                    wanted_route.link,
                    wanted_route.metric,
                    wanted_route.field,
                )
            observed = self.network.observe()
        if wanted.hostname and self.network.hostname() != wanted.hostname:
            self.network.set_hostname(wanted.hostname)
            logger.info("hostname set to %s", wanted.hostname)
        self._write_resolv_conf(wanted.nameservers, logger)
        hosts = self.paths.hosts
        if wanted.hosts or hosts.exists():
            current = hosts.read_text() if hosts.exists() else ""
            if machinenet_io.write_in_place(hosts, machinenet.render_hosts(current, wanted.hosts)):
                logger.info("wrote %d extra host entries to %s", len(wanted.hosts), hosts)
        devices = {device.name: self.network.wireguard_state(device.name) for device in wanted.wireguard}
        return _Outcome(observed=observed, errors=(), devices=devices)

    def _write_resolv_conf(self, nameservers: tuple[str, ...] | None, logger: ControllerLogger) -> None:
        path, replaced = self.paths.resolv_conf, self.paths.replaced_resolv_conf
        current = path.read_text() if path.exists() else ""
        if nameservers is None:
            if machinenet.is_ours(current) and replaced.exists():
                machinenet_io.write_in_place(path, replaced.read_text())
                replaced.unlink()
                logger.info("nameservers unset: restored the earlier %s", path)
            return
        if not machinenet.is_ours(current) and not replaced.exists():
            replaced.parent.mkdir(parents=True, exist_ok=True)
            replaced.write_text(current)
        if machinenet_io.write_in_place(path, machinenet.render_resolv_conf(nameservers)):
            logger.info("nameservers %s written to %s", ", ".join(nameservers), path)

    def _publish(self, ctx: ReconcileContext, wanted: machinenet.Desired, outcome: _Outcome) -> None:
        observed = outcome.observed
        links = {}
        for link in wanted.links:
            seen = observed.links.get(link.name)
            links[link.name] = catalog.MachineLinkSpec(
                mtu=seen.mtu if seen else 0,
                up=seen.up if seen else False,
                oper_state=seen.oper_state if seen else "MISSING",
                kind=seen.kind if seen else "",
                master=(seen.master or "") if seen else "",
                parent=(seen.parent or "") if seen else "",
                vlan_id=seen.vlan_id if seen else None,
                configured_mtu=link.mtu,
                field=link.field,
            )
        present = {address.key: address for address in observed.addresses}
        addresses = {}
        for address in wanted.addresses:
            found = present.get(address.key)
            if found is not None:
                addresses[f"{address.link}/{address.cidr}"] = catalog.MachineAddressSpec(
                    link=address.link, address=address.cidr, owned=found.owned, field=address.field
                )
        installed = {route.key: route for route in observed.routes}
        routes = {}
        for route in wanted.routes:
            current = installed.get(route.key)
            if current is not None:
                routes[f"{route.link}/{route.network}/{route.metric}"] = catalog.MachineRouteSpec(
                    link=route.link,
                    network=route.network,
                    gateway=route.gateway or "",
                    metric=route.metric,
                    owned=current.owned,
                    field=route.field,
                )
        devices = {name: _device_spec(state) for name, state in outcome.devices.items()}
        for type_name, specs in (
            (catalog.MACHINE_LINKS, links),
            (catalog.MACHINE_ADDRESSES, addresses),
            (catalog.MACHINE_ROUTES, routes),
            (catalog.WIREGUARD_DEVICES, devices),
        ):
            for resource_id, spec in specs.items():
                outputs.publish(ctx, catalog.NETWORK_NAMESPACE, type_name, resource_id, spec)
            ctx.cleanup(catalog.NETWORK_NAMESPACE, type_name, specs.keys())
        self._publish_status(ctx, wanted, outcome.errors)

    @staticmethod
    def _publish_status(ctx: ReconcileContext, wanted: machinenet.Desired, errors: tuple[str, ...]) -> None:
        status = catalog.MachineNetworkStatusSpec(
            hostname=wanted.hostname or "",
            nameservers=list(wanted.nameservers or ()),
            extra_host_entries=[" ".join([ip, *aliases]) for ip, aliases in wanted.hosts],
            errors=list(errors),
            unsupported=list(wanted.unsupported),
        )
        outputs.publish(ctx, catalog.NETWORK_NAMESPACE, catalog.MACHINE_NETWORK_STATUSES, STATUS_ID, status)


def _device_spec(state: wireguard.DeviceState) -> catalog.WireguardDeviceSpec:
    return catalog.WireguardDeviceSpec(
        public_key=pki.wireguard_public_key(state.private_key) if state.private_key else "",
        listen_port=state.listen_port,
        peers=[
            {
                "publicKey": peer.public_key,
                "endpoint": peer.endpoint,
                "allowedIPs": list(peer.allowed_ips),
                "persistentKeepaliveInterval": peer.keepalive,
                "latestHandshake": peer.latest_handshake,
                "rxBytes": peer.rx_bytes,
                "txBytes": peer.tx_bytes,
            }
            for peer in state.peers
        ],
    )
