"""The layout of the toolchain cache: the one place that spells its paths and image names.

``kubeplane toolchain build`` (:mod:`kubeplane.provision.toolchain`) fills the cache; the agent
reads binaries and images from it (a local cluster's nodes import the images instead of pulling
them). Both take the paths from here::

    $KUBEPLANE_CACHE (default /var/cache/kubeplane)
      kubernetes/<version>/bin/<name>          binaries
      kubernetes/<version>/images/<name>.tar   docker-archive images
      kubernetes/<version>/kubeadm-images/     the images only kubeadm asks for (etcd), which a
                                               kubeplane node never imports
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
KUBEADM_IMAGES_DIR = "kubeadm-images"
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


#: The etcd image tag kubeadm asks for, by Kubernetes minor version (its ``constants.EtcdVersion``
#: table; ``kubeadm config images list`` prints it, and the toolchain checks the two agree).
KUBEADM_ETCD_TAGS = {"1.20": "3.4.13-0"}
#: The CoreDNS release kubeadm deploys, by Kubernetes minor version (``constants.CoreDNSVersion``):
#: a kubeadm cluster runs kubeplane's cluster DNS under this tag, the CoreDNS whose Corefile and
#: ports it stands in for, so ``kubeadm upgrade``'s CoreDNS checks know the version.
KUBEADM_COREDNS_TAGS = {"1.20": "1.7.0"}


def kubeadm_coredns_tag(version: str) -> str | None:
    """The CoreDNS tag kubeadm of Kubernetes ``version`` deploys (``1.7.0``); None if unknown."""
    return KUBEADM_COREDNS_TAGS.get(".".join(version.removeprefix("v").split(".")[:2]))


def kubeadm_image_ref(name: str, version: str) -> str | None:
    """Upstream reference of the kubeadm-only image ``name`` (``etcd``) for Kubernetes ``version``
    (``v1.20.2`` → ``k8s.gcr.io/etcd:3.4.13-0``); None for a version the table does not know."""
    minor = ".".join(version.removeprefix("v").split(".")[:2])
    tag = KUBEADM_ETCD_TAGS.get(minor) if name == "etcd" else None
    return f"{REGISTRY}/{name}:{tag}" if tag else None
