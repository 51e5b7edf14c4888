"""Registry config, mirror path mapping, archive digests and access-log parsing (no registry)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubeplane.provision import images, registry

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("k8s.gcr.io/kube-apiserver:v1.20.2", ("kube-apiserver", "v1.20.2")),
        ("k8s.gcr.io/pause:3.2", ("pause", "3.2")),
        ("quay.io/coreos/flannel:v0.13.0", ("coreos/flannel", "v0.13.0")),
        ("localhost:5000/thing:1", ("thing", "1")),
        ("docker.io/library/busybox:1.33", ("library/busybox", "1.33")),
        ("busybox:1.33", ("library/busybox", "1.33")),
        ("busybox", ("library/busybox", "latest")),
        ("coredns/coredns:1.8.0", ("coredns/coredns", "1.8.0")),
        ("registry.local:6000/team/app", ("team/app", "latest")),
    ],
)
def test_mirror_path_drops_the_upstream_host(ref: str, expected: tuple[str, str]) -> None:
    assert registry.mirror_path(ref) == expected


@pytest.mark.parametrize(
    ("ref", "message"),
    [("k8s.gcr.io/pause@sha256:" + "0" * 64, "pins a digest"), ("k8s.gcr.io/Bad:1", "'Bad'")],
)
def test_unmappable_references_are_refused(ref: str, message: str) -> None:
    with pytest.raises(registry.RegistryError, match=message):
        registry.mirror_path(ref)


def test_config_serves_plain_http_from_the_cluster_dir(tmp_path: Path) -> None:
    config = yaml.safe_load(registry.render_config(storage=tmp_path / "storage", address="10.5.0.1"))
    assert config["http"] == {"addr": "10.5.0.1:6000"}
    assert config["storage"]["filesystem"] == {"rootdirectory": str(tmp_path / "storage")}
    assert config["log"]["accesslog"] == {"disabled": False}


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("k8s.gcr.io/kube-apiserver:v1.20.2", "k8s.gcr.io/kube-apiserver:v1.20.2"),
        ("busybox", "docker.io/library/busybox:latest"),
        ("kubeplane/cluster-dns:0.1.0", "docker.io/kubeplane/cluster-dns:0.1.0"),
        ("localhost:5000/thing:1", "localhost:5000/thing:1"),
    ],
)
def test_qualified_spells_out_the_registry_host(ref: str, expected: str) -> None:
    assert registry.qualified(ref) == expected
    # The air-gapped guide's sed (first component -> the mirror) then gives the mirror's path.
    assert registry.qualified(ref).split("/", 1)[1] == ":".join(registry.mirror_path(ref))


def test_config_of_a_pull_through_cache_over_tls(tmp_path: Path) -> None:
    tls = registry.TLS(certificate=tmp_path / "tls.crt", key=tmp_path / "tls.key", ca=tmp_path / "ca.crt")
    config = yaml.safe_load(
        registry.render_config(
            storage=tmp_path / "storage",
            address="0.0.0.0",
            port=5001,
            proxy_remote="https://k8s.gcr.io",
            tls=tls,
        )
    )
    assert config["proxy"] == {"remoteurl": "https://k8s.gcr.io"}
    assert config["http"] == {
        "addr": "0.0.0.0:5001",
        "tls": {"certificate": str(tmp_path / "tls.crt"), "key": str(tmp_path / "tls.key")},
    }
    assert "proxy" not in yaml.safe_load(registry.render_config(storage=tmp_path, address="10.5.0.1"))
    assert registry.Registry(directory=tmp_path, address="10.5.0.1", port=5443, tls=tls).url == (
        "https://10.5.0.1:5443"
    )


def test_archive_config_digest_is_the_image_id(tmp_path: Path) -> None:
    payload = tmp_path / "hello.txt"
    payload.write_text("hello\n")
    spec = images.ImageSpec("k8s.gcr.io/hello:1", (images.LayerEntry("/hello.txt", "file", 0o644, payload),))
    image_id = images.write_docker_archive(spec, tmp_path / "hello.tar")
    assert registry.archive_config_digest(tmp_path / "hello.tar") == f"sha256:{image_id}"


def test_archive_config_digest_refuses_other_files(tmp_path: Path) -> None:
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    with pytest.raises(registry.RegistryError, match=r"junk\.tar is not a docker-archive"):
        registry.archive_config_digest(tmp_path / "junk.tar")


def _access(client: str, request: str, status: int, agent: str) -> str:
    """One line of the registry's access log (combined log format)."""
    return f'{client} - - [01/Jan/2026:00:00:01 +0000] "{request} HTTP/1.1" {status} 426 "" "{agent}"'


