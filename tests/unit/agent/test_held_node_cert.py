"""The node API certificate a worker keeps for its next boots: used only while valid and issued by
the current OS CA, and written owner-only."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest

from kubeplane import api, pki
from kubeplane.agent import nodecert
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit


def credentials(ca: pki.CertKey, **kwargs: object) -> api.Credentials:
    pair = pki.issue(ca=ca, common_name="worker-1", usages=("server",), **kwargs)  # type: ignore[arg-type]
    return api.Credentials(ca=ca.cert, cert=pair.cert, key=pair.key)


def test_a_saved_certificate_is_loaded_for_its_own_ca_only(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path)
    ca, other = pki.new_ca("os ca"), pki.new_ca("another cluster's os ca")
    assert nodecert.load(paths, ca.cert) is None  # none held yet

    held = credentials(ca)
    nodecert.save(paths, held)
    assert nodecert.load(paths, ca.cert) == held
    assert nodecert.load(paths, other.cert) is None  # the config now trusts another CA
    for name in ("node.crt", "node.key"):
        assert stat.S_IMODE((paths.secrets / "node-api" / name).stat().st_mode) == 0o600


def test_an_expired_certificate_is_not_used(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path)
    ca = pki.new_ca("os ca")
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    nodecert.save(paths, credentials(ca, now=long_ago, lifetime=datetime.timedelta(days=1)))
    assert nodecert.load(paths, ca.cert) is None
