"""Wire conventions of the node API: service name, JSON codec, metadata keys and the call table.

The service ``kubeplane.machine.Machine`` is registered generically (no protoc): every request
and response is one JSON document (UTF-8, compact). The call table :data:`CALLS` is the single
place that says, for each call, whether it streams, which backend method serves it, which
parameters it takes, who may make it and whether maintenance mode accepts it; the server, the
client and the tests are all driven by it, so adding a call is one :class:`Call` entry plus the
backend method.

Documents:

- request: the call's parameters, e.g. ``{"type": "Services", "namespace": "runtime"}``;
- unary response: ``{"replies": [{"node": N, "result": R} | {"node": N, "error": E}, ...]}`` with
  one reply per node (a single one, labelled with the serving node, when not proxying);
- stream message: ``{"node": N, "result": R}`` or, when proxying, ``{"node": N, "error": E}``
  as the last message of a node that failed;
- error ``E``: ``{"code": "NOT_FOUND", "message": "...", "fields": [[path, problem], ...]}``.

A call that fails on the node that received it (not a proxied node) fails with the gRPC status
instead; its trailing metadata carries :data:`MD_ORIGIN` (so the client can tell a node's answer
from a connection failure) and :data:`MD_FIELDS` (JSON field errors of INVALID_ARGUMENT).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubeplane.api import errors

SERVICE = "kubeplane.machine.Machine"
DEFAULT_PORT = 50000

#: Comma-separated node list the receiving server forwards the call to.
MD_NODES = "nodes"
#: Role of the original caller, set by a forwarding server; trusted only from proxy certificates.
MD_ROLE = "kubeplane-role"
#: Trailing metadata set on every error a server produced itself.
MD_ORIGIN = "kubeplane-origin"
#: Trailing metadata with the JSON list of field errors of an INVALID_ARGUMENT status.
MD_FIELDS = "kubeplane-fields"

Document = dict[str, Any]
Access = Literal["read", "admin"]


def encode(document: object) -> bytes:
    """Serialise a request/response document."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class BadRequest:
    """What the request deserializer returns for bytes that are not a JSON object."""

    reason: str


def decode_request(data: bytes) -> Document | BadRequest:
    """Parse a request without raising: grpc would turn an exception here into an opaque INTERNAL."""
    try:
        document = json.loads(data) if data else {}
    except ValueError as exc:
        return BadRequest(f"request is not valid JSON: {exc}")
    if not isinstance(document, dict):
        return BadRequest(f"request must be a JSON object, got {type(document).__name__}")
    return document


def decode(data: bytes) -> Any:
    """Parse a response document."""
    return json.loads(data)


def encode_chunk(chunk: bytes) -> Document:
    """File contents travel base64-encoded inside the JSON message."""
    return {"data": base64.b64encode(chunk).decode("ascii")}


def decode_chunk(result: Mapping[str, Any]) -> bytes:
    """Inverse of :func:`encode_chunk`."""
    return base64.b64decode(result["data"])


@dataclass(frozen=True)
class Param:
    """One request parameter: its JSON type, whether it is required and its default."""

    name: str
    kind: type[str] | type[int] | type[bool]
    required: bool = False
    default: object = None
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Call:
    """One API call; see the module docstring."""

    name: str
    backend_method: str
    stream: bool = False
    params: tuple[Param, ...] = ()
    #: ``read``: the reader role may make the call, so nothing it returns may hold a secret (key
    #: material, tokens, kubeconfigs, file contents, user-written manifests or headers) and no
    #: parameter may name a path outside what the call serves; ``admin``: everything else.
    #: tests/integration/agent/test_security.py makes every read call as a reader and scans it.
    access: Access = "read"
    maintenance: bool = False
    #: Name of the parameter holding a resource type; readers are refused types the node flags sensitive.
    resource_type_param: str | None = None
    #: Fixed keyword arguments added to the backend call (several calls share one backend method).
    fixed: Mapping[str, object] = field(default_factory=dict)
    #: Converts each backend result (or stream item) to its JSON form.
    to_wire: Callable[[Any], Any] | None = None

    @property
    def method(self) -> str:
        """Full gRPC method path."""
        return f"/{SERVICE}/{self.name}"


APPLY_MODES = ("reboot", "immediate", "on-reboot", "no-reboot")
SERVICE_ACTIONS = ("start", "stop", "restart")

_TYPE = Param("type", str, required=True)
_NAMESPACE = Param("namespace", str)

