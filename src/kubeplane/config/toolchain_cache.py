"""The layout of the toolchain cache: the one place that spells its paths and image names.

``kubeplane toolchain build`` (:mod:`kubeplane.provision.toolchain`) fills the cache; the agent
reads binaries and images from it (a local cluster's nodes import the images instead of pulling
them). Both take the paths from here::

    $KUBEPLANE_CACHE (default /var/cache/kubeplane)
      kubernetes/<version>/bin/<name>          binaries
      kubernetes/<version>/images/<name>.tar   docker-archive images
      kubernetes/<version>/stamp.json          what was built, with checksums
      python-images/, workloads/               kubeplane's own images, built once per machine
                                               (kubeplane.provision.python_image, .workload_images)
      registry-storage/                        the last seeded local registry's storage, which
                                               the next one starts from (.provision.registry)
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that overrides the cache directory.
CACHE_ENV = "KUBEPLANE_CACHE"
DEFAULT_CACHE = Path("/var/cache/kubeplane")
#: The copy of a seeded registry's storage that a new local cluster's registry starts from.
REGISTRY_STORAGE_DIR = "registry-storage"
#: Below a version's directory.
BIN_DIR = "bin"
IMAGES_DIR = "images"
STAMP_FILE = "stamp.json"
#: Images are named like upstream; pause keeps the tag kubelet v1.20 uses as its default sandbox.
REGISTRY = "k8s.gcr.io"
PAUSE = "pause"
PAUSE_TAG = "3.2"


def cache_dir() -> Path:
    """``$KUBEPLANE_CACHE`` or ``/var/cache/kubeplane``."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def versions_dir(cache: Path | None = None) -> Path:
    """The directory holding one directory per cached Kubernetes version."""
    return (cache if cache is not None else cache_dir()) / "kubernetes"


def version_dir(version: str, cache: Path | None = None) -> Path:
    """Where the cache keeps Kubernetes ``version`` (``kubernetes/<version>``)."""
    return versions_dir(cache) / version


def image_ref(name: str, version: str) -> str:
    """Upstream reference of image ``name`` for Kubernetes ``version``."""
    return f"{REGISTRY}/{name}:{PAUSE_TAG if name == PAUSE else version}"
