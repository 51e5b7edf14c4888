"""kubeplane: run and change a Kubernetes control plane.

The package is layered (see docs/architecture.md); ``kubeplane.cli`` is the ``kubeplane`` command and
``kubeplane.agent`` the ``kubeplaned`` node agent.
"""

__version__ = "0.1.0"

#: The Kubernetes version kubeplane renders and builds by default.
DEFAULT_KUBERNETES_VERSION = "v1.20.2"
