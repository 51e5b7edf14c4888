"""``kubeplane kubeadm ha``'s decisions: which SANs the re-signed certificate gets, the files
kubeadm's phases read, the join command, and reading the live state's times."""

from __future__ import annotations

import base64

import pytest
import yaml

from kubeplane.clients import ssh
from kubeplane.ops import kubeadm_ha
from kubeplane.ops.errors import OpsError

pytestmark = pytest.mark.unit

CLUSTER_CONFIG = {
    "apiVersion": "kubeadm.k8s.io/v1beta2",
    "kind": "ClusterConfiguration",
    "apiServer": {"certSANs": ["api.example"], "timeoutForControlPlane": "4m0s"},
    "networking": {"serviceSubnet": "10.96.0.0/16", "dnsDomain": "cluster.local"},
    "kubernetesVersion": "v1.20.2",
}


def _machine(name: str, address: str) -> kubeadm_ha.Machine:
    return kubeadm_ha.Machine(name=name, address=address, target=ssh.Target(host=address, name=name))


def test_default_sans_are_what_kubeadm_adds_by_itself() -> None:
    assert kubeadm_ha.default_sans(
        node_name="cp1", advertise="10.5.0.2", service_subnet="10.96.0.0/16", dns_domain="cluster.local"
    ) == {
        "cp1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "10.96.0.1",
        "10.5.0.2",
    }


def test_the_new_certificate_keeps_every_old_san_and_adds_the_endpoint_once() -> None:
    defaults = kubeadm_ha.default_sans(
        node_name="cp1", advertise="10.5.0.2", service_subnet="10.96.0.0/16", dns_domain="cluster.local"
    )
    old = ["cp1", "kubernetes", "old-lb.example", "10.96.0.1", "10.5.0.2", "192.0.2.7"]
    wanted = kubeadm_ha.wanted_cert_sans(
        CLUSTER_CONFIG, old_sans=old, defaults=defaults, endpoint_host="10.5.0.1"
    )
    # Listed ones first, then the old names kubeadm would drop, then the endpoint.
    assert wanted == ["api.example", "old-lb.example", "192.0.2.7", "10.5.0.1"]
    again = kubeadm_ha.wanted_cert_sans(
        {"apiServer": {"certSANs": wanted}},
        old_sans=[*old, "10.5.0.1"],
        defaults=defaults,
        endpoint_host="10.5.0.1",
    )
    assert again == wanted, "a re-run adds nothing twice"


def test_ha_cluster_config_sets_the_endpoint_and_sans_and_keeps_the_rest() -> None:
    updated = kubeadm_ha.ha_cluster_config(
        CLUSTER_CONFIG, cert_sans=["api.example", "10.5.0.1"], endpoint="10.5.0.1:6443"
    )
    assert updated["controlPlaneEndpoint"] == "10.5.0.1:6443"
    assert updated["apiServer"] == {"certSANs": ["api.example", "10.5.0.1"], "timeoutForControlPlane": "4m0s"}
    assert updated["networking"] == CLUSTER_CONFIG["networking"]
    assert updated["etcd"] == {"local": {"extraArgs": {"pre-vote": "true"}}}
    assert kubeadm_ha.has_ha_settings(updated, endpoint="10.5.0.1:6443", endpoint_host="10.5.0.1")
    assert not kubeadm_ha.has_ha_settings(CLUSTER_CONFIG, endpoint="10.5.0.1:6443", endpoint_host="10.5.0.1")
    kept = kubeadm_ha.ha_cluster_config(
        {"etcd": {"local": {"dataDir": "/d", "extraArgs": {"quota-backend-bytes": "1"}}}},
        cert_sans=[],
        endpoint="e:6443",
    )
    assert kept["etcd"]["local"] == {
        "dataDir": "/d",
        "extraArgs": {"quota-backend-bytes": "1", "pre-vote": "true"},
    }
    assert CLUSTER_CONFIG["apiServer"]["certSANs"] == ["api.example"], "the input is not changed"
    init, cluster = yaml.safe_load_all(kubeadm_ha.ha_config(updated, node_name="cp1", advertise="10.5.0.2"))
    assert init["kind"] == "InitConfiguration"
    assert init["localAPIEndpoint"]["advertiseAddress"] == "10.5.0.2"
    assert init["nodeRegistration"] == {"name": "cp1", "criSocket": "/run/containerd/containerd.sock"}
    assert cluster["kind"] == "ClusterConfiguration" and cluster["controlPlaneEndpoint"] == "10.5.0.1:6443"


def test_kubeconfig_server_is_replaced_and_nothing_else() -> None:
    text = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "clusters": [
                {
                    "name": "k",
                    "cluster": {"server": "https://10.5.0.2:6443", "certificate-authority-data": "QQ=="},
                }
            ],
            "users": [{"name": "u", "user": {"token": "t"}}],
        }
    )
    moved = kubeadm_ha.with_server(text, "https://10.5.0.1:6443")
    assert kubeadm_ha.kubeconfig_server(moved) == "https://10.5.0.1:6443"
    document = yaml.safe_load(moved)
    assert document["users"] == [{"name": "u", "user": {"token": "t"}}]
    assert document["clusters"][0]["cluster"]["certificate-authority-data"] == "QQ=="
    assert kubeadm_ha.kubeconfig_server("") == ""


