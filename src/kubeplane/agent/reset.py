"""What ``kubeplane reset`` wipes on a node: the labels a caller chooses from, their directories,
and the wipe itself.

The original names disk partitions (``--system-labels-to-wipe STATE,EPHEMERAL``); a kubeplane node
has directories instead, grouped under four labels:

- ``state``: the machine config (current and staged) and the node's secrets under ``/system``;
  without them the node comes back in maintenance mode, waiting for ``apply-config --insecure``;
- ``etcd``: the etcd data directory and the bootstrap marker (a member that rejoins is a new one);
- ``kubelet``: the kubelet's root (its client certificate, pods), ``/etc/kubernetes`` (kubeconfigs,
  static pod manifests) and the CNI config the pod network wrote;
- ``containerd``: containerd's root (images, snapshots) and state.

The default is all four: the node forgets the cluster. The logs under ``/var/log/kubeplane`` are
kept, to explain what happened. Each directory keeps existing; its contents go. A mount point
inside one (a bind mount the machine was set up with, never one the services made: those are
unmounted when the services stop) is left in place and reported, and no symlink is followed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from kubeplane.config.paths import NodePaths

WIPE_LABELS = ("state", "etcd", "kubelet", "containerd")


class UnknownLabel(ValueError):
    """A wipe label that is not one of :data:`WIPE_LABELS`."""


def parse_labels(text: str | None) -> tuple[str, ...]:
    """``"etcd,kubelet"`` → the labels, in :data:`WIPE_LABELS` order; None or empty: all of them."""
    if not text or not text.strip():
        return WIPE_LABELS
    given = [label.strip() for label in text.split(",") if label.strip()]
    unknown = sorted(set(given) - set(WIPE_LABELS))
    if unknown:
        raise UnknownLabel(f"unknown wipe label {', '.join(unknown)}: choose from {', '.join(WIPE_LABELS)}")
    return tuple(label for label in WIPE_LABELS if label in given)


def directories(paths: NodePaths, labels: Iterable[str]) -> list[Path]:
    """The directories whose contents a reset with ``labels`` removes."""
    by_label = {
        "state": [paths.system],
        "etcd": [paths.etcd_data],
        "kubelet": [paths.kubelet_root, paths.kubernetes_etc, paths.cni_conf],
        "containerd": [paths.containerd_root, paths.containerd_state],
    }
    chosen = list(labels)
    found = [directory for label in chosen for directory in by_label[label]]
    if "etcd" in chosen and "state" not in chosen:
        found.append(paths.system / "etcd-bootstrap")  # the marker: a wiped member is a new one
    return found


def wipe(targets: Iterable[Path]) -> list[str]:
    """Remove the contents of each directory (a file target: the file); returns what was left,
    as messages (mount points, entries that could not be removed)."""
    left: list[str] = []
    for target in targets:
        if target.is_symlink() or target.is_file():
            target.unlink(missing_ok=True)
            continue
        if not target.is_dir():
            continue
        for entry in sorted(target.iterdir()):
            left += _remove(entry)
    return left


def _remove(entry: Path) -> list[str]:
    if os.path.ismount(entry):
        return [f"{entry} is a mount point: left in place"]
    if entry.is_dir() and not entry.is_symlink():
        left: list[str] = []
        for child in sorted(entry.iterdir()):
            left += _remove(child)
        if not left:
            try:
                entry.rmdir()
            except OSError as exc:
                left.append(f"{entry}: {exc.strerror}")
        return left
    try:
        entry.unlink(missing_ok=True)
    except OSError as exc:
        return [f"{entry}: {exc.strerror}"]
    return []
