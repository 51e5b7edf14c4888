"""Exceptions of :mod:`kubeplane.ops` (the tree is drawn in the package docstring)."""

from __future__ import annotations


class OpsError(Exception):
    """An operation could not start or could not finish; the message says what, where and what to do."""


class PreflightError(OpsError):
    """A check before any change failed (unreachable node, bad version, unsupported path); nothing changed."""


class WaitTimeout(OpsError):
    """A step's wait for the cluster to reach the expected state ran out of time."""


class NodeUnavailable(OpsError):
    """A node API call could not be served now: no endpoint answered, or the node answered
    ``UNAVAILABLE`` or ran out of time (retryable). Raised by the CLI's node adapter."""
