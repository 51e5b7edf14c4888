"""What a node's agent may unmount when it stops: only the mounts its services made."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplane.agent import owned

pytestmark = pytest.mark.unit

KUBELET = Path("/var/lib/kubelet")
CONTAINERD = Path("/var/lib/containerd")


def _line(mount_id: int, point: str) -> str:
    return f"{mount_id} 1 0:1 / {point} rw,relatime shared:1 - ext4 /dev/sda1 rw"


def _write(path: Path, mounts: list[tuple[int, str]]) -> None:
    path.write_text("".join(_line(mount_id, point) + "\n" for mount_id, point in mounts))


HOST = [(1, "/"), (2, "/proc"), (3, "/var/lib/kubelet/pods/admin-volume"), (4, "/mnt/data")]


def test_only_new_mounts_below_owned_directories_are_the_services(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    _write(mountinfo, HOST)
    ledger = owned.MountLedger([KUBELET, CONTAINERD], mountinfo=mountinfo)
    ledger.mark()
    _write(
        mountinfo,
        [
            *HOST,
            (10, "/var/lib/kubelet"),  # the kubelet's own bind mount of its root (MakeRShared)
            (11, "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~secret/token"),
            (12, "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/s1/shm"),
            (13, "/mnt/other"),  # someone else's, made while the node ran
            (14, "/var/lib/kubelet-backup/x"),  # a sibling whose name only starts the same
            (15, "/"),  # a new mount on the root itself is never the services'
        ],
    )
    assert ledger.made() == [
        Path("/var/lib/kubelet/pods/p1/volumes/kubernetes.io~secret/token"),
        Path("/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/s1/shm"),
        Path("/var/lib/kubelet"),
    ]


def test_the_root_is_never_an_owned_directory(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    _write(mountinfo, [(1, "/")])
    ledger = owned.MountLedger([Path("/"), KUBELET], mountinfo=mountinfo)
    ledger.mark()
    _write(mountinfo, [(1, "/"), (7, "/srv"), (8, "/var/lib/kubelet/pods/x")])
    assert ledger.owned == (KUBELET,)
    assert ledger.made() == [Path("/var/lib/kubelet/pods/x")]


def test_nothing_is_owned_before_the_services_started(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    _write(mountinfo, [(1, "/"), (8, "/var/lib/kubelet/pods/x")])
    assert owned.MountLedger([KUBELET], mountinfo=mountinfo).made() == []


def test_escaped_mount_points_are_decoded(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    _write(mountinfo, [(1, "/")])
    ledger = owned.MountLedger([KUBELET], mountinfo=mountinfo)
    ledger.mark()
    _write(mountinfo, [(1, "/"), (9, "/var/lib/kubelet/pods/a\\040b")])
    assert ledger.made() == [Path("/var/lib/kubelet/pods/a b")]
