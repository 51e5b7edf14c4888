"""kubeplane.controllers.k8s: the Kubernetes control plane of a node.

Pure rendering (no I/O, no runtime): ``render`` builds the static pods of kube-apiserver,
kube-controller-manager and kube-scheduler, ``manifests`` the bootstrap manifests applied to the
API server, ``files`` the layout and contents of the per-component secrets directories. The
controllers that feed them from resources and write their results come on top of these modules,
one module each: ``control_plane`` (K8sControlPlaneController → kcpc), ``static_pod``
(ControlPlaneStaticPodController), ``kubelet_static_pod`` (KubeletStaticPodController),
``manifest`` (ManifestController), ``extra_manifest`` (ExtraManifestController),
``manifest_apply`` (ManifestApplyController), ``bootstrap_status`` (BootstrapStatusController);
helpers: ``outputs`` (writing outputs), ``etcd_access`` (keys, client, watch). The Kubernetes
API is reached through :class:`kubeplane.clients.kube.KubeClient` (its errors are
``kubeplane.clients.errors.KubeError``).

Exceptions::

    kubeplane.controllers.ControllerError
    ├── RenderError                        an input cannot be rendered (bad image tag, bad token, bad
    │                                      encryption secret); the message names the input, what was
    │                                      wrong and what to do
    ├── extra_manifest.ManifestSourceError an extra manifest URL cannot be fetched or its YAML parsed
    └── manifest_apply.ApplyError          one object could not be applied (kept per manifest)
"""

from __future__ import annotations

from kubeplane.controllers import ControllerError

__all__ = ["RenderError"]


class RenderError(ControllerError, ValueError):
    """An input cannot be rendered; the message says which input, why, and what to do."""
