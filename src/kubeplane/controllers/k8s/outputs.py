"""Small helpers the k8s controllers share for writing their outputs."""

from __future__ import annotations

from kubeplane.resources import Resource, Spec
from kubeplane.runtime import ReconcileContext


def publish(ctx: ReconcileContext, namespace: str, type_name: str, resource_id: str, spec: Spec) -> Resource:
    """Create or update an output to exactly ``spec`` (an equal spec keeps the version)."""

    def replace(_: Spec | None) -> Spec:
        return spec

    return ctx.modify(namespace, type_name, resource_id, replace)
