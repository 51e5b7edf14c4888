"""Local cluster nodes as machines: the agent of each node runs at ``--root /``.

A node of a local cluster is a process tree in its own network namespace (made by
:mod:`kubeplane.provision.netns`), mount namespace and UTS namespace (hostname = node name). In
the mount namespace the node's own directory (``nodes/<node>`` under the cluster directory)
is bind-mounted over each standard path a node uses (:data:`MACHINE_DIRS`; ``/etc/ssl/certs``
starts as a copy of the host's), and a machine ID of its own over ``/etc/machine-id``, its own
``/etc/hosts`` and ``/etc/resolv.conf`` (copies of the host's, made once; the agent writes
``machine.network``'s nameservers and extra host entries there, never into the host's) over
theirs (:data:`MACHINE_FILES`). So its agent, containerd, kubelet and etcd see
``/etc/kubernetes``, ``/var/lib/kubelet``, ``/var/lib/etcd``, ``/run/containerd`` ... exactly as
on a real machine, and the agent runs with its default root, ``/``.

The mount namespace is a slave of the host's: host mounts still propagate in (cgroups, the
toolchain cache, ``/run/netns``), while every mount the node makes (its bind mounts, pod volumes)
stays private to it and is gone when its last process exits. Nothing is mounted on the host.

What it takes from the host: a mount point must exist before something can be mounted on it, so
:func:`prepare` creates any of the standard directories the host lacks (empty; on a Debian host
with containerd and etcd installed most exist) and reports which it created.

Not namespaced, and why: PID (the provisioner finds and stops a node's processes by network
namespace and cgroup membership, which works as it is) and cgroup (kubelet v1.20's cgroupfs
driver on this hybrid v1 layout reads the host's hierarchy; each node's containers are kept
apart by their cgroup root, named from the node's machine ID).

``python -m kubeplane.provision.machine --node-dir DIR --hostname NAME -- COMMAND...`` is the
step that runs inside the new namespaces: it sets the hostname, makes the bind mounts and execs
``COMMAND`` (the agent), keeping its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from kubeplane.agent import owned

#: Directories a node owns, relative to ``/``: each is the node directory's own, bind-mounted.
MACHINE_DIRS = (
    "system",
    "etc/kubernetes",
    "etc/containerd",
    "etc/cni",
    "opt/containerd",
    "run/containerd",
    # wireguard-go's UAPI sockets (a fixed path): each node's own devices.
    "run/wireguard",
    "usr/libexec/kubernetes",
    "var/lib/cni",
    "var/lib/containerd",
    "var/lib/etcd",
    "var/lib/kubelet",
    "var/lib/kubeplane",
    "var/log/containers",
    "var/log/kubeplane",
    "var/log/pods",
    # The places machine.files may write (kubeplane.config.machine_files): the node's own.
    "var/cri",
    "var/local",
    "etc/ssl/certs",
)
#: Machine directories that start as a copy of the host's (symlinks kept), made once per node
#: directory: the node trusts the host's CAs, and what machine.files appends to its CA bundle
#: stays in its own copy.
SEEDED_DIRS = ("etc/ssl/certs", "etc/default")
MACHINE_ID = "etc/machine-id"
#: Files a node owns besides its machine ID, relative to ``/``: its copy of the host's, bind-mounted.
MACHINE_FILES = ("etc/hosts", "etc/resolv.conf")
#: What a kubeadm node (:mod:`kubeplane.provision.kubeadm`) owns besides :data:`MACHINE_DIRS`: the
#: commands installed on it (kubeadm, kubelet, kubectl, crictl, systemctl) in ``/usr/local/sbin``,
#: first on root's ``PATH`` (not ``/usr/local/bin``, where the host's Python may live), its SSH
#: server's configuration, host key and authorized keys, sshd's privilege separation directory,
#: and ``/etc/default`` (``/etc/default/kubelet``: the node's own kubelet flags), which starts as a
#: copy of the host's. Not ``/root``: the checkout running kubeplane may be there.
KUBEADM_DIRS = ("usr/local/sbin", "etc/ssh", "run/sshd", "etc/default")


class MachineError(Exception):
    """A node could not be made into a machine (the message names the path and why)."""


def machine_id(node_dir: Path) -> str:
    """The node's machine ID (32 hex digits), made on first use and kept in its directory."""
    path = node_dir / MACHINE_ID
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(16)
    path.write_text(value + "\n")
    return value


