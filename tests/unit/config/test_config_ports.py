"""``machine.ports``: the node API and trustd ports, their defaults, validation and generation.

Every node of a cluster dials the others on these ports, so the checks refuse a port that another
service of a node already listens on (the guide's "Configuring Network Connectivity" table and
the Kubernetes ports next to it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kubeplane import config
from kubeplane.agent.node import Node
from kubeplane.api import trustd
from kubeplane.cli import main as cli_main
from kubeplane.config import client
from kubeplane.config import generate as gen

pytestmark = pytest.mark.unit


def document(ports: str = "", *, local_api_server_port: int | None = None) -> str:
    control_plane = "    endpoint: https://10.5.0.1:6443\n"
    if local_api_server_port is not None:
        control_plane += f"    localAPIServerPort: {local_api_server_port}\n"
    return (
        "version: v1alpha1\nmachine:\n  type: controlplane\n"
        + (f"  ports:\n{ports}" if ports else "")
        + "cluster:\n  controlPlane:\n"
        + control_plane
    )


def errors_of(text: str) -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        config.load(text)
    return [str(error) for error in caught.value.errors]


def test_defaults_are_the_guides_ports() -> None:
    machine = config.load(document()).model.machine
    assert (machine.node_api_port, machine.trustd_port) == (50000, 50001)
    assert "ports" not in config.load(document()).to_dict()["machine"]


def test_ports_are_read_from_the_config() -> None:
    machine = config.load(document("    nodeAPI: 51000\n    trustd: 51001\n")).model.machine
    assert (machine.node_api_port, machine.trustd_port) == (51000, 51001)
    # Setting one leaves the other at its default.
    machine = config.load(document("    trustd: 51001\n")).model.machine
    assert (machine.node_api_port, machine.trustd_port) == (50000, 51001)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "machine.ports.nodeAPI: 0 is out of range (expected greater than or equal to 1)"),
        ("65536", "machine.ports.nodeAPI: 65536 is out of range (expected less than or equal to 65535)"),
        ("api", "machine.ports.nodeAPI:"),
    ],
)
def test_port_out_of_range_names_the_field(value: str, message: str) -> None:
    errors = errors_of(document(f"    nodeAPI: {value}\n"))
    assert len(errors) == 1
    assert errors[0].startswith(message)


def test_unknown_port_name_is_refused() -> None:
    errors = errors_of(document("    apid: 50000\n"))
    assert errors == ["machine.ports.apid: unknown field (expected one of: nodeAPI, trustd)"]


def test_the_two_ports_must_differ() -> None:
    assert errors_of(document("    nodeAPI: 51000\n    trustd: 51000\n")) == [
        "machine.ports.trustd: 51000 is also the node API's port (machine.ports.nodeAPI): give each its own"
    ]
    # The default of one counts too.
    assert errors_of(document("    nodeAPI: 50001\n")) == [
        "machine.ports.trustd: 50001 is also the node API's port (machine.ports.nodeAPI): give each its own"
    ]


@pytest.mark.parametrize(
    ("port", "owner"),
    [
        (2379, "etcd client"),
        (2380, "etcd peer"),
        (10250, "kubelet API"),
        (10248, "kubelet healthz"),
        (10257, "kube-controller-manager"),
        (10259, "kube-scheduler"),
        (10256, "kube-proxy healthz"),
        (50010, "kubeplaned metrics"),
        (6443, "kube-apiserver (cluster.controlPlane.localAPIServerPort)"),
    ],
)
def test_ports_of_other_services_are_refused(port: int, owner: str) -> None:
    assert errors_of(document(f"    nodeAPI: {port}\n")) == [
        f"machine.ports.nodeAPI: {port} is already the port of {owner}"
    ]
    assert errors_of(document(f"    trustd: {port}\n")) == [
        f"machine.ports.trustd: {port} is already the port of {owner}"
    ]


def test_the_api_servers_configured_port_is_the_one_refused() -> None:
    assert errors_of(document("    nodeAPI: 7443\n", local_api_server_port=7443)) == [
        "machine.ports.nodeAPI: 7443 is already the port of kube-apiserver "
        "(cluster.controlPlane.localAPIServerPort)"
    ]
    # 6443 is free once the API server moved away from it.
    assert (
        config.load(document("    nodeAPI: 6443\n", local_api_server_port=7443)).model.machine.node_api_port
        == 6443
    )


def test_changing_the_ports_needs_a_reboot() -> None:
    old = config.load(document())
    new = config.load(document("    nodeAPI: 51000\n"))
    allowed = config.allowed_modes(old, new)
    assert allowed.changed == ("machine.ports",)
    assert not allowed.allows("immediate")
    assert allowed.allows("reboot")


# --- generation ---------------------------------------------------------------------------------


def test_gen_sets_the_ports_in_every_config_and_the_client_endpoint() -> None:
    options = gen.GenOptions(
        cluster_name="demo",
        endpoint="https://10.5.0.1:6443",
        with_init=True,
        node_api_port=51000,
        trustd_port=51001,
    )
    generated = gen.generate(options, gen.new_secrets())
    for name, doc in generated.documents.items():
        assert doc["machine"]["ports"] == {"nodeAPI": 51000, "trustd": 51001}, name
    assert generated.client_config.contexts["demo"].endpoints == ("10.5.0.1:51000",)


def test_gen_without_ports_leaves_them_out() -> None:
    generated = gen.generate(
        gen.GenOptions(cluster_name="demo", endpoint="https://10.5.0.1:6443"), gen.new_secrets()
    )
    assert all("ports" not in doc["machine"] for doc in generated.documents.values())
    assert generated.client_config.contexts["demo"].endpoints == ("10.5.0.1",)


def test_gen_client_endpoint_follows_a_patched_port() -> None:
    patch = gen.parse_patch('{"machine": {"ports": {"nodeAPI": 51000}}}')
    options = gen.GenOptions(cluster_name="demo", endpoint="https://[fd00::1]:6443", patches=(patch,))
    generated = gen.generate(options, gen.new_secrets())
    assert generated.client_config.contexts["demo"].endpoints == ("[fd00::1]:51000",)


def test_gen_refuses_colliding_ports() -> None:
    options = gen.GenOptions(cluster_name="demo", endpoint="https://10.5.0.1:6443", node_api_port=10250)
    with pytest.raises(
        gen.GenerateError, match=r"machine\.ports\.nodeAPI: 10250 is already the port of kubelet API"
    ):
        gen.generate(options, gen.new_secrets())


def test_gen_config_cli_options(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli_main.cli,
        [
            "gen",
            "config",
            "demo",
            "https://10.5.0.1:6443",
            "-o",
            str(tmp_path),
            "--node-api-port",
            "51000",
            "--trustd-port",
            "51001",
        ],
    )
    assert result.exit_code == 0, result.output
    for name in ("controlplane", "worker"):
        machine = config.load((tmp_path / f"{name}.yaml").read_text()).model.machine
        assert (machine.node_api_port, machine.trustd_port) == (51000, 51001)
    context = client.loads((tmp_path / "kubeplaneconfig").read_text()).contexts["demo"]
    assert context.endpoints == ("10.5.0.1:51000",)
    refused = CliRunner().invoke(
        cli_main.cli,
        ["gen", "config", "demo", "https://10.5.0.1:6443", "-o", str(tmp_path), "--trustd-port", "0"],
    )
    assert refused.exit_code == 2
    assert "--trustd-port" in refused.output


# --- where the agent listens and dials ------------------------------------------------------------


def test_trustd_targets_use_the_configured_port() -> None:
    assert trustd.endpoints("https://10.5.0.1:6443", ["10.5.0.2", "fd00::2"], port=51001) == [
        "10.5.0.1:51001",
        "10.5.0.2:51001",
        "[fd00::2]:51001",
    ]
    assert trustd.target("10.5.0.2") == "10.5.0.2:50001"


@pytest.mark.parametrize(
    ("listen", "ports", "expected"),
    [
        ("10.5.0.2:50000", "", "10.5.0.2:50000"),
        ("10.5.0.2:50000", "    nodeAPI: 51000\n", "10.5.0.2:51000"),
        ("0.0.0.0:50000", "    nodeAPI: 51000\n", "0.0.0.0:51000"),
        ("[fd00::2]:50000", "    nodeAPI: 51000\n", "[fd00::2]:51000"),
        # Only trustd moved: the node API stays where --listen put it.
        ("10.5.0.2:52000", "    trustd: 51001\n", "10.5.0.2:52000"),
    ],
)
def test_secure_api_listens_on_the_configured_port(
    tmp_path: Path, listen: str, ports: str, expected: str
) -> None:
    node = Node(root=tmp_path, listen=listen, services=False)
    machine = config.load(document(ports)).model.machine
    assert node._secure_listen(machine) == expected