_NS = "?ns=k8s.gcr.io"
_CTR = "containerd/1.6.20"
LOG = "\n".join(
    [
        'time="2026-01-01T00:00:00Z" level=info msg="listening on 10.5.0.1:6000"',
        _access("10.5.0.1", "PUT /v2/pause/manifests/3.2", 201, "skopeo/1.9.3"),
        _access("10.5.0.1", "GET /v2/pause/manifests/3.2", 200, "kubeplane"),
        _access("10.5.0.2", f"HEAD /v2/pause/manifests/3.2{_NS}", 200, _CTR),
        _access("10.5.0.2", f"GET /v2/pause/manifests/sha256:abc{_NS}", 200, _CTR),
        _access("10.5.0.2", f"GET /v2/pause/blobs/sha256:def{_NS}", 200, _CTR),
        _access("10.5.0.3", f"GET /v2/coredns/manifests/1.7.0{_NS}", 404, _CTR),
    ]
)


def test_pulls_come_from_the_access_log_without_our_own_requests(tmp_path: Path) -> None:
    log = tmp_path / "registry.log"
    log.write_text(LOG)
    found = registry.pulls(log)
    assert [(p.client, p.method, p.repository, p.kind, p.reference, p.status) for p in found] == [
        ("10.5.0.2", "HEAD", "pause", "manifests", "3.2", 200),
        ("10.5.0.2", "GET", "pause", "manifests", "sha256:abc", 200),
        ("10.5.0.2", "GET", "pause", "blobs", "sha256:def", 200),
        ("10.5.0.3", "GET", "coredns", "manifests", "1.7.0", 404),
    ]
    # A failed pull (404) is not a pull that went through the registry.
    assert registry.pulled_repositories(log) == {"pause"}
    assert registry.pulls(tmp_path / "missing.log") == []


def _storage(root: Path) -> Path:
    blob = root / registry.BLOBS / "sha256/ab/abcd/data"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"layer")
    link = root / "docker/registry/v2/repositories/pause/_manifests/tags/3.2/current/link"
    link.parent.mkdir(parents=True)
    link.write_text("sha256:abcd")
    return root


def test_a_saved_storage_is_restored_with_blobs_shared_and_links_copied(tmp_path: Path) -> None:
    seeded = _storage(tmp_path / "cluster1")
    seed = tmp_path / "cache/registry-storage"
    registry.save_storage(seeded, seed)
    storage = tmp_path / "cluster2/storage"
    storage.mkdir(parents=True)  # what Registry.start leaves: an empty directory is restored into
    assert registry.restore_storage(seed, storage)
    blob = registry.BLOBS / "sha256/ab/abcd/data"
    link = Path("docker/registry/v2/repositories/pause/_manifests/tags/3.2/current/link")
    assert (storage / blob).read_bytes() == b"layer"
    assert (storage / blob).stat().st_ino == (seed / blob).stat().st_ino
    # The registry rewrites tag links in place: a cluster's rewrite must not reach the seed.
    assert (storage / link).stat().st_ino != (seed / link).stat().st_ino
    (storage / link).write_text("sha256:ffff")
    assert (seed / link).read_text() == "sha256:abcd"
    # A storage that holds anything is left alone; without a seed nothing is restored.
    assert not registry.restore_storage(seed, storage)
    assert not registry.restore_storage(tmp_path / "none", tmp_path / "cluster3/storage")


def test_saving_replaces_the_seed_whole(tmp_path: Path) -> None:
    seed = tmp_path / "cache/registry-storage"
    registry.save_storage(_storage(tmp_path / "a"), seed)
    newer = _storage(tmp_path / "b")
    (newer / "docker/registry/v2/repositories/pause/_manifests/tags/3.2/current/link").write_text("new")
    registry.save_storage(newer, seed)
    assert sorted(p.name for p in seed.parent.iterdir()) == ["registry-storage"]
    link = seed / "docker/registry/v2/repositories/pause/_manifests/tags/3.2/current/link"
    assert link.read_text() == "new"


def test_a_failed_restore_leaves_an_empty_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = _storage(tmp_path / "seed")
    storage = tmp_path / "cluster/storage"

    def vanished(*_: object, **__: object) -> None:
        raise FileNotFoundError("the seed was replaced meanwhile")

    monkeypatch.setattr(registry.shutil, "copy2", vanished)
    assert not registry.restore_storage(seed, storage)
    assert storage.is_dir() and not any(storage.iterdir())
