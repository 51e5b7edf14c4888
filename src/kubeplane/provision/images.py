"""Single-layer docker-archive images, written byte-for-byte reproducibly in plain Python.

Owns the image format the toolchain produces (what ``skopeo``, ``ctr images import`` and
``docker load`` read): an outer tar holding ``manifest.json``, one ``<sha256>.json`` image config
and one ``<sha256>/layer.tar``. Every tar member has mtime 0, owner root and sorted order, and
JSON is written with sorted keys, so packing the same files twice gives identical bytes (and
identical image IDs, which keeps containerd from re-importing unchanged images).

Also owns which files go into each Kubernetes image: the component binary at
``/usr/local/bin/<name>`` (``/pause`` for pause), and for ``kube-proxy`` the host's
``iptables``/``ip6tables`` (with their save/restore variants, both the nft and legacy backends,
the xtables extension modules), ``conntrack``, and every shared library ``ldd`` names for them.
Symbolic links are kept as links, including those on the way to a file (``/lib`` →
``usr/lib`` on merged-/usr systems, ``iptables`` → ``/etc/alternatives/iptables`` →
``xtables-nft-multi``), so the host's choice of iptables backend carries into the image.

Errors: :class:`ImageError` (a file the image needs is missing, ``ldd`` unusable).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

#: PATH inside every image; component commands are found by name (``command: [kube-apiserver]``).
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Commands kube-proxy execs in iptables mode.
KUBE_PROXY_COMMANDS = (
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
    "iptables-legacy",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "ip6tables-legacy",
    "ip6tables-legacy-save",
    "ip6tables-legacy-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
    "conntrack",
)
#: Host files that make iptables work like on the host (protocol names for ``-p tcp``).
KUBE_PROXY_FILES = ("/etc/protocols",)
_HOST_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MAX_LINKS = 40
_ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}
_EPOCH = "1970-01-01T00:00:00Z"


class ImageError(Exception):
    """An image cannot be packed (missing input file, unusable ``ldd``)."""


@dataclasses.dataclass(frozen=True)
class LayerEntry:
    """One member of the layer: a file copied from ``source``, a directory or a symlink."""

    path: str
    kind: Literal["file", "dir", "symlink"]
    mode: int = 0o755
    source: Path | None = None
    target: str = ""


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """What to pack: the reference (``k8s.gcr.io/pause:3.2``), the layer's files and the config."""

    ref: str
    entries: tuple[LayerEntry, ...]
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = (f"PATH={IMAGE_PATH}",)


def host_arch() -> str:
    return _ARCHES.get(platform.machine(), platform.machine())


# -- which files go into an image ----------------------------------------------------------


def component_image(*, name: str, ref: str, binary: Path) -> ImageSpec:
    """The image of Kubernetes component ``name`` (``pause`` or a ``kube-*`` binary)."""
    if not binary.is_file():
        raise ImageError(f"cannot pack {ref}: binary {binary} does not exist; build it first")
    if name == "pause":
        return ImageSpec(ref, (LayerEntry("/pause", "file", 0o755, binary),), entrypoint=("/pause",))
    entries = [LayerEntry(f"/usr/local/bin/{name}", "file", 0o755, binary)]
    if name == "kube-proxy":
        entries += kube_proxy_host_entries()
    return ImageSpec(ref, tuple(entries), entrypoint=(f"/usr/local/bin/{name}",))


#: Debian's etcd commands, packed into the etcd image kubeadm's static pod runs.
ETCD_COMMANDS = ("/usr/bin/etcd", "/usr/bin/etcdctl")


