"""Fixtures of the ops unit tests (the fakes themselves live in ``ops_fakes``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kubeplane.config import generate


@pytest.fixture(scope="session")
def generated() -> Mapping[str, Any]:
    secrets = generate.new_secrets()
    result = generate.generate(
        generate.GenOptions(cluster_name="t", endpoint="https://10.5.0.1:6443"), secrets
    )
    return result.documents
