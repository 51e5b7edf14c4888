"""Validation errors: every problem at once, each with its field path and what was expected."""

from __future__ import annotations

import pytest

from kubeplane import config

pytestmark = pytest.mark.unit

HEADER = "version: v1alpha1\n"
CLUSTER = "cluster:\n  controlPlane:\n    endpoint: https://10.5.0.1:6443\n"


def errors_of(text: str, **kwargs: object) -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        config.load(text, **kwargs)  # type: ignore[arg-type]
    return [str(error) for error in caught.value.errors]


def test_all_errors_reported_at_once_with_paths() -> None:
    text = """\
version: v1alpha1
machine:
  type: worker
  network:
    interfaces:
      - interface: eth0
        cidr: 10.5.0.300/24
        mtu: "1500"
        vip:
          ip: 10.5.0.15
  files:
    - path: etc/motd
      content: hi
      op: prepend
cluster:
  controlPlane:
    endpoint: http://10.5.0.1:6443
  network:
    dnsDomain: Cluster_Local
    cni:
      name: custom
"""
    assert errors_of(text) == [
        'machine.network.interfaces[0].cidr: "10.5.0.300/24" is not a valid CIDR '
        "(expected address/prefix, e.g. 10.5.0.2/24)",
        'machine.network.interfaces[0].mtu: expected an integer, got "1500" (a string)',
        'machine.files[0].path: "etc/motd" is not an absolute path (expected it to start with /)',
        'machine.files[0].op: "prepend" is not allowed (expected create, append or overwrite)',
        'cluster.controlPlane.endpoint: "http://10.5.0.1:6443" is not a valid URL '
        "(expected https://HOST[:PORT][/PATH])",
        'cluster.network.dnsDomain: "Cluster_Local" is not a valid DNS domain (expected lower-case labels '
        "of letters, digits and '-' separated by dots, e.g. cluster.local)",
    ]


def test_cross_field_rules_of_one_section_run_despite_errors_in_the_other() -> None:
    text = (
        HEADER
        + """\
machine:
  type: worker
  network:
    interfaces:
      - interface: eth0
        dhcp: true
        vip:
          ip: 10.5.0.15
cluster:
  controlPlane:
    endpoint: 42
"""
    )
    assert errors_of(text) == [
        "machine.network.interfaces[0].vip: a shared IP (vip) is only allowed on control plane nodes, "
        "this is a worker node (remove vip or set machine.type to controlplane)",
        'cluster.controlPlane.endpoint: "42" is not a valid URL (expected https://HOST[:PORT][/PATH])',
    ]