def etcd_image(ref: str) -> ImageSpec:
    """The etcd image kubeadm asks for (``k8s.gcr.io/etcd:3.4.13-0``), packed from Debian's
    ``etcd-server`` and ``etcd-client``: ``etcd`` and ``etcdctl`` on ``PATH`` (kubeadm's static pod
    runs ``etcd --...``), the libraries they link, ``/tmp`` and ``/var/lib/etcd``."""
    entries: dict[str, LayerEntry] = {}
    elves = []
    for command in ETCD_COMMANDS:
        if not os.path.isfile(command):
            raise ImageError(
                f"the etcd image needs {command}, which is not installed; install Debian's etcd-server "
                "and etcd-client packages (scripts/setup does)"
            )
        elves.append(add_with_links(command, entries))
    for library in shared_libraries(sorted(elves)):
        add_with_links(library, entries)
    for directory, mode in (("/tmp", 0o1777), ("/var/lib/etcd", 0o700)):  # noqa: S108 - inside the image
        entries.setdefault(directory, LayerEntry(directory, "dir", mode))
    return ImageSpec(ref, tuple(entries.values()), entrypoint=(), cmd=("etcd",))


def kube_proxy_host_entries() -> list[LayerEntry]:
    """The host's iptables/conntrack commands, xtables modules and their libraries as entries."""
    entries: dict[str, LayerEntry] = {}
    search = os.pathsep.join(filter(None, (_HOST_SEARCH_PATH, os.environ.get("PATH"))))
    elves: list[str] = []
    for command in KUBE_PROXY_COMMANDS:
        found = shutil.which(command, path=search)
        if found is None:
            raise ImageError(
                f"kube-proxy image needs {command!r}, which is not installed; install Debian's iptables "
                "and conntrack packages (scripts/setup does)"
            )
        elves.append(add_with_links(found, entries))
    for module_dir in [*sorted(Path("/usr/lib").glob("*/xtables")), Path("/usr/lib/xtables")]:
        if module_dir.is_dir():
            for module in sorted(module_dir.iterdir()):
                elves.append(add_with_links(str(module), entries))
    for extra in KUBE_PROXY_FILES:
        if Path(extra).is_file():
            add_with_links(extra, entries)
    for library in shared_libraries(sorted(set(elves))):
        add_with_links(library, entries)
    # iptables takes its lock in /run; the runtime mounts nothing there unless told to.
    for directory, mode in (("/run", 0o755), ("/tmp", 0o1777)):  # noqa: S108 - paths inside the image
        entries.setdefault(directory, LayerEntry(directory, "dir", mode))
    return list(entries.values())


def add_with_links(path: str, entries: dict[str, LayerEntry]) -> str:
    """Add host ``path`` and every symlink met on the way to it; returns the real file's path."""
    current = path
    for _ in range(_MAX_LINKS):
        parts = PurePosixPath(current).parts[1:]
        walked = PurePosixPath("/")
        for index, part in enumerate(parts):
            candidate = walked / part
            if os.path.islink(candidate):
                target = os.readlink(candidate)
                entries[str(candidate)] = LayerEntry(str(candidate), "symlink", 0o777, target=target)
                # ``walked / "/abs"`` is "/abs", so absolute and relative targets both resolve.
                resolved = PurePosixPath(os.path.normpath(walked / target))
                current = str(resolved.joinpath(*parts[index + 1 :]))
                break
            walked = candidate
        else:
            if not os.path.isfile(walked):
                raise ImageError(f"{path} resolves to {walked}, which is not a regular file")
            mode = os.stat(walked).st_mode & 0o7777
            entries[str(walked)] = LayerEntry(str(walked), "file", mode, Path(walked))
            return str(walked)
    raise ImageError(f"too many symbolic links resolving {path}")


def shared_libraries(files: Sequence[str]) -> list[str]:
    """Every shared library (and the dynamic loader) ``ldd`` lists for ``files``."""
    if not files:
        return []
    try:
        # ldd exits non-zero when one of many files is not dynamic; the listing is still complete.
        out = subprocess.run(["ldd", *files], capture_output=True, text=True, check=False).stdout
    except OSError as exc:
        raise ImageError(f"cannot run ldd to find shared libraries: {exc}") from exc
    return parse_ldd(out)


def parse_ldd(out: str) -> list[str]:
    """Library paths in ``ldd`` output (``libc.so.6 => /lib/.../libc.so.6 (0x...)``, loader lines)."""
    found: set[str] = set()
    for line in out.splitlines():
        words = line.split()
        if "=>" in words:
            index = words.index("=>")
            if index + 1 < len(words) and words[index + 1].startswith("/"):
                found.add(words[index + 1])
        elif words and words[0].startswith("/") and not words[0].endswith(":"):
            found.add(words[0])
    return sorted(found)


