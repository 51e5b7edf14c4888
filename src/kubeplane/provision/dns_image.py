"""The ``kubeplane/cluster-dns`` container image: the DNS add-on on Debian's Python.

A recipe of :mod:`kubeplane.provision.python_image` (the shared minbase rootfs with ``python3``,
``python3-yaml``, ``python3-dnspython`` and ``python3-httpx``, cached once per machine): the image
is that rootfs plus exactly the import closure of ``kubeplane.dns`` (the package, the Kubernetes
client it watches the API server with and what that imports; nothing else of kubeplane, as the
import-linter contracts in ``pyproject.toml`` keep it) in Debian's ``dist-packages``, tagged
``kubeplane/cluster-dns:<kubeplane version>`` with entrypoint ``python3 -m kubeplane.dns`` (the
Deployment passes CoreDNS's arguments, ``-conf /etc/coredns/Corefile``) and
``PYTHONDONTWRITEBYTECODE=1`` (the container's root filesystem is read-only).

``cluster create`` pushes it to every local cluster's registry; local clusters set
``cluster.coreDNS.image`` to :func:`image_ref`. This module only names files of ``kubeplane.dns``,
it never imports it (only the add-on's image runs it).
"""

from __future__ import annotations

from pathlib import Path

import kubeplane
from kubeplane.provision import python_image

IMAGE_NAME = "kubeplane/cluster-dns"
RECIPE = python_image.Recipe(
    name="cluster-dns",
    repository=IMAGE_NAME,
    package="kubeplane.dns",
    entrypoint=("/usr/bin/python3", "-m", "kubeplane.dns"),
)


def image_ref(version: str = kubeplane.__version__) -> str:
    """``kubeplane/cluster-dns:<version>``: the image local clusters run as their cluster DNS."""
    return RECIPE.ref(version)


class Builder(python_image.Builder):
    """Builds (or finds cached) the cluster DNS image (see :class:`python_image.Builder`)."""

    def __init__(self, cache_dir: Path | None = None, *, apt_dir: Path = Path("/etc/apt")) -> None:
        super().__init__(RECIPE, cache_dir, apt_dir=apt_dir)
