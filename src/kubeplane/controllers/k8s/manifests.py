"""Bootstrap manifests: the objects every cluster gets applied to its API server.

Pure functions from `ManifestInputs` to ``{manifest id: [object, ...]}``. The ids and their
content follow the original system (REFERENCE.md §2 item 8) so people who know it find the same
things: the kubelet bootstrap token and the RBAC that lets kubelets join and renew, the binding
for kube-system service accounts, the default PodSecurityPolicy (only for versions that have
it), flannel, kube-proxy, CoreDNS and the in-cluster kubeconfig kube-proxy uses. One is
kubeplane's own: ``01-trustd-discovery`` lets bootstrap tokens read ``Endpoints
default/kubernetes``, where workers find the control plane nodes to ask trustd (see
:mod:`kubeplane.api.trustd`).

Ordering is part of the contract: ids sort in apply order, and inside a manifest objects come in
dependency order (accounts and RBAC, then configuration, then workloads), so rendering the same
inputs always gives the same bytes and an apply never creates a workload before its account.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeplane.clients import kube
from kubeplane.controllers.k8s import RenderError, render

__all__ = [
    "CNI_CUSTOM",
    "CNI_FLANNEL",
    "CNI_HOST_GW",
    "CNI_NONE",
    "ManifestInputs",
    "render_bootstrap_manifests",
]

CNI_FLANNEL = "flannel"
CNI_CUSTOM = "custom"
#: The node agents route pods between nodes themselves (kubeplane.services.cni): no manifest.
CNI_HOST_GW = "host-gw"
CNI_NONE = "none"

_TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
_RBAC = "rbac.authorization.k8s.io"
_KUBE_SYSTEM = "kube-system"
# Every bootstrap token authenticates as a member of this group; binding to it (rather than to a
# token-specific extra group) keeps the RBAC valid when the token is rotated.
_BOOTSTRAPPERS = "system:bootstrappers"
#: The ClusterRoleBinding of each bootstrap manifest a kubelet's TLS bootstrap needs: one lets the
#: bootstrap token create a CSR, the other lets kube-controller-manager approve it.
CSR_BINDINGS = {
    "01-csr-node-bootstrap": "create-csrs-for-bootstrapping",
    "01-csr-approver-role-binding": "auto-approve-csrs-for-group",
}
_IN_CLUSTER_CONFIGMAP = "kubeconfig-in-cluster"
_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Tolerate every NoSchedule/NoExecute taint: node agents must run on control plane nodes too.
_NODE_AGENT_TOLERATIONS = [
    {"effect": "NoSchedule", "operator": "Exists"},
    {"effect": "NoExecute", "operator": "Exists"},
]


@dataclass(frozen=True)
class ManifestInputs:
    """Everything the bootstrap manifests are rendered from (the ``system-manifests`` kcpc)."""

    kubernetes_version: render.KubeVersion
    server: str
    """The control plane endpoint URL: kube-proxy reaches the API server there, not via a Service."""
    bootstrap_token: str
    """``<id>.<secret>`` (``cluster.token``)."""
    pod_cidrs: tuple[str, ...]
    dns_service_ip: str
    proxy_image: str
    dns_domain: str = "cluster.local"
    cni: str = CNI_FLANNEL
    flannel_image: str = "quay.io/coreos/flannel:v0.13.0"
    cni_conf_dir: str = "/etc/cni/net.d"
    proxy_enabled: bool = True
    proxy_mode: str = "iptables"
    proxy_extra_args: Mapping[str, str] = field(default_factory=dict)
    coredns_enabled: bool = True
    coredns_image: str = "k8s.gcr.io/coredns:1.7.0"


def render_bootstrap_manifests(inputs: ManifestInputs) -> dict[str, list[dict[str, Any]]]:
    """Every bootstrap manifest for `inputs`, keyed by id in apply (sorted) order."""
    manifests: dict[str, list[dict[str, Any]]] = {
        "00-kubelet-bootstrapping-token": [_bootstrap_token_secret(inputs.bootstrap_token)],
        "01-csr-node-bootstrap": [
            _cluster_role_binding(
                CSR_BINDINGS["01-csr-node-bootstrap"], "system:node-bootstrapper", [_group(_BOOTSTRAPPERS)]
            )
        ],
        "01-csr-approver-role-binding": [
            _cluster_role_binding(
                CSR_BINDINGS["01-csr-approver-role-binding"],
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                [_group(_BOOTSTRAPPERS)],
            )
        ],
        "01-csr-renewal-role-binding": [
            _cluster_role_binding(
                "auto-approve-renewals-for-nodes",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                [_group(kube.NODES_GROUP)],
            )
        ],
        # Workers find the control plane nodes' own addresses (trustd signs only the address a
        # request comes from, so not through a load balancer) in this one object, with the token.
        "01-trustd-discovery": _trustd_discovery(),
        # The original bound kube-system's default account to cluster-admin so that add-ons
        # deployed there without their own RBAC keep working; kept for compatibility.
        "02-kube-system-sa-role-binding": [
            _cluster_role_binding(
                "system:default-sa", "cluster-admin", [_service_account("default", _KUBE_SYSTEM)]
            )
        ],
    }
    if render.has_pod_security_policy(inputs.kubernetes_version):
        manifests["03-default-pod-security-policy"] = _default_pod_security_policy()
    if inputs.cni == CNI_FLANNEL:
        manifests["05-flannel"] = _flannel(inputs)
    elif inputs.cni not in (CNI_CUSTOM, CNI_HOST_GW, CNI_NONE):
        raise RenderError(
            f"cluster.network.cni.name {inputs.cni!r} is not supported; "
            f"use {CNI_FLANNEL}, {CNI_HOST_GW}, {CNI_CUSTOM} (with urls) or {CNI_NONE}"
        )
    if inputs.proxy_enabled:
        manifests["10-kube-proxy"] = _kube_proxy(inputs)
    if inputs.coredns_enabled:
        manifests["11-core-dns"] = _coredns(inputs)
        manifests["11-core-dns-svc"] = [_coredns_service(inputs)]
    manifests["11-kube-config-in-cluster"] = [_kubeconfig_in_cluster(inputs.server)]
    return dict(sorted(manifests.items()))


def _meta(name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta.update(extra)
    return meta


def _group(name: str) -> dict[str, Any]:
    return {"apiGroup": _RBAC, "kind": "Group", "name": name}


def _service_account(name: str, namespace: str) -> dict[str, Any]:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


def _service_account_object(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, _KUBE_SYSTEM)}


def _cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": f"{_RBAC}/v1", "kind": "ClusterRole", "metadata": _meta(name), "rules": rules}


def _cluster_role_binding(name: str, role: str, subjects: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{_RBAC}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _meta(name),
        "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    }


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


def _trustd_discovery() -> list[dict[str, Any]]:
    """Bootstrap tokens may get ``Endpoints default/kubernetes``: the control plane nodes' addresses."""
    name = "kubeplane:trustd-discovery"
    rule = {**_rule([""], ["endpoints"], ["get"]), "resourceNames": ["kubernetes"]}
    role = {"apiVersion": f"{_RBAC}/v1", "kind": "Role", "metadata": _meta(name, "default"), "rules": [rule]}
    binding = {
        "apiVersion": f"{_RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": _meta(name, "default"),
        "roleRef": {"apiGroup": _RBAC, "kind": "Role", "name": name},
        "subjects": [_group(_BOOTSTRAPPERS)],
    }
    return [role, binding]


