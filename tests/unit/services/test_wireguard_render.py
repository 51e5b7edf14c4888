"""WireGuard devices, pure: what machine.network asks for, the UAPI set request that configures a
device (hex keys, resolved endpoints, whole-second keepalives, every peer replaced), reading a
device's get response back, and telling whether a device already has its configuration. Also the
process side's clear failure when wireguard-go is not installed."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from kubeplane import pki
from kubeplane.config import models
from kubeplane.services import machinenet, wireguard, wireguard_io

pytestmark = pytest.mark.unit

# RFC 7748's X25519 test vector (Alice), as WireGuard keys.
PRIVATE_HEX = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
PUBLIC_HEX = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
PRIVATE = base64.b64encode(bytes.fromhex(PRIVATE_HEX)).decode()
PUBLIC = base64.b64encode(bytes.fromhex(PUBLIC_HEX)).decode()
PEER = "8vy509p7j40ExyJLiWxeokxy8yJlYVfQOv80rAunEEE="
PEER_HEX = base64.b64decode(PEER).hex()


def network(**wireguard_config: object) -> models.MachineNetwork:
    return models.MachineNetwork.model_validate(
        {
            "interfaces": [
                {
                    "interface": "wg0",
                    "cidr": "10.1.0.2/24",
                    "wireguard": {"privateKey": PRIVATE, **wireguard_config},
                }
            ]
        }
    )


def resolve(endpoint: str) -> str:
    return {"cp.example:51111": "10.5.0.2:51111"}.get(endpoint, endpoint)


def test_public_keys_are_derived_as_wg_pubkey_does() -> None:
    assert pki.wireguard_public_key(PRIVATE) == PUBLIC
    fresh = pki.wireguard_private_key()
    assert len(base64.b64decode(fresh)) == 32 and pki.wireguard_public_key(fresh) != PUBLIC


def test_the_config_becomes_a_device_on_its_link() -> None:
    wanted = machinenet.desired(
        network(
            listenPort=51111,
            peers=[
                {
                    "publicKey": PEER,
                    "endpoint": "cp.example:51111",
                    "allowedIPs": ["10.1.0.3/32", "192.168.88.1/24"],
                    "persistentKeepaliveInterval": "1m",
                }
            ],
        )
    )
    assert wanted.unsupported == () and wanted.errors == ()
    assert [link.name for link in wanted.links] == ["wg0"]
    assert wanted.wireguard == (
        wireguard.Device(
            name="wg0",
            private_key=PRIVATE,
            listen_port=51111,
            firewall_mark=0,
            peers=(
                wireguard.Peer(
                    public_key=PEER,
                    endpoint="cp.example:51111",
                    keepalive=60,
                    allowed_ips=("10.1.0.3/32", "192.168.88.0/24"),
                ),
            ),
            field="machine.network.interfaces[0].wireguard",
        ),
    )


def test_two_wireguard_configurations_for_one_link_are_an_error() -> None:
    twice = models.MachineNetwork.model_validate(
        {"interfaces": [{"interface": "wg0", "wireguard": {"privateKey": PRIVATE}}] * 2}
    )
    assert machinenet.desired(twice).errors == (
        "machine.network.interfaces[1].wireguard: wg0 is configured in "
        "machine.network.interfaces[0].wireguard already",
    )


def test_the_set_request_replaces_the_whole_configuration() -> None:
    (device,) = machinenet.desired(
        network(
            listenPort=51111,
            peers=[
                {
                    "publicKey": PEER,
                    "endpoint": "cp.example:51111",
                    "allowedIPs": ["10.1.0.3/32"],
                    "persistentKeepaliveInterval": "5s",
                },
                {"publicKey": PUBLIC, "allowedIPs": ["10.1.0.4/32"]},
            ],
        )
    ).wireguard
    assert wireguard.set_request(device, resolve) == (
        f"set=1\nprivate_key={PRIVATE_HEX}\nlisten_port=51111\nfwmark=0\nreplace_peers=true\n"
        f"public_key={PEER_HEX}\nendpoint=10.5.0.2:51111\npersistent_keepalive_interval=5\n"
        "replace_allowed_ips=true\nallowed_ip=10.1.0.3/32\n"
        f"public_key={PUBLIC_HEX}\npersistent_keepalive_interval=0\nreplace_allowed_ips=true\n"
        "allowed_ip=10.1.0.4/32\n\n"
    )
    # No listen port configured: the device keeps the one it picked.
    (portless,) = machinenet.desired(network()).wireguard
    assert "listen_port" not in wireguard.set_request(portless, resolve)


def test_endpoints_split_and_join_with_ipv6_brackets() -> None:
    assert wireguard.split_endpoint("[fd00::1]:51820") == ("fd00::1", 51820)
    assert wireguard.split_endpoint("10.5.0.2:51111") == ("10.5.0.2", 51111)
    assert wireguard.join_endpoint("fd00::1", 51820) == "[fd00::1]:51820"
    assert wireguard_io.resolve_endpoint("127.0.0.1:51111") == "127.0.0.1:51111"


GET_RESPONSE = (
    f"private_key={PRIVATE_HEX}\nlisten_port=51111\n"
    f"public_key={PEER_HEX}\nendpoint=10.5.0.2:51111\nlast_handshake_time_sec=1700000000\n"
    "last_handshake_time_nsec=5\ntx_bytes=148\nrx_bytes=92\npersistent_keepalive_interval=5\n"
    "allowed_ip=10.1.0.3/32\nprotocol_version=1\nerrno=0\n\n"
)


def test_a_get_response_is_read_back_with_base64_keys_and_handshakes() -> None:
    assert wireguard.parse_get(GET_RESPONSE) == wireguard.DeviceState(
        private_key=PRIVATE,
        listen_port=51111,
        firewall_mark=0,
        peers=(
            wireguard.PeerState(
                public_key=PEER,
                endpoint="10.5.0.2:51111",
                keepalive=5,
                allowed_ips=("10.1.0.3/32",),
                latest_handshake=1700000000,
                rx_bytes=92,
                tx_bytes=148,
            ),
        ),
    )


def test_only_a_device_that_differs_from_the_config_is_set_again() -> None:
    peer = {"publicKey": PEER, "endpoint": "cp.example:51111", "allowedIPs": ["10.1.0.3/32"]}
    state = wireguard.parse_get(GET_RESPONSE)

    def device(**changes: object) -> wireguard.Device:
        (found,) = machinenet.desired(
            network(listenPort=51111, peers=[{**peer, "persistentKeepaliveInterval": "5s", **changes}])
        ).wireguard
        return found

    assert wireguard.matches(device(), state, resolve)
    # A peer without an endpoint takes whatever endpoint the device learned from it.
    assert wireguard.matches(device(endpoint=None), state, resolve)
    assert not wireguard.matches(device(endpoint="10.5.0.9:51111"), state, resolve)
    assert not wireguard.matches(device(allowedIPs=["10.1.0.0/24"]), state, resolve)
    assert not wireguard.matches(device(persistentKeepaliveInterval="25s"), state, resolve)
    assert not wireguard.matches(device(publicKey=PUBLIC), state, resolve)
    (other_port,) = machinenet.desired(network(listenPort=51820)).wireguard
    assert not wireguard.matches(other_port, state, resolve)


def test_a_missing_wireguard_go_is_named_and_nothing_runs(tmp_path: Path) -> None:
    daemons = wireguard_io.Daemons(log_dir=tmp_path, binary="no-such-wireguard-go", socket_dir=tmp_path)
    with pytest.raises(wireguard_io.WireguardError) as caught:
        asyncio.run(daemons.converge(["wg0"]))
    assert str(caught.value) == (
        "no-such-wireguard-go is not installed: WireGuard device wg0 needs the userspace implementation "
        "(this kernel has no wireguard module; apt-get install wireguard-go)"
    )
    assert daemons.pid("wg0") is None
