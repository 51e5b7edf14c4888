"""WireGuard devices from ``machine.network.interfaces[].wireguard``, pure: what the config asks
for, the requests that configure a device, and what a device reports about itself.

This kernel has no ``wireguard`` module, so a device is the TUN interface of a userspace
``wireguard-go`` (run by :mod:`kubeplane.services.wireguard_io`). The device is configured over
the UAPI socket ``wireguard-go`` opens (``/var/run/wireguard/<name>.sock``), speaking the
documented cross-platform text protocol (https://www.wireguard.com/xplatform/) directly rather than
running ``wg setconf``: the private key never touches a file or an argument list, one protocol
both sets the device (:func:`set_request`) and reads it back (:func:`parse_get`, whose latest
handshakes the ``WireguardDevices`` resources show), and nothing but ``wireguard-go`` has to be
installed. ``wg show`` (wireguard-tools) speaks the same socket, so an operator sees the same.

The set request replaces the device's whole configuration (``replace_peers``), so a peer removed
from the config is removed from the device. Because that also drops the peers' sessions, the
controller only sends it when :func:`matches` says the device differs from the config.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
from collections.abc import Callable, Mapping

from kubeplane.config import models
from kubeplane.config.scalars import duration_seconds

#: The directory ``wireguard-go`` (and ``wg``) keep the devices' UAPI sockets in.
SOCKET_DIR = "/var/run/wireguard"


@dataclasses.dataclass(frozen=True)
class Peer:
    """A configured peer; keys are base64 as in the config, ``endpoint`` is ``HOST:PORT``."""

    public_key: str
    endpoint: str | None
    keepalive: int
    allowed_ips: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Device:
    """A configured WireGuard device ``name``, from config field ``field``."""

    name: str
    private_key: str
    listen_port: int | None
    firewall_mark: int
    peers: tuple[Peer, ...]
    field: str


@dataclasses.dataclass(frozen=True)
class PeerState:
    """A peer as the device reports it (keys base64; ``latest_handshake`` in Unix seconds, 0: never)."""

    public_key: str
    endpoint: str
    keepalive: int
    allowed_ips: tuple[str, ...]
    latest_handshake: int
    rx_bytes: int
    tx_bytes: int


@dataclasses.dataclass(frozen=True)
class DeviceState:
    """What ``get=1`` reports for a device (keys base64)."""

    private_key: str
    listen_port: int
    firewall_mark: int
    peers: tuple[PeerState, ...]


def device(interface: models.Interface, field: str) -> Device | None:
    """The WireGuard device ``interface`` asks for (``field`` is its config path), or None."""
    wireguard = interface.wireguard
    if wireguard is None:
        return None
    peers = tuple(
        Peer(
            public_key=peer.public_key,
            endpoint=peer.endpoint or None,
            keepalive=int(duration_seconds(peer.persistent_keepalive_interval or "0")),
            allowed_ips=tuple(str(ipaddress.ip_network(ip, strict=False)) for ip in peer.allowed_ips or ()),
        )
        for peer in wireguard.peers or ()
    )
    return Device(
        name=interface.interface,
        private_key=wireguard.private_key,
        listen_port=wireguard.listen_port,
        firewall_mark=wireguard.firewall_mark or 0,
        peers=peers,
        field=f"{field}.wireguard",
    )


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` (validated by the config) as host and port."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def join_endpoint(ip: str, port: int) -> str:
    """``IP:PORT``, with the brackets an IPv6 address needs."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def set_request(wanted: Device, resolve: Callable[[str], str]) -> str:
    """The UAPI ``set=1`` request that gives the device exactly ``wanted``'s configuration.

    ``resolve`` turns a configured ``HOST:PORT`` endpoint into ``IP:PORT`` (the protocol takes
    addresses only).
    """
    lines = ["set=1", f"private_key={_hex(wanted.private_key)}"]
    if wanted.listen_port is not None:
        lines.append(f"listen_port={wanted.listen_port}")
    lines += [f"fwmark={wanted.firewall_mark}", "replace_peers=true"]
    for peer in wanted.peers:
        lines.append(f"public_key={_hex(peer.public_key)}")
        if peer.endpoint is not None:
            lines.append(f"endpoint={resolve(peer.endpoint)}")
        lines += [f"persistent_keepalive_interval={peer.keepalive}", "replace_allowed_ips=true"]
        lines += [f"allowed_ip={cidr}" for cidr in peer.allowed_ips]
    return "\n".join(lines) + "\n\n"


def parse_get(response: str) -> DeviceState:
    """The device described by a UAPI ``get=1`` response (``key=value`` lines, ``errno`` last)."""
    device_fields: dict[str, str] = {}
    peers: list[dict[str, list[str]]] = []
    for line in response.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "public_key":
            peers.append({})
        if peers:
            peers[-1].setdefault(key, []).append(value)
        else:
            device_fields[key] = value
    return DeviceState(
        private_key=_base64(device_fields.get("private_key", "")),
        listen_port=int(device_fields.get("listen_port", "0")),
        firewall_mark=int(device_fields.get("fwmark", "0")),
        peers=tuple(_peer_state(fields) for fields in peers),
    )


def _peer_state(fields: Mapping[str, list[str]]) -> PeerState:
    def one(key: str, default: str = "0") -> str:
        return fields.get(key, [default])[-1]

    return PeerState(
        public_key=_base64(one("public_key", "")),
        endpoint=one("endpoint", ""),
        keepalive=int(one("persistent_keepalive_interval")),
        allowed_ips=tuple(fields.get("allowed_ip", ())),
        latest_handshake=int(one("last_handshake_time_sec")),
        rx_bytes=int(one("rx_bytes")),
        tx_bytes=int(one("tx_bytes")),
    )


def matches(wanted: Device, state: DeviceState, resolve: Callable[[str], str]) -> bool:
    """Whether the device already has ``wanted``'s configuration (so no set request is needed).

    A peer without a configured endpoint matches whatever endpoint the device learned from it.
    """
    if state.private_key != wanted.private_key or state.firewall_mark != wanted.firewall_mark:
        return False
    if wanted.listen_port is not None and state.listen_port != wanted.listen_port:
        return False
    current = {peer.public_key: peer for peer in state.peers}
    if set(current) != {peer.public_key for peer in wanted.peers}:
        return False
    for peer in wanted.peers:
        have = current[peer.public_key]
        if have.keepalive != peer.keepalive or set(have.allowed_ips) != set(peer.allowed_ips):
            return False
        if peer.endpoint is not None and have.endpoint != resolve(peer.endpoint):
            return False
    return True


def _hex(key: str) -> str:
    return base64.b64decode(key).hex()


def _base64(hex_key: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_key)).decode() if hex_key else ""
