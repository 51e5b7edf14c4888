"""Workload images a local cluster serves offline: ``busybox`` from Debian's ``busybox-static``.

Pods of a local cluster pull through the cluster's registry, which holds only what
``cluster create`` pushed; so ``kubectl run --image=busybox`` works without the network only if
the toolchain built a busybox image. It is built here, cached under ``<cache>/workloads``:

1. ``busybox-deb``: ``apt-get download busybox-static`` (the candidate version of the machine's
   apt lists) into ``<cache>/workloads/debs/``. The .deb is kept, so a rebuild never downloads.
2. ``busybox-image``: ``dpkg-deb -x`` the package, ask the static binary for its applets
   (``busybox --list-full``) and pack one layer: ``/bin/busybox``, a symlink to it per applet,
   ``/etc/passwd`` and ``/etc/group`` (root and nobody), ``/tmp`` (1777); default command ``sh``
   like Docker Hub's image. It is tagged ``docker.io/library/busybox:<upstream version>`` and
   ``:latest`` (what ``--image=busybox`` means); the archive carries the first, the registry
   gets both.

The cache key is the package's Debian version plus :data:`RECIPE_VERSION`: a stamp records it
with the archive's sha256, and the image is rebuilt only when the key changes or the archive no
longer verifies. Errors: :class:`WorkloadImageError` (package unknown to apt) and
:class:`kubeplane.provision.steps.StepFailed` (download, extraction or packing failed).
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

    def ensure_busybox(self, *, progress: plan_module.Progress | None = None) -> WorkloadImage:
        """Build the busybox image unless the cached one matches the apt candidate; returns it."""
        with fileio.directory_lock(self.root):
            steps = steps_mod.Steps(self.cache_dir / "logs" / "workloads", progress, kind="image")
            with steps.step("busybox-verify", str(self.root)):
                version = candidate_version()
                image = self._verified(version)
            if image is not None:
                steps.cached("busybox-image", image.refs[0])
                return image
            deb = self._deb(steps, version)
            with steps.step("busybox-image", busybox_refs(version)[0]) as log:
                with tempfile.TemporaryDirectory(dir=self.root, prefix=".busybox.") as scratch:
                    tree = Path(scratch)
                    steps.run(["dpkg-deb", "-x", str(deb), str(tree)])
                    binary = tree / "bin" / "busybox"
                    applets = parse_applets(steps.run([str(binary), "--list-full"], capture=True))
                    (tree / "passwd").write_text(USERS)
                    (tree / "group").write_text(GROUPS)
                    spec = busybox_spec(version, busybox_entries(binary, applets, tree))
                    image_id = images_mod.write_docker_archive(spec, self.archive)
                size = self.archive.stat().st_size
                info: dict[str, object] = {
                    "format": _STAMP_FORMAT,
                    "refs": list(busybox_refs(version)),
                    "key": cache_key(version),
                    "deb_version": version,
                    "sha256": toolchain.sha256_file(self.archive),
                    "size": size,
                    "image_id": image_id,
                }
                toolchain.write_public(self.stamp, (json.dumps(info, indent=2) + "\n").encode())
                with log.open("a") as handle:
                    handle.write(
                        f"packed {spec.ref} ({len(applets)} applets, {size} bytes) -> {self.archive}\n"
                    )
            return WorkloadImage(busybox_refs(version), self.archive, size)

    def _verified(self, deb_version: str) -> WorkloadImage | None:
        """The cached image if its stamp names ``deb_version``'s key and the archive verifies."""
        try:
            info = json.loads(self.stamp.read_text())
            if (
                info.get("format") == _STAMP_FORMAT
                and info.get("key") == cache_key(deb_version)
                and self.archive.stat().st_size == info.get("size")
                and toolchain.sha256_file(self.archive) == info.get("sha256")
            ):
                return WorkloadImage(busybox_refs(deb_version), self.archive, int(info["size"]))
        except (OSError, ValueError, AttributeError):
            pass
        return None

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
