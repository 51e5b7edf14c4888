"""e2e: ``kubeplane endpoint set`` refuses what is not this cluster's endpoint, on the shared 1
control plane + 1 worker cluster, before any change; and the helpers test_ha.py uses to check a
moved cluster (the serving certificate's names, the kubelets' and the ConfigMaps' servers).

The move itself, to a second load balancer with three control plane nodes and back, with clients
polling throughout, is part of test_ha.py (issue 16's acceptance: 1 → 3 control plane nodes, a new
endpoint, a node lost, back to 1).
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from cryptography.hazmat.primitives.serialization import Encoding
from e2e_clients import serving_certificate

from kubeplane import pki

if TYPE_CHECKING:
    from conftest import E2ECluster

pytestmark = pytest.mark.e2e

STEP_DONE = re.compile(r"^ < (?P<what>done|already at target, skipped) \((?P<seconds>[\d.]+)s\)")
CLUSTER_INFO = "cluster-info"


@pytest.fixture(scope="module")
def cluster(cluster_1cp1w: E2ECluster) -> E2ECluster:
    return cluster_1cp1w


def serving_names(address: str) -> set[str]:
    """The names in the certificate the kube-apiserver on ``address`` presents."""
    info = pki.cert_info(serving_certificate(address).public_bytes(Encoding.PEM))
    return {*info.dns_names, *info.ip_addresses}


def server_of(kubeconfig_text: str) -> str:
    return str(yaml.safe_load(kubeconfig_text)["clusters"][0]["cluster"]["server"])


def configmap_server(cluster: Any, namespace: str, name: str) -> str:
    result = cluster.kubectl("-n", namespace, "get", "configmap", name, "-o", "jsonpath={.data.kubeconfig}")
    assert result.returncode == 0, result.stderr
    return server_of(result.stdout)


def kubelet_server(cluster: Any, node: str) -> str:
    result = cluster.cli("-n", node, "read", "etc/kubernetes/kubelet.conf")
    assert result.returncode == 0, result.stderr
    return server_of(result.stdout)


def free_address(cluster: Any) -> str:
    """An address of the cluster's network that no node and not the host uses."""
    network = cluster.state().network
    taken = {network.host_ip, *cluster.control_plane, *cluster.workers}
    for host in reversed(list(ipaddress.ip_network(network.cidr).hosts())):
        if str(host) not in taken:
            return str(host)
    raise AssertionError(f"no free address in {network.cidr}")


def create_cluster_info(cluster: Any, server: str) -> None:
    """A ``kube-public/cluster-info`` as kubeadm makes it: a kubeconfig with the CA and the endpoint."""
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "contexts": [],
        "users": [],
    }
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CLUSTER_INFO, "namespace": "kube-public"},
        "data": {"kubeconfig": yaml.safe_dump(kubeconfig)},
    }
    result = subprocess.run(
        [*cluster.kubectl_argv(), "apply", "-f", "-"],
        input=yaml.safe_dump(manifest),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def outcomes(lines: Sequence[str]) -> list[str]:
    return [m["what"] for line in lines if (m := STEP_DONE.match(line))]


def test_a_url_that_is_not_https_host_port_is_refused(cluster: Any) -> None:
    result = cluster.cli("endpoint", "set", "http://example.test")
    assert result.returncode != 0
    assert "https://HOST:PORT" in result.stderr


def test_an_endpoint_that_is_not_this_cluster_is_refused_before_any_change(cluster: Any) -> None:
    # The node API port answers TLS with the node's OS CA, not the cluster CA.
    result = cluster.cli("endpoint", "set", f"https://{cluster.control_plane[0]}:50000")
    assert result.returncode != 0
    assert "nothing was changed" in result.stderr, result.stderr
    assert "CA did not issue" in result.stderr or "does not answer TLS" in result.stderr, result.stderr
