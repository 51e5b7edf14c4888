"""What the agent owns on its machine, so that stopping it removes exactly that and nothing else.

The agent runs at ``--root /`` on a real machine, next to other people's processes, mounts and
containers. Stopping its services (stop, reboot, an apply that restarts them) must leave the
machine as it found it, which rules out finding leftovers by a path prefix or a command line:
at ``/`` a prefix sweep unmounts the root file system, and ``/run/containerd/containerd.sock``
is also the socket of the host's own containerd. Ownership is tracked instead:

- **Processes** the supervisor started are known by PID and process group. What containerd and
  the kubelet start outlives them in two places the agent creates, and only there: the kubelet's
  cgroup root (every pod's processes) and the shim cgroup that containerd's runc runtime is told
  to put its shims in (``ShimCgroup``). :func:`cgroup_members` of those two is the whole set.
- **Mounts**: :class:`MountLedger` records the mount IDs (``/proc/self/mountinfo``'s first
  field, never reused while the mount exists) that exist before the services start. Afterwards
  the mounts the services made are the new IDs at or below the directories the services own
  (the kubelet's root, containerd's root and state). The root mount, a mount that was there
  before, or anything outside those directories is never unmounted.

Cgroups are cgroup v1 hierarchies (these machines run the hybrid layout).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_MOUNTINFO = Path("/proc/self/mountinfo")
_ROOT = Path("/")


def cgroup_hierarchies() -> list[Path]:
    """Mount points of the cgroup v1 hierarchies."""
    found = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup":
                found.append(Path(fields[1]))
    return found


def make_cgroup(name: str) -> None:
    """Create the cgroup ``/name`` in every hierarchy, usable for tasks at once.

    A new cpuset cgroup starts with no CPUs and no memory nodes and refuses tasks (ENOSPC):
    it gets its parent's, as a cgroup with ``cgroup.clone_children`` would.
    """
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / name.strip("/")
        path.mkdir(parents=True, exist_ok=True)
        for setting in ("cpuset.cpus", "cpuset.mems"):
            own, parent = path / setting, path.parent / setting
            if own.exists() and not own.read_text().strip():
                own.write_text(parent.read_text())


def remove_cgroup(path: Path) -> None:
    """rmdir a cgroup and its children deepest first (cgroupfs refuses recursive removal)."""
    if not path.is_dir():
        return
    children = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for child in [*children, path]:
        with contextlib.suppress(OSError):
            child.rmdir()


def cgroup_members(cgroups: Iterable[Path | str]) -> list[int]:
    """PIDs in the given cgroup directories or below them."""
    found: set[int] = set()
    for directory in cgroups:
        base = Path(directory)
        if not base.is_dir():
            continue
        for procs in [base / "cgroup.procs", *base.rglob("cgroup.procs")]:
            with contextlib.suppress(OSError):
                found.update(int(line) for line in procs.read_text().split())
    found.discard(os.getpid())
    return sorted(found)


def cgroup_paths(names: Sequence[str]) -> list[Path]:
    """Every hierarchy's directory of each cgroup ``/name``."""
    return [hierarchy / name.strip("/") for hierarchy in cgroup_hierarchies() for name in names]


def kill_cgroups(names: Sequence[str], *, timeout: float = 10.0) -> list[int]:
    """SIGKILL every process in the cgroups ``names`` until none is left; the PIDs that survived.

    A process is only ever found here because the agent's services put it in one of its own
    cgroups, so nothing outside the node is touched.
    """
    deadline = time.monotonic() + timeout
    paths = cgroup_paths(names)
    while pids := cgroup_members(paths):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            return pids
        time.sleep(0.05)
    return []


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return field.encode().decode("unicode_escape")


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo``: the mount's ID, where it is mounted and its type."""

    id: int
    point: Path
    fstype: str = ""


def mount_table(mountinfo: Path = _MOUNTINFO) -> list[Mount]:
    """The mounts of this mount namespace."""
    found = []
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[0].isdigit():
            # Optional fields end with "-"; the file system type follows it.
            rest = fields[fields.index("-") + 1 :] if "-" in fields[5:] else []
            point = Path(_unescape(fields[4]))
            found.append(Mount(id=int(fields[0]), point=point, fstype=rest[0] if rest else ""))
    return found


def mount_tables(pids: Iterable[int] | None = None, *, proc: Path = Path("/proc")) -> list[list[Mount]]:
    """The mount table of each mount namespace the processes ``pids`` (default: every process)
    are in, each namespace read once."""
    if pids is None:
        pids = [int(entry.name) for entry in proc.iterdir() if entry.name.isdigit()]
    seen: set[tuple[int, int]] = set()
    tables = []
    for pid in pids:
        try:
            ns = os.stat(proc / str(pid) / "ns" / "mnt")
            if (ns.st_ino, ns.st_dev) in seen:
                continue
            table = mount_table(proc / str(pid) / "mountinfo")
        except OSError:  # the process is gone
            continue
        seen.add((ns.st_ino, ns.st_dev))
        tables.append(table)
    return tables


def _within(point: Path, directory: Path) -> bool:
    return point == directory or directory in point.parents


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below ``root``, deepest first (for directories a caller owns whole)."""
    points = {m.point for m in mount_table() if _within(m.point, root)}
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def unmount(point: Path) -> None:
    """Unmount ``point``; detach it lazily when it is busy."""
    if subprocess.run(["umount", str(point)], check=False, capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


class MountLedger:
    """The mounts a node's services made below the directories they own (see the module docstring).

    :meth:`mark` before the services start; :meth:`made` lists, deepest first, the mounts that
    appeared since at or below ``owned``; :meth:`unmount_made` removes them.
    """

    def __init__(self, owned: Sequence[Path], *, mountinfo: Path = _MOUNTINFO) -> None:
        self.owned = tuple(path for path in owned if path != _ROOT)
        self._mountinfo = mountinfo
        self._before: frozenset[int] | None = None

    def mark(self) -> None:
        self._before = frozenset(m.id for m in mount_table(self._mountinfo))

    def made(self) -> list[Path]:
        if self._before is None:
            return []
        points = {
            m.point
            for m in mount_table(self._mountinfo)
            if m.id not in self._before
            and m.point != _ROOT
            and any(_within(m.point, directory) for directory in self.owned)
        }
        return sorted(points, key=lambda p: len(p.parts), reverse=True)

    def unmount_made(self, *, attempts: int = 3) -> list[Path]:
        """Unmount what :meth:`made` lists (a stacked mount may need another round); what is left."""
        for _ in range(attempts):
            points = self.made()
            if not points:
                return []
            for point in points:
                unmount(point)
        return self.made()
