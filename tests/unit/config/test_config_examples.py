"""Every config example of the guides loads, validates and round-trips byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplane import config
from kubeplane.config import defaults
from kubeplane.config.document import dump

pytestmark = pytest.mark.unit

EXAMPLES = sorted((Path(__file__).parent / "examples").iterdir())
TOPICS = {
    "static_addressing",
    "additional_addresses",
    "bonding",
    "vlans",
    "registry_mirror_airgapped",
    "registry_pull_through_cache",
    "registry_config_tls_auth",
    "files_append_ca",
    "files_create_containerd",
    "proxy_env",
    "time_servers",
    "wireguard",
    "vip",
    "disk_encryption",
    "cluster_endpoint",
    "manifests",
}


def test_every_guide_topic_has_an_example() -> None:
    assert {path.stem for path in EXAMPLES} >= TOPICS


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads_and_round_trips(path: Path) -> None:
    text = path.read_text()
    document = config.load(text)
    assert document.to_yaml() == text
    if path.suffix == ".yaml":
        # Not just the kept source: ruamel writes the tree back identically in the guessed style.
        assert dump(document.tree, document.style) == text


def test_full_example_model(full_text: str) -> None:
    model = config.load(full_text).model
    machine, cluster = model.machine, model.cluster
    assert machine.is_control_plane and machine.role == "controlplane"
    assert machine.files is not None and machine.files[0].permissions == 0o644
    assert machine.kubelet is not None and machine.kubelet.extra_args == {
        "max-pods": "250",
        "rotate-server-certificates": "true",
    }
    assert machine.ca is not None and machine.ca.crt_pem().startswith(b"-----BEGIN CERTIFICATE-----")
    assert machine.ca.key_pem().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert cluster.api_service_ip == "10.96.0.1"
    assert cluster.dns_service_ip == "10.96.0.10"
    assert cluster.proxy is not None and cluster.proxy.mode == "ipvs"
    assert machine.network is not None and machine.network.interfaces is not None
    assert machine.network.interfaces[0].vip is not None


def test_defaults_apply_when_fields_are_absent(minimal: config.MachineConfig) -> None:
    cluster = minimal.model.cluster
    assert cluster.local_api_server_port == 6443
    assert cluster.dns_domain == "cluster.local"
    assert cluster.pod_subnets == ["10.244.0.0/16"]
    assert cluster.service_subnets == ["10.96.0.0/12"]
    assert cluster.cni_name == "flannel"
    assert cluster.controller_manager_image == "k8s.gcr.io/kube-controller-manager:v1.20.2"
    assert cluster.etcd_image == defaults.DEFAULT_ETCD_IMAGE
    assert minimal.model.machine.kubelet_image == defaults.DEFAULT_KUBELET_IMAGE


def test_derived_service_ips_follow_the_first_service_subnet(minimal_text: str) -> None:
    text = minimal_text + "  network:\n    serviceSubnets:\n      - 192.168.128.0/20\n      - fd00::/112\n"
    cluster = config.load(text).model.cluster
    assert (cluster.api_service_ip, cluster.dns_service_ip) == ("192.168.128.1", "192.168.128.10")


@pytest.mark.parametrize(
    ("kind", "control_plane"), [("init", True), ("controlplane", True), ("join", False), ("worker", False)]
)
def test_machine_types(minimal_text: str, kind: str, control_plane: bool) -> None:
    machine = config.load(minimal_text.replace("type: controlplane", f"type: {kind}")).model.machine
    assert machine.is_control_plane is control_plane
    assert machine.role == ("worker" if kind == "join" else kind)


def test_to_dict_is_plain_and_copy_is_independent(full_text: str) -> None:
    document = config.load(full_text)
    data = document.to_dict()
    assert data["machine"]["files"][0]["permissions"] == 0o644
    assert type(data["cluster"]["controlPlane"]) is dict
    clone = document.copy()
    clone.tree["machine"]["type"] = "worker"
    assert document.tree["machine"]["type"] == "controlplane"


def test_from_dict_builds_a_valid_document(minimal: config.MachineConfig) -> None:
    built = config.MachineConfig.from_dict(minimal.to_dict())
    assert built.model == minimal.model
    assert config.load(built.to_yaml()).to_dict() == minimal.to_dict()


def test_comments_survive_a_change_elsewhere(full_text: str) -> None:
    patched = config.apply_merge_patch(config.load(full_text), {"machine": {"time": {"disabled": True}}})
    text = patched.to_yaml()
    assert "# trustd join token" in text and "# numbers are read as strings" in text
    assert text.replace("disabled: true\n    servers", "disabled: false\n    servers") == full_text
