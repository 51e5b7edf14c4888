"""Workload images a local cluster serves offline: ``busybox`` and Kubernetes' test image ``agnhost``.

Pods of a local cluster pull through the cluster's registry, which holds only what
``cluster create`` pushed; so ``kubectl run --image=busybox`` (or an echo server from ``agnhost``)
works without the network only if the toolchain built the image. Both are built here, cached
under ``<cache>/workloads``, once per machine (not per Kubernetes version):

1. ``busybox-deb``: ``apt-get download busybox-static`` (the candidate version of the machine's
   apt lists) into ``<cache>/workloads/debs/``. The .deb is kept, so a rebuild never downloads.
2. ``busybox-image``: ``dpkg-deb -x`` the package, ask the static binary for its applets
   (``busybox --list-full``) and pack one layer: ``/bin/busybox``, a symlink to it per applet,
   ``/etc/passwd`` and ``/etc/group`` (root and nobody), ``/tmp`` (1777); default command ``sh``
   like Docker Hub's image. It is tagged ``docker.io/library/busybox:<upstream version>`` and
   ``:latest`` (what ``--image=busybox`` means); the archive carries the first, the registry
   gets both.

3. ``agnhost-build``: ``go build`` of ``test/images/agnhost`` from the Kubernetes source tree the
   toolchain unpacked (:meth:`kubeplane.provision.toolchain.Toolchain.source_tree`), offline, with
   the flags and Go build cache of the tree's own Makefile build
   (:func:`kubeplane.provision.toolchain.go_build`): seconds after a Kubernetes build, because
   only agnhost's own packages are compiled; about 1.5 minutes on a cold Go cache.
4. ``agnhost-image``: one layer like upstream's (Alpine-based) image: ``/agnhost``, ``/agnhost-2``
   linking to it, porter's ``/localhost.crt`` and ``/localhost.key``, ``/uploads``; plus the
   busybox layer's files, so ``kubectl exec -- sh`` and ``kubectl cp`` (``tar``) work. Entrypoint
   ``/agnhost``, command ``pause``. Tagged ``k8s.gcr.io/e2e-test-images/agnhost:<VERSION file>``
   and with the tag the tree's own e2e framework names (``test/utils/image/manifest.go``; 2.21 for
   1.20.2); the archive carries the first.

Each image has a stamp recording its cache key and its archive's sha256, and is rebuilt only when
the key changes or the archive no longer verifies. busybox's key is the package's Debian version
plus :data:`RECIPE_VERSION`; agnhost's is the source package the tree was unpacked from, the
``VERSION`` file, the busybox version it carries and :data:`AGNHOST_RECIPE_VERSION`. Errors:
:class:`WorkloadImageError` (package unknown to apt) and
:class:`kubeplane.provision.steps.StepFailed` (no source tree, download, build, extraction or
packing failed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import tempfile
from pathlib import Path

from kubeplane import fileio
from kubeplane import plan as plan_module
from kubeplane.provision import images as images_mod
from kubeplane.provision import steps as steps_mod
from kubeplane.provision import toolchain

BUSYBOX_PACKAGE = "busybox-static"
BUSYBOX_REPOSITORY = "docker.io/library/busybox"
#: Bump when the layer's layout changes, so cached images are repacked.
RECIPE_VERSION = 1
BUSYBOX_BINARY = "/bin/busybox"
#: /etc/passwd and /etc/group of the image (root and nobody).
USERS = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n"
GROUPS = "root:x:0:\nnobody:x:65534:\n"
_STAMP_FORMAT = 1

AGNHOST_PACKAGE = "test/images/agnhost"
AGNHOST_REPOSITORY = "k8s.gcr.io/e2e-test-images/agnhost"
#: Bump when agnhost's build or layer layout changes, so the cached image is rebuilt.
AGNHOST_RECIPE_VERSION = 1
#: Where the tree's e2e framework names the agnhost image it runs.
E2E_MANIFEST = "test/utils/image/manifest.go"
_E2E_AGNHOST = re.compile(r'configs\[Agnhost\]\s*=\s*Config\{[^,]+,\s*"agnhost",\s*"([^"]+)"\}')


class WorkloadImageError(Exception):
    """A workload image cannot be built or is not cached."""


@dataclasses.dataclass(frozen=True)
class WorkloadImage:
    """A packed image: every reference it is pushed as (the archive's own first), archive, size."""

    refs: tuple[str, ...]
    archive: Path
    size: int


def upstream_version(deb_version: str) -> str:
    """``1:1.35.0-4+deb12u1+b1`` → ``1.35.0``: Debian's epoch and revision dropped."""
    version = deb_version.partition(":")[2] or deb_version
    return version.rpartition("-")[0] or version


def busybox_refs(deb_version: str) -> tuple[str, str]:
    """The busybox image's references: the upstream version's tag, then ``latest``."""
    return (f"{BUSYBOX_REPOSITORY}:{upstream_version(deb_version)}", f"{BUSYBOX_REPOSITORY}:latest")


def cache_key(deb_version: str) -> str:
    """Hash of every input that shapes the busybox image."""
    inputs = {"package": BUSYBOX_PACKAGE, "version": deb_version, "recipe": RECIPE_VERSION}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def candidate_version(package: str = BUSYBOX_PACKAGE) -> str:
    """The version ``apt-get download`` would fetch, read from the local apt lists (no network)."""
    try:
        out = subprocess.run(
            ["apt-cache", "show", "--no-all-versions", package],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkloadImageError(f"cannot ask apt-cache about {package}: {exc}") from exc
    match = re.search(r"^Version: (\S+)$", out, re.MULTILINE)
    if match is None:
        raise WorkloadImageError(f"apt knows no package {package!r}; run apt-get update first")
    return match.group(1)


def deb_file_name(deb_version: str, arch: str) -> str:
    """The file name ``apt-get download`` gives the package (the epoch's colon quoted as ``%3a``)."""
    return f"{BUSYBOX_PACKAGE}_{deb_version.replace(':', '%3a')}_{arch}.deb"


def parse_applets(list_full: str) -> list[str]:
    """Absolute applet paths from ``busybox --list-full`` (``bin/sh`` → ``/bin/sh``), sorted."""
    found = {"/" + line.strip().lstrip("/") for line in list_full.splitlines() if line.strip()}
    found.discard(BUSYBOX_BINARY)
    return sorted(found)


def busybox_entries(binary: Path, applets: list[str], etc_dir: Path) -> list[images_mod.LayerEntry]:
    """The layer: the binary, one symlink per applet, passwd/group from ``etc_dir``, ``/tmp``."""
    entries = [
        images_mod.LayerEntry(BUSYBOX_BINARY, "file", 0o755, source=binary),
        images_mod.LayerEntry("/etc/passwd", "file", 0o644, source=etc_dir / "passwd"),
        images_mod.LayerEntry("/etc/group", "file", 0o644, source=etc_dir / "group"),
        images_mod.LayerEntry("/tmp", "dir", 0o1777),  # noqa: S108 - a path inside the image
        images_mod.LayerEntry("/root", "dir", 0o700),
    ]
    entries += [images_mod.LayerEntry(path, "symlink", 0o777, target=BUSYBOX_BINARY) for path in applets]
    return entries


def busybox_spec(deb_version: str, entries: list[images_mod.LayerEntry]) -> images_mod.ImageSpec:
    """The busybox image: ``entries`` under the version's reference, default command ``sh``."""
    return images_mod.ImageSpec(ref=busybox_refs(deb_version)[0], entries=tuple(entries), cmd=("sh",))


def parse_e2e_agnhost_tag(manifest_go: str) -> str | None:
    """The agnhost tag in the e2e framework's image table (``configs[Agnhost] = Config{..., "2.21"}``)."""
    match = _E2E_AGNHOST.search(manifest_go)
    return match.group(1) if match else None


def agnhost_refs(version: str, e2e_tag: str | None) -> tuple[str, ...]:
    """agnhost's references: the ``VERSION`` file's tag, then the e2e framework's if it differs."""
    tags = [version] + ([e2e_tag] if e2e_tag and e2e_tag != version else [])
    return tuple(f"{AGNHOST_REPOSITORY}:{tag}" for tag in tags)


def agnhost_key(source_package: str, version: str, busybox_version: str) -> str:
    """Hash of every input that shapes the agnhost image."""
    inputs = {
        "source": source_package,
        "agnhost": version,
        "busybox": busybox_version,
        "recipe": AGNHOST_RECIPE_VERSION,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def agnhost_entries(
    binary: Path, porter_dir: Path, busybox: list[images_mod.LayerEntry]
) -> list[images_mod.LayerEntry]:
    """The layer: upstream's files (``/agnhost``, ``/agnhost-2``, porter's key pair, ``/uploads``)
    over ``busybox``'s (a shell, ``tar`` and the other applets, users, ``/tmp``)."""
    return [
        *busybox,
        images_mod.LayerEntry("/agnhost", "file", 0o755, source=binary),
        # The entrypoint-tester e2e tests override the entrypoint with this second name.
        images_mod.LayerEntry("/agnhost-2", "symlink", 0o777, target="agnhost"),
        images_mod.LayerEntry("/localhost.crt", "file", 0o644, source=porter_dir / "localhost.crt"),
        images_mod.LayerEntry("/localhost.key", "file", 0o644, source=porter_dir / "localhost.key"),
        images_mod.LayerEntry("/uploads", "dir", 0o755),
    ]


def agnhost_spec(refs: tuple[str, ...], entries: list[images_mod.LayerEntry]) -> images_mod.ImageSpec:
    """The agnhost image: entrypoint ``/agnhost``, default command ``pause`` like upstream's."""
    return images_mod.ImageSpec(ref=refs[0], entries=tuple(entries), entrypoint=("/agnhost",), cmd=("pause",))


def _stamp_info(refs: tuple[str, ...], key: str, archive: Path, image_id: str) -> dict[str, object]:
    return {
        "format": _STAMP_FORMAT,
        "refs": list(refs),
        "key": key,
        "sha256": toolchain.sha256_file(archive),
        "size": archive.stat().st_size,
        "image_id": image_id,
    }


def _verified(stamp: Path, archive: Path, key: str, refs: tuple[str, ...]) -> WorkloadImage | None:
    """The cached image if ``stamp`` names ``key`` and ``refs`` and ``archive`` still verifies."""
    try:
        info = json.loads(stamp.read_text())
        if (
            info.get("format") == _STAMP_FORMAT
            and info.get("key") == key
            and info.get("refs") == list(refs)
            and archive.stat().st_size == info.get("size")
            and toolchain.sha256_file(archive) == info.get("sha256")
        ):
            return WorkloadImage(refs, archive, int(info["size"]))
    except (OSError, ValueError, AttributeError):
        pass
    return None


class Builder:
    """Builds (or finds cached) the workload images under ``<cache>/workloads``."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.cache_dir = cache_dir if cache_dir is not None else toolchain.default_cache_dir()
        self.root = self.cache_dir / "workloads"

    @property
    def archive(self) -> Path:
        return self.root / "images" / "busybox.tar"

    @property
    def stamp(self) -> Path:
        return self.root / "busybox-stamp.json"

    @property
    def agnhost_archive(self) -> Path:
        return self.root / "images" / "agnhost.tar"

    @property
    def agnhost_stamp(self) -> Path:
        return self.root / "agnhost-stamp.json"

    def _steps(self, progress: plan_module.Progress | None) -> steps_mod.Steps:
        return steps_mod.Steps(self.cache_dir / "logs" / "workloads", progress, kind="image")

    def ensure(self, *, progress: plan_module.Progress | None = None) -> tuple[WorkloadImage, ...]:
        """Every workload image (busybox, agnhost), each built unless cached."""
        return (self.ensure_busybox(progress=progress), self.ensure_agnhost(progress=progress))

    def ensure_busybox(self, *, progress: plan_module.Progress | None = None) -> WorkloadImage:
        """Build the busybox image unless the cached one matches the apt candidate; returns it."""
        with fileio.directory_lock(self.root):
            steps = self._steps(progress)
            with steps.step("busybox-verify", str(self.root)):
                version = candidate_version()
                refs = busybox_refs(version)
                image = _verified(self.stamp, self.archive, cache_key(version), refs)
            if image is not None:
                steps.cached("busybox-image", image.refs[0])
                return image
            deb = self._deb(steps, version)
            with steps.step("busybox-image", refs[0]) as log:
                with tempfile.TemporaryDirectory(dir=self.root, prefix=".busybox.") as scratch:
                    entries = self._busybox_entries(steps, deb, Path(scratch))
                    spec = busybox_spec(version, entries)
                    image_id = images_mod.write_docker_archive(spec, self.archive)
                info = _stamp_info(refs, cache_key(version), self.archive, image_id)
                info["deb_version"] = version
                toolchain.write_public(self.stamp, (json.dumps(info, indent=2) + "\n").encode())
                with log.open("a") as handle:
                    handle.write(f"packed {spec.ref} ({info['size']} bytes) -> {self.archive}\n")
            return WorkloadImage(refs, self.archive, self.archive.stat().st_size)

    def ensure_agnhost(self, *, progress: plan_module.Progress | None = None) -> WorkloadImage:
        """Build the agnhost image unless the cached one matches the source tree and busybox; returns it.

        Needs the Kubernetes source tree a toolchain build left in the cache (any version: the
        image is built once per machine and source package).
        """
        with fileio.directory_lock(self.root):
            steps = self._steps(progress)
            with steps.step("agnhost-verify", str(self.root)):
                tree = toolchain.Toolchain(self.cache_dir).source_tree()
                source = tree.path / AGNHOST_PACKAGE
                version = (source / "VERSION").read_text().strip()
                e2e_tag = parse_e2e_agnhost_tag((tree.path / E2E_MANIFEST).read_text())
                refs = agnhost_refs(version, e2e_tag)
                busybox_version = candidate_version()
                key = agnhost_key(tree.source_package, version, busybox_version)
                image = _verified(self.agnhost_stamp, self.agnhost_archive, key, refs)
            if image is not None:
                steps.cached("agnhost-image", ", ".join(image.refs))
                return image
            deb = self._deb(steps, busybox_version)
            with tempfile.TemporaryDirectory(dir=self.root, prefix=".agnhost.") as scratch:
                binary = Path(scratch) / "agnhost"
                detail = f"go build {AGNHOST_PACKAGE} {version} from {tree.path.name} (seconds after a "
                detail += "Kubernetes build, about 1.5 minutes on a cold Go cache)"
                with steps.step("agnhost-build", detail):
                    home = self.cache_dir / "home"
                    home.mkdir(parents=True, exist_ok=True)
                    build = toolchain.go_build(tree.path, AGNHOST_PACKAGE, binary, home=home)
                    # The toolchain's lock: no Kubernetes build rewrites the tree meanwhile.
                    with fileio.directory_lock(self.cache_dir):
                        steps.run(build.argv, cwd=build.cwd, env=build.env)
                with steps.step("agnhost-image", ", ".join(refs)) as log:
                    busybox = self._busybox_entries(steps, deb, Path(scratch) / "busybox")
                    spec = agnhost_spec(refs, agnhost_entries(binary, source / "porter", busybox))
                    image_id = images_mod.write_docker_archive(spec, self.agnhost_archive)
                    info = _stamp_info(refs, key, self.agnhost_archive, image_id)
                    info["source_package"] = tree.source_package
                    toolchain.write_public(self.agnhost_stamp, (json.dumps(info, indent=2) + "\n").encode())
                    with log.open("a") as handle:
                        handle.write(f"packed {spec.ref} ({info['size']} bytes) -> {self.agnhost_archive}\n")
            return WorkloadImage(refs, self.agnhost_archive, self.agnhost_archive.stat().st_size)

    def _busybox_entries(self, steps: steps_mod.Steps, deb: Path, tree: Path) -> list[images_mod.LayerEntry]:
        """Unpack ``deb`` into ``tree`` (inside the current step) and return busybox's layer entries."""
        tree.mkdir(parents=True, exist_ok=True)
        steps.run(["dpkg-deb", "-x", str(deb), str(tree)])
        binary = tree / "bin" / "busybox"
        applets = parse_applets(steps.run([str(binary), "--list-full"], capture=True))
        (tree / "passwd").write_text(USERS)
        (tree / "group").write_text(GROUPS)
        return busybox_entries(binary, applets, tree)

    def _deb(self, steps: steps_mod.Steps, deb_version: str) -> Path:
        """The kept .deb of ``deb_version``, downloaded once."""
        debs = self.root / "debs"
        deb = debs / deb_file_name(deb_version, images_mod.host_arch())
        if deb.is_file():
            steps.cached("busybox-deb", deb.name)
            return deb
        with steps.step("busybox-deb", f"apt-get download {BUSYBOX_PACKAGE}={deb_version}"):
            debs.mkdir(parents=True, exist_ok=True)
            steps.run(["apt-get", "download", f"{BUSYBOX_PACKAGE}={deb_version}"], cwd=debs)
            if not deb.is_file():
                raise WorkloadImageError(f"apt-get download left no {deb.name} in {debs}")
        return deb
