"""The certificates a node holds on disk, read for ``kubeplane certs``: where, whose, until when.

Looked for only where the node keeps them: its secret directories (etcd and the Kubernetes
components), ``/etc/kubernetes`` (the kubelet's CA and kubeconfigs) and the kubelet's ``pki``
directory (the certificates it got through TLS bootstrap and rotates). A PEM file contributes every
certificate in it; a kubeconfig its embedded client certificate and cluster CA. Only public parts
are parsed and reported (subject, issuer, expiry): ``.key`` files are never opened, and of a file
that holds a key beside its certificate (the kubelet's ``kubelet-client-current.pem``) only the
``CERTIFICATE`` blocks are parsed.

Files are opened without following symlinks and skipped beyond :data:`MAX_FILE_BYTES`, so a node
directory someone tampered with cannot make the agent read elsewhere or without bound.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kubeplane import pki
from kubeplane.config.paths import NodePaths

#: Larger files are not certificates the node wrote.
MAX_FILE_BYTES = 1 << 20
#: Most files looked at per node (a directory with more is reported as cut short).
MAX_FILES = 2000

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?-----END CERTIFICATE-----", re.DOTALL)
_CERT_SUFFIXES = (".crt", ".pem")
_KUBECONFIG_SUFFIXES = (".conf", ".kubeconfig")


@dataclasses.dataclass(frozen=True)
class Found:
    """One certificate: the file (relative to the node root), which one in it, and what it says."""

    path: str
    what: str
    subject: str
    issuer: str
    not_after: str
    is_ca: bool

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def scan(paths: NodePaths) -> list[Found]:
    """Every certificate under the node's certificate locations (see the module docstring)."""
    found: list[Found] = []
    for index, path in enumerate(_candidates(paths)):
        if index >= MAX_FILES:
            break
        data = _read(path)
        if data is None:
            continue
        relative = "/" + path.relative_to(paths.root).as_posix()
        if path.name.endswith(_KUBECONFIG_SUFFIXES):
            found += _from_kubeconfig(relative, data)
        else:
            found += _from_pem(relative, data, what="certificate")
    return sorted(found, key=lambda f: (f.not_after, f.path))


def _candidates(paths: NodePaths) -> Iterator[Path]:
    roots = (paths.secrets, paths.kubernetes_etc, paths.kubelet_root / "pki")
    for root in roots:
        if not root.is_dir():
            continue
        recursive = root != paths.kubernetes_etc  # /etc/kubernetes: its own files, not manifests/
        walker = os.walk(root) if recursive else [(str(root), [], os.listdir(root))]
        for directory, _, names in walker:
            for name in sorted(names):
                if name.endswith(_CERT_SUFFIXES + _KUBECONFIG_SUFFIXES):
                    yield Path(directory) / name


def _read(path: Path) -> bytes | None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            data = handle.read(MAX_FILE_BYTES + 1)
        return data if len(data) <= MAX_FILE_BYTES else None
    return None


def _from_pem(path: str, data: bytes, *, what: str) -> list[Found]:
    found = []
    for number, block in enumerate(_PEM_CERT.findall(data)):
        try:
            info = pki.cert_info(block + b"\n")
        except (ValueError, pki.PKIError):
            continue
        label = what if number == 0 else f"{what} #{number + 1}"
        found.append(
            Found(
                path=path,
                what=label,
                subject=info.subject_cn,
                issuer=info.issuer_cn,
                not_after=info.not_after.isoformat(timespec="seconds"),
                is_ca=info.is_ca,
            )
        )
    return found


def _from_kubeconfig(path: str, data: bytes) -> list[Found]:
    try:
        document = yaml.safe_load(data)
    except yaml.YAMLError:
        return []
    if not isinstance(document, dict):
        return []
    found: list[Found] = []
    for section, field, what in (
        ("users", "client-certificate-data", "client certificate"),
        ("clusters", "certificate-authority-data", "cluster CA"),
    ):
        for entry in document.get(section) or ():
            body = entry.get(section[:-1]) if isinstance(entry, dict) else None
            value = body.get(field) if isinstance(body, dict) else None
            if isinstance(value, str):
                with contextlib.suppress(ValueError):
                    found += _from_pem(path, base64.b64decode(value), what=f"{what} of {entry.get('name')}")
    return found
