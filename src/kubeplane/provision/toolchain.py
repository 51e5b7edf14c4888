"""The real-component toolchain: Kubernetes binaries and images built from Debian's source.

Owns the version-keyed cache of Kubernetes server binaries (``kube-apiserver``,
``kube-controller-manager``, ``kube-scheduler``, ``kubelet``, ``kube-proxy``, ``kubectl``,
``kubeadm``), the ``pause`` sandbox binary and the docker-archive images packed from them (plus
the etcd image ``kubeadm`` asks for, packed from Debian's etcd), and the pipeline that fills it:

1. ``apt-sources``: a ``deb-src`` twin of every ``deb`` entry the machine already uses, then
   ``apt-get update`` only if apt cannot see the ``kubernetes`` source package yet;
2. ``fetch``: ``apt-get source --download-only kubernetes`` into the cache (tarballs kept and
   checked against the ``.dsc`` checksums, so later runs need no network);
3. ``unpack``: the upstream (orig) tarball, once, shared by every version string;
4. ``build``: the upstream Makefile with Go 1.19, ``CGO_ENABLED=0``, the build tag
   ``dockerless`` (:data:`BUILD_TAGS`) and a GOPATH, Go build cache and HOME inside the cache
   (``KUBE_GIT_VERSION`` for builds with another version string),
   after replacing the tree's vendored ``github.com/modern-go/reflect2`` v1.0.1 with Debian's
   v1.0.2 (:data:`REFLECT2_DEBIAN`): v1.0.1 reads Go runtime internals that changed in Go 1.18,
   and built with Go 1.19 it panics (a nil pointer in ``UnsafeMapType.Key``) wherever a map type
   is first encoded, which ``kubeadm`` does with every config it writes; and after kubeplane's
   one change to the code (:func:`patch_shutdown_close`): a kube-apiserver that is shutting down
   tells its clients to reconnect elsewhere while it still answers;
5. ``pause``: ``build/pause/linux/pause.c`` with ``gcc -Os -static``;
6. ``images``: docker-archive tars named like upstream (:mod:`kubeplane.provision.images`), and
   ``k8s.gcr.io/etcd:<the tag kubeadm asks for>`` from Debian's ``etcd-server`` in
   ``kubeadm-images/`` (checked against ``kubeadm config images list``).

Layout under the cache directory (``$KUBEPLANE_CACHE``, default ``/var/cache/kubeplane``; the paths
the agent reads too are spelled once, in :mod:`kubeplane.config.toolchain_cache`)::

    kubernetes/<version>/bin/<name>          binaries
    kubernetes/<version>/images/<name>.tar   docker-archive images
    kubernetes/<version>/kubeadm-images/     etcd.tar, for kubeadm clusters only
    kubernetes/<version>/stamp.json          version, source package, sha256 + size per artifact
    logs/<version>/<step>.log                one log per step
    src/debian/                              the Debian source package files
    src/kubernetes-<upstream>/               the unpacked tree (shared by all version strings, and
                                             by the agnhost build: :meth:`Toolchain.source_tree`)
    go/, home/                               GOPATH, Go build cache and HOME of the build

An artifact is trusted only if the stamp records it and its size and sha256 still match, so a
corrupt or half-written cache entry is rebuilt, never used. Artifacts are written to a temporary
name and renamed into place. One build runs at a time per cache (an exclusive ``flock``).

Errors: :class:`ToolchainError` (bad version string, cache not built) and
:class:`kubeplane.provision.steps.StepFailed` (a pipeline step failed; names step and log).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubeplane import fileio
from kubeplane import plan as plan_module
from kubeplane.config import toolchain_cache as cache_layout
from kubeplane.provision import images as images_mod
from kubeplane.provision import steps as steps_mod

#: Environment variable that overrides the cache directory (layout: :mod:`kubeplane.config.toolchain_cache`).
CACHE_ENV = cache_layout.CACHE_ENV
DEFAULT_CACHE = cache_layout.DEFAULT_CACHE

#: Binaries built with the upstream Makefile, in build order.
KUBE_BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
    "kubeadm",
)
PAUSE = cache_layout.PAUSE
BINARIES = (*KUBE_BINARIES, PAUSE)
#: Images packed per version; pause keeps the tag kubelet v1.20 uses as its default sandbox.
IMAGES = (PAUSE, "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")
#: Images only kubeadm clusters use (a kubeplane node runs Debian's etcd as a service, not a pod).
KUBEADM_IMAGES = ("etcd",)
REGISTRY = cache_layout.REGISTRY
PAUSE_TAG = cache_layout.PAUSE_TAG

SOURCE_PACKAGE = "kubernetes"
GO_BIN = Path("/usr/lib/go-1.19/bin")
#: 2: binaries built with reflect2 v1.0.2 (format 1's panic in kubeadm), kubeadm and the etcd
#: image added; 3: built with :data:`BUILD_TAGS`; 4: kube-apiserver with
#: :data:`SHUTDOWN_PATCH_MARKER`'s change. An entry of an older format is rebuilt.
STAMP_FORMAT = 4
#: Go build tags of the binaries. ``dockerless`` leaves dockershim out of the kubelet, and with it
#: cAdvisor's docker plugin, which at every kubelet start asks a docker daemon for its root
#: directory five times, a second apart, before the kubelet syncs any pod (cadvisor #3175): 5 s
#: of every node's start. Every kubeplane kubelet talks to containerd over the CRI.
BUILD_TAGS = "dockerless"
#: Debian's source of github.com/modern-go/reflect2 v1.0.2 (golang-github-modern-go-reflect2-dev),
#: and where the Kubernetes tree vendors v1.0.1.
REFLECT2_DEBIAN = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")
REFLECT2_VENDOR = Path("vendor/github.com/modern-go/reflect2")
REFLECT2_PACKAGE = "golang-github-modern-go-reflect2-dev"
#: kubeplane's one change to Kubernetes' code (:func:`patch_shutdown_close`), in the generic API
#: server every kube-apiserver build links: from the moment a graceful shutdown starts, every
#: HTTP/1.x response asks its client to end the connection (``Connection: close``) while the
#: server still answers for ``--shutdown-delay-duration`` (HTTP/2 clients get the shutdown's
#: GOAWAY when the delay ends, as before). Unpatched, the server answers normally during the delay and
#: then closes its idle keep-alive connections, and an HTTP/1.1 client that sends a request on
#: one at that instant loses it (HTTP/1.1 cannot announce the close; RFC 9112 §9.6). Patched, a
#: client that sends anything during the delay leaves on its own and reconnects, through the
#: load balancer, to another API server.
SHUTDOWN_PATCH_FILE = Path("staging/src/k8s.io/apiserver/pkg/server/genericapiserver.go")
SHUTDOWN_PATCH_MARKER = "// kubeplane: close connections from the start of a graceful shutdown"
_SHUTDOWN_SERVE = "s.SecureServingInfo.Serve(s.Handler, s.ShutdownTimeout, internalStopCh)"
_SHUTDOWN_SERVE_PATCHED = (
    "s.SecureServingInfo.Serve(closeOnShutdown(s.Handler, s.readinessStopCh), "
    "s.ShutdownTimeout, internalStopCh)"
)
_SHUTDOWN_CALL = re.compile(r"closeOnShutdown\(s\.Handler(, [^()]*)?\)")
_SHUTDOWN_FILTER = f"""
{SHUTDOWN_PATCH_MARKER}
// (--shutdown-delay-duration): every HTTP/1.x response then carries "Connection: close", so a
// client ends its connection after the answer instead of meeting the close of its idle
// connection when the delay is over. HTTP/2 is left to the shutdown's GOAWAY: sent with the
// first answer of the delay, it would always reach a client while that answer is on its way.
func closeOnShutdown(handler http.Handler, shuttingDown <-chan struct{{}}) http.Handler {{
\treturn http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {{
\t\tif req.ProtoMajor == 1 {{
\t\t\tselect {{
\t\t\tcase <-shuttingDown:
\t\t\t\tw.Header().Set("Connection", "close")
\t\t\tdefault:
\t\t\t}}
\t\t}}
\t\thandler.ServeHTTP(w, req)
\t}})
}}
"""

_VERSION_RE = re.compile(r"^v(\d+\.\d+\.\d+)(-[0-9A-Za-z][0-9A-Za-z.-]*)?$")


class ToolchainError(Exception):
    """A toolchain request cannot be served (bad version string, nothing cached)."""


@dataclasses.dataclass(frozen=True)
class ToolchainPaths:
    """Where the artifacts of one Kubernetes version live (they may not exist yet)."""

    version: str
    root: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / cache_layout.BIN_DIR

    @property
    def images_dir(self) -> Path:
        return self.root / cache_layout.IMAGES_DIR

    @property
    def stamp(self) -> Path:
        return self.root / cache_layout.STAMP_FILE

    def binary(self, name: str) -> Path:
        """Path of binary ``name`` (one of :data:`BINARIES`)."""
        if name not in BINARIES:
            raise ToolchainError(f"unknown binary {name!r}; the toolchain builds {', '.join(BINARIES)}")
        return self.bin_dir / name

    def image(self, name: str) -> Path:
        """Path of the docker-archive of image ``name`` (one of :data:`IMAGES`)."""
        if name not in IMAGES:
            raise ToolchainError(f"unknown image {name!r}; the toolchain packs {', '.join(IMAGES)}")
        return self.images_dir / f"{name}.tar"

    def image_ref(self, name: str) -> str:
        """Upstream reference of image ``name``, e.g. ``k8s.gcr.io/kube-apiserver:v1.20.2``."""
        return image_ref(name, self.version)

    def kubeadm_image(self, name: str) -> Path:
        """Path of the docker-archive of kubeadm-only image ``name`` (one of :data:`KUBEADM_IMAGES`)."""
        if name not in KUBEADM_IMAGES:
            raise ToolchainError(
                f"unknown kubeadm image {name!r}; the toolchain packs {', '.join(KUBEADM_IMAGES)}"
            )
        return self.root / cache_layout.KUBEADM_IMAGES_DIR / f"{name}.tar"

    @property
    def kubeadm_images(self) -> dict[str, Path]:
        """Reference → archive of the kubeadm-only images this version has (none for a Kubernetes
        minor version whose etcd tag :mod:`kubeplane.config.toolchain_cache` does not know)."""
        refs = {name: cache_layout.kubeadm_image_ref(name, self.version) for name in KUBEADM_IMAGES}
        return {ref: self.kubeadm_image(name) for name, ref in refs.items() if ref is not None}

    @property
    def binaries(self) -> dict[str, Path]:
        return {name: self.binary(name) for name in BINARIES}

    @property
    def images(self) -> dict[str, Path]:
        return {name: self.image(name) for name in IMAGES}

    @property
    def image_refs(self) -> dict[str, str]:
        return {name: self.image_ref(name) for name in IMAGES}


@dataclasses.dataclass(frozen=True)
class SourceTree:
    """The unpacked Kubernetes source tree and the Debian source version it was unpacked from."""

    path: Path
    source_package: str


def image_ref(name: str, version: str) -> str:
    """Upstream reference of image ``name`` for Kubernetes ``version``."""
    return cache_layout.image_ref(name, version)


def parse_version(version: str) -> str:
    """The upstream release (``1.20.2``) a version string (``v1.20.2``, ``v1.20.2-kp.1``) builds."""
    match = _VERSION_RE.match(version)
    if match is None:
        raise ToolchainError(
            f"invalid Kubernetes version {version!r}: expected vMAJOR.MINOR.PATCH with an optional "
            "-suffix, e.g. v1.20.2 or v1.20.2-kp.1"
        )
    return match.group(1)


def default_cache_dir() -> Path:
    """``$KUBEPLANE_CACHE`` or ``/var/cache/kubeplane``."""
    return cache_layout.cache_dir()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def upstream_of(source_version: str) -> str:
    """Upstream release inside a Debian source version (``1.20.5+really1.20.2-1.1+deb12u1``)."""
    upstream = source_version.rsplit("-", 1)[0].split(":", 1)[-1]
    return upstream.rsplit("+really", 1)[-1]


@dataclasses.dataclass
class Stamp:
    """What a finished (or partly finished) build of one version recorded about its artifacts."""

    version: str
    source_package: str = ""
    artifacts: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, version: str) -> Stamp:
        """The stamp at ``path``; an empty one if it is missing, unreadable or for another version."""
        try:
            data = json.loads(path.read_text())
            if data.get("format") != STAMP_FORMAT or data.get("version") != version:
                return cls(version)
            return cls(version, str(data.get("source_package", "")), dict(data.get("artifacts", {})))
        except (OSError, ValueError, AttributeError):
            return cls(version)

    def save(self, path: Path) -> None:
        data = {
            "format": STAMP_FORMAT,
            "version": self.version,
            "source_package": self.source_package,
            "artifacts": dict(sorted(self.artifacts.items())),
        }
        write_public(path, (json.dumps(data, indent=2) + "\n").encode())

    def record(self, root: Path, rel: str) -> None:
        path = root / rel
        self.artifacts[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}

    def verified(self, root: Path) -> set[str]:
        """Artifacts whose file still has the recorded size and sha256."""
        good = set()
        for rel, info in self.artifacts.items():
            path = root / rel
            try:
                if path.stat().st_size == info.get("size") and sha256_file(path) == info.get("sha256"):
                    good.add(rel)
            except OSError:
                continue
        return good


def write_public(path: Path, data: bytes) -> None:
    """Write a cache file every user may read (0644), atomically; missing parents are created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_atomic(path, data, mode=fileio.PUBLIC_MODE)


