"""Definitions: every type of the reference table, alias resolution, close-match errors, print columns."""

from __future__ import annotations

import pytest

from kubeplane.resources import (
    NAMESPACES,
    RESOURCE_DEFINITIONS,
    DefinitionError,
    DictSpec,
    Namespace,
    PrintColumn,
    Registry,
    Resource,
    ResourceDefinition,
    State,
    UnknownTypeError,
    catalog,
    default_registry,
)

pytestmark = pytest.mark.unit

# (alias as a user types it, display type, default namespace) from the reference table.
TABLE = [
    ("staticpods", "StaticPod", "controlplane"),
    ("staticpod", "StaticPod", "controlplane"),
    ("sp", "StaticPod", "controlplane"),
    ("staticpodstatus", "StaticPodStatus", "controlplane"),
    ("podstatus", "StaticPodStatus", "controlplane"),
    ("manifests", "Manifest", "controlplane"),
    ("ms", "ManifestStatus", "controlplane"),
    ("ss", "SecretStatus", "controlplane"),
    ("kcpc", "KubernetesControlPlaneConfig", "config"),
    ("mc", "MachineConfig", "config"),
    ("mt", "MachineType", "config"),
    ("bs", "BootstrapStatus", "runtime"),
    ("rs", "RootSecret", "secrets"),
    ("ks", "KubernetesSecret", "secrets"),
    ("es", "EtcdSecret", "secrets"),
    ("svc", "Service", "runtime"),
    ("rd", "ResourceDefinition", "meta"),
    ("ns", "Namespace", "meta"),
    ("vip", "VipStatus", "network"),
    ("vipstatus", "VipStatus", "network"),
]


@pytest.mark.parametrize(("alias", "display", "namespace"), TABLE)
def test_every_reference_alias_resolves_case_insensitively(alias: str, display: str, namespace: str) -> None:
    registry = default_registry()
    for spelling in (alias, alias.upper(), alias.capitalize()):
        definition = registry.resolve(spelling)
        assert (definition.display_type, definition.default_namespace) == (display, namespace)


def test_full_type_name_resolves() -> None:
    assert default_registry().resolve("StaticPods.kubernetes.kubeplane.dev").type == catalog.STATIC_PODS


def test_unknown_type_lists_close_matches() -> None:
    with pytest.raises(UnknownTypeError, match=r"unknown resource type 'staticpd'; did you mean staticpod"):
        default_registry().resolve("staticpd")


# Every type's reader access, decided one by one (the catalog docstring says why): a new type
# fails this test until someone decides whether its resources can hold a secret.
SENSITIVITY = {
    catalog.MACHINE_CONFIGS: True,  # the whole config: CA keys, machine and bootstrap tokens
    catalog.ROOT_SECRETS: True,  # CA keys, bootstrap token, encryption secret
    catalog.KUBERNETES_SECRETS: True,  # component keys and kubeconfigs with client keys
    catalog.ETCD_SECRETS: True,  # etcd peer/client keys
    catalog.MANIFESTS: True,  # the bootstrap token Secret, inline and downloaded manifests
    catalog.KUBERNETES_CONTROL_PLANE_CONFIGS: True,  # extra manifest headers, inline manifests
    catalog.MACHINE_TYPES: False,
    catalog.SECRET_STATUSES: False,  # readiness, a version and an issue time, not the secrets
    catalog.CERTIFICATE_RENEWALS: False,  # a time: renew what was issued before it
    catalog.STATIC_PODS: False,  # secrets are referenced by file path
    catalog.STATIC_POD_STATUSES: False,
    catalog.MANIFEST_STATUSES: False,  # ids and errors naming objects
    catalog.BOOTSTRAP_STATUSES: False,
    catalog.SERVICES: False,
    catalog.TIME_STATUSES: False,  # NTP server names and addresses, the sync state
    catalog.NODE_ADDRESSES: False,
    catalog.POD_NETWORK_STATUSES: False,  # CIDRs, node names and their addresses
    catalog.MACHINE_ADDRESSES: False,  # addresses and config field paths
    catalog.MACHINE_ROUTES: False,  # networks, gateways, metrics
    catalog.MACHINE_LINKS: False,  # MTU and link state
    catalog.MACHINE_NETWORK_STATUSES: False,  # hostname, resolvers, host entries, errors
    catalog.WIREGUARD_DEVICES: False,  # public keys and endpoints, never the private key
    catalog.VIP_STATUSES: False,  # an address, a link, node names
    RESOURCE_DEFINITIONS: False,
    NAMESPACES: False,
}


def test_every_type_has_a_decided_sensitivity() -> None:
    registry = default_registry()
    assert {d.type: d.sensitive for d in registry.definitions()} == SENSITIVITY


def test_sensitivity_is_published_in_the_resource_definitions() -> None:
    for definition in default_registry().definitions():
        assert definition.to_spec().to_dict()["sensitive"] is definition.sensitive


def test_types_in_the_secrets_namespace_are_sensitive() -> None:
    for definition in default_registry().definitions():
        if definition.default_namespace == catalog.SECRETS_NAMESPACE:
            assert definition.sensitive, definition.type


def test_alias_clash_is_refused() -> None:
    registry = Registry(namespaces=[Namespace("test")])
    registry.register(
        ResourceDefinition(
            type="Foos.test.dev", display_type="Foo", default_namespace="test", spec_type=DictSpec
        )
    )
    with pytest.raises(DefinitionError, match=r"alias 'foo' is already used by Foos\.test\.dev"):
        registry.register(
            ResourceDefinition(
                type="Bars.test.dev",
                display_type="Bar",
                default_namespace="test",
                spec_type=DictSpec,
                aliases=("foo",),
            )
        )


def test_print_columns_render_spec_values() -> None:
    state = State()
    registry = state.registry
    status = state.create(
        catalog.CONTROLPLANE_NAMESPACE,
        catalog.STATIC_POD_STATUSES,
        "kube-system/kube-apiserver-n1",
        spec=catalog.StaticPodStatusSpec(
            pod_status={
                "conditions": [
                    {"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": "False"},
                ]
            }
        ),
    )
    secrets = state.create(
        catalog.CONTROLPLANE_NAMESPACE,
        catalog.SECRET_STATUSES,
        "static-pods",
        spec=catalog.SecretStatusSpec(ready=True, version="3"),
    )
    service = state.create(
        catalog.RUNTIME_NAMESPACE, catalog.SERVICES, "etcd", spec=catalog.ServiceSpec(running=True)
    )

    def row(alias: str, resource: Resource) -> dict[str, str]:
        return {c.name: c.value(resource) for c in registry.resolve(alias).print_columns}

    assert row("podstatus", status) == {"READY": "False"}
    assert row("ss", secrets) == {"READY": "true", "SECRETS VERSION": "3"}
    assert row("svc", service) == {"RUNNING": "true", "HEALTHY": "?"}


def test_print_column_needs_exactly_one_source() -> None:
    with pytest.raises(DefinitionError, match="exactly one of json_path and func"):
        PrintColumn("X")


def test_definitions_and_namespaces_are_meta_resources() -> None:
    state = State()
    namespaces = {r.id for r in state.list("meta", NAMESPACES)}
    assert namespaces == {"meta", "config", "controlplane", "extras", "network", "runtime", "secrets"}
    rd = state.get("meta", RESOURCE_DEFINITIONS, catalog.MACHINE_TYPES)
    assert rd.spec.to_dict()["printColumns"] == [{"name": "TYPE", "jsonPath": "machineType"}]
