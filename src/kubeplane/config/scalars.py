"""Scalar field types of the machine configuration: how YAML scalars coerce, and per-field checks.

Coercion follows the original (Go, yaml.v3) loader so configs written for it load unchanged: any
scalar is accepted where a string is expected (``extraArgs: {v: 4}``), while integers and booleans
must be written as such (``mtu: "1500"`` is an error). Each check raises ``ValueError`` with a
message that says what was expected; pydantic attaches the field path.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, StrictInt

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


def scalar_to_str(value: Any) -> Any:
    """Render a YAML scalar as the string the original loader would have read (``true``, ``4``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def _cidr(value: str) -> str:
    if "/" not in value:
        raise ValueError(f'"{value}" is not a valid CIDR (expected address/prefix, e.g. 10.5.0.2/24)')
    try:
        ipaddress.ip_interface(value)
    except ValueError:
        raise ValueError(
            f'"{value}" is not a valid CIDR (expected address/prefix, e.g. 10.5.0.2/24)'
        ) from None
    return value


def _ip(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f'"{value}" is not a valid IP address (expected e.g. 10.5.0.1 or fd00::1)') from None
    return value


def _url(value: str, schemes: tuple[str, ...]) -> str:
    expected = " or ".join(f"{s}://" for s in schemes)
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ValueError(f'"{value}" is not a valid URL (expected {expected}HOST[:PORT][/PATH])') from None
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f'"{value}" is not a valid URL (expected {expected}HOST[:PORT][/PATH])')
    del port
    return value


def _https_url(value: str) -> str:
    return _url(value, ("https",))


def _http_url(value: str) -> str:
    return _url(value, ("http", "https"))


def _dns_domain(value: str) -> str:
    labels = value.rstrip(".").split(".")
    if len(value) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        raise ValueError(
            f'"{value}" is not a valid DNS domain (expected lower-case labels of letters, digits and '
            "'-' separated by dots, e.g. cluster.local)"
        )
    return value


def _base64(value: str) -> str:
    decode_base64(value)
    return value


def decode_base64(value: str) -> bytes:
    """Decode standard base64 (padding required), raising ``ValueError`` with a readable message."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64 (expected standard base64 of the value)") from None


def _pem_base64(value: str) -> str:
    if value and b"-----BEGIN " not in decode_base64(value):
        raise ValueError("does not decode to a PEM block (expected base64 of '-----BEGIN ...' text)")
    return value


def _wireguard_key(value: str) -> str:
    if len(decode_base64(value)) != 32:
        raise ValueError("is not a WireGuard key (expected 32 bytes in base64, as printed by `wg genkey`)")
    return value


def _duration(value: str) -> str:
    if value != "0" and not _DURATION.match(value):
        raise ValueError(f'"{value}" is not a valid duration (expected e.g. 8760h, 30m or 1h30m)')
    return value


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(value: str) -> float:
    """A duration that passed the check of :data:`Duration` (``5s``, ``1h30m``, ``0``) in seconds."""
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(value))


def parse_host_port(value: str) -> tuple[str, int | None]:
    """``HOST``, ``HOST:PORT``, ``V6`` or ``[V6]:PORT`` as (host, port or None); ValueError says why."""
    host, port = value, None
    if value.startswith("["):
        inside, bracket, rest = value[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ValueError(f'"{value}" is not HOST[:PORT] (an IPv6 address with a port is [ADDRESS]:PORT)')
        host, port = inside, rest[1:]
    elif value.count(":") == 1:
        host, port = value.split(":")
    if ":" in host or value.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f'"{value}" is not HOST[:PORT]: "{host}" is not an IPv6 address') from None
    elif not _HOST.match(host):
        raise ValueError(f'"{value}" is not HOST[:PORT]: "{host}" is not a host name or address')
    if port is None:
        return host, None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f'"{value}" is not HOST[:PORT]: the port must be 1-65535')
    return host, int(port)


def _abs_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f'"{value}" is not an absolute path (expected it to start with /)')
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(f'"{value}" is not a valid environment variable name')
    return value


def _not_empty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


Str = Annotated[str, BeforeValidator(scalar_to_str)]
NonEmptyStr = Annotated[Str, AfterValidator(_not_empty)]
Int = StrictInt
Bool = StrictBool
UInt8 = Annotated[StrictInt, Field(ge=0, le=255)]
UInt16 = Annotated[StrictInt, Field(ge=0, le=65535)]
UInt32 = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]
Port = Annotated[StrictInt, Field(ge=1, le=65535)]
CIDR = Annotated[Str, AfterValidator(_cidr)]
IPAddress = Annotated[Str, AfterValidator(_ip)]
HTTPSURL = Annotated[Str, AfterValidator(_https_url)]
URL = Annotated[Str, AfterValidator(_http_url)]
DNSDomain = Annotated[Str, AfterValidator(_dns_domain)]
Base64 = Annotated[Str, AfterValidator(_base64)]
PEMBase64 = Annotated[Str, AfterValidator(_base64), AfterValidator(_pem_base64)]
WireguardKey = Annotated[Str, AfterValidator(_wireguard_key)]
Duration = Annotated[Str, AfterValidator(_duration)]
AbsPath = Annotated[Str, AfterValidator(_abs_path)]
EnvName = Annotated[Str, AfterValidator(_env_name)]
