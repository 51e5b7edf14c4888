"""Validation of machine configurations: turning model errors into path-qualified messages, and
the rules that relate several fields (REFERENCE.md §1).

:func:`validate` checks a plain document (dicts, lists, scalars) and returns the model plus
warnings, or raises :class:`~kubeplane.config.errors.ConfigError` listing every problem. The
``machine`` and ``cluster`` sections are validated separately so that a type error in one does not
hide the cross-field rules of the other; rules that relate fields of one section run whenever that
section parses.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import pydantic

from kubeplane.config import defaults, machine_files, models
from kubeplane.config.errors import DOCUMENT_PATH, ConfigError, FieldError, join_path
from kubeplane.config.scalars import Bool, decode_base64, duration_seconds, parse_host_port

#: Where the config will run: a real machine, a container, or a kubeplane local (netns) cluster.
Mode = Literal["metal", "container", "local"]
MODES: tuple[Mode, ...] = ("metal", "container", "local")

_BOOTSTRAP_TOKEN = re.compile(r"^[a-z0-9]{6}\.[a-z0-9]{16}$")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")
_REGISTRY_HOST = re.compile(r"^[A-Za-z0-9.-]+(:\d{1,5})?$")
_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
#: The longest link name the kernel takes (IFNAMSIZ less the terminating zero).
_MAX_LINK_NAME = 15

#: Extra advice for fields whose absence users hit most often.
_REQUIRED_HINTS = {
    "version": "required (expected v1alpha1)",
    "machine": "required (the machine section: type, network, kubelet, ...)",
    "cluster": "required (the cluster section; at least controlPlane.endpoint)",
    "machine.type": "required (expected init, controlplane, join or worker)",
    "cluster.controlPlane": "required (expected endpoint: https://HOST:PORT of the control plane)",
    "cluster.controlPlane.endpoint": "required (the URL of the control plane, e.g. https://10.5.0.1:6443)",
}


def validate(data: Any, *, mode: Mode | None = None) -> tuple[models.Config, list[FieldError]]:
    """Validate a plain document; return the model and warnings, or raise ``ConfigError``."""
    if not isinstance(data, Mapping):
        raise ConfigError([FieldError(DOCUMENT_PATH, _top_level_message(data))])
    errors: list[FieldError] = []
    header = {key: data[key] for key in data if key not in ("machine", "cluster")}
    errors.extend(_model_errors(_Header, header))
    for name in ("machine", "cluster"):
        if name not in data:
            errors.append(FieldError(name, _REQUIRED_HINTS[name]))
    machine = _section(models.Machine, "machine", data, errors)
    if machine is not None:
        errors.extend(check_machine(machine))
    cluster = _section(models.Cluster, "cluster", data, errors)
    if cluster is not None:
        errors.extend(check_cluster(cluster))
    if machine is not None and cluster is not None:
        errors.extend(check_roles(machine, cluster))
        errors.extend(check_ports(machine, cluster))
    if mode is not None and machine is not None:
        errors.extend(check_mode(machine, mode))
    if errors:
        raise ConfigError(list(dict.fromkeys(errors)))
    assert machine is not None and cluster is not None
    config = models.Config.model_construct(
        **_Header.model_validate(header).model_dump(), machine=machine, cluster=cluster
    )
    return config, mode_warnings(config.machine, mode)


class _Header(models.Model):
    """The top-level scalars; the two sections are validated on their own."""

    version: Literal["v1alpha1"]
    debug: Bool | None = None
    persist: Bool | None = None


def _top_level_message(data: Any) -> str:
    if data is None:
        return "the document is empty (expected a mapping with version, machine and cluster)"
    return f"expected a mapping with version, machine and cluster, got {_describe(data)}"


def _section(
    model: type[pydantic.BaseModel], name: str, sections: Mapping[str, Any], errors: list[FieldError]
) -> Any:
    if name not in sections:
        return None
    section_errors = _model_errors(model, sections[name], prefix=(name,))
    errors.extend(section_errors)
    if section_errors:
        return None
    return model.model_validate(sections[name])


def _model_errors(
    model: type[pydantic.BaseModel], data: Any, *, prefix: tuple[str | int, ...] = ()
) -> list[FieldError]:
    try:
        model.model_validate(data)
    except pydantic.ValidationError as exc:
        found: dict[str, FieldError] = {}
        for error in exc.errors(include_url=False):
            field_error = _field_error(prefix, error, data)
            found.setdefault(field_error.path, field_error)
        return list(found.values())
    except (RecursionError, OverflowError):
        return [FieldError(join_path("", str(prefix[0])) if prefix else DOCUMENT_PATH, "too deeply nested")]
    except UnicodeError:
        # JSON escapes can smuggle in unpaired surrogates, which no YAML writer can emit again.
        return [
            FieldError(
                join_path("", str(prefix[0])) if prefix else DOCUMENT_PATH,
                "contains text that is not valid Unicode (an unpaired surrogate)",
            )
        ]
    return []


def _field_error(prefix: tuple[str | int, ...], error: Any, data: Any) -> FieldError:
    # Union members add tags such as "function-after[...]" to the location; keep only the steps
    # that exist in the document so the path is one the user can find in their file.
    loc: list[str | int] = list(prefix)
    node = data
    is_key = False
    for step in error["loc"]:
        if step == "[key]":
            is_key = True
            break
        if isinstance(node, Mapping) and step in node:
            node = node[step]
        elif isinstance(step, int) and isinstance(node, Sequence) and not isinstance(node, str):
            node = node[step] if 0 <= step < len(node) else None
        elif (
            isinstance(step, str)
            and isinstance(node, Mapping)
            and error["type"] in ("missing", "extra_forbidden")
        ):
            pass
        else:
            continue
        loc.append(step)
    path = ""
    for step in loc:
        path = join_path(path, step)
    return FieldError(path or DOCUMENT_PATH, _message(error, loc, is_key=is_key))


def _message(error: Any, loc: list[str | int], *, is_key: bool) -> str:
    kind = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return _REQUIRED_HINTS.get(_path(loc), "required field is missing")
    if kind == "extra_forbidden":
        return _unknown_field_message(loc)
    if kind == "value_error":
        message = str(ctx.get("error", error["msg"]))
        prefix = "key " if is_key else ""
        if message.startswith('"'):
            return prefix + message
        return f"{prefix}{_short(value)} {message}"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "")
        return f"{_short(value)} is not allowed (expected {expected})"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return f"{value} is out of range ({error['msg'].replace('Input should be ', 'expected ')})"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_describe(value)}"
    return str(error["msg"])


_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
    "dict_type": "a mapping (key: value)",
    "list_type": "a list",
    "string_unicode": "valid Unicode text (it has unpaired surrogates)",
}


def _path(loc: Sequence[str | int]) -> str:
    path = ""
    for step in loc:
        path = join_path(path, step)
    return path


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int | float):
        return f"{value} (a number)"
    if isinstance(value, str):
        return f"{_short(value)} (a string)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, Sequence):
        return "a list"
    return type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f'"{text}"'


def _unknown_field_message(loc: list[str | int]) -> str:
    key = str(loc[-1])
    allowed = _allowed_keys(loc[:-1])
    if not allowed:
        return "unknown field"
    lowered = {name.lower(): name for name in allowed}
    close = [lowered[name] for name in difflib.get_close_matches(key.lower(), lowered, n=1)] or [
        name for name in allowed if len(name) > 2 and name.lower() in key.lower()
    ]
    hint = f'did you mean "{close[0]}"? ' if close else ""
    return f"unknown field ({hint}expected one of: {', '.join(allowed)})"


def _allowed_keys(loc: Sequence[str | int]) -> list[str]:
    annotation: Any = models.Config
    for step in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
            field = next((f for name, f in annotation.model_fields.items() if step in (name, f.alias)), None)
            if field is None:
                return []
            annotation = field.annotation
        elif typing.get_origin(annotation) in (list, dict):
            annotation = typing.get_args(annotation)[-1]
        else:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [field.alias or name for name, field in annotation.model_fields.items()]
    return []


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            annotation = members[0]
        else:
            return annotation


# --- rules relating several fields ----------------------------------------------------------


def check_machine(machine: models.Machine) -> Iterator[FieldError]:
    """Rules within the machine section."""
    network = machine.network
    for index, interface in enumerate((network.interfaces if network else None) or []):
        yield from _check_interface(machine, interface, f"machine.network.interfaces[{index}]")
    for index, file in enumerate(machine.files or []):
        if file.permissions is not None and file.permissions > 0o7777:
            yield FieldError(
                f"machine.files[{index}].permissions",
                f"{file.permissions} is not a file mode (expected octal up to 07777, e.g. 0644)",
            )
    yield from machine_files.check(machine.files or [])
    encryption = machine.system_disk_encryption
    for name in ("state", "ephemeral"):
        partition = getattr(encryption, name) if encryption else None
        if partition is not None:
            yield from _check_encryption(partition, f"machine.systemDiskEncryption.{name}")
    for index, server in enumerate((machine.time.servers if machine.time else None) or []):
        try:
            parse_host_port(server)
        except ValueError as exc:
            yield FieldError(f"machine.time.servers[{index}]", str(exc))
    registries = machine.registries
    for host in (registries.mirrors or {}) if registries else {}:
        if host != "*" and not _REGISTRY_HOST.match(host):
            yield FieldError(
                join_path("machine.registries.mirrors", host),
                f'"{host}" is not a registry host (expected HOST[:PORT] such as docker.io, or "*")',
            )
    for host, config in ((registries.config or {}) if registries else {}).items():
        base = join_path("machine.registries.config", host)
        if not _REGISTRY_HOST.match(host):
            yield FieldError(base, f'"{host}" is not a registry host (expected HOST[:PORT])')
        identity = config.tls.client_identity if config.tls else None
        if identity is not None and bool(identity.crt) != bool(identity.key):
            yield FieldError(f"{base}.tls.clientIdentity", "needs both crt and key")


def _check_bond(bond: models.Bond, path: str) -> Iterator[FieldError]:
    if not bond.interfaces:
        yield FieldError(f"{path}.interfaces", "a bond needs at least one interface (e.g. [eth0, eth1])")
    elif bond.primary is not None and bond.primary not in bond.interfaces:
        yield FieldError(f"{path}.primary", f"{bond.primary} is not one of the bond's interfaces")
    if bond.ad_actor_system is not None and not _MAC.match(bond.ad_actor_system):
        yield FieldError(
            f"{path}.adActorSystem",
            f'"{bond.ad_actor_system}" is not a MAC address (expected e.g. 02:00:00:00:00:01)',
        )


def _check_interface(machine: models.Machine, interface: models.Interface, path: str) -> Iterator[FieldError]:
    if interface.vip is not None and not machine.is_control_plane:
        yield FieldError(
            f"{path}.vip",
            f"a shared IP (vip) is only allowed on control plane nodes, this is a {machine.role} "
            "node (remove vip or set machine.type to controlplane)",
        )
    if interface.dhcp and (interface.cidr or interface.addresses):
        yield FieldError(path, "set either dhcp: true or static addresses (cidr, addresses), not both")
    if interface.bond is not None:
        yield from _check_bond(interface.bond, f"{path}.bond")
    yield from _check_routes(interface.routes, f"{path}.routes")
    seen: set[int] = set()
    for index, vlan in enumerate(interface.vlans or []):
        vlan_path = f"{path}.vlans[{index}]"
        if vlan.vlan_id in seen:
            yield FieldError(
                f"{vlan_path}.vlanId", f"VLAN {vlan.vlan_id} is defined twice on {interface.interface}"
            )
        seen.add(vlan.vlan_id)
        name = f"{interface.interface}.{vlan.vlan_id}"
        if len(name) > _MAX_LINK_NAME:
            yield FieldError(
                f"{vlan_path}.vlanId",
                f"the VLAN link {name} would have a name longer than the kernel's {_MAX_LINK_NAME} "
                "characters (the link is named <interface>.<vlanId>)",
            )
        if vlan.dhcp and vlan.cidr:
            yield FieldError(vlan_path, "set either dhcp: true or a static cidr, not both")
        yield from _check_routes(vlan.routes, f"{vlan_path}.routes")
    for index, peer in enumerate((interface.wireguard.peers or []) if interface.wireguard else []):
        endpoint = peer.endpoint
        match = _HOST_PORT.match(endpoint) if endpoint else None
        if endpoint and (match is None or not 0 < int(match.group(2)) < 65536):
            yield FieldError(
                f"{path}.wireguard.peers[{index}].endpoint",
                f'"{endpoint}" is not HOST:PORT (expected e.g. 192.0.2.1:51820)',
            )
        keepalive = peer.persistent_keepalive_interval
        if keepalive and not _is_keepalive(duration_seconds(keepalive)):
            yield FieldError(
                f"{path}.wireguard.peers[{index}].persistentKeepaliveInterval",
                f'"{keepalive}" is not a whole number of seconds up to 65535 (expected e.g. 5s or 25s)',
            )


def _is_keepalive(seconds: float) -> bool:
    """WireGuard's persistent keepalive is whole seconds in 16 bits (0 turns it off)."""
    return seconds.is_integer() and 0 <= seconds <= 65535