def atomic_copy(src: Path, dest: Path) -> None:
    """Copy an executable into place atomically, 0755 (every user may run the built binaries)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as source, fileio.atomic_open(dest, mode=fileio.EXECUTABLE_MODE) as out:
        shutil.copyfileobj(source, out)


def expected_artifacts(version: str | None = None) -> list[str]:
    """Every artifact a complete build of ``version`` has (the kubeadm images only for a version
    whose etcd tag is known)."""
    found = [f"bin/{name}" for name in BINARIES] + [f"images/{name}.tar" for name in IMAGES]
    if version is not None:
        found += [
            f"{cache_layout.KUBEADM_IMAGES_DIR}/{name}.tar"
            for name in KUBEADM_IMAGES
            if cache_layout.kubeadm_image_ref(name, version) is not None
        ]
    return found


class Toolchain:
    """The version-keyed cache of real Kubernetes components and the pipeline that fills it."""

    def __init__(
        self,
        cache_dir: Path | None = None,
        *,
        apt_dir: Path = Path("/etc/apt"),
        make_command: Sequence[str] = ("make",),
        reflect2_source: Path = REFLECT2_DEBIAN,
    ) -> None:
        self.cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
        self.apt_dir = apt_dir
        self.make_command = tuple(make_command)
        self.reflect2_source = reflect2_source

    # -- queries --------------------------------------------------------------------------

    def paths(self, version: str) -> ToolchainPaths:
        """Where the artifacts of ``version`` live (no check that they exist; see :meth:`ensure`)."""
        parse_version(version)
        return ToolchainPaths(version, cache_layout.version_dir(version, self.cache_dir))

    def versions(self) -> list[str]:
        """Versions that have a stamp in the cache (complete or not)."""
        root = cache_layout.versions_dir(self.cache_dir)
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if (p / cache_layout.STAMP_FILE).is_file())

    def status(self, version: str) -> dict[str, Any]:
        """What the stamp of ``version`` says and which artifacts still verify."""
        paths = self.paths(version)
        stamp = Stamp.load(paths.stamp, version)
        good = stamp.verified(paths.root)
        missing = [rel for rel in expected_artifacts(version) if rel not in good]
        return {
            "version": version,
            "complete": not missing,
            "source_package": stamp.source_package,
            "root": str(paths.root),
            "binaries": {name: str(p) for name, p in paths.binaries.items()},
            "images": {paths.image_ref(name): str(p) for name, p in paths.images.items()},
            "missing": missing,
        }

    def require(self, version: str) -> ToolchainPaths:
        """Paths of ``version`` if its cache entry is complete and verifies; raises otherwise."""
        paths = self.paths(version)
        good = Stamp.load(paths.stamp, version).verified(paths.root)
        missing = [rel for rel in expected_artifacts(version) if rel not in good]
        if missing:
            raise ToolchainError(
                f"toolchain {version} in {paths.root} is missing or corrupt ({', '.join(missing)}); "
                f"run `kubeplane toolchain build --version {version}` (or scripts/setup)"
            )
        return paths

    def source_tree(self) -> SourceTree:
        """The unpacked tree of the fetched source package, which a build leaves in the cache.

        Other builds from the same source (the workload images' ``agnhost``) use it without
        fetching or unpacking anything; raises if no build has unpacked it yet.
        """
        debian_dir = self.cache_dir / "src" / "debian"
        for dsc in sorted(debian_dir.glob(f"{SOURCE_PACKAGE}_*.dsc")):
            orig = _orig_name(dsc)
            tree = _unpacked_tree(self.cache_dir / "src", orig) if orig else None
            if tree is not None:
                return SourceTree(tree, _dsc_field(dsc, "Version"))
        raise ToolchainError(
            f"no unpacked Kubernetes source tree in {self.cache_dir / 'src'}; run `kubeplane toolchain "
            "build` (or scripts/setup) first"
        )

    # -- the pipeline ---------------------------------------------------------------------

    def ensure(self, version: str, *, progress: plan_module.Progress | None = None) -> ToolchainPaths:
        """Build whatever of ``version`` is missing or corrupt; returns its paths when complete."""
        upstream = parse_version(version)
        paths = self.paths(version)
        with fileio.directory_lock(self.cache_dir):
            steps = steps_mod.Steps(self.cache_dir / "logs" / version, progress, kind="toolchain")
            run = _Build(self, steps=steps, paths=paths, upstream=upstream)
            run.execute()
        return paths


class _Build:
    """One run of the pipeline for one version; each step skips what is already good."""

    def __init__(self, toolchain: Toolchain, *, steps: steps_mod.Steps, paths: ToolchainPaths, upstream: str):
        self.tc = toolchain
        self.steps = steps
        self.paths = paths
        self.upstream = upstream
        self.src_dir = toolchain.cache_dir / "src"
        self.debian_dir = self.src_dir / "debian"
        self._tree: Path | None = None

    def execute(self) -> None:
        with self.steps.step("verify", self.paths.root.as_posix()):
            stamp = Stamp.load(self.paths.stamp, self.paths.version)
            good = stamp.verified(self.paths.root)
            stamp.artifacts = {rel: info for rel, info in stamp.artifacts.items() if rel in good}
        if all(rel in good for rel in expected_artifacts(self.paths.version)):
            return
        rebuilt: set[str] = set()
        if any(f"bin/{name}" not in good for name in KUBE_BINARIES):
            self._build(stamp)
            rebuilt.update(KUBE_BINARIES)
        else:
            self.steps.cached("build")
        if f"bin/{PAUSE}" not in good:
            self._pause(stamp)
            rebuilt.add(PAUSE)
        else:
            self.steps.cached("pause")
        todo = [n for n in IMAGES if n in rebuilt or f"images/{n}.tar" not in good]
        if todo:
            self._images(stamp, todo)
        else:
            self.steps.cached("images")
        kubeadm_todo = [
            rel
            for rel in expected_artifacts(self.paths.version)
            if rel.startswith(cache_layout.KUBEADM_IMAGES_DIR)
        ]
        if any(rel not in good for rel in kubeadm_todo) or "kubeadm" in rebuilt:
            self._kubeadm_images(stamp)
        elif kubeadm_todo:
            self.steps.cached("kubeadm images")

    # -- source ---------------------------------------------------------------------------

    def tree(self, stamp: Stamp) -> Path:
        """The unpacked source tree, fetching and unpacking it first if needed."""
        if self._tree is None:
            dsc = self._fetched_dsc()
            if dsc is None:
                self._apt_sources()
                dsc = self._fetch()
            else:
                self.steps.cached("fetch", dsc.name)
            source_version = _dsc_field(dsc, "Version")
            if upstream_of(source_version) != self.upstream:
                raise steps_mod.StepFailed(
                    step="fetch",
                    reason=(
                        f"Debian's {SOURCE_PACKAGE} source package is {source_version} (Kubernetes "
                        f"{upstream_of(source_version)}); it cannot build {self.paths.version}. Ask for "
                        f"v{upstream_of(source_version)} or a v{upstream_of(source_version)}-SUFFIX build"
                    ),
                    log=None,
                )
            stamp.source_package = source_version
            self._tree = self._unpack(dsc)
        return self._tree

    def _fetched_dsc(self) -> Path | None:
        """The cached ``.dsc`` if it and every file it lists are present and match its sha256s."""
        for dsc in sorted(self.debian_dir.glob(f"{SOURCE_PACKAGE}_*.dsc")):
            files = _dsc_files(dsc)
            if files and all(
                (self.debian_dir / name).is_file() and sha256_file(self.debian_dir / name) == digest
                for name, digest in files.items()
            ):
                return dsc
        return None

    def _apt_sources(self) -> None:
        with self.steps.step("apt-sources") as log:
            changed = ensure_deb_src(self.tc.apt_dir)
            with log.open("a") as handle:
                handle.write(f"deb-src entry {'written' if changed else 'already present'}\n")
            known = ""
            if not changed:
                known = self.steps.run(["apt-cache", "showsrc", SOURCE_PACKAGE], capture=True)
            if changed or not known.strip():
                self.steps.run(["apt-get", "update"])

    def _fetch(self) -> Path:
        with self.steps.step("fetch", f"apt-get source {SOURCE_PACKAGE}"):
            if self.debian_dir.exists():
                shutil.rmtree(self.debian_dir)
            self.debian_dir.mkdir(parents=True)
            self.steps.run(
                ["apt-get", "source", "--download-only", SOURCE_PACKAGE],
                cwd=self.debian_dir,
            )
            dsc = self._fetched_dsc()
            if dsc is None:
                raise steps_mod.StepError(
                    f"apt-get source left no complete {SOURCE_PACKAGE}_*.dsc set in {self.debian_dir}"
                )
        return dsc

    def _unpack(self, dsc: Path) -> Path:
        orig_name = _orig_name(dsc)
        if orig_name is None:
            raise steps_mod.StepFailed(step="unpack", reason=f"{dsc} lists no .orig tarball", log=None)
        orig = self.debian_dir / orig_name
        existing = _unpacked_tree(self.src_dir, orig_name)
        if existing is not None:
            self.steps.cached("unpack", existing.name)
            return existing
        with self.steps.step("unpack", orig.name):
            with tarfile.open(orig) as archive:
                top = archive.next()
                if top is None:
                    raise steps_mod.StepError(f"{orig} is empty")
                name = top.name.split("/", 1)[0]
                tree = self.src_dir / name
                staging = Path(tempfile.mkdtemp(dir=self.src_dir, prefix=".unpack-"))
                try:
                    archive.extractall(staging, filter="tar")
                    if tree.exists():
                        shutil.rmtree(tree)
                    (staging / name).rename(tree)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
            (tree / _UNPACKED_MARKER).write_text(orig.name)
        return tree

    # -- build ----------------------------------------------------------------------------

    def _build_env(self, tree: Path) -> dict[str, str]:
        cache = self.tc.cache_dir
        gopath = cache / "go"
        link = gopath / "src" / "k8s.io" / "kubernetes"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink() or Path(os.readlink(link)) != tree:
            link.unlink(missing_ok=True)
            link.symlink_to(tree)
        (cache / "home").mkdir(exist_ok=True)
        env = steps_mod.env_with(
            {
                "PATH": f"{GO_BIN}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
                "CGO_ENABLED": "0",
                "HOME": str(cache / "home"),
                "GOPATH": str(gopath),
                "GOCACHE": str(gopath / "cache"),
                "GOFLAGS": "",
            }
        )
        env.pop("KUBE_GIT_VERSION", None)
        env.pop("KUBE_GIT_VERSION_FILE", None)
        if self.paths.version != f"v{self.upstream}":
            env["KUBE_GIT_VERSION"] = self.paths.version
            env["KUBE_GIT_VERSION_FILE"] = str(self._version_file(tree))
        return env

    def _version_file(self, tree: Path) -> Path:
        """Version variables for hack/lib/version.sh, which ignores ``KUBE_GIT_VERSION`` alone.

        In a ``git archive`` tree the script overwrites ``KUBE_GIT_VERSION`` with the archived
        tag; only a ``KUBE_GIT_VERSION_FILE`` replaces all of its version logic.
        """
        major, minor, _patch = self.upstream.split(".")
        script = tree / "hack" / "lib" / "version.sh"
        text = script.read_text(errors="replace") if script.is_file() else ""
        commit = re.search(r"KUBE_GIT_COMMIT='([0-9a-f]{40})'", text)
        values = {
            "KUBE_GIT_COMMIT": commit.group(1) if commit else "",
            "KUBE_GIT_TREE_STATE": "archive",
            "KUBE_GIT_VERSION": self.paths.version,
            "KUBE_GIT_MAJOR": major,
            "KUBE_GIT_MINOR": minor,
        }
        # parse_version() admits only [0-9A-Za-z.-], so single quotes need no escaping.
        path = self.tc.cache_dir / "src" / f"version-{self.paths.version}.env"
        write_public(path, "".join(f"{key}='{value}'\n" for key, value in values.items()).encode())
        return path

    def _vendor_reflect2(self, tree: Path) -> None:
        """Replace the tree's vendored reflect2 with Debian's v1.0.2 (see the module docstring);
        nothing when it already is. Its go.mod is left out: a vendored package has none."""
        source = self.tc.reflect2_source
        if not source.is_dir():
            raise steps_mod.StepFailed(
                step="build",
                reason=(
                    f"{source} is missing: install Debian's {REFLECT2_PACKAGE} (scripts/setup "
                    "does); the vendored reflect2 v1.0.1 makes binaries built with Go 1.19 panic"
                ),
                log=None,
            )
        wanted = {p.name: p for p in source.iterdir() if p.suffix in (".go", ".s") and p.is_file()}
        vendored = tree / REFLECT2_VENDOR
        present = {p.name: p for p in vendored.iterdir() if p.is_file()} if vendored.is_dir() else {}
        same = set(present) == set(wanted) and all(
            sha256_file(present[name]) == sha256_file(path) for name, path in wanted.items()
        )
        if same:
            return
        vendored.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=vendored.parent, prefix=".reflect2-"))
        for name, path in wanted.items():
            shutil.copy2(path, staging / name)
        if vendored.exists():
            shutil.rmtree(vendored)
        staging.rename(vendored)

    def _build(self, stamp: Stamp) -> None:
        tree = self.tree(stamp)
        self._vendor_reflect2(tree)
        patch_shutdown_close(tree)
        what = " ".join(f"cmd/{name}" for name in KUBE_BINARIES)
        with self.steps.step("build", f"make {len(KUBE_BINARIES)} binaries {self.paths.version}"):
            # hack/lib/golang.sh reads the tags out of GOFLAGS (and adds its own).
            env = {**self._build_env(tree), "GOFLAGS": f"-tags={BUILD_TAGS}"}
            self.steps.run([*self.tc.make_command, f"WHAT={what}"], cwd=tree, env=env)
            for name in KUBE_BINARIES:
                built = tree / "_output" / "bin" / name
                if not built.is_file():
                    raise steps_mod.StepError(f"make finished but {built} does not exist")
                atomic_copy(built, self.paths.binary(name))
            said = self.steps.run([str(self.paths.binary("kube-apiserver")), "--version"], capture=True)
            if said.strip() != f"Kubernetes {self.paths.version}":
                raise steps_mod.StepError(
                    f"kube-apiserver --version printed {said.strip()!r}, "
                    f"expected 'Kubernetes {self.paths.version}'"
                )
            # The panic reflect2 v1.0.1 caused: kubeadm encoding its default configs.
            self.steps.run(
                [str(self.paths.binary("kubeadm")), "config", "print", "init-defaults",
                 "--component-configs", "KubeletConfiguration,KubeProxyConfiguration"],
                capture=True,
            )  # fmt: skip
            for name in KUBE_BINARIES:
                stamp.record(self.paths.root, f"bin/{name}")
            stamp.save(self.paths.stamp)

    def _pause(self, stamp: Stamp) -> None:
        tree = self.tree(stamp)
        source = tree / "build" / "pause" / "linux" / "pause.c"
        with self.steps.step("pause", "gcc -Os -static pause.c"):
            tag = pause_source_version(tree)
            out = self.paths.bin_dir / f".{PAUSE}.build"
            self.paths.bin_dir.mkdir(parents=True, exist_ok=True)
            self.steps.run(["gcc", "-Os", "-static", f"-DVERSION={tag}", "-o", str(out), str(source)])
            os.replace(out, self.paths.binary(PAUSE))
            stamp.record(self.paths.root, f"bin/{PAUSE}")
            stamp.save(self.paths.stamp)

    def _images(self, stamp: Stamp, names: Sequence[str]) -> None:
        with self.steps.step("images", ", ".join(names)) as log:
            for name in names:
                spec = images_mod.component_image(
                    name=name, ref=self.paths.image_ref(name), binary=self.paths.binary(name)
                )
                images_mod.write_docker_archive(spec, self.paths.image(name))
                with log.open("a") as handle:
                    handle.write(f"packed {spec.ref} -> {self.paths.image(name)}\n")
                stamp.record(self.paths.root, f"images/{name}.tar")
            stamp.save(self.paths.stamp)

    def _kubeadm_images(self, stamp: Stamp) -> None:
        with self.steps.step("kubeadm images", ", ".join(KUBEADM_IMAGES)) as log:
            listed = self.steps.run(
                [str(self.paths.binary("kubeadm")), "config", "images", "list",
                 "--kubernetes-version", self.upstream_version()],
                capture=True,
            ).split()  # fmt: skip
            for name, archive in [(n, self.paths.kubeadm_image(n)) for n in KUBEADM_IMAGES]:
                ref = cache_layout.kubeadm_image_ref(name, self.paths.version)
                if ref is None:
                    continue
                if ref not in listed:
                    raise steps_mod.StepError(
                        f"kubeadm {self.paths.version} asks for {', '.join(listed)}, not {ref}; "
                        "update KUBEADM_ETCD_TAGS in kubeplane.config.toolchain_cache"
                    )
                images_mod.write_docker_archive(images_mod.etcd_image(ref), archive)
                with log.open("a") as handle:
                    handle.write(f"packed {ref} -> {archive}\n")
                stamp.record(self.paths.root, f"{cache_layout.KUBEADM_IMAGES_DIR}/{name}.tar")
            stamp.save(self.paths.stamp)

    def upstream_version(self) -> str:
        """``v1.20.2`` for any build of that release (kubeadm's image table knows upstream tags)."""
        return f"v{self.upstream}"


def pause_source_version(tree: Path) -> str:
    """Version token for pause.c: the tree's ``build/pause/Makefile`` TAG, marked as ours.

    pause.c stringifies the ``VERSION`` macro itself, so it must be a bare token, not a C string.
    """
    makefile = tree / "build" / "pause" / "Makefile"
    match = re.search(r"^TAG\s*\??=\s*(\S+)", makefile.read_text(), re.MULTILINE)
    tag = match.group(1) if match else "unknown"
    return f"v{tag}-kubeplane"


_UNPACKED_MARKER = ".kubeplane-unpacked"


def _orig_name(dsc: Path) -> str | None:
    """The upstream (orig) tarball a ``.dsc`` lists."""
    return next((name for name in _dsc_files(dsc) if ".orig.tar." in name), None)


def _unpacked_tree(src_dir: Path, orig_name: str) -> Path | None:
    """The tree under ``src_dir`` whose marker says it was unpacked from ``orig_name``."""
    for tree in sorted(src_dir.glob("kubernetes-*")):
        marker = tree / _UNPACKED_MARKER
        if marker.is_file() and marker.read_text() == orig_name:
            return tree
    return None


@dataclasses.dataclass(frozen=True)
class GoBuild:
    """A command to run: argv, environment and working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


def go_build(tree: Path, package: str, output: Path, *, home: Path) -> GoBuild:
    """The ``go build`` of ``package`` (a directory of ``tree``) into ``output``, offline.

    The build is the one the tree's Makefile does (hack/lib/golang.sh): GOPATH mode in the tree's
    ``_output/local/go`` (vendored dependencies, nothing downloaded), ``CGO_ENABLED=0`` and the
    Makefile's compiler flags and Go build cache, so every package the Kubernetes build already
    compiled is a cache hit and only the package's own code is compiled.
    """
    gopath = tree / "_output" / "local" / "go"
    link = gopath / "src" / "k8s.io" / "kubernetes"
    if not link.is_symlink():
        # What the Makefile's kube::golang::create_gopath_tree makes; missing if make never ran.
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(tree)
    env = steps_mod.env_with(
        {
            "PATH": f"{GO_BIN}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
            "CGO_ENABLED": "0",
            "GO111MODULE": "off",
            "GOFLAGS": "",
            "GOPATH": str(gopath),
            "GOCACHE": str(gopath / "cache"),
            "HOME": str(home),
            # Go takes the working directory from $PWD when it names the same directory: the
            # package is then inside GOPATH (through the link), where vendor/ applies.
            "PWD": str(link),
        }
    )
    argv = [
        str(GO_BIN / "go"),
        "build",
        "-gcflags",
        f"-trimpath={tree}",
        "-asmflags",
        f"-trimpath={tree}",
        "-ldflags",
        "-s -w -buildid=",
        "-tags",
        "selinux,notest",
        "-o",
        str(output),
        f"./{package}",
    ]
    return GoBuild(argv, env, link)


def patch_shutdown_close(tree: Path) -> None:
    """Apply kubeplane's graceful-shutdown change to the tree (:data:`SHUTDOWN_PATCH_FILE`);
    nothing when it is there already, and an earlier form of it (the tree is cached) is replaced.
    A tree whose code no longer has the line it changes fails the build, naming the file: a
    kube-apiserver built without it would lose requests again."""
    path = tree / SHUTDOWN_PATCH_FILE
    try:
        text = path.read_text()
    except OSError as exc:
        raise steps_mod.StepFailed(
            step="build", reason=f"cannot read {SHUTDOWN_PATCH_FILE} to patch it: {exc}", log=None
        ) from exc
    if SHUTDOWN_PATCH_MARKER in text:
        if text.endswith(_SHUTDOWN_FILTER) and _SHUTDOWN_SERVE_PATCHED in text:
            return
        # Appended last, so everything from the marker on is the earlier form; its call wraps
        # s.Handler, whatever else it passed.
        text = _SHUTDOWN_CALL.sub("s.Handler", text[: text.index(SHUTDOWN_PATCH_MARKER)])
    if text.count(_SHUTDOWN_SERVE) != 1 or '"net/http"' not in text:
        raise steps_mod.StepFailed(
            step="build",
            reason=(
                f"{SHUTDOWN_PATCH_FILE} does not serve through {_SHUTDOWN_SERVE!r} exactly once: "
                "kubeplane's kube-apiserver shutdown change does not apply to this source"
            ),
            log=None,
        )
    patched = text.replace(_SHUTDOWN_SERVE, _SHUTDOWN_SERVE_PATCHED).rstrip("\n") + "\n" + _SHUTDOWN_FILTER
    fileio.write_atomic(path, patched, mode=0o644)


def _dsc_field(dsc: Path, field: str) -> str:
    match = re.search(rf"^{field}:\s*(\S+)", dsc.read_text(errors="replace"), re.MULTILINE)
    if match is None:
        raise steps_mod.StepFailed(step="fetch", reason=f"{dsc} has no {field} field", log=None)
    return match.group(1)


def _dsc_files(dsc: Path) -> dict[str, str]:
    """File name → sha256 from a .dsc's ``Checksums-Sha256`` field."""
    files: dict[str, str] = {}
    in_field = False
    for line in dsc.read_text(errors="replace").splitlines():
        if line.startswith("Checksums-Sha256:"):
            in_field = True
            continue
        if in_field and line.startswith(" "):
            digest, _size, name = line.split()
            files[name] = digest
        elif in_field:
            break
    return files


# -- apt sources ---------------------------------------------------------------------------

DEB_SRC_FILE = "kubeplane-deb-src.sources"


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = ""
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if current:
                stanzas.append(current)
            current, key = {}, ""
        elif line.startswith("#"):
            continue
        elif line[0].isspace() and key:
            current[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            current[key] = value.strip()
    return stanzas


def _one_line_entries(text: str) -> list[dict[str, str]]:
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        signed_by = ""
        options = re.match(r"deb\s+\[([^]]*)\]\s+(.*)", line)
        if options:
            for option in options.group(1).split():
                if option.startswith("signed-by="):
                    signed_by = option.split("=", 1)[1]
            fields = options.group(2).split()
        else:
            fields = line.split()[1:]
        if len(fields) >= 3:
            entry = {"types": "deb", "uris": fields[0], "suites": fields[1]}
            entry["components"] = " ".join(fields[2:])
            if signed_by:
                entry["signed-by"] = signed_by
            entries.append(entry)
    return entries


def deb_entries(apt_dir: Path) -> list[dict[str, str]]:
    """Every enabled ``deb`` entry under ``apt_dir`` (deb822 and one-line), keys lower-case.

    Each entry has at least ``types``, ``uris``, ``suites`` and usually ``components`` and
    ``signed-by``; the debootstrap of the checkpointer image takes its mirror from here.
    """
    entries: list[dict[str, str]] = []
    parts = apt_dir / "sources.list.d"
    for path in sorted(parts.glob("*.sources")) if parts.is_dir() else []:
        if path.name == DEB_SRC_FILE:
            continue
        entries += _deb822_stanzas(path.read_text(errors="replace"))
    lists = [apt_dir / "sources.list", *(sorted(parts.glob("*.list")) if parts.is_dir() else [])]
    for path in lists:
        if path.is_file():
            entries += _one_line_entries(path.read_text(errors="replace"))
    return [
        entry
        for entry in entries
        if "deb" in entry.get("types", "").split() and entry.get("enabled", "yes").lower() != "no"
    ]


def deb_src_entries(apt_dir: Path) -> str:
    """deb822 ``deb-src`` stanzas mirroring every enabled ``deb`` entry under ``apt_dir``."""
    parts = apt_dir / "sources.list.d"
    stanzas = []
    for entry in deb_entries(apt_dir):
        lines = [
            "Types: deb-src",
            f"URIs: {entry['uris']}",
            f"Suites: {entry['suites']}",
            f"Components: {entry.get('components', 'main')}",
        ]
        if entry.get("signed-by"):
            lines.append(f"Signed-By: {entry['signed-by']}")
        stanzas.append("\n".join(lines))
    if not stanzas:
        raise steps_mod.StepError(
            f"no enabled 'deb' entry found in {apt_dir}/sources.list or {parts}/*.sources|*.list; "
            "configure a Debian bookworm mirror first"
        )
    return "# Written by kubeplane: source twins of the deb entries, for `apt-get source kubernetes`.\n" + (
        "\n\n".join(stanzas) + "\n"
    )


def ensure_deb_src(apt_dir: Path) -> bool:
    """Write kubeplane's deb-src file under ``apt_dir``; returns True if it changed."""
    target = apt_dir / "sources.list.d" / DEB_SRC_FILE
    content = deb_src_entries(apt_dir)
    if target.is_file() and target.read_text() == content:
        return False
    write_public(target, content.encode())
    return True
