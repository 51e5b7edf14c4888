"""kubeplane.checkpointer: the pod-checkpointer of a self-hosted control plane.

A self-hosted control plane runs kube-apiserver, kube-controller-manager and kube-scheduler as
DaemonSet pods, which a kubelet only learns about from the API server: after a reboot of every
control plane node nothing would start them again. The checkpointer closes that loop. It runs as
a DaemonSet pod (hostNetwork) on every control plane node, and for every pod on its node
annotated ``checkpointer.alpha.coreos.com/checkpoint: "true"`` it keeps a *checkpoint*: a
sanitised static pod copy of the pod (with the Secrets and ConfigMaps it uses copied to disk and
mounted as host paths) annotated ``checkpointer.alpha.coreos.com/checkpoint-of: <parent>``.

Modules:

- :mod:`~kubeplane.checkpointer.logic`: pure decisions (which checkpoints to store, activate,
  deactivate or remove; grace timers on an injected clock) and pod sanitising;
- :mod:`~kubeplane.checkpointer.sources`: reading pods, Secrets and ConfigMaps from the API server
  (urllib + ssl, in-cluster service account or a kubeconfig) and pods from the kubelet;
- :mod:`~kubeplane.checkpointer.store`: checkpoints on disk (state dir and kubelet manifest dir);
- :mod:`~kubeplane.checkpointer.main`: flags, environment and the loop
  (``python3 -m kubeplane.checkpointer``).

This package runs inside its own image with Debian's ``python3`` and ``python3-yaml`` only, so it
imports nothing but the standard library, PyYAML and itself (a unit test checks that).

Exceptions::

    CheckpointerError          base class
    ├── SourceUnavailable      the API server or kubelet did not answer (network, 5xx, timeout):
    │                          keep every checkpoint and try again next round
    ├── SourceRejected         the API server refused a request (4xx): bad credentials, RBAC
    └── ConfigError            bad flags, kubeconfig or in-cluster credentials; names what and where
"""

from __future__ import annotations

__all__ = ["CheckpointerError", "ConfigError", "SourceRejected", "SourceUnavailable"]


class CheckpointerError(Exception):
    """Base class of the checkpointer's errors."""


class SourceUnavailable(CheckpointerError):
    """The API server or the kubelet did not answer; nothing may be concluded from silence."""


class SourceRejected(CheckpointerError):
    """The API server answered with a client error (401/403/404 on a list); names the request."""


class ConfigError(CheckpointerError):
    """Flags, kubeconfig or in-cluster credentials are unusable; says what and where."""
