"""Kubernetes versions and image references for ``upgrade-k8s``: parse, compare, retag, patch.

Pure functions: :class:`Version` parses ``v1.20.2`` or a local build ``v1.20.2-kp.1``,
:func:`check_path` says whether an upgrade path is supported, :func:`retag` and
:func:`image_version` work on an image's tag (its repository is kept), and :func:`image_patch`
is the JSON patch that sets an image in a machine config.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kubeplane.ops.errors import PreflightError

_VERSION = re.compile(r"^v?(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)(?P<suffix>[-+][0-9A-Za-z.+-]+)?$")


@dataclasses.dataclass(frozen=True)
class Version:
    """A Kubernetes version such as ``v1.20.2`` or a local build ``v1.20.2-kp.1``."""

    major: int
    minor: int
    patch: int
    suffix: str = ""

    @classmethod
    def parse(cls, text: str, *, what: str = "version") -> Version:
        """Parse ``1.20.2``, ``v1.20.2`` or ``v1.20.2-kp.1``; raise PreflightError otherwise."""
        match = _VERSION.match(text.strip())
        if match is None:
            raise PreflightError(
                f"malformed {what} {text!r}: expected a Kubernetes version like v1.20.2 or v1.20.2-kp.1"
            )
        return cls(
            major=int(match["major"]),
            minor=int(match["minor"]),
            patch=int(match["patch"]),
            suffix=match["suffix"] or "",
        )

    @property
    def tag(self) -> str:
        """The image tag: ``v1.20.2-kp.1``."""
        return f"v{self.major}.{self.minor}.{self.patch}{self.suffix}"

    def __str__(self) -> str:
        return self.tag


def check_path(source: Version, target: Version, *, allow_downgrade: bool = False) -> None:
    """Allow the same minor version or the next one; anything else is an unsupported path.

    A target older than the running version is refused unless ``allow_downgrade``: an older
    kube-apiserver may not read what a newer one stored. Builds of the same release
    (``v1.20.2`` and ``v1.20.2-kp.1``) are the same version here, in either direction.
    """
    if (target.major, target.minor, target.patch) < (source.major, source.minor, source.patch):
        if not allow_downgrade:
            raise PreflightError(
                f"{target} is older than the running {source}: refusing to downgrade "
                "(pass --allow-downgrade if that is what you want)"
            )
        if source.major == target.major and source.minor - target.minor in (0, 1):
            return
    if source.major != target.major or target.minor not in (source.minor, source.minor + 1):
        raise PreflightError(
            f"unsupported upgrade path: {source} -> {target} "
            f"(supported: within {source.major}.{source.minor} or to {source.major}.{source.minor + 1})"
        )


def split_image(image: str) -> tuple[str, str | None]:
    """``(repository, tag)`` of an image reference; a registry port is not a tag, a digest is dropped."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, None


def retag(image: str, version: Version) -> str:
    """``image`` with its tag set to ``version``; the repository (registry host and path) is kept."""
    repository, _ = split_image(image)
    return f"{repository}:{version.tag}"


def image_version(image: str) -> Version:
    """The Kubernetes version an image's tag names (raises PreflightError when it names none)."""
    _, tag = split_image(image)
    if tag is None:
        raise PreflightError(f"image {image!r} has no tag to read the version from: pass --from")
    return Version.parse(tag, what=f"version in the tag of image {image}")


def image_patch(document: Mapping[str, Any], path: Sequence[str], value: Any) -> list[dict[str, Any]]:
    """A JSON patch setting ``path`` to ``value`` (an image, or any value: ``endpoint set`` sets the
    endpoint and ``certSANs`` with it), creating the missing parent mappings.

    The guide warns that a plain ``replace`` fails when the config has no ``cluster.apiServer.image``
    key; ``add`` on the first missing level (with the rest nested in its value) works either way.
    """
    node: Any = document
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping) or key not in node or node[key] is None:
            value_tree: Any = value
            for inner in reversed(path[depth + 1 :]):
                value_tree = {inner: value_tree}
            return [{"op": "add", "path": "/" + "/".join(path[: depth + 1]), "value": value_tree}]
        node = node[key]
    return [{"op": "replace", "path": "/" + "/".join(path), "value": value}]