def test_error_string_lists_every_problem() -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.load(HEADER + "machine:\n  type: master\n  colour: blue\n" + CLUSTER)
    assert str(caught.value) == (
        "2 problems in machine config:\n"
        '  machine.type: "master" is not allowed (expected init, controlplane, join or worker)\n'
        "  machine.colour: unknown field (expected one of: type, token, ca, certSANs, kubelet,"
        " network, disks, "
        "install, files, env, time, sysctls, registries, systemDiskEncryption, ports)"
    )


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        (
            "machine:\n  type: controlplane\n  systemDiskEncryption:\n    ephemeral:\n      keys:\n"
            "        - static:\n            passphrase: oldkey\n          keySlot: 0\n",
            [
                'machine.systemDiskEncryption.ephemeral.keys[0].keySlot: unknown field (did you mean "slot"? '
                "expected one of: static, nodeID, slot)"
            ],
        ),
        (
            "machine:\n  type: controlplane\n  systemDiskEncryption:\n    state:\n      keys:\n"
            "        - nodeID: {}\n        - nodeID: {}\n          slot: 3\n        - nodeID: {}\n   "
            "       slot: 3\n",
            [
                "machine.systemDiskEncryption.state.keys[0].slot: every key needs a slot (expected an"
                " integer 0-31)",
                "machine.systemDiskEncryption.state.keys[2].slot: slot 3 is used by another key"
                " (slots must be unique)",
            ],
        ),
        (
            "machine:\n  type: init\n  registries:\n    mirrors:\n      docker.io:\n       "
            " endpoints: [10.5.0.1:5000]\n",
            [
                'machine.registries.mirrors["docker.io"].endpoints[0]: "10.5.0.1:5000" is not a valid URL '
                "(expected http:// or https://HOST[:PORT][/PATH])"
            ],
        ),
        (
            "machine:\n  type: init\n  network:\n    interfaces:\n      - interface: eth0\n        routes:\n"
            "          - network: 0.0.0.0/0\n            gateway: fd00::1\n",
            [
                "machine.network.interfaces[0].routes[0].gateway: gateway fd00::1 is IPv6 but network "
                "0.0.0.0/0 is IPv4"
            ],
        ),
        (
            "machine:\n  type: init\n  network:\n    interfaces:\n      - interface: wg0\n       "
            " wireguard:\n"
            "          privateKey: not-a-key\n",
            [
                'machine.network.interfaces[0].wireguard.privateKey: "not-a-key" is not valid base64 '
                "(expected standard base64 of the value)"
            ],
        ),
        (
            "machine:\n  type: init\n  network:\n    interfaces:\n      - interface: wg0\n       "
            " wireguard:\n"
            "          privateKey: DfNT3K6s8U3YhpFOBGj9VUIuxogjYAsRcQn4MBt5QEU=\n"
            "          peers:\n"
            "            - publicKey: 8vy509p7j40ExyJLiWxeokxy8yJlYVfQOv80rAunEEE=\n"
            "              persistentKeepaliveInterval: 1500ms\n",
            [
                "machine.network.interfaces[0].wireguard.peers[0].persistentKeepaliveInterval: "
                '"1500ms" is not a whole number of seconds up to 65535 (expected e.g. 5s or 25s)'
            ],
        ),
        (
            "machine:\n  type: init\n  network:\n    interfaces:\n      - interface: wg0\n       "
            " wireguard:\n"
            "          privateKey: DfNT3K6s8U3YhpFOBGj9VUIuxogjYAsRcQn4MBt5QEU=\n"
            "          peers:\n"
            "            - publicKey: c2hvcnQ=\n",
            [
                'machine.network.interfaces[0].wireguard.peers[0].publicKey: "c2hvcnQ=" is not a '
                "WireGuard key (expected 32 bytes in base64, as printed by `wg genkey`)"
            ],
        ),
        (
            "machine:\n  type: init\n  time:\n"
            "    servers: [pool.ntp.org, '[fd00::1]:123', 'ntp:99999', 'a b']\n",
            [
                'machine.time.servers[2]: "ntp:99999" is not HOST[:PORT]: the port must be 1-65535',
                'machine.time.servers[3]: "a b" is not HOST[:PORT]: "a b" is not a host name or address',
            ],
        ),
        (
            "machine:\n  type: init\n  env:\n    http-proxy: x\n",
            ['machine.env.http-proxy: key "http-proxy" is not a valid environment variable name'],
        ),
        (
            "machine:\n  type: init\n  network:\n    interfaces:\n      - interface: eth0\n        vlans:\n"
            "          - vlanId: 5000\n",
            [
                "machine.network.interfaces[0].vlans[0].vlanId: 5000 is out of range (expected less"
                " than or equal to 4094)"
            ],
        ),
        (
            "machine:\n  type: init\n  network:\n    interfaces:\n      - interface: enp0s31f6name\n"
            "        vlans:\n          - vlanId: 100\n",
            [
                "machine.network.interfaces[0].vlans[0].vlanId: the VLAN link enp0s31f6name.100 would have a "
                "name longer than the kernel's 15 characters (the link is named <interface>.<vlanId>)"
            ],
        ),
        (
            "machine:\n  type: init\n  network:\n    interfaces:\n      - interface: bond0\n        bond:\n"
            "          interfaces: [eth0, eth1]\n          primary: eth2\n          adActorSystem: 02-00\n",
            [
                "machine.network.interfaces[0].bond.primary: eth2 is not one of the bond's interfaces",
                'machine.network.interfaces[0].bond.adActorSystem: "02-00" is not a MAC address (expected '
                "e.g. 02:00:00:00:00:01)",
            ],
        ),
    ],
)
def test_machine_rules(snippet: str, expected: list[str]) -> None:
    assert errors_of(HEADER + snippet + CLUSTER) == expected


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        (
            "  network:\n    cni:\n      name: custom\n",
            ["cluster.network.cni.urls: required when cni.name is custom (the URLs of the CNI manifests)"],
        ),
        (
            "  network:\n    podSubnets: [10.96.0.0/16]\n    serviceSubnets: [10.96.0.0/29]\n",
            [
                "cluster.network.serviceSubnets[0]: 10.96.0.0/29 is too small (the DNS service takes"
                " its 10th "
                "address; use /28 or larger)",
                "cluster.network: pod subnet 10.96.0.0/16 overlaps service subnet 10.96.0.0/29",
            ],
        ),
        (
            "  token: not-a-token\n",
            [
                "cluster.token: is not a bootstrap token (expected 6 + 16 lower-case letters/digits, "
                "e.g. abcdef.0123456789abcdef)"
            ],
        ),
        (
            "  inlineManifests:\n    - name: a\n      contents: x\n    - name: a\n      contents: y\n",
            ['cluster.inlineManifests[1].name: "a" is used twice'],
        ),
    ],
)
def test_cluster_rules(snippet: str, expected: list[str]) -> None:
    assert errors_of(HEADER + "machine:\n  type: controlplane\n" + CLUSTER + snippet) == expected


