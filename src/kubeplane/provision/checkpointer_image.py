"""The ``kubeplane/pod-checkpointer`` container image: a Debian minbase rootfs with Python.

Owns how the image of :mod:`kubeplane.checkpointer` is built and cached:

1. ``rootfs``: ``debootstrap --variant=minbase --include=python3,python3-yaml bookworm`` from the
   Debian mirror the machine's apt sources already use, then stripped of what a container never
   reads (apt lists and caches, documentation except copyright files, man/info pages, locales,
   logs). The result is cached under ``<cache>/checkpointer/rootfs-<key>/``, where the key is a
   hash of everything that shaped it (suite, variant, packages, mirror, recipe version): a
   rebuild with the same inputs reuses it, and a changed input builds a new one beside it.
2. ``image``: the rootfs plus the checkpointer's sources (``kubeplane/__init__.py`` and
   ``kubeplane/checkpointer/*.py``, which import only the standard library and PyYAML) in
   Debian's ``dist-packages``, packed by :func:`kubeplane.provision.images.write_docker_archive`
   as ``kubeplane/pod-checkpointer:<kubeplane version>`` with entrypoint
   ``python3 -m kubeplane.checkpointer``. A stamp records the archive's sha256 and the hash of
   the rootfs key plus the sources it was packed from, so the warm path is one hash of the
   sources and one of the archive.

Why debootstrap rather than copying the host's Python: the image must not depend on what the
build machine happens to have installed (the venv's packages, its Python version), and Debian's
``python3-yaml`` is exactly the one dependency the checkpointer has.

Errors: :class:`CheckpointerImageError` (no mirror, cache not built) and
:class:`kubeplane.provision.steps.StepFailed` (debootstrap or packing failed; names the log).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

import kubeplane
from kubeplane import fileio
from kubeplane import plan as plan_module
from kubeplane.provision import images as images_mod
from kubeplane.provision import steps as steps_mod
from kubeplane.provision import toolchain

SUITE = "bookworm"
VARIANT = "minbase"
PACKAGES = ("python3", "python3-yaml")
#: Bump when the strip list or the layout changes, so cached rootfs trees are rebuilt.
RECIPE_VERSION = 1
IMAGE_NAME = "kubeplane/pod-checkpointer"
PYTHON_PATH = PurePosixPath("/usr/lib/python3/dist-packages")
ENTRYPOINT = ("/usr/bin/python3", "-m", "kubeplane.checkpointer")

# Relative to the rootfs; globs. Nothing here is read by python3 at run time.
_STRIP = (
    "var/lib/apt/lists/*",
    "var/cache/apt/*",
    "var/cache/debconf/*-old",
    "var/log/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*",
    "usr/share/lintian/*",
    "usr/share/bug/*",
)
_COMPLETE_MARKER = ".kubeplane-rootfs.json"
_STAMP_FORMAT = 1


class CheckpointerImageError(Exception):
    """The checkpointer image cannot be built or is not cached."""


@dataclasses.dataclass(frozen=True)
class CheckpointerImage:
    """A packed image: its reference, archive path and size."""

    ref: str
    archive: Path
    size: int


def image_ref(version: str = kubeplane.__version__) -> str:
    """``kubeplane/pod-checkpointer:<version>``."""
    return f"{IMAGE_NAME}:{version}"


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The URI of the first enabled ``deb`` entry for suite ``bookworm`` in the apt sources."""
    for entry in toolchain.deb_entries(apt_dir):
        if SUITE in entry.get("suites", "").split():
            return entry["uris"].split()[0]
    raise CheckpointerImageError(
        f"no enabled 'deb' entry for Debian {SUITE} in {apt_dir}/sources.list or "
        f"{apt_dir}/sources.list.d/; debootstrap needs a {SUITE} mirror: configure one first"
    )


