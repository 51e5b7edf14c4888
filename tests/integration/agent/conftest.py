"""Fixtures for the node agent acceptance tests (the harness itself is :mod:`agent_harness`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import Cluster


@pytest.fixture
def cluster(tmp_path: Path, processes: Any) -> Iterator[Cluster]:
    """Agents for one test; the parent conftest's ``processes`` fixture stops every one of them."""
    yield Cluster(tmp_path=tmp_path, processes=processes)