def _check_routes(routes: list[models.Route] | None, path: str) -> Iterator[FieldError]:
    for index, route in enumerate(routes or []):
        if route.gateway is None:
            continue
        network = ipaddress.ip_interface(route.network)
        gateway = ipaddress.ip_address(route.gateway)
        if network.version != gateway.version:
            yield FieldError(
                f"{path}[{index}].gateway",
                f"gateway {route.gateway} is IPv{gateway.version} but network {route.network} is "
                f"IPv{network.version}",
            )


def _check_encryption(partition: models.EncryptionConfig, path: str) -> Iterator[FieldError]:
    if not partition.keys:
        yield FieldError(f"{path}.keys", "at least one key is required (e.g. - nodeID: {}\\n  slot: 0)")
        return
    slots: set[int] = set()
    for index, key in enumerate(partition.keys):
        key_path = f"{path}.keys[{index}]"
        if key.slot is None:
            yield FieldError(f"{key_path}.slot", "every key needs a slot (expected an integer 0-31)")
        elif key.slot in slots:
            yield FieldError(
                f"{key_path}.slot", f"slot {key.slot} is used by another key (slots must be unique)"
            )
        else:
            slots.add(key.slot)
        if (key.static is None) == (key.node_id is None):
            yield FieldError(key_path, "a key needs exactly one kind: static {passphrase} or nodeID {}")


