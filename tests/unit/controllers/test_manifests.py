"""Bootstrap manifests: one golden file per manifest id, plus the rules that decide the set.

Regenerate golden files after an intended change with ``KUBEPLANE_UPDATE_GOLDEN=1`` (see conftest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s_client

from kubeplane.controllers.k8s import RenderError, manifests, render

pytestmark = pytest.mark.unit

ALL_IDS = [
    "00-kubelet-bootstrapping-token",
    "01-csr-approver-role-binding",
    "01-csr-node-bootstrap",
    "01-csr-renewal-role-binding",
    "01-trustd-discovery",
    "02-kube-system-sa-role-binding",
    "03-default-pod-security-policy",
    "05-flannel",
    "10-kube-proxy",
    "11-core-dns",
    "11-core-dns-svc",
    "11-kube-config-in-cluster",
]


def _find(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]


def test_default_set_in_apply_order(manifest_inputs: manifests.ManifestInputs) -> None:
    rendered = manifests.render_bootstrap_manifests(manifest_inputs)
    assert list(rendered) == ALL_IDS


@pytest.mark.parametrize("manifest_id", ALL_IDS)
def test_manifest_matches_golden(
    manifest_inputs: manifests.ManifestInputs, golden: Callable[[str, str], None], manifest_id: str
) -> None:
    objects = manifests.render_bootstrap_manifests(manifest_inputs)[manifest_id]
    golden(f"manifest-{manifest_id}.yaml", render.dump_yaml_documents(objects))


def test_pod_security_policy_only_where_it_exists(manifest_inputs: manifests.ManifestInputs) -> None:
    for version, present in (((1, 24, 9), True), ((1, 25, 0), False)):
        inputs = dataclasses.replace(manifest_inputs, kubernetes_version=render.KubeVersion(*version))
        assert ("03-default-pod-security-policy" in manifests.render_bootstrap_manifests(inputs)) is present


@pytest.mark.parametrize("cni", [manifests.CNI_CUSTOM, manifests.CNI_NONE])
def test_flannel_only_for_flannel(manifest_inputs: manifests.ManifestInputs, cni: str) -> None:
    rendered = manifests.render_bootstrap_manifests(dataclasses.replace(manifest_inputs, cni=cni))
    assert "05-flannel" not in rendered
    assert len(rendered) == len(ALL_IDS) - 1


def test_unknown_cni_is_refused(manifest_inputs: manifests.ManifestInputs) -> None:
    with pytest.raises(RenderError, match=r"cluster\.network\.cni\.name 'calico'"):
        manifests.render_bootstrap_manifests(dataclasses.replace(manifest_inputs, cni="calico"))


def test_disabled_proxy_and_coredns_are_left_out(manifest_inputs: manifests.ManifestInputs) -> None:
    inputs = dataclasses.replace(manifest_inputs, proxy_enabled=False, coredns_enabled=False)
    rendered = manifests.render_bootstrap_manifests(inputs)
    assert not {"10-kube-proxy", "11-core-dns", "11-core-dns-svc"} & set(rendered)
    # kube-proxy may be replaced by another proxy that still reads this config map.
    assert "11-kube-config-in-cluster" in rendered


def test_bootstrap_token_secret(manifest_inputs: manifests.ManifestInputs) -> None:
    (secret,) = manifests.render_bootstrap_manifests(manifest_inputs)["00-kubelet-bootstrapping-token"]
    assert secret["metadata"] == {"name": "bootstrap-token-abcdef", "namespace": "kube-system"}
    assert secret["type"] == "bootstrap.kubernetes.io/token"
    assert secret["stringData"]["token-secret"] == "0123456789abcdef"
    assert secret["stringData"]["usage-bootstrap-authentication"] == "true"


def test_malformed_token_is_refused_without_echoing_it(manifest_inputs: manifests.ManifestInputs) -> None:
    bad = "ABCDEF.not-a-valid-secret"
    with pytest.raises(RenderError, match=r"cluster\.token") as info:
        manifests.render_bootstrap_manifests(dataclasses.replace(manifest_inputs, bootstrap_token=bad))
    assert bad not in str(info.value)
    assert "not-a-valid" not in str(info.value)


def test_csr_rbac_binds_the_groups_bootstrap_tokens_and_nodes_have(
    manifest_inputs: manifests.ManifestInputs,
) -> None:
    rendered = manifests.render_bootstrap_manifests(manifest_inputs)
    expected = {
        "01-csr-node-bootstrap": ("system:node-bootstrapper", "system:bootstrappers"),
        "01-csr-approver-role-binding": (
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "system:bootstrappers",
        ),
        "01-csr-renewal-role-binding": (
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    }
    for manifest_id, (role, group) in expected.items():
        (binding,) = rendered[manifest_id]
        assert binding["roleRef"]["name"] == role
        assert binding["subjects"] == [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
        ]


def test_bootstrap_tokens_may_get_only_the_kubernetes_endpoints(
    manifest_inputs: manifests.ManifestInputs,
) -> None:
    role, binding = manifests.render_bootstrap_manifests(manifest_inputs)["01-trustd-discovery"]
    assert (role["kind"], role["metadata"]["namespace"]) == ("Role", "default")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["endpoints"], "verbs": ["get"], "resourceNames": ["kubernetes"]}
    ]
    assert (binding["kind"], binding["metadata"]["namespace"]) == ("RoleBinding", "default")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers"}
    ]


def test_kube_proxy_daemonset(manifest_inputs: manifests.ManifestInputs) -> None:
    objects = manifests.render_bootstrap_manifests(manifest_inputs)["10-kube-proxy"]
    assert [o["kind"] for o in objects] == ["ServiceAccount", "ClusterRoleBinding", "DaemonSet"]
    assert _find(objects, "ClusterRoleBinding")["roleRef"]["name"] == "system:node-proxier"
    spec = _find(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    (container,) = spec["containers"]
    assert container["securityContext"] == {"privileged": True}
    assert container["image"] == "k8s.gcr.io/kube-proxy:v1.20.2"
    command = container["command"]
    assert "--conntrack-max-per-core=0" in command
    assert "--hostname-override=$(NODE_NAME)" in command
    assert "--cluster-cidr=10.244.0.0/16" in command
    assert "--proxy-mode=iptables" in command
    assert {"name": "kubeconfig", "configMap": {"name": "kubeconfig-in-cluster"}} in spec["volumes"]
    assert {"effect": "NoSchedule", "operator": "Exists"} in spec["tolerations"]


def test_kube_proxy_extra_args_override(manifest_inputs: manifests.ManifestInputs) -> None:
    inputs = dataclasses.replace(
        manifest_inputs, proxy_mode="ipvs", proxy_extra_args={"proxy-mode": "userspace"}
    )
    objects = manifests.render_bootstrap_manifests(inputs)["10-kube-proxy"]
    command = _find(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert [a for a in command if a.startswith("--proxy-mode")] == ["--proxy-mode=userspace"]


def test_dns_service_and_corefile_follow_inputs(manifest_inputs: manifests.ManifestInputs) -> None:
    inputs = dataclasses.replace(manifest_inputs, dns_service_ip="10.100.0.10", dns_domain="example.internal")
    rendered = manifests.render_bootstrap_manifests(inputs)
    (service,) = rendered["11-core-dns-svc"]
    assert (service["metadata"]["name"], service["spec"]["clusterIP"]) == ("kube-dns", "10.100.0.10")
    corefile = _find(rendered["11-core-dns"], "ConfigMap")["data"]["Corefile"]
    assert "kubernetes example.internal in-addr.arpa ip6.arpa {" in corefile


def test_in_cluster_kubeconfig_points_at_the_endpoint(manifest_inputs: manifests.ManifestInputs) -> None:
    import yaml

    (config_map,) = manifests.render_bootstrap_manifests(manifest_inputs)["11-kube-config-in-cluster"]
    kubeconfig = yaml.safe_load(config_map["data"]["kubeconfig"])
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://10.5.0.1:6443"
    assert kubeconfig["users"][0]["user"]["tokenFile"].endswith("/serviceaccount/token")


def test_flannel_network_is_the_first_pod_subnet(manifest_inputs: manifests.ManifestInputs) -> None:
    import json

    inputs = dataclasses.replace(manifest_inputs, pod_cidrs=("10.200.0.0/16", "fd00::/48"))
    config_map = _find(manifests.render_bootstrap_manifests(inputs)["05-flannel"], "ConfigMap")
    assert json.loads(config_map["data"]["net-conf.json"])["Network"] == "10.200.0.0/16"


_MODELS = {
    "ServiceAccount": "V1ServiceAccount",
    "Secret": "V1Secret",
    "ConfigMap": "V1ConfigMap",
    "Service": "V1Service",
    "DaemonSet": "V1DaemonSet",
    "Deployment": "V1Deployment",
    "ClusterRole": "V1ClusterRole",
    "ClusterRoleBinding": "V1ClusterRoleBinding",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
}


def test_objects_are_valid_for_their_kind(manifest_inputs: manifests.ManifestInputs) -> None:
    # PodSecurityPolicy (policy/v1beta1) is not in the current client models; everything else
    # round-trips through them, so a misspelt or misplaced field shows up as a difference.
    api = k8s_client.ApiClient()
    checked = 0
    for objects in manifests.render_bootstrap_manifests(manifest_inputs).values():
        for obj in objects:
            if obj["kind"] == "PodSecurityPolicy":
                continue
            model = api._ApiClient__deserialize(obj, _MODELS[obj["kind"]])  # type: ignore[attr-defined]
            assert api.sanitize_for_serialization(model) == obj, obj["metadata"]["name"]
            checked += 1
    assert checked >= 20
