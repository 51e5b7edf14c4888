"""The busybox workload image: references, cache key, layer layout and rebuild decisions."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from kubeplane.provision import images, workload_images

pytestmark = pytest.mark.unit

DEB_VERSION = "1:1.35.0-4+deb12u1+b1"


def test_refs_use_the_upstream_version_then_latest() -> None:
    assert workload_images.upstream_version(DEB_VERSION) == "1.35.0"
    assert workload_images.upstream_version("1.36.1-3") == "1.36.1"
    assert workload_images.busybox_refs(DEB_VERSION) == (
        "docker.io/library/busybox:1.35.0",
        "docker.io/library/busybox:latest",
    )


def test_cache_key_changes_with_the_package_version_and_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    key = workload_images.cache_key(DEB_VERSION)
    assert key == workload_images.cache_key(DEB_VERSION)
    assert key != workload_images.cache_key("1:1.35.0-4+deb12u2")
    monkeypatch.setattr(workload_images, "RECIPE_VERSION", workload_images.RECIPE_VERSION + 1)
    assert key != workload_images.cache_key(DEB_VERSION)


def test_deb_file_name_quotes_the_epoch_like_apt_get_download() -> None:
    assert (
        workload_images.deb_file_name(DEB_VERSION, "amd64")
        == "busybox-static_1%3a1.35.0-4+deb12u1+b1_amd64.deb"
    )


def test_applets_are_absolute_sorted_and_never_the_binary_itself() -> None:
    listed = "bin/sh\nusr/bin/wget\n\nbin/busybox\nbin/tar\nsbin/ifconfig\n"
    assert workload_images.parse_applets(listed) == ["/bin/sh", "/bin/tar", "/sbin/ifconfig", "/usr/bin/wget"]


def _spec(tmp_path: Path) -> images.ImageSpec:
    binary = tmp_path / "busybox"
    binary.write_bytes(b"\x7fELF fake busybox")
    (tmp_path / "passwd").write_text(workload_images.USERS)
    (tmp_path / "group").write_text(workload_images.GROUPS)
    entries = workload_images.busybox_entries(binary, ["/bin/sh", "/bin/tar", "/usr/bin/nslookup"], tmp_path)
    return workload_images.busybox_spec(DEB_VERSION, entries)


def test_one_layer_with_the_binary_a_symlink_per_applet_users_and_tmp(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert spec.ref == "docker.io/library/busybox:1.35.0"
    assert spec.cmd == ("sh",) and spec.entrypoint == ()
    archive = tmp_path / "busybox.tar"
    images.write_docker_archive(spec, archive)
    (entry,) = images.read_manifest(archive)
    assert entry["RepoTags"] == [spec.ref]
    (layer_name,) = entry["Layers"]
    with tarfile.open(archive) as outer:
        layer = outer.extractfile(layer_name)
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            members = {m.name: m for m in inner}
            passwd = inner.extractfile("etc/passwd")
            assert passwd is not None
            assert passwd.read().decode().startswith("root:x:0:0:root:/root:/bin/sh\n")
    assert members["bin/busybox"].isfile() and members["bin/busybox"].mode == 0o755
    for applet in ("bin/sh", "bin/tar", "usr/bin/nslookup"):
        assert members[applet].issym() and members[applet].linkname == "/bin/busybox"
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777
    assert members["etc/group"].isfile()


def _fake_build(monkeypatch: pytest.MonkeyPatch, version: str, tmp_path: Path) -> list[list[str]]:
    """Stand-ins for apt-cache, apt-get download, dpkg-deb and busybox; returns the commands run."""
    ran: list[list[str]] = []
    monkeypatch.setattr(workload_images, "candidate_version", lambda package="": version)

    def run(
        self: object, argv: list[str], *, cwd: Path | None = None, capture: bool = False, **_: object
    ) -> str:
        ran.append(list(argv))
        if argv[:2] == ["apt-get", "download"]:
            assert cwd is not None
            (cwd / workload_images.deb_file_name(version, images.host_arch())).write_bytes(b"deb")
        elif argv[0] == "dpkg-deb":
            (Path(argv[3]) / "bin").mkdir(parents=True)
            (Path(argv[3]) / "bin" / "busybox").write_bytes(version.encode())
        return "bin/sh\nbin/tar\n" if capture else ""

    monkeypatch.setattr(workload_images.steps_mod.Steps, "run", run)
    return ran


def test_rebuilds_only_when_the_package_version_changes_or_the_archive_breaks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran = _fake_build(monkeypatch, DEB_VERSION, tmp_path)
    builder = workload_images.Builder(tmp_path / "cache")
    first = builder.ensure_busybox()
    assert first.refs == workload_images.busybox_refs(DEB_VERSION)
    assert [argv[0] for argv in ran[:2]] == ["apt-get", "dpkg-deb"]
    assert ran[2][0].endswith("/bin/busybox") and ran[2][1:] == ["--list-full"]
    ran.clear()
    assert builder.ensure_busybox() == first
    assert ran == []  # warm: nothing downloaded, nothing unpacked
    # A damaged archive is repacked from the kept .deb, without a download.
    first.archive.write_bytes(b"broken")
    builder.ensure_busybox()
    assert [argv[0] for argv in ran][:1] == ["dpkg-deb"]
    ran.clear()
    # A new Debian version is a new key: downloaded and packed under its own tag.
    ran = _fake_build(monkeypatch, "1:1.36.1-1", tmp_path)
    second = builder.ensure_busybox()
    assert ran[0][:2] == ["apt-get", "download"] and ran[0][2] == "busybox-static=1:1.36.1-1"
    assert second.refs[0] == "docker.io/library/busybox:1.36.1"


def test_candidate_version_reads_apt_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        assert argv == ["apt-cache", "show", "--no-all-versions", "busybox-static"]
        return subprocess.CompletedProcess(
            argv, 0, stdout=f"Package: busybox-static\nVersion: {DEB_VERSION}\n"
        )

    monkeypatch.setattr(workload_images.subprocess, "run", fake)
    assert workload_images.candidate_version() == DEB_VERSION
    monkeypatch.setattr(
        workload_images.subprocess, "run", lambda argv, **_: subprocess.CompletedProcess(argv, 0, stdout="")
    )
    with pytest.raises(workload_images.WorkloadImageError, match="apt-get update"):
        workload_images.candidate_version()
