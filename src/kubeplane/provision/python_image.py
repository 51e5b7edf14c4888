"""kubeplane's own Python container images: one Debian rootfs with Python, one recipe per image.

Two parts of kubeplane run as containers in a cluster, each from an image the toolchain builds:
the pod-checkpointer (:mod:`kubeplane.provision.checkpointer_image`) and the cluster DNS add-on
(:mod:`kubeplane.provision.dns_image`). Both are Debian's ``python3`` plus a few of its packaged
libraries plus the kubeplane modules the program imports, so they share this builder:

1. ``python-rootfs``: ``debootstrap --variant=minbase --include=<PACKAGES> bookworm`` from the
   Debian mirror the machine's apt sources already use, then stripped of what a container never
   reads (apt lists and caches, documentation except copyright files, man/info pages, locales,
   logs, httpx's command line client's libraries, Python's test suite and pydoc topics, iconv
   modules, perl). One rootfs serves every recipe (one debootstrap per machine, not per image); it is
   cached under ``<cache>/python-images/rootfs-<key>/``, where the key is a hash of everything
   that shaped it (suite, variant, package list, mirror, :data:`RECIPE_VERSION`): the same inputs
   reuse it, a changed input builds a new one beside it.
2. ``<name>-image``: the rootfs plus the recipe's *import closure* in Debian's ``dist-packages``:
   every module of the recipe's package and every ``kubeplane`` module those import, transitively,
   with their packages' ``__init__.py`` (found by reading the sources' import statements, so the
   builder never imports the program, nor its libraries). Packed by
   :func:`kubeplane.provision.images.write_docker_archive` as ``<repository>:<kubeplane version>``
   with the recipe's entrypoint into ``<cache>/python-images/images/<name>-<version>.tar``. A stamp
   per recipe records the archive's sha256 and the hash of the rootfs key plus the sources it was
   packed from, so the warm path is one hash of the sources and one of the archive.

Why debootstrap rather than the host's Python: the images must not depend on what the build
machine happens to have installed (the venv's packages, its Python version); Debian's packages
(``python3-yaml``, ``python3-dnspython``, ``python3-httpx``) are exactly the dependencies the
programs declare, at the versions Debian maintains.

Errors: :class:`PythonImageError` (no mirror, image not built, a module of the closure missing)
and :class:`kubeplane.provision.steps.StepFailed` (debootstrap or packing failed; names the log).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path, PurePosixPath

import kubeplane
from kubeplane import fileio
from kubeplane import plan as plan_module
from kubeplane.provision import images as images_mod
from kubeplane.provision import steps as steps_mod
from kubeplane.provision import toolchain

SUITE = "bookworm"
VARIANT = "minbase"
#: Debian packages of the shared rootfs: Python and every library a recipe's closure imports.
PACKAGES = ("python3", "python3-yaml", "python3-dnspython", "python3-httpx")
#: Bump when the strip list or the layout changes, so cached rootfs trees are rebuilt.
RECIPE_VERSION = 3
PYTHON_PATH = PurePosixPath("/usr/lib/python3/dist-packages")
#: Below the cache directory.
CACHE_SUBDIR = "python-images"
ENV = (f"PATH={images_mod.IMAGE_PATH}", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")

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
    # httpx's command line client and what only it imports (httpx itself runs without them).
    "usr/lib/python3/dist-packages/click",
    "usr/lib/python3/dist-packages/markdown_it",
    "usr/lib/python3/dist-packages/mdurl",
    "usr/lib/python3/dist-packages/pygments",
    "usr/lib/python3/dist-packages/rich",
    # The interpreter's own test suite and pydoc's topics; glibc's iconv modules (Python's codecs
    # are its own); perl, which only dpkg's and debconf's scripts run.
    "usr/lib/python3.*/test",
    "usr/lib/python3.*/pydoc_data",
    "usr/lib/*-linux-gnu/gconv",
    "usr/lib/*-linux-gnu/perl-base",
    "usr/bin/perl*",
    "usr/share/perl5",
)
_COMPLETE_MARKER = ".kubeplane-rootfs.json"
_STAMP_FORMAT = 1


class PythonImageError(Exception):
    """A Python image cannot be built or is not cached."""


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One image: ``repository:<kubeplane version>`` running ``entrypoint`` with ``package``'s closure.

    ``name`` names its archive, stamp and build steps; ``package`` is the dotted kubeplane package
    whose modules (all of them) are the roots of the import closure.
    """

    name: str
    repository: str
    package: str
    entrypoint: tuple[str, ...]

    def ref(self, version: str = kubeplane.__version__) -> str:
        """``<repository>:<version>``."""
        return f"{self.repository}:{version}"


