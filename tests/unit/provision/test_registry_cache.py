"""Pull-through cache names, upstreams and records (no process is started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubeplane.provision import hostproc, registry_cache

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["docker.io", "k8s.gcr.io", "registry-1.example.com", "q"])
def test_registry_hosts_are_cache_names(name: str) -> None:
    registry_cache.check_name(name)


@pytest.mark.parametrize("name", ["", "../x", "Docker.io", "a/b", "-x", "x.", "a b"])
def test_other_names_are_refused(name: str) -> None:
    with pytest.raises(registry_cache.CacheError, match="not a lower-case registry host name"):
        registry_cache.check_name(name)


@pytest.mark.parametrize("upstream", ["k8s.gcr.io", "ftp://x", "https://", "http:///v2"])
def test_upstreams_must_be_http_urls(upstream: str) -> None:
    with pytest.raises(registry_cache.CacheError, match="not an http"):
        registry_cache.check_upstream(upstream)


def test_the_guide_caches_one_upstream_per_port() -> None:
    ports = [port for _, port in registry_cache.GUIDE_CACHES.values()]
    assert ports == [5000, 5001, 5002, 5003, 5004]
    assert registry_cache.GUIDE_CACHES["docker.io"][0] == "https://registry-1.docker.io"


def test_records_are_read_back_and_a_dead_process_is_not_running(tmp_path: Path) -> None:
    gone = hostproc.ProcessRecord(name="registry", pid=2**22 + 7, start_time=1, argv=("x",), log="l")
    cache = registry_cache.Cache(
        name="k8s.gcr.io",
        upstream="https://k8s.gcr.io",
        address="0.0.0.0",
        port=5001,
        directory=tmp_path / "k8s.gcr.io",
        record=gone,
    )
    (tmp_path / "k8s.gcr.io").mkdir()
    (tmp_path / "k8s.gcr.io" / registry_cache.STATE_FILE).write_text(json.dumps(cache.to_dict()))
    (tmp_path / "stray").mkdir()  # not a cache: no state file
    assert registry_cache.load("k8s.gcr.io", root=tmp_path) == cache
    assert registry_cache.list_caches(root=tmp_path) == [cache]
    summary = cache.summary()
    assert (summary["listen"], summary["running"], summary["pid"]) == ("0.0.0.0:5001", False, None)
    assert registry_cache.load("quay.io", root=tmp_path) is None
    assert registry_cache.stop("quay.io", root=tmp_path) is False
    assert registry_cache.stop("k8s.gcr.io", root=tmp_path) is False  # nothing ran
    assert registry_cache.stop("k8s.gcr.io", purge=True, root=tmp_path) is True
    assert not (tmp_path / "k8s.gcr.io").exists()


def test_a_damaged_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "gcr.io").mkdir()
    (tmp_path / "gcr.io" / registry_cache.STATE_FILE).write_text("{")
    with pytest.raises(registry_cache.CacheError, match=r"gcr\.io/cache\.json"):
        registry_cache.load("gcr.io", root=tmp_path)
