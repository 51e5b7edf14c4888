"""JSON patches (RFC 6902) and merge patches (RFC 7386) of machine config documents."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeplane import config

pytestmark = pytest.mark.unit


def patched(doc: config.MachineConfig, ops: Any) -> dict[str, Any]:
    return config.apply_json_patch(doc, ops).to_dict()


def test_replace_keeps_comments_and_position(minimal: config.MachineConfig, minimal_text: str) -> None:
    ops = (
        '[{"op": "replace", "path": "/cluster/apiServer/image", '
        '"value": "k8s.gcr.io/kube-apiserver:v1.20.5"}]'
    )
    result = config.apply_json_patch(minimal, ops)
    assert result.model.cluster.api_server_image == "k8s.gcr.io/kube-apiserver:v1.20.5"
    assert result.to_yaml() == minimal_text.replace("apiserver:v1.20.2", "apiserver:v1.20.5")
    assert minimal.model.cluster.api_server_image.endswith("v1.20.2")


def test_every_operation(minimal: config.MachineConfig) -> None:
    ops = [
        {"op": "add", "path": "/machine/certSANs", "value": ["a.example"]},
        {"op": "add", "path": "/machine/certSANs/-", "value": "c.example"},
        {"op": "add", "path": "/machine/certSANs/1", "value": "b.example"},
        {"op": "test", "path": "/machine/certSANs", "value": ["a.example", "b.example", "c.example"]},
        {"op": "copy", "from": "/machine/time", "path": "/machine/time2"},
        {"op": "move", "from": "/machine/time2/servers", "path": "/machine/time/servers"},
        {"op": "remove", "path": "/machine/time2"},
        {"op": "remove", "path": "/machine/certSANs/0"},
        {"op": "add", "path": "/cluster/extraManifestHeaders", "value": {"a/b": "1", "m~n": "2"}},
        {"op": "replace", "path": "/cluster/extraManifestHeaders/a~1b", "value": "3"},
        {"op": "remove", "path": "/cluster/extraManifestHeaders/m~0n"},
    ]
    data = patched(minimal, ops)
    assert data["machine"]["certSANs"] == ["b.example", "c.example"]
    assert data["machine"]["time"] == {"servers": ["time.cloudflare.com"]}
    assert "time2" not in data["machine"]
    assert data["cluster"]["extraManifestHeaders"] == {"a/b": "3"}


def test_root_pointer_replaces_the_document(minimal: config.MachineConfig) -> None:
    new = minimal.to_dict()
    new["machine"]["type"] = "worker"
    assert patched(minimal, [{"op": "replace", "path": "", "value": new}]) == new


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        (
            [{"op": "replace", "path": "/machine/kubelet/imagex", "value": 1}],
            "/machine/kubelet has no key 'imagex'",
        ),
        (
            [{"op": "test", "path": "/machine/type", "value": "worker"}],
            'test failed: value is "controlplane"',
        ),
        ([{"op": "add", "path": "/machine/time/servers/5", "value": "x"}], "index 5 is out of range"),
        ([{"op": "add", "path": "/machine/time/servers/01", "value": "x"}], "'01' is not a list index"),
        (
            [{"op": "move", "from": "/machine", "path": "/machine/x"}],
            "cannot move /machine into its own child",
        ),
        ([{"op": "add", "path": "/version/x", "value": 1}], "/version is a scalar"),
    ],
)
def test_failed_operation_names_itself(minimal: config.MachineConfig, ops: Any, message: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.apply_json_patch(minimal, ops)
    (error,) = caught.value.errors
    assert error.path == "patch[0]" and message in error.message


def test_malformed_patches(minimal: config.MachineConfig) -> None:
    with pytest.raises(config.ConfigError, match="not valid JSON"):
        config.apply_json_patch(minimal, "[{")
    with pytest.raises(config.ConfigError) as caught:
        config.apply_json_patch(minimal, [{"op": "frob", "path": "/a"}, {"op": "add", "path": "a"}, 3])  # type: ignore[list-item]
    assert [str(e) for e in caught.value.errors] == [
        "patch[0].op: 'frob' is not one of add, remove, replace, move, copy, test",
        'patch[1].path: \'a\' is not a JSON pointer (expected "" or "/a/b")',
        "patch[1].value: required for add",
        "patch[2]: expected an operation mapping with op and path",
    ]


def test_invalid_result_reports_field_paths(minimal: config.MachineConfig) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.apply_json_patch(minimal, [{"op": "replace", "path": "/machine/type", "value": "master"}])
    assert caught.value.errors[0].path == "machine.type"


def test_merge_patch(minimal: config.MachineConfig, minimal_text: str) -> None:
    patch = """\
machine:
  time: null # delete
  certSANs: [a.example]
cluster:
  apiServer:
    extraArgs:
      v: 4
"""
    result = config.apply_merge_patch(minimal, patch)
    data = result.to_dict()
    assert "time" not in data["machine"]
    assert data["machine"]["certSANs"] == ["a.example"]
    assert data["cluster"]["apiServer"] == {
        "image": "k8s.gcr.io/kube-apiserver:v1.20.2",
        "extraArgs": {"v": 4},
    }
    assert "# the node runs etcd" in result.to_yaml()
    # Lists replace rather than merge.
    again = config.apply_merge_patch(result, {"machine": {"certSANs": ["b.example"]}})
    assert again.to_dict()["machine"]["certSANs"] == ["b.example"]


def test_apply_patch_picks_the_kind_from_the_text(minimal: config.MachineConfig) -> None:
    json_patch = '[{"op": "add", "path": "/machine/certSANs", "value": ["x.example"]}]'
    merge_patch = "machine: {certSANs: [x.example]}"
    assert (
        config.apply_patch(minimal, json_patch).to_dict()
        == config.apply_patch(minimal, merge_patch).to_dict()
    )


POINTERS = st.lists(
    st.sampled_from(
        ["machine", "cluster", "time", "servers", "0", "1", "-", "type", "apiServer", "image", "x~1y", ""]
    ),
    max_size=4,
).map(lambda parts: "".join("/" + p for p in parts))
OPS = st.fixed_dictionaries(
    {
        "op": st.sampled_from(["add", "remove", "replace", "move", "copy", "test"]),
        "path": POINTERS,
        "from": POINTERS,
        "value": st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=5),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
            ),
            max_leaves=5,
        ),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, max_size=5))
def test_patches_are_atomic(minimal: config.MachineConfig, ops: list[dict[str, Any]]) -> None:
    before_text = minimal.to_yaml()
    before = copy.deepcopy(minimal.to_dict())
    try:
        result = config.apply_json_patch(minimal, json.dumps(ops))
    except config.ConfigError as exc:
        assert exc.errors
    else:
        assert result.model is not None
        assert config.load(result.to_yaml()).to_dict() == result.to_dict()
    assert minimal.to_dict() == before
    assert minimal.to_yaml() == before_text