def check_cluster(cluster: models.Cluster) -> Iterator[FieldError]:
    """Rules within the cluster section."""
    network = cluster.network
    cni = network.cni if network else None
    if cni is not None and cni.name == "custom" and not cni.urls:
        yield FieldError(
            "cluster.network.cni.urls", "required when cni.name is custom (the URLs of the CNI manifests)"
        )
    if cni is not None and cni.name != "custom" and cni.urls:
        yield FieldError("cluster.network.cni.urls", f"only allowed when cni.name is custom, not {cni.name}")
    for name in ("podSubnets", "serviceSubnets"):
        subnets = (
            getattr(network, "pod_subnets" if name == "podSubnets" else "service_subnets")
            if network
            else None
        )
        if subnets is not None and not subnets:
            yield FieldError(f"cluster.network.{name}", "must list at least one subnet (or be omitted)")
    service = ipaddress.ip_interface(cluster.service_subnets[0]).network
    if service.num_addresses <= 10:
        yield FieldError(
            "cluster.network.serviceSubnets[0]",
            f"{service} is too small (the DNS service takes its 10th address; use /28 or larger)",
        )
    for pod in cluster.pod_subnets:
        pod_network = ipaddress.ip_interface(pod).network
        for other in cluster.service_subnets:
            other_network = ipaddress.ip_interface(other).network
            if pod_network.version == other_network.version and pod_network.overlaps(other_network):
                yield FieldError("cluster.network", f"pod subnet {pod} overlaps service subnet {other}")
    if cluster.token is not None and not _BOOTSTRAP_TOKEN.match(cluster.token):
        yield FieldError(
            "cluster.token",
            "is not a bootstrap token (expected 6 + 16 lower-case letters/digits, "
            "e.g. abcdef.0123456789abcdef)",
        )
    secret = cluster.aescbc_encryption_secret
    if secret is not None and len(decode_base64(secret)) not in (16, 24, 32):
        yield FieldError(
            "cluster.aescbcEncryptionSecret", "must decode to a 16, 24 or 32 byte AES key (32 recommended)"
        )
    names: set[str] = set()
    for index, manifest in enumerate(cluster.inline_manifests or []):
        if manifest.name in names:
            yield FieldError(f"cluster.inlineManifests[{index}].name", f'"{manifest.name}" is used twice')
        names.add(manifest.name)