def _bootstrap_token_secret(token: str) -> dict[str, Any]:
    match = _TOKEN_RE.match(token)
    if match is None:
        # Never echo the token: it is a credential.
        raise RenderError(
            f"cluster.token must look like abcdef.0123456789abcdef (6 and 16 lowercase letters or "
            f"digits separated by a dot), got a value of {len(token)} characters; "
            "generate a new config or a token with `kubeplane gen config`"
        )
    token_id, token_secret = match.groups()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(f"bootstrap-token-{token_id}", _KUBE_SYSTEM),
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": token_id,
            "token-secret": token_secret,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
        },
    }


def _default_pod_security_policy() -> list[dict[str, Any]]:
    # Permissive by design: with the admission plugin on, a pod without any usable policy is
    # rejected, and the control plane's own mirror pods and add-ons must keep working.
    policy = {
        "apiVersion": "policy/v1beta1",
        "kind": "PodSecurityPolicy",
        "metadata": _meta(
            "privileged", annotations={"seccomp.security.alpha.kubernetes.io/allowedProfileNames": "*"}
        ),
        "spec": {
            "allowPrivilegeEscalation": True,
            "allowedCapabilities": ["*"],
            "fsGroup": {"rule": "RunAsAny"},
            "hostIPC": True,
            "hostNetwork": True,
            "hostPID": True,
            "hostPorts": [{"max": 65535, "min": 0}],
            "privileged": True,
            "runAsUser": {"rule": "RunAsAny"},
            "seLinux": {"rule": "RunAsAny"},
            "supplementalGroups": {"rule": "RunAsAny"},
            "volumes": ["*"],
        },
    }
    role = _cluster_role(
        "psp:privileged",
        [{**_rule(["policy"], ["podsecuritypolicies"], ["use"]), "resourceNames": ["privileged"]}],
    )
    binding = _cluster_role_binding(
        "psp:privileged", "psp:privileged", [_group("system:serviceaccounts"), _group(kube.NODES_GROUP)]
    )
    return [policy, role, binding]


