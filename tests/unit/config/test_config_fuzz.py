"""Robustness: any text or JSON-like document either loads or raises ConfigError, never anything else."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeplane import config

pytestmark = pytest.mark.unit

KEYS = st.sampled_from(
    [
        "version",
        "machine",
        "cluster",
        "type",
        "network",
        "interfaces",
        "cidr",
        "controlPlane",
        "endpoint",
        "files",
        "op",
        "time",
        "servers",
        "keys",
        "slot",
        "vip",
        "ip",
        "registries",
        "mirrors",
        "*",
        "x",
    ]
) | st.text(max_size=8)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()
    | st.sampled_from(["v1alpha1", "controlplane", "worker", "https://10.5.0.1:6443", "10.5.0.2/24", "0644"])
    | st.text(max_size=10)
)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=25,
)


def load_or_config_error(text: str) -> None:
    try:
        document = config.load(text)
    except config.ConfigError as exc:
        assert exc.errors and all(error.path and error.message for error in exc.errors)
        assert str(exc)
    else:
        assert document.to_yaml() == text


@settings(max_examples=300, deadline=None)
@given(DOCUMENTS)
def test_arbitrary_json_documents(data: Any) -> None:
    load_or_config_error(json.dumps(data))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text(text: str) -> None:
    load_or_config_error(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(section=st.sampled_from(["machine", "cluster"]), extra=st.dictionaries(KEYS, DOCUMENTS, max_size=3))
def test_arbitrary_additions_to_a_valid_document(
    minimal: config.MachineConfig, section: str, extra: Any
) -> None:
    data = minimal.to_dict()
    data[section].update(extra)
    load_or_config_error(json.dumps(data))


@pytest.mark.parametrize(
    "text",
    [
        "a: &a [*a]\n",
        "[" * 5000,
        "version: !!binary aGVsbG8=\n",
        "? [a, b]\n: c\n",
        "version: v1alpha1\nmachine:\n  type: init\n  network:\n    interfaces:\n      - mtu:"
        " 99999999999999999999999999\n",
        "--- a\n--- b\n",
        "\t- x",
        "version: 2021-01-01\n",
        "!!python/object:os.system x\n",
    ],
)
def test_hostile_documents(text: str) -> None:
    load_or_config_error(text)