@dataclasses.dataclass(frozen=True)
class PythonImage:
    """A packed image: its reference, archive path and size."""

    ref: str
    archive: Path
    size: int


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The URI of the first enabled ``deb`` entry for suite ``bookworm`` in the apt sources."""
    for entry in toolchain.deb_entries(apt_dir):
        if SUITE in entry.get("suites", "").split():
            return entry["uris"].split()[0]
    raise PythonImageError(
        f"no enabled 'deb' entry for Debian {SUITE} in {apt_dir}/sources.list or "
        f"{apt_dir}/sources.list.d/; debootstrap needs a {SUITE} mirror: configure one first"
    )


def rootfs_key(mirror: str, packages: tuple[str, ...] = PACKAGES) -> str:
    """Hash of every input that shapes the rootfs."""
    inputs = {
        "suite": SUITE,
        "variant": VARIANT,
        "packages": packages,
        "mirror": mirror,
        "recipe": RECIPE_VERSION,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


# -- the import closure -------------------------------------------------------------------------


def _module_file(root: Path, module: str) -> Path | None:
    """The source of kubeplane module ``module`` below ``root`` (the directory holding ``kubeplane``)."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(root: Path, path: Path) -> set[str]:
    """Names ``path`` imports: ``from a import b`` gives ``a`` and, if it is a module, ``a.b``.

    kubeplane imports absolutely; a relative import is refused rather than guessed at.
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level or not node.module:
                raise PythonImageError(
                    f"{path}:{node.lineno}: relative import; the image builder needs absolute ones"
                )
            names.add(node.module)
            names.update(
                f"{node.module}.{a.name}" for a in node.names if _module_file(root, f"{node.module}.{a.name}")
            )
    return names


def import_closure(package: str, source_root: Path | None = None) -> tuple[dict[str, Path], set[str]]:
    """The kubeplane modules reachable from every module of ``package``, and the third-party names.

    Returns module name → source file (packages as their ``__init__.py``; every parent package of a
    module is in it, as Python runs it before the module) and the top-level names of the
    non-standard-library imports met on the way (what the rootfs must provide).
    """
    root = source_root if source_root is not None else Path(kubeplane.__file__).parent.parent
    start = _module_file(root, package)
    if start is None or start.name != "__init__.py":
        raise PythonImageError(f"{package} is not a package under {root}")
    todo = [package] + [
        f"{package}.{p.stem}" for p in sorted(start.parent.glob("*.py")) if p.stem != "__init__"
    ]
    found: dict[str, Path] = {}
    third_party: set[str] = set()
    while todo:
        module = todo.pop()
        if module in found:
            continue
        path = _module_file(root, module)
        if path is None:
            raise PythonImageError(
                f"{module} (imported on the way from {package}) has no source under {root}"
            )
        found[module] = path
        parts = module.split(".")
        todo += [".".join(parts[:n]) for n in range(1, len(parts))]
        for name in _imports(root, path):
            top = name.split(".")[0]
            if top == "kubeplane":
                # ``from kubeplane.x import y``: y may be a name in x, not a module of its own.
                todo += [n for n in (name, name.rpartition(".")[0]) if n and _module_file(root, n)]
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    return found, third_party


def closure_files(package: str, source_root: Path | None = None) -> dict[PurePosixPath, Path]:
    """Image path (in ``dist-packages``) → host path of every file of ``package``'s import closure."""
    modules, _ = import_closure(package, source_root)
    root = source_root if source_root is not None else Path(kubeplane.__file__).parent.parent
    return {PYTHON_PATH / path.relative_to(root).as_posix(): path for path in sorted(modules.values())}


def _sources_hash(files: dict[PurePosixPath, Path], key: str) -> str:
    digest = hashlib.sha256(key.encode())
    for image_path, host_path in sorted(files.items()):
        digest.update(str(image_path).encode() + b"\0" + host_path.read_bytes() + b"\0")
    return digest.hexdigest()


# -- the image ----------------------------------------------------------------------------------


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


