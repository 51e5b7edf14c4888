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


# -- agnhost ------------------------------------------------------------------------------------

SOURCE_PACKAGE = "1.20.5+really1.20.2-1.1+deb12u1"
MANIFEST_GO = """func initImageConfigs() map[int]Config {
	configs := map[int]Config{}
	configs[Agnhost] = Config{promoterE2eRegistry, "agnhost", "2.21"}
	configs[AgnhostPrivate] = Config{PrivateRegistry, "agnhost", "2.6"}
"""


def test_agnhost_refs_are_the_version_file_then_the_e2e_frameworks_tag() -> None:
    assert workload_images.parse_e2e_agnhost_tag(MANIFEST_GO) == "2.21"
    assert workload_images.parse_e2e_agnhost_tag('configs[BusyBox] = Config{x, "busybox", "1.29"}') is None
    assert workload_images.agnhost_refs("2.25", "2.21") == (
        "k8s.gcr.io/e2e-test-images/agnhost:2.25",
        "k8s.gcr.io/e2e-test-images/agnhost:2.21",
    )
    assert workload_images.agnhost_refs("2.21", "2.21") == ("k8s.gcr.io/e2e-test-images/agnhost:2.21",)
    assert workload_images.agnhost_refs("2.25", None) == ("k8s.gcr.io/e2e-test-images/agnhost:2.25",)


def test_agnhost_key_has_every_input_but_the_kubernetes_version(monkeypatch: pytest.MonkeyPatch) -> None:
    key = workload_images.agnhost_key(SOURCE_PACKAGE, "2.25", DEB_VERSION)
    assert key == workload_images.agnhost_key(SOURCE_PACKAGE, "2.25", DEB_VERSION)
    assert key != workload_images.agnhost_key("1.20.2-2", "2.25", DEB_VERSION)
    assert key != workload_images.agnhost_key(SOURCE_PACKAGE, "2.26", DEB_VERSION)
    assert key != workload_images.agnhost_key(SOURCE_PACKAGE, "2.25", "1:1.36.1-1")
    monkeypatch.setattr(workload_images, "AGNHOST_RECIPE_VERSION", workload_images.AGNHOST_RECIPE_VERSION + 1)
    assert key != workload_images.agnhost_key(SOURCE_PACKAGE, "2.25", DEB_VERSION)


def test_agnhost_layer_is_upstreams_files_over_busybox(tmp_path: Path) -> None:
    busybox = _spec(tmp_path).entries
    binary = tmp_path / "agnhost"
    binary.write_bytes(b"\x7fELF fake agnhost")
    porter = tmp_path / "porter"
    porter.mkdir()
    (porter / "localhost.crt").write_text("CERT")
    (porter / "localhost.key").write_text("KEY")
    refs = workload_images.agnhost_refs("2.25", "2.21")
    spec = workload_images.agnhost_spec(refs, workload_images.agnhost_entries(binary, porter, list(busybox)))
    assert spec.ref == refs[0]
    assert spec.entrypoint == ("/agnhost",) and spec.cmd == ("pause",)
    archive = tmp_path / "agnhost.tar"
    images.write_docker_archive(spec, archive)
    (entry,) = images.read_manifest(archive)
    with tarfile.open(archive) as outer:
        layer = outer.extractfile(entry["Layers"][0])
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            members = {m.name: m for m in inner}
    assert members["agnhost"].isfile() and members["agnhost"].mode == 0o755
    assert members["agnhost-2"].issym() and members["agnhost-2"].linkname == "agnhost"
    assert members["localhost.crt"].isfile() and members["localhost.key"].isfile()
    assert members["uploads"].isdir()
    assert members["bin/sh"].linkname == "/bin/busybox" and members["bin/tar"].linkname == "/bin/busybox"
    assert members["tmp"].mode == 0o1777 and members["etc/passwd"].isfile()


def _source_tree(cache: Path, version: str = "2.25") -> Path:
    """A cache with what a toolchain build leaves: the .dsc and the tree unpacked from its orig."""
    orig = "kubernetes_1.20.5+really1.20.2.orig.tar.gz"
    debian = cache / "src" / "debian"
    debian.mkdir(parents=True, exist_ok=True)
    (debian / f"kubernetes_{SOURCE_PACKAGE}.dsc").write_text(
        f"Source: kubernetes\nVersion: {SOURCE_PACKAGE}\nChecksums-Sha256:\n {'0' * 64} 1 {orig}\n"
    )
    tree = cache / "src" / "kubernetes-1.20.2"
    agnhost = tree / workload_images.AGNHOST_PACKAGE
    (agnhost / "porter").mkdir(parents=True, exist_ok=True)
    (agnhost / "VERSION").write_text(f"{version}\n")
    (agnhost / "porter" / "localhost.crt").write_text("CERT")
    (agnhost / "porter" / "localhost.key").write_text("KEY")
    (tree / workload_images.E2E_MANIFEST).parent.mkdir(parents=True, exist_ok=True)
    (tree / workload_images.E2E_MANIFEST).write_text(MANIFEST_GO)
    (tree / ".kubeplane-unpacked").write_text(orig)
    return tree


def test_agnhost_is_built_once_per_source_and_repacked_only_when_an_input_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran = _fake_build(monkeypatch, DEB_VERSION, tmp_path)
    fake_run = workload_images.steps_mod.Steps.run

    def run(self: object, argv: list[str], **kwargs: object) -> str:
        if argv[0].endswith("/go"):
            ran.append(list(argv))
            Path(argv[argv.index("-o") + 1]).write_bytes(b"\x7fELF agnhost")
            return ""
        return fake_run(self, argv, **kwargs)

    monkeypatch.setattr(workload_images.steps_mod.Steps, "run", run)
    cache = tmp_path / "cache"
    builder = workload_images.Builder(cache)
    with pytest.raises(workload_images.steps_mod.StepFailed, match="no unpacked Kubernetes source tree"):
        builder.ensure_agnhost()
    tree = _source_tree(cache)
    first = builder.ensure_agnhost()
    assert first.refs == workload_images.agnhost_refs("2.25", "2.21")
    assert images.read_manifest(first.archive)[0]["RepoTags"] == [first.refs[0]]
    go = [argv for argv in ran if argv[0].endswith("/go")]
    assert len(go) == 1 and go[0][-1] == "./test/images/agnhost"
    assert (tree / "_output/local/go/src/k8s.io/kubernetes").resolve() == tree.resolve()
    # Warm: nothing runs, whichever Kubernetes versions the cache holds.
    ran.clear()
    assert workload_images.Builder(cache).ensure_agnhost() == first
    assert ran == []
    # A damaged archive, a new VERSION file: built again.
    first.archive.write_bytes(b"broken")
    assert workload_images.Builder(cache).ensure_agnhost().size == first.size
    assert sum(argv[0].endswith("/go") for argv in ran) == 1
    _source_tree(cache, version="2.26")
    assert workload_images.Builder(cache).ensure_agnhost().refs[0].endswith(":2.26")
    assert sum(argv[0].endswith("/go") for argv in ran) == 2
    # ensure() gives both workload images.
    assert [image.refs[0].rpartition(":")[0] for image in builder.ensure()] == [
        "docker.io/library/busybox",
        "k8s.gcr.io/e2e-test-images/agnhost",
    ]
