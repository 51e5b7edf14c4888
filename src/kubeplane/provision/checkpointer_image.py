"""The ``kubeplane/pod-checkpointer`` container image: the checkpointer on Debian's Python.

A recipe of :mod:`kubeplane.provision.python_image` (the shared minbase rootfs with ``python3``
and its packaged libraries, cached once per machine): the image is that rootfs plus the import
closure of :mod:`kubeplane.checkpointer` (``kubeplane/__init__.py`` and
``kubeplane/checkpointer/*.py``, which import only the standard library and PyYAML) in Debian's
``dist-packages``, tagged ``kubeplane/pod-checkpointer:<kubeplane version>`` with entrypoint
``python3 -m kubeplane.checkpointer``. ``cluster create --self-hosted`` pushes it to the cluster's
registry; self-hosted control planes run it as a DaemonSet.

Errors: :class:`kubeplane.provision.python_image.PythonImageError` (no mirror, not built) and
:class:`kubeplane.provision.steps.StepFailed` (debootstrap or packing failed; names the log).
"""

from __future__ import annotations

from pathlib import Path

import kubeplane
from kubeplane.provision import python_image

IMAGE_NAME = "kubeplane/pod-checkpointer"
RECIPE = python_image.Recipe(
    name="pod-checkpointer",
    repository=IMAGE_NAME,
    package="kubeplane.checkpointer",
    entrypoint=("/usr/bin/python3", "-m", "kubeplane.checkpointer"),
)


def image_ref(version: str = kubeplane.__version__) -> str:
    """``kubeplane/pod-checkpointer:<version>``."""
    return RECIPE.ref(version)


class Builder(python_image.Builder):
    """Builds (or finds cached) the pod-checkpointer image (see :class:`python_image.Builder`)."""

    def __init__(self, cache_dir: Path | None = None, *, apt_dir: Path = Path("/etc/apt")) -> None:
        super().__init__(RECIPE, cache_dir, apt_dir=apt_dir)
