"""A pull-through cache (``docker-registry`` in proxy mode) in front of a real upstream registry.

The pull through cache guide's promise, on this machine: what was pulled through the cache once
is served by it with the upstream gone; starting a running cache again changes nothing, other
settings restart it (the cached images stay), and stop/purge take it away by its PID only.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kubeplane.provision import hostproc, images, registry, registry_cache

pytestmark = pytest.mark.integration

ADDRESS = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((ADDRESS, 0))
        return int(probe.getsockname()[1])


def pull(ref: str, target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{ref}", f"dir:{target}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_warm_cache_serves_without_its_upstream(tmp_path: Path) -> None:
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (Debian package {tool}; scripts/setup installs it)")
    payload = tmp_path / "hello.txt"
    payload.write_text("hello\n")
    spec = images.ImageSpec("k8s.gcr.io/hello:1", (images.LayerEntry("/hello.txt", "file", 0o644, payload),))
    images.write_docker_archive(spec, tmp_path / "hello.tar")
    upstream = registry.Registry(directory=tmp_path / "upstream", address=ADDRESS, port=free_port())
    root = tmp_path / "caches"
    try:
        upstream.start()
        assert upstream.push(tmp_path / "hello.tar", "k8s.gcr.io/hello:1")
        port = free_port()
        cache, started = registry_cache.start(
            "k8s.gcr.io", upstream=upstream.url, port=port, address=ADDRESS, root=root
        )
        assert started and cache.running
        assert registry_cache.start(
            "k8s.gcr.io", upstream=upstream.url, port=port, address=ADDRESS, root=root
        ) == (
            cache,
            False,
        )

        # Cold: the cache fetches from the upstream (its log shows the cache's request).
        first = pull(f"{ADDRESS}:{port}/hello:1", tmp_path / "first")
        assert first.returncode == 0, first.stderr
        assert "hello" in registry.pulled_repositories(upstream.log)
        # docker-registry stores a blob it served in the background (it fetches it from the
        # upstream a second time); a cache stopped before that ends has not kept it. Restart it
        # only once every blob of the image is in its storage.
        blobs = root / "k8s.gcr.io" / "storage" / registry.BLOBS / "sha256"
        manifest = json.loads((tmp_path / "first" / "manifest.json").read_text())
        digests = [manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])]
        wanted = [
            blobs / digest.removeprefix("sha256:")[:2] / digest.removeprefix("sha256:") / "data"
            for digest in digests
        ]
        deadline = time.monotonic() + 30
        while not all(path.is_file() for path in wanted):
            assert time.monotonic() < deadline, (
                f"the cache did not store {[str(p) for p in wanted if not p.is_file()]}"
            )
            time.sleep(0.1)

        # Other settings restart it (a new process; docker-registry must reach its upstream to
        # start at all), keeping what it cached.
        moved, restarted = registry_cache.start(
            "k8s.gcr.io", upstream=upstream.url, port=free_port(), address=ADDRESS, root=root
        )
        assert restarted and cache.record is not None and not hostproc.is_running(cache.record)

        # Warm, upstream gone: served from the cache alone; what it never fetched is not there.
        upstream.stop()
        second = pull(f"{ADDRESS}:{moved.port}/hello:1", tmp_path / "second")
        assert second.returncode == 0, second.stderr
        missing = pull(f"{ADDRESS}:{moved.port}/other:1", tmp_path / "missing")
        assert missing.returncode != 0 and "manifest unknown" in missing.stderr
        assert [c.name for c in registry_cache.list_caches(root=root)] == ["k8s.gcr.io"]

        assert registry_cache.stop("k8s.gcr.io", root=root) is True
        assert moved.record is not None and not hostproc.is_running(moved.record)
        assert registry_cache.stop("k8s.gcr.io", root=root) is False
        assert (root / "k8s.gcr.io" / "storage").is_dir()
        assert registry_cache.stop("k8s.gcr.io", purge=True, root=root) is True
        assert not (root / "k8s.gcr.io").exists()
    finally:
        upstream.stop()
        for cache in registry_cache.list_caches(root=root):
            registry_cache.stop(cache.name, root=root)