def test_cluster_ca_comes_from_the_admin_kubeconfig() -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n"
    text = yaml.safe_dump(
        {"clusters": [{"cluster": {"certificate-authority-data": base64.b64encode(pem).decode()}}]}
    )
    assert kubeadm_ha.cluster_ca(text) == pem
    with pytest.raises(OpsError, match="no cluster CA"):
        kubeadm_ha.cluster_ca("clusters: []")


def test_times_from_systemd_and_from_the_api() -> None:
    assert kubeadm_ha.parse_timestamp("Thu 1970-01-01 00:01:40 UTC") == 100.0
    assert kubeadm_ha.parse_timestamp("1970-01-01T00:01:40Z\n") == 100.0
    with pytest.raises(OpsError, match="cannot read the time"):
        kubeadm_ha.parse_timestamp("n/a")


def test_join_command_is_the_guides_with_the_node_s_own_address() -> None:
    request = kubeadm_ha.Request(
        control_plane=_machine("cp1", "10.5.0.2"), workers=(), endpoint_host="10.5.0.1"
    )
    command = kubeadm_ha.join_command(
        request,
        _machine("cp2", "10.5.0.4"),
        token="abcdef.0123456789abcdef",
        ca_hash="sha256:00",
        certificate_key="k" * 64,
    )
    assert command.startswith("kubeadm join 10.5.0.1:6443 --token abcdef.0123456789abcdef ")
    expected = (
        "--discovery-token-ca-cert-hash sha256:00",
        "--control-plane",
        f"--certificate-key {'k' * 64}",
        "--apiserver-advertise-address 10.5.0.4",
        "--node-name cp2",
    )
    for part in expected:
        assert part in command
    assert request.endpoint == "https://10.5.0.1:6443"
    v6 = kubeadm_ha.Request(control_plane=_machine("cp1", "fd00::2"), workers=(), endpoint_host="fd00::1")
    assert v6.control_plane_endpoint == "[fd00::1]:6443"


def test_control_plane_nodes_are_told_by_their_role_label() -> None:
    assert kubeadm_ha.is_control_plane({"metadata": {"labels": {"node-role.kubernetes.io/master": ""}}})
    assert kubeadm_ha.is_control_plane(
        {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}
    )
    assert not kubeadm_ha.is_control_plane({"metadata": {"labels": {}}})


def test_ssh_targets_parse_user_host_and_port() -> None:
    assert ssh.Target.parse("10.5.0.2") == ssh.Target(host="10.5.0.2")
    assert ssh.Target.parse("admin@node-1:2222") == ssh.Target(host="node-1", port=2222, user="admin")
    assert ssh.Target.parse("[fd00::2]:2200") == ssh.Target(host="fd00::2", port=2200)
    assert str(ssh.Target(host="h", name="cp1")) == "cp1 (root@h)"
    for bad in ("", "user@", "h:0", "h:70000"):
        with pytest.raises(ValueError):
            ssh.Target.parse(bad)


def test_a_joining_etcd_member_is_told_the_cluster_it_joins() -> None:
    assert kubeadm_ha.peer_url("10.5.0.4") == "https://10.5.0.4:2380"
    assert kubeadm_ha.peer_url("fd00::4") == "https://[fd00::4]:2380"
    members = [
        {"ID": "1", "name": "cp1", "peerURLs": ["https://10.5.0.2:2380"]},
        {"ID": "2", "name": "", "peerURLs": ["https://10.5.0.4:2380"], "isLearner": True},
    ]
    initial = kubeadm_ha.initial_cluster(members, name="cp2", peer="https://10.5.0.4:2380")
    assert initial == "cp1=https://10.5.0.2:2380,cp2=https://10.5.0.4:2380"
    init, cluster = yaml.safe_load_all(
        kubeadm_ha.etcd_join_config(
            {**CLUSTER_CONFIG, "etcd": {"local": {"extraArgs": {"pre-vote": "true"}}}},
            node_name="cp2",
            advertise="10.5.0.4",
            initial=initial,
        )
    )
    assert init["localAPIEndpoint"]["advertiseAddress"] == "10.5.0.4"
    assert init["nodeRegistration"]["name"] == "cp2"
    # kubeadm lets etcd.local.extraArgs override its own arguments of the member's pod.
    assert cluster["etcd"]["local"]["extraArgs"] == {
        "pre-vote": "true",
        "initial-cluster": initial,
        "initial-cluster-state": "existing",
    }
    assert "controlPlaneEndpoint" not in cluster, "only the etcd arguments change"


def test_the_join_leaves_etcd_to_kubeplane_and_patches_kubeadms_etcd_pod() -> None:
    request = kubeadm_ha.Request(
        control_plane=_machine("cp1", "10.5.0.2"), workers=(), endpoint_host="10.5.0.1"
    )
    command = kubeadm_ha.join_command(
        request, _machine("cp2", "10.5.0.4"), token="t", ca_hash="h", certificate_key="k"
    )
    assert "--skip-phases=control-plane-join/etcd" in command
    assert "--experimental-patches=/etc/kubernetes/kubeplane/patches" in command