def test_missing_required_fields_say_what_to_write() -> None:
    assert errors_of("version: v1alpha1\nmachine: {}\ncluster: {}\n") == [
        "machine.type: required (expected init, controlplane, join or worker)",
        "cluster.controlPlane: required (expected endpoint: https://HOST:PORT of the control plane)",
    ]
    assert errors_of("machine:\n  type: init\n") == [
        "version: required (expected v1alpha1)",
        "cluster: required (the cluster section; at least controlPlane.endpoint)",
    ]


def test_worker_configs_must_not_carry_cluster_private_keys(full_text: str) -> None:
    errors = errors_of(full_text.replace("type: controlplane", "type: worker"))
    assert "cluster.ca.key: a worker config must not carry this private key (remove it)" in errors
    assert "cluster.serviceAccount.key: a worker config must not carry this private key (remove it)" in errors


def test_metal_mode_requires_install(minimal_text: str, full_text: str) -> None:
    assert errors_of(minimal_text, mode="metal") == [
        "machine.install.disk: required in metal mode (the disk to install to, e.g. /dev/sda)",
        "machine.install.image: required in metal mode (the installer image)",
    ]
    assert config.load(full_text, mode="metal").warnings == []
    assert [str(w) for w in config.load(full_text, mode="local").warnings] == [
        "machine.install: ignored in local mode",
        "machine.disks: ignored in local mode",
        "machine.systemDiskEncryption: ignored in local mode",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "(document): the document is empty (expected a mapping with version, machine and cluster)"),
        ("- a\n- b\n", "(document): expected a mapping with version, machine and cluster, got a list"),
        ("a: [1\n", "(document): not valid YAML: "),
        ("version: v1alpha1\nversion: v1alpha1\n", '(document): not valid YAML: duplicate key "version"'),
        (b"\xff\xfe", "(document): not UTF-8 text"),
    ],
)
def test_unparsable_documents(text: str | bytes, expected: str) -> None:
    (error,) = errors_of(text)  # type: ignore[arg-type]
    assert error.startswith(expected)