def image_spec(recipe: Recipe, rootfs: Path, files: dict[PurePosixPath, Path]) -> images_mod.ImageSpec:
    """``recipe``'s image: ``rootfs`` plus ``files`` (its closure) at their ``dist-packages`` paths."""
    entries = {entry.path: entry for entry in rootfs_entries(rootfs)}
    for image_path, host_path in files.items():
        entries[str(image_path)] = images_mod.LayerEntry(str(image_path), "file", 0o644, source=host_path)
    return images_mod.ImageSpec(
        ref=recipe.ref(), entries=tuple(entries.values()), entrypoint=recipe.entrypoint, env=ENV
    )


class Builder:
    """Builds (or finds cached) ``recipe``'s image on the shared rootfs under ``<cache>/python-images``."""

    def __init__(
        self, recipe: Recipe, cache_dir: Path | None = None, *, apt_dir: Path = Path("/etc/apt")
    ) -> None:
        self.recipe = recipe
        self.cache_dir = cache_dir if cache_dir is not None else toolchain.default_cache_dir()
        self.apt_dir = apt_dir
        self.root = self.cache_dir / CACHE_SUBDIR

    @property
    def archive(self) -> Path:
        return self.root / "images" / f"{self.recipe.name}-{kubeplane.__version__}.tar"

    @property
    def stamp(self) -> Path:
        return self.root / f"{self.recipe.name}-stamp.json"

    def rootfs_dir(self, mirror: str) -> Path:
        return self.root / f"rootfs-{rootfs_key(mirror)}"

    def require(self) -> PythonImage:
        """The cached image if it is up to date with the sources and verifies; raises otherwise."""
        image = self._verified(self._expected_hash())
        if image is None:
            raise PythonImageError(
                f"the {self.recipe.ref()} image in {self.root} is missing, corrupt or older than the "
                "sources; build it with `kubeplane toolchain build --with-images` (or scripts/setup)"
            )
        return image

    def ensure(self, *, progress: plan_module.Progress | None = None) -> PythonImage:
        """Build whatever is missing or stale (the rootfs, the image); returns the packed image."""
        name = self.recipe.name
        with fileio.directory_lock(self.root):
            steps = steps_mod.Steps(self.cache_dir / "logs" / CACHE_SUBDIR, progress, kind="image")
            with steps.step(f"{name}-verify", str(self.root)):
                mirror = debian_mirror(self.apt_dir)
                expected = self._expected_hash(mirror)
                image = self._verified(expected)
            if image is not None:
                steps.cached(f"{name}-image", image.ref)
                return image
            rootfs = self._rootfs(steps, mirror)
            with steps.step(f"{name}-image", self.recipe.ref()) as log:
                files = closure_files(self.recipe.package)
                spec = image_spec(self.recipe, rootfs, files)
                image_id = images_mod.write_docker_archive(spec, self.archive)
                size = self.archive.stat().st_size
                info: dict[str, object] = {
                    "format": _STAMP_FORMAT,
                    "ref": spec.ref,
                    "inputs": expected,
                    "sha256": toolchain.sha256_file(self.archive),
                    "size": size,
                    "image_id": image_id,
                    "modules": sorted(str(path) for path in files),
                }
                toolchain.write_public(self.stamp, (json.dumps(info, indent=2) + "\n").encode())
                with log.open("a") as handle:
                    handle.write(
                        f"packed {spec.ref} ({len(files)} modules, {size} bytes) -> {self.archive}\n"
                    )
            return PythonImage(spec.ref, self.archive, size)

    def _expected_hash(self, mirror: str | None = None) -> str:
        files = closure_files(self.recipe.package)
        return _sources_hash(files, rootfs_key(mirror or debian_mirror(self.apt_dir)))

    def _verified(self, expected: str) -> PythonImage | None:
        try:
            info = json.loads(self.stamp.read_text())
            if (
                info.get("format") == _STAMP_FORMAT
                and info.get("inputs") == expected
                and info.get("ref") == self.recipe.ref()
                and self.archive.stat().st_size == info.get("size")
                and toolchain.sha256_file(self.archive) == info.get("sha256")
            ):
                return PythonImage(str(info["ref"]), self.archive, int(info["size"]))
        except (OSError, ValueError, AttributeError):
            pass
        return None

    def _rootfs(self, steps: steps_mod.Steps, mirror: str) -> Path:
        target = self.rootfs_dir(mirror)
        if (target / _COMPLETE_MARKER).is_file():
            steps.cached("python-rootfs", target.name)
            return target
        staging = target.with_name(f".{target.name}.building")
        with steps.step(
            "python-rootfs", f"debootstrap {SUITE} with {', '.join(PACKAGES)} from {mirror}"
        ) as log:
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