def rootfs_key(mirror: str) -> str:
    """Hash of every input that shapes the rootfs."""
    inputs = {
        "suite": SUITE,
        "variant": VARIANT,
        "packages": PACKAGES,
        "mirror": mirror,
        "recipe": RECIPE_VERSION,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def source_files(package_root: Path | None = None) -> dict[PurePosixPath, Path]:
    """Image path → host path of every Python file the checkpointer needs."""
    root = package_root if package_root is not None else Path(kubeplane.__file__).parent
    found = {PYTHON_PATH / "kubeplane" / "__init__.py": root / "__init__.py"}
    for path in sorted((root / "checkpointer").glob("*.py")):
        found[PYTHON_PATH / "kubeplane" / "checkpointer" / path.name] = path
    return found


def _sources_hash(files: dict[PurePosixPath, Path], key: str) -> str:
    digest = hashlib.sha256(key.encode())
    for image_path, host_path in sorted(files.items()):
        digest.update(str(image_path).encode() + b"\0" + host_path.read_bytes() + b"\0")
    return digest.hexdigest()


class Builder:
    """Builds (or finds cached) the rootfs and the image under ``<cache>/checkpointer``."""

    def __init__(self, cache_dir: Path | None = None, *, apt_dir: Path = Path("/etc/apt")) -> None:
        self.cache_dir = cache_dir if cache_dir is not None else toolchain.default_cache_dir()
        self.apt_dir = apt_dir
        self.root = self.cache_dir / "checkpointer"

    @property
    def archive(self) -> Path:
        return self.root / "images" / f"pod-checkpointer-{kubeplane.__version__}.tar"

    @property
    def stamp(self) -> Path:
        return self.root / "stamp.json"

    def rootfs_dir(self, mirror: str) -> Path:
        return self.root / f"rootfs-{rootfs_key(mirror)}"

    def require(self) -> CheckpointerImage:
        """The cached image if it is up to date with the sources and verifies; raises otherwise."""
        image = self._verified(self._expected_hash())
        if image is None:
            raise CheckpointerImageError(
                f"the pod-checkpointer image in {self.root} is missing, corrupt or older than the "
                "sources; build it with kubeplane.provision.checkpointer_image.Builder().ensure()"
            )
        return image

    def ensure(self, *, progress: plan_module.Progress | None = None) -> CheckpointerImage:
        """Build whatever is missing or stale; returns the packed image."""
        with fileio.directory_lock(self.root):
            steps = steps_mod.Steps(self.cache_dir / "logs" / "checkpointer", progress, kind="image")
            with steps.step("checkpointer-verify", str(self.root)):
                mirror = debian_mirror(self.apt_dir)
                expected = self._expected_hash(mirror)
                image = self._verified(expected)
            if image is not None:
                steps.cached("checkpointer-image", image.ref)
                return image
            rootfs = self._rootfs(steps, mirror)
            with steps.step("checkpointer-image", image_ref()) as log:
                spec = image_spec(rootfs, source_files())
                image_id = images_mod.write_docker_archive(spec, self.archive)
                size = self.archive.stat().st_size
                info: dict[str, object] = {
                    "format": _STAMP_FORMAT,
                    "ref": spec.ref,
                    "inputs": expected,
                    "sha256": toolchain.sha256_file(self.archive),
                    "size": size,
                    "image_id": image_id,
                }
                toolchain.write_public(self.stamp, (json.dumps(info, indent=2) + "\n").encode())
                with log.open("a") as handle:
                    handle.write(f"packed {spec.ref} ({size} bytes) -> {self.archive}\n")
            return CheckpointerImage(spec.ref, self.archive, size)

    def _expected_hash(self, mirror: str | None = None) -> str:
        return _sources_hash(source_files(), rootfs_key(mirror or debian_mirror(self.apt_dir)))

    def _verified(self, expected: str) -> CheckpointerImage | None:
        try:
            info = json.loads(self.stamp.read_text())
            if (
                info.get("format") == _STAMP_FORMAT
                and info.get("inputs") == expected
                and info.get("ref") == image_ref()
                and self.archive.stat().st_size == info.get("size")
                and toolchain.sha256_file(self.archive) == info.get("sha256")
            ):
                return CheckpointerImage(str(info["ref"]), self.archive, int(info["size"]))
        except (OSError, ValueError, AttributeError):
            pass
        return None

    def _rootfs(self, steps: steps_mod.Steps, mirror: str) -> Path:
        target = self.rootfs_dir(mirror)
        if (target / _COMPLETE_MARKER).is_file():
            steps.cached("checkpointer-rootfs", target.name)
            return target
        staging = target.with_name(f".{target.name}.building")
        with steps.step("checkpointer-rootfs", f"debootstrap {SUITE} from {mirror}") as log:
            # debootstrap leaves device nodes and mounts nothing in minbase; a leftover from an
            # interrupted run is simply discarded.
            if staging.exists():
                shutil.rmtree(staging)
            staging.parent.mkdir(parents=True, exist_ok=True)
            steps.run(
                [
                    "debootstrap",
                    f"--variant={VARIANT}",
                    f"--include={','.join(PACKAGES)}",
                    SUITE,
                    str(staging),
                    mirror,
                ]
            )
            removed = strip_rootfs(staging)
            with log.open("a") as handle:
                handle.write(f"stripped {removed} bytes\n")
            (staging / _COMPLETE_MARKER).write_text(
                json.dumps({"suite": SUITE, "packages": PACKAGES, "mirror": mirror}) + "\n"
            )
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        return target


def strip_rootfs(rootfs: Path) -> int:
    """Delete what a container never reads; returns the number of bytes freed."""
    freed = 0
    doomed: list[Path] = [path for pattern in _STRIP for path in rootfs.glob(pattern)]
    # Documentation goes, except each package's copyright file (its licence terms).
    doc = rootfs / "usr" / "share" / "doc"
    if doc.is_dir():
        doomed += [p for p in doc.glob("*/*") if p.name != "copyright"]
    for path in doomed:
        if path.is_dir() and not path.is_symlink():
            freed += sum(p.lstat().st_size for p in path.rglob("*"))
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            freed += path.lstat().st_size
            path.unlink()
    return freed


def rootfs_entries(rootfs: Path) -> list[images_mod.LayerEntry]:
    """Layer entries for every directory, regular file and symlink of ``rootfs``.

    Device nodes, FIFOs and sockets are left out: the container runtime provides ``/dev``.
    """
    entries: list[images_mod.LayerEntry] = []
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in sorted([*dirnames, *filenames]):
            host = Path(dirpath) / name
            rel = "/" + host.relative_to(rootfs).as_posix()
            if rel == f"/{_COMPLETE_MARKER}":
                continue
            info = host.lstat()
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                entries.append(images_mod.LayerEntry(rel, "symlink", 0o777, target=os.readlink(host)))
            elif stat.S_ISDIR(info.st_mode):
                entries.append(images_mod.LayerEntry(rel, "dir", mode))
            elif stat.S_ISREG(info.st_mode):
                entries.append(images_mod.LayerEntry(rel, "file", mode, source=host))
    return entries


def image_spec(rootfs: Path, files: dict[PurePosixPath, Path]) -> images_mod.ImageSpec:
    """The image: ``rootfs`` plus the checkpointer sources at their ``dist-packages`` paths."""
    entries = {entry.path: entry for entry in rootfs_entries(rootfs)}
    for image_path, host_path in files.items():
        entries[str(image_path)] = images_mod.LayerEntry(str(image_path), "file", 0o644, source=host_path)
    return images_mod.ImageSpec(
        ref=image_ref(),
        entries=tuple(entries.values()),
        entrypoint=ENTRYPOINT,
        env=(f"PATH={images_mod.IMAGE_PATH}", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"),
    )