def _flannel(inputs: ManifestInputs) -> list[dict[str, Any]]:
    if not inputs.pod_cidrs:
        raise RenderError("cluster.network.podSubnets is empty; flannel needs a pod subnet")
    cni_conf = {
        "name": "cbr0",
        "cniVersion": "0.3.1",
        "plugins": [
            {"type": "flannel", "delegate": {"hairpinMode": True, "isDefaultGateway": True}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    # flannel of this generation handles one IPv4 network: the first pod subnet.
    net_conf = {"Network": inputs.pod_cidrs[0], "Backend": {"Type": "vxlan"}}
    labels = {"app": "flannel", "tier": "node"}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta("kube-flannel-cfg", _KUBE_SYSTEM, labels=labels),
        "data": {
            "cni-conf.json": json.dumps(cni_conf, indent=2) + "\n",
            "net-conf.json": json.dumps(net_conf, indent=2) + "\n",
        },
    }
    pod_spec = {
        "hostNetwork": True,
        "priorityClassName": "system-node-critical",
        "serviceAccountName": "flannel",
        "tolerations": _NODE_AGENT_TOLERATIONS,
        "initContainers": [
            {
                "name": "install-cni",
                "image": inputs.flannel_image,
                "command": ["cp"],
                "args": ["-f", "/etc/kube-flannel/cni-conf.json", "/etc/cni/net.d/10-flannel.conflist"],
                "volumeMounts": [
                    {"name": "cni", "mountPath": "/etc/cni/net.d"},
                    {"name": "flannel-cfg", "mountPath": "/etc/kube-flannel/"},
                ],
            }
        ],
        "containers": [
            {
                "name": "kube-flannel",
                "image": inputs.flannel_image,
                "command": ["/opt/bin/flanneld"],
                "args": ["--ip-masq", "--kube-subnet-mgr"],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                ],
                "resources": {
                    "limits": {"cpu": "100m", "memory": "50Mi"},
                    "requests": {"cpu": "100m", "memory": "50Mi"},
                },
                "securityContext": {
                    "privileged": False,
                    "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]},
                },
                "volumeMounts": [
                    {"name": "run", "mountPath": "/run/flannel"},
                    {"name": "flannel-cfg", "mountPath": "/etc/kube-flannel/"},
                ],
            }
        ],
        "volumes": [
            {"name": "run", "hostPath": {"path": "/run/flannel"}},
            {"name": "cni", "hostPath": {"path": inputs.cni_conf_dir}},
            {"name": "flannel-cfg", "configMap": {"name": "kube-flannel-cfg"}},
        ],
    }
    daemon_set = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta("kube-flannel", _KUBE_SYSTEM, labels=labels),
        "spec": {
            "selector": {"matchLabels": {"app": "flannel"}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    role = _cluster_role(
        "flannel",
        [
            _rule([""], ["pods"], ["get"]),
            _rule([""], ["nodes"], ["list", "watch"]),
            _rule([""], ["nodes/status"], ["patch"]),
        ],
    )
    binding = _cluster_role_binding("flannel", "flannel", [_service_account("flannel", _KUBE_SYSTEM)])
    return [_service_account_object("flannel"), role, binding, config_map, daemon_set]


def _kube_proxy(inputs: ManifestInputs) -> list[dict[str, Any]]:
    defaults = {
        "cluster-cidr": ",".join(inputs.pod_cidrs),
        # A network namespace cannot change the global conntrack table size; 0 leaves it alone.
        "conntrack-max-per-core": "0",
        "hostname-override": "$(NODE_NAME)",
        "kubeconfig": "/etc/kubernetes/kubeconfig",
        "proxy-mode": inputs.proxy_mode,
    }
    command = [
        "/usr/local/bin/kube-proxy",
        *render.merge_flags(defaults, inputs.proxy_extra_args, where="cluster.proxy"),
    ]
    labels = {"k8s-app": "kube-proxy", "tier": "node"}
    pod_spec = {
        "hostNetwork": True,
        "priorityClassName": "system-node-critical",
        "serviceAccountName": "kube-proxy",
        "tolerations": _NODE_AGENT_TOLERATIONS,
        "containers": [
            {
                "name": "kube-proxy",
                "image": inputs.proxy_image,
                "imagePullPolicy": "IfNotPresent",
                "command": command,
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "securityContext": {"privileged": True},
                "volumeMounts": [
                    {"name": "kubeconfig", "mountPath": "/etc/kubernetes", "readOnly": True},
                    {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": True},
                    {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
                ],
            }
        ],
        "volumes": [
            {"name": "kubeconfig", "configMap": {"name": _IN_CLUSTER_CONFIGMAP}},
            {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}},
            # Shared with every other iptables user on the node so rule updates do not interleave.
            {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
        ],
    }
    daemon_set = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta("kube-proxy", _KUBE_SYSTEM, labels=labels),
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    binding = _cluster_role_binding(
        "kube-proxy", "system:node-proxier", [_service_account("kube-proxy", _KUBE_SYSTEM)]
    )
    return [_service_account_object("kube-proxy"), binding, daemon_set]


def _corefile(dns_domain: str) -> str:
    # No ``ttl``: the plugin's default (5 s) keeps a client's cached answer from outliving a
    # Service change by more than a few seconds.
    return (
        ".:53 {\n"
        "    errors\n"
        "    health {\n"
        "        lameduck 5s\n"
        "    }\n"
        "    ready\n"
        f"    kubernetes {dns_domain} in-addr.arpa ip6.arpa {{\n"
        "        pods insecure\n"
        "        fallthrough in-addr.arpa ip6.arpa\n"
        "    }\n"
        "    prometheus :9153\n"
        "    forward . /etc/resolv.conf\n"
        "    cache 30\n"
        "    loop\n"
        "    reload\n"
        "    loadbalance\n"
        "}\n"
    )


def _coredns(inputs: ManifestInputs) -> list[dict[str, Any]]:
    labels = {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}
    role = _cluster_role(
        "system:coredns",
        [
            _rule([""], ["endpoints", "services", "pods", "namespaces"], ["list", "watch"]),
            _rule(["discovery.k8s.io"], ["endpointslices"], ["list", "watch"]),
        ],
    )
    binding = _cluster_role_binding(
        "system:coredns", "system:coredns", [_service_account("coredns", _KUBE_SYSTEM)]
    )
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta("coredns", _KUBE_SYSTEM),
        "data": {"Corefile": _corefile(inputs.dns_domain)},
    }
    container = {
        "name": "coredns",
        "image": inputs.coredns_image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 9153, "protocol": "TCP"},
        ],
        "resources": {"limits": {"memory": "170Mi"}, "requests": {"cpu": "100m", "memory": "70Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["all"]},
            "readOnlyRootFilesystem": True,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": 8080, "scheme": "HTTP"},
            "initialDelaySeconds": 60,
            "timeoutSeconds": 5,
            "failureThreshold": 5,
        },
        # Probed every second (a local HTTP GET): a replica that starts (a new cluster, scaled up,
        # restarted) takes queries within a second of being ready.
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181, "scheme": "HTTP"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": True}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("coredns", _KUBE_SYSTEM, labels=labels),
        "spec": {
            "replicas": 2,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "priorityClassName": "system-cluster-critical",
                    "serviceAccountName": "coredns",
                    # Resolve upstream names through the node, not through itself.
                    "dnsPolicy": "Default",
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    # The replicas prefer different nodes, so one node going away leaves DNS up.
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "labelSelector": {
                                            "matchExpressions": [
                                                {"key": "k8s-app", "operator": "In", "values": ["kube-dns"]}
                                            ]
                                        },
                                        "topologyKey": "kubernetes.io/hostname",
                                    },
                                }
                            ]
                        }
                    },
                    "tolerations": [
                        {"key": "CriticalAddonsOnly", "operator": "Exists"},
                        {"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"},
                        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                    ],
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "config-volume",
                            "configMap": {
                                "name": "coredns",
                                "items": [{"key": "Corefile", "path": "Corefile"}],
                            },
                        }
                    ],
                },
            },
        },
    }
    return [_service_account_object("coredns"), role, binding, config_map, deployment]


