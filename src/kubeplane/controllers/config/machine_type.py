"""MachineTypeController: the machine config's ``machine.type`` → ``config/MachineTypes/machine-type``."""

from __future__ import annotations

from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, ReconcileContext


class MachineTypeController:
    """Publishes the node's machine type (``join`` for workers, as the original names it)."""

    name = "config.MachineTypeController"
    inputs = (Input(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID),)
    outputs = (Output(catalog.MACHINE_TYPES),)

    async def reconcile(self, ctx: ReconcileContext) -> None:
        config = ctx.find(catalog.CONFIG_NAMESPACE, catalog.MACHINE_CONFIGS, catalog.MACHINE_CONFIG_ID)
        if config is None:
            ctx.cleanup(catalog.CONFIG_NAMESPACE, catalog.MACHINE_TYPES, ())
            return
        machine_type = str(config.spec.to_dict().get("machine", {}).get("type", ""))
        if machine_type == "worker":
            machine_type = "join"
        ctx.modify(
            catalog.CONFIG_NAMESPACE,
            catalog.MACHINE_TYPES,
            catalog.MACHINE_TYPE_ID,
            lambda _: catalog.MachineTypeSpec(machine_type=machine_type),
        )