CALLS: tuple[Call, ...] = (
    Call("Version", "version", maintenance=True),
    Call(
        "ResourceGet",
        "resource_get",
        params=(_TYPE, Param("id", str, required=True), _NAMESPACE),
        resource_type_param="type",
    ),
    Call("ResourceList", "resource_list", params=(_TYPE, _NAMESPACE), resource_type_param="type"),
    Call(
        "ResourceWatch",
        "resource_watch",
        stream=True,
        params=(_TYPE, _NAMESPACE, Param("id", str)),
        resource_type_param="type",
    ),
    Call(
        "ApplyConfiguration",
        "apply_configuration",
        params=(
            Param("data", str, required=True),
            Param("mode", str, default="reboot", choices=APPLY_MODES),
            Param("dry_run", bool, default=False),
        ),
        access="admin",
        maintenance=True,
    ),
    Call("MachineConfig", "machine_config", access="admin"),
    Call(
        "ReadFile",
        "read_file",
        stream=True,
        params=(Param("path", str, required=True),),
        access="admin",
        to_wire=encode_chunk,
    ),
    Call(
        "ListDir", "list_dir", params=(Param("path", str, default="."), Param("recurse", bool, default=False))
    ),
    Call(
        "Logs",
        "logs",
        stream=True,
        params=(
            Param("service", str, required=True),
            Param("tail", int),
            Param("follow", bool, default=False),
        ),
    ),
    Call("ServiceList", "service_list"),
    *(
        Call(
            f"Service{action.capitalize()}",
            "service_control",
            params=(Param("id", str, required=True),),
            access="admin",
            fixed={"action": action},
        )
        for action in SERVICE_ACTIONS
    ),
    Call("Reboot", "reboot", access="admin"),
    # Cluster formation (etcd, bootstrap) and the node's CRI containers.
    Call(
        "Bootstrap",
        "bootstrap",
        params=(
            Param("snapshot", str),
            Param("self_hosted", bool, default=False),
            Param("checkpointer_image", str),
            Param("checkpointer_grace_period", int),
        ),
        access="admin",
    ),
    Call("EtcdMembers", "etcd_members", access="admin"),
    Call("EtcdLeave", "etcd_leave", params=(Param("force", bool, default=False),), access="admin"),
    Call("EtcdForfeitLeadership", "etcd_forfeit_leadership", access="admin"),
    Call("EtcdSnapshot", "etcd_snapshot", stream=True, access="admin", to_wire=encode_chunk),
    Call("Kubeconfig", "kubeconfig", access="admin"),
    Call("Containers", "containers", access="admin"),
    Call("ImagePull", "image_pull", params=(Param("image", str, required=True),), access="admin"),
    Call(
        "ContainerLogs",
        "container_logs",
        stream=True,
        params=(Param("id", str, required=True), Param("tail", int), Param("follow", bool, default=False)),
        access="admin",
    ),
)

CALLS_BY_NAME: Mapping[str, Call] = {call.name: call for call in CALLS}


def validate(call: Call, request: Mapping[str, Any]) -> dict[str, object]:
    """Check a request against the call's parameters and return the backend keyword arguments.

    Raises :class:`~kubeplane.api.errors.InvalidArgumentError` naming every bad field at once.
    """
    known = {param.name for param in call.params}
    problems: list[errors.FieldError] = [
        (name, f"unknown parameter (expected one of: {', '.join(sorted(known)) or 'none'})")
        for name in request
        if name not in known
    ]
    kwargs: dict[str, object] = {}
    for param in call.params:
        value = request.get(param.name)
        if value is None:
            if param.required:
                problems.append((param.name, "required"))
            kwargs[param.name] = param.default
            continue
        # bool is a subclass of int in Python but not in JSON: refuse true for an int parameter.
        if not isinstance(value, param.kind) or (param.kind is int and isinstance(value, bool)):
            problems.append((param.name, f"must be a {param.kind.__name__}, got {type(value).__name__}"))
        elif param.choices and value not in param.choices:
            problems.append((param.name, f"must be one of {', '.join(param.choices)}, got {value!r}"))
        kwargs[param.name] = value
    if problems:
        raise errors.InvalidArgumentError(f"invalid {call.name} request", fields=problems)
    return {**kwargs, **call.fixed}


def error_document(code: str, message: str, fields: tuple[errors.FieldError, ...] = ()) -> Document:
    """The in-band form of a per-node error in proxied replies."""
    return {"code": code, "message": message, "fields": [list(item) for item in fields]}
