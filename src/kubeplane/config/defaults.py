"""Default values of the machine configuration: versions, images, ports and subnets.

Every default the config layer (and the generator built on it) uses lives here, so a version bump
is a one-file change.
"""

from __future__ import annotations

from typing import Final

#: The only machine configuration schema version kubeplane reads and writes.
CONFIG_VERSION: Final = "v1alpha1"

KUBERNETES_VERSION: Final = "v1.20.2"
ETCD_VERSION: Final = "v3.4.14"
COREDNS_VERSION: Final = "1.7.0"

KUBE_APISERVER_IMAGE: Final = "k8s.gcr.io/kube-apiserver"
KUBE_CONTROLLER_MANAGER_IMAGE: Final = "k8s.gcr.io/kube-controller-manager"
KUBE_SCHEDULER_IMAGE: Final = "k8s.gcr.io/kube-scheduler"
KUBE_PROXY_IMAGE: Final = "k8s.gcr.io/kube-proxy"
KUBELET_IMAGE: Final = "ghcr.io/talos-systems/kubelet"
ETCD_IMAGE: Final = "gcr.io/etcd-development/etcd"
COREDNS_IMAGE: Final = "k8s.gcr.io/coredns"


def image(repository: str, version: str = KUBERNETES_VERSION) -> str:
    """Return the image reference ``repository:version``."""
    return f"{repository}:{version}"


DEFAULT_API_SERVER_IMAGE: Final = image(KUBE_APISERVER_IMAGE)
DEFAULT_CONTROLLER_MANAGER_IMAGE: Final = image(KUBE_CONTROLLER_MANAGER_IMAGE)
DEFAULT_SCHEDULER_IMAGE: Final = image(KUBE_SCHEDULER_IMAGE)
DEFAULT_PROXY_IMAGE: Final = image(KUBE_PROXY_IMAGE)
DEFAULT_KUBELET_IMAGE: Final = image(KUBELET_IMAGE)
DEFAULT_ETCD_IMAGE: Final = image(ETCD_IMAGE, ETCD_VERSION)
DEFAULT_COREDNS_IMAGE: Final = image(COREDNS_IMAGE, COREDNS_VERSION)

DEFAULT_LOCAL_API_SERVER_PORT: Final = 6443
#: The node API (``machine.ports.nodeAPI``): what the CLI dials, and what a node forwards ``-n`` to.
DEFAULT_NODE_API_PORT: Final = 50000
#: trustd (``machine.ports.trustd``): where workers get their node API certificate.
DEFAULT_TRUSTD_PORT: Final = 50001
#: Where kubeplaned serves Prometheus metrics unless ``--metrics-port`` says otherwise.
DEFAULT_METRICS_PORT: Final = 50010
#: TCP ports other services of a node listen on, with who uses them: the node API and trustd
#: must not take one (the API server's port is ``cluster.controlPlane.localAPIServerPort``).
RESERVED_NODE_PORTS: Final = {
    2379: "etcd client",
    2380: "etcd peer",
    10248: "kubelet healthz",
    10249: "kube-proxy metrics",
    10250: "kubelet API",
    10256: "kube-proxy healthz",
    10257: "kube-controller-manager",
    10259: "kube-scheduler",
    DEFAULT_METRICS_PORT: "kubeplaned metrics",
}
DEFAULT_DNS_DOMAIN: Final = "cluster.local"
DEFAULT_POD_SUBNETS: Final = ("10.244.0.0/16",)
DEFAULT_SERVICE_SUBNETS: Final = ("10.96.0.0/12",)
DEFAULT_CNI: Final = "flannel"
DEFAULT_PROXY_MODE: Final = "iptables"
DEFAULT_DISK_ENCRYPTION_PROVIDER: Final = "luks2"
DEFAULT_ADMIN_KUBECONFIG_CERT_LIFETIME: Final = "8760h"
#: CAs live ten years, as in the original system.
DEFAULT_CA_LIFETIME: Final = "87600h"

#: Offsets into the first service subnet: the API service takes the 1st address, DNS the 10th.
API_SERVICE_IP_INDEX: Final = 1
DNS_SERVICE_IP_INDEX: Final = 10