def prepare(node_dir: Path, *, host_root: Path = Path("/"), extra_dirs: Sequence[str] = ()) -> list[Path]:
    """Make the node directory's standard directories (and ``extra_dirs``, e.g.
    :data:`KUBEADM_DIRS`) and the host's mount points; the host directories this created (they
    were missing)."""
    machine_id(node_dir)
    created = []
    for relative in (*MACHINE_DIRS, *extra_dirs):
        own, target = node_dir / relative, host_root / relative
        if relative in SEEDED_DIRS and not own.exists() and target.is_dir():
            shutil.copytree(target, own, symlinks=True)
        own.mkdir(parents=True, exist_ok=True)
        if not target.is_dir():
            if target.exists() or target.is_symlink():
                raise MachineError(
                    f"{target} exists and is not a directory: a node cannot mount its own there"
                )
            target.mkdir(parents=True)
            created.append(target)
    if not (host_root / MACHINE_ID).is_file():
        raise MachineError(f"{host_root / MACHINE_ID} is missing: a node mounts its own machine ID over it")
    for relative in MACHINE_FILES:
        host_file, own = host_root / relative, node_dir / relative
        if not host_file.is_file():
            raise MachineError(f"{host_file} is missing: a node mounts its own {relative} over it")
        if not own.is_file():
            own.write_text(host_file.read_text())
    return created


def _mounted_anywhere() -> set[str]:
    """Mount points in every mount namespace on this machine."""
    return {str(m.point) for table in owned.mount_tables() for m in table}


def remove_host_dirs(paths: Sequence[Path]) -> list[Path]:
    """Remove the mount-point directories :func:`prepare` created, once nothing uses them.

    A directory is kept while it holds anything or while a node of any cluster (any mount
    namespace) still mounts on it: removing it would detach that node's mount. Returns the
    directories kept because they are mounted on.
    """
    mounted = _mounted_anywhere()
    kept = []
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        if str(path) in mounted:
            kept.append(path)
            continue
        with contextlib.suppress(OSError):  # gone already, or not empty: someone put files there
            path.rmdir()
    return kept


def argv(
    *, node_dir: Path, hostname: str, command: Sequence[str], extra_dirs: Sequence[str] = ()
) -> list[str]:
    """The command line that starts ``command`` as the node at ``node_dir`` (see the module
    docstring), with ``extra_dirs`` bind-mounted too."""
    return [
        "unshare",
        "--mount",
        "--uts",
        "--propagation",
        "slave",
        "--",
        sys.executable,
        "-m",
        "kubeplane.provision.machine",
        "--node-dir",
        str(node_dir),
        "--hostname",
        hostname,
        *(f"--extra-dir={relative}" for relative in extra_dirs),
        "--",
        *command,
    ]


def _bind(source: Path, target: Path) -> None:
    result = subprocess.run(
        ["mount", "--bind", str(source), str(target)], check=False, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise MachineError(f"cannot bind-mount {source} over {target}: {result.stderr.strip()}")


def boot(*, node_dir: Path, hostname: str, command: Sequence[str], extra_dirs: Sequence[str] = ()) -> None:
    """Inside the node's new mount and UTS namespaces: hostname, bind mounts, then exec ``command``."""
    unknown = [relative for relative in extra_dirs if relative not in KUBEADM_DIRS]
    if unknown:
        raise MachineError(
            f"--extra-dir {unknown[0]}: a node may own only {', '.join(KUBEADM_DIRS)} besides its "
            "standard directories"
        )
    socket.sethostname(hostname)
    for relative in (*MACHINE_DIRS, *extra_dirs):
        _bind(node_dir / relative, Path("/") / relative)
    for relative in (MACHINE_ID, *MACHINE_FILES):
        _bind(node_dir / relative, Path("/") / relative)
    os.execvp(command[0], list(command))  # noqa: S606 - the agent's argv, from the provisioner


def main(args: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kubeplane.provision.machine", description=__doc__)
    parser.add_argument("--node-dir", required=True, type=Path)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--extra-dir", action="append", default=[], dest="extra_dirs")
    parser.add_argument("command", nargs="+")
    options = parser.parse_args(args)
    try:
        boot(
            node_dir=options.node_dir.resolve(),
            hostname=options.hostname,
            command=options.command,
            extra_dirs=options.extra_dirs,
        )
    except (MachineError, OSError) as exc:
        sys.exit(f"node {options.hostname}: {exc}")


if __name__ == "__main__":
    main()