# -- the docker-archive format ----------------------------------------------------------------


def _tarinfo(name: str, kind: str, *, mode: int, size: int = 0, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}[kind]
    info.mode = mode
    info.size = size
    info.linkname = target
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def layer_members(entries: Iterable[LayerEntry]) -> list[LayerEntry]:
    """Entries plus their missing parent directories, sorted so parents come first."""
    by_path = {entry.path: entry for entry in entries}
    for path in list(by_path):
        for parent in PurePosixPath(path).parents:
            if str(parent) != "/" and str(parent) not in by_path:
                by_path[str(parent)] = LayerEntry(str(parent), "dir", 0o755)
    return [by_path[path] for path in sorted(by_path)]


def write_layer(entries: Iterable[LayerEntry], dest: io.BufferedIOBase) -> None:
    """Write the layer tar of ``entries`` to ``dest``."""
    with tarfile.open(fileobj=dest, mode="w", format=tarfile.GNU_FORMAT) as layer:
        for entry in layer_members(entries):
            name = entry.path.lstrip("/")
            if entry.kind == "file":
                assert entry.source is not None
                size = entry.source.stat().st_size
                with entry.source.open("rb") as handle:
                    layer.addfile(_tarinfo(name, "file", mode=entry.mode, size=size), handle)
            else:
                layer.addfile(_tarinfo(name, entry.kind, mode=entry.mode, target=entry.target))


def _json_bytes(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def image_config(spec: ImageSpec, diff_id: str) -> dict[str, Any]:
    config: dict[str, Any] = {"Env": list(spec.env), "WorkingDir": "/"}
    if spec.entrypoint:
        config["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        config["Cmd"] = list(spec.cmd)
    return {
        "architecture": host_arch(),
        "os": "linux",
        "created": _EPOCH,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": _EPOCH, "created_by": f"kubeplane toolchain: pack {spec.ref}"}],
    }


def write_docker_archive(spec: ImageSpec, dest: Path) -> str:
    """Write ``spec`` as a docker-archive at ``dest`` (atomically); returns the image ID (config sha256)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as scratch:
        layer_path = Path(scratch) / "layer.tar"
        with layer_path.open("wb") as layer_file:
            write_layer(spec.entries, layer_file)
        digest = hashlib.sha256()
        with layer_path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        diff_id = digest.hexdigest()
        config = _json_bytes(image_config(spec, diff_id))
        config_id = hashlib.sha256(config).hexdigest()
        manifest = _json_bytes(
            [{"Config": f"{config_id}.json", "RepoTags": [spec.ref], "Layers": [f"{diff_id}/layer.tar"]}]
        )
        out_path = Path(scratch) / "image.tar"
        with tarfile.open(out_path, mode="w", format=tarfile.GNU_FORMAT) as archive:
            archive.addfile(_tarinfo(diff_id, "dir", mode=0o755))
            with layer_path.open("rb") as handle:
                info = _tarinfo(f"{diff_id}/layer.tar", "file", mode=0o644, size=layer_path.stat().st_size)
                archive.addfile(info, handle)
            for name, data in ((f"{config_id}.json", config), ("manifest.json", manifest)):
                archive.addfile(_tarinfo(name, "file", mode=0o644, size=len(data)), io.BytesIO(data))
        os.chmod(out_path, 0o644)
        os.replace(out_path, dest)
    return config_id


def read_manifest(archive_path: Path) -> list[dict[str, Any]]:
    """The ``manifest.json`` of a docker-archive (for callers that import or push images)."""
    with tarfile.open(archive_path) as archive:
        member = archive.extractfile("manifest.json")
        if member is None:
            raise ImageError(f"{archive_path} has no manifest.json; it is not a docker-archive")
        data: list[dict[str, Any]] = json.loads(member.read())
        return data