def check_roles(machine: models.Machine, cluster: models.Cluster) -> Iterator[FieldError]:
    """Rules relating the machine type to the cluster section: workers hold no cluster private keys."""
    if machine.is_control_plane:
        return
    etcd_ca = cluster.etcd.ca if cluster.etcd else None
    secrets = {
        "cluster.ca.key": cluster.ca.key if cluster.ca else "",
        "cluster.aggregatorCA.key": cluster.aggregator_ca.key if cluster.aggregator_ca else "",
        "cluster.etcd.ca.key": etcd_ca.key if etcd_ca else "",
        "cluster.serviceAccount.key": cluster.service_account.key if cluster.service_account else "",
    }
    for path, secret in secrets.items():
        if secret:
            yield FieldError(path, f"a {machine.role} config must not carry this private key (remove it)")


def check_ports(machine: models.Machine, cluster: models.Cluster) -> Iterator[FieldError]:
    """The node API and trustd ports differ from each other and from every other port a node uses."""
    taken = {
        **defaults.RESERVED_NODE_PORTS,
        cluster.local_api_server_port: "kube-apiserver (cluster.controlPlane.localAPIServerPort)",
    }
    if machine.node_api_port == machine.trustd_port:
        yield FieldError(
            "machine.ports.trustd",
            f"{machine.trustd_port} is also the node API's port (machine.ports.nodeAPI): give each its own",
        )
    for name, port in (("nodeAPI", machine.node_api_port), ("trustd", machine.trustd_port)):
        if port in taken:
            yield FieldError(f"machine.ports.{name}", f"{port} is already the port of {taken[port]}")


def check_mode(machine: models.Machine, mode: Mode) -> Iterator[FieldError]:
    """Rules that depend on where the config runs."""
    if mode == "metal":
        install = machine.install
        if install is None or not install.disk:
            yield FieldError(
                "machine.install.disk", "required in metal mode (the disk to install to, e.g. /dev/sda)"
            )
        if install is None or not install.image:
            yield FieldError("machine.install.image", "required in metal mode (the installer image)")


def mode_warnings(machine: models.Machine, mode: Mode | None) -> list[FieldError]:
    """Settings that are valid but have no effect in ``mode``."""
    if mode not in ("container", "local"):
        return []
    ignored = {
        "machine.install": machine.install,
        "machine.disks": machine.disks,
        "machine.systemDiskEncryption": machine.system_disk_encryption,
    }
    return [
        FieldError(path, f"ignored in {mode} mode") for path, value in ignored.items() if value is not None
    ]
