"""Specs: deep freezing, camelCase dict form, decoding errors; the node/metadata/spec output shape."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from kubeplane.resources import DictSpec, SpecError, State, catalog, from_output_dict, to_output_dict

pytestmark = pytest.mark.unit


def test_spec_is_frozen_deeply_so_callers_cannot_mutate_stored_values() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "kube-apiserver"}, "spec": {"containers": [{"name": "a"}]}}
    spec = catalog.StaticPodSpec(pod=pod)
    pod["metadata"]["name"] = "changed"
    assert spec.pod["metadata"]["name"] == "kube-apiserver"
    with pytest.raises(TypeError):
        spec.pod["metadata"]["name"] = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.pod = {}  # type: ignore[misc]


def test_to_dict_uses_camel_case_and_round_trips() -> None:
    spec = catalog.ManifestStatusSpec(manifests_applied=["00-a", "01-b"], errors={"05-flannel": "boom"})
    data = spec.to_dict()
    assert data == {"manifestsApplied": ["00-a", "01-b"], "errors": {"05-flannel": "boom"}}
    assert catalog.ManifestStatusSpec.from_dict(data) == spec
    assert catalog.BootstrapStatusSpec(self_hosted_control_plane=True).to_dict() == {
        "selfHostedControlPlane": True
    }


def test_dict_spec_serialises_as_its_payload() -> None:
    spec = catalog.KubernetesControlPlaneConfigSpec(data={"image": "k8s.gcr.io/kube-apiserver:v1.20.2"})
    assert spec.to_dict() == {"image": "k8s.gcr.io/kube-apiserver:v1.20.2"}
    assert catalog.KubernetesControlPlaneConfigSpec.from_dict(spec.to_dict()) == spec
    assert isinstance(spec, DictSpec)


def test_from_dict_rejects_unknown_fields_naming_them() -> None:
    with pytest.raises(SpecError, match=r"unknown field\(s\) bogus; expected some of machineType"):
        catalog.MachineTypeSpec.from_dict({"machineType": "init", "bogus": 1})


def test_non_json_value_is_rejected_with_its_field_path() -> None:
    with pytest.raises(SpecError, match=r"spec\.pod\.spec\.items\[1\]: a set is not a JSON value"):
        catalog.StaticPodSpec(pod={"spec": {"items": [1, {3}]}})


def test_output_dict_is_json_safe_and_decodes_back() -> None:
    state = State()
    resource = state.create(
        catalog.RUNTIME_NAMESPACE,
        catalog.SERVICES,
        "etcd",
        spec=catalog.ServiceSpec(running=True, healthy=True, unknown=False),
        owner="v1alpha1.ServiceController",
    )
    data = json.loads(json.dumps(to_output_dict(resource, node="10.5.0.2")))
    assert data["node"] == "10.5.0.2"
    assert data["metadata"]["owner"] == "v1alpha1.ServiceController"
    assert data["metadata"]["version"] == 1
    assert data["metadata"]["phase"] == "running"
    assert data["metadata"]["created"].endswith("Z")
    assert data["spec"] == {"running": True, "healthy": True, "unknown": False}
    node, decoded = state.registry.decode(data)
    assert (node, decoded) == ("10.5.0.2", resource)
    assert from_output_dict(data, catalog.ServiceSpec)[1] == resource


def test_output_dict_omits_owner_and_finalizers_when_unset() -> None:
    state = State()
    resource = state.create(
        catalog.CONFIG_NAMESPACE, catalog.MACHINE_TYPES, "machine-type", spec=catalog.MachineTypeSpec("init")
    )
    metadata = to_output_dict(resource)["metadata"]
    assert "owner" not in metadata
    assert "finalizers" not in metadata
    assert list(metadata) == ["namespace", "type", "id", "version", "phase", "created", "updated"]