def _coredns_service(inputs: ManifestInputs) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(
            "kube-dns",
            _KUBE_SYSTEM,
            labels={
                "k8s-app": "kube-dns",
                "kubernetes.io/cluster-service": "true",
                "kubernetes.io/name": "CoreDNS",
            },
            annotations={"prometheus.io/port": "9153", "prometheus.io/scrape": "true"},
        ),
        "spec": {
            "selector": {"k8s-app": "kube-dns"},
            "clusterIP": inputs.dns_service_ip,
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                {"name": "metrics", "port": 9153, "protocol": "TCP"},
            ],
        },
    }


def _kubeconfig_in_cluster(server: str) -> dict[str, Any]:
    # kube-proxy is what makes the `kubernetes` Service reachable, so it must talk to the control
    # plane endpoint directly; it authenticates with its own service account token.
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": f"{_SA_DIR}/ca.crt"}}
        ],
        "users": [{"name": "service-account", "user": {"tokenFile": f"{_SA_DIR}/token"}}],
        "contexts": [{"name": "default", "context": {"cluster": "local", "user": "service-account"}}],
        "current-context": "default",
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(_IN_CLUSTER_CONFIGMAP, _KUBE_SYSTEM),
        "data": {"kubeconfig": render.dump_yaml(kubeconfig)},
    }
