"""Wire conventions of the node API: service names, documents, metadata keys and the call table.

The node API is the typed service ``kubeplane.node.v1.Machine`` (:data:`SERVICE`), defined in
``proto/kubeplane/node/v1/machine.proto``; :mod:`kubeplane.api.schema` converts its protobuf
messages to and from the documents below, which are what the server, the client and the backend
work with. The same calls are also served, for clients older than the schema, as the untyped
``kubeplane.machine.Machine`` (:data:`LEGACY_SERVICE`), where every request and response is one
of these documents as JSON (UTF-8, compact; file chunks ``{"data": base64}``); docs/api.md says
how long. The call table :data:`CALLS` is the single place that says, for each call, whether it
streams, which backend method serves it, which parameters it takes, who may make it and whether
maintenance mode accepts it; the server, the client and the tests are all driven by it, so
adding a call is one :class:`Call` entry, its method in the .proto file, plus the backend method.

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

Malformed requests: bytes that are not the method's protobuf message
(:func:`kubeplane.api.schema.decode_message`) or, on the JSON wire, one JSON object
(:func:`decode_request`), and parameters that are missing, unknown, of the wrong type or
unusable (a NUL, a lone surrogate, too long, out of range; :func:`validate`) are
INVALID_ARGUMENT naming the request or the fields, before the backend sees anything; a message
over the transport's limit is RESOURCE_EXHAUSTED from grpc.
What an error repeats of the request is escaped and bounded (:func:`status_message`,
:func:`status_fields`), so every status can be sent and received.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kubeplane.api import errors
from kubeplane.config import defaults

#: The typed node API (kubeplane/node/v1/machine.proto); the client and forwarding nodes call it.
SERVICE = "kubeplane.node.v1.Machine"
#: The JSON wire of the same calls, from before the schema; still served, never called.
LEGACY_SERVICE = "kubeplane.machine.Machine"
#: The node API's port unless ``machine.ports.nodeAPI`` (or ``host:port`` endpoints) say otherwise.
DEFAULT_PORT = defaults.DEFAULT_NODE_API_PORT

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
    """Serialise a request/response document.

    A lone surrogate (a file name that is not UTF-8, as Python decodes one) has no UTF-8 form: such
    a document travels with every non-ASCII character escaped, which JSON readers decode the same.
    Bytes (file and snapshot chunks) become ``{"data": base64}`` (:func:`encode_chunk`).
    """
    try:
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False, default=_chunk).encode()
    except UnicodeEncodeError:
        return json.dumps(document, separators=(",", ":"), default=_chunk).encode()


def _chunk(value: object) -> object:
    if isinstance(value, bytes):
        return encode_chunk(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


@dataclass(frozen=True)
class Malformed:
    """A parameter value the request deserializer could not read as its type (a protobuf field
    sent with another wire type); :func:`validate` refuses it with ``problem``."""

    problem: str


@dataclass(frozen=True)
class BadRequest:
    """What the request deserializer returns for bytes that are not a JSON object."""

    reason: str


def decode_request(data: bytes) -> Document | BadRequest:
    """Parse a request without raising: grpc would turn an exception here into an opaque UNKNOWN
    carrying the exception's text. A request is UTF-8 JSON text holding one object; the empty
    message is ``{}``."""
    if not data:
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRequest(f"request is not UTF-8 text: byte {data[exc.start]:#04x} at offset {exc.start}")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        return BadRequest(f"request is not valid JSON: {exc}")
    except ValueError:
        # The parser's only other ValueError: Python's limit on the digits of an integer.
        return BadRequest("request is not valid JSON for this API: a number has too many digits")
    except RecursionError:
        return BadRequest("request is not valid JSON for this API: it is nested too deeply")
    if not isinstance(document, dict):
        return BadRequest(f"request must be a JSON object, got {_json_type(document)}")
    return document


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: How much of a caller's text an error message repeats (a name, a value), in characters.
SHOWN_CHARS = 100


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """Caller-supplied text as an error repeats it: lone surrogates escaped, at most ``limit``
    characters (then the number left out)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


#: The most UTF-8 bytes of a gRPC status message. grpc carries the message in the trailers and a
#: client drops trailers over 16 KiB whole (the caller then sees RESOURCE_EXHAUSTED and none of
#: the error); non-ASCII bytes travel percent-encoded, three characters each.
MAX_STATUS_MESSAGE = 2048
#: The most bytes of :data:`MD_FIELDS` (JSON, ASCII), for the same reason.
MAX_STATUS_FIELDS = 4096


def status_message(message: str) -> str:
    """A status message that grpc can send and a client can receive: lone surrogates escaped (grpc
    cannot encode them and never finishes the call), cut to :data:`MAX_STATUS_MESSAGE` bytes."""
    data = message.encode("utf-8", "backslashreplace")
    if len(data) <= MAX_STATUS_MESSAGE:
        return data.decode("utf-8")
    cut = data[: MAX_STATUS_MESSAGE - 64].decode("utf-8", "ignore")
    return f"{cut}... (message cut: {len(data)} bytes)"


def status_fields(fields: Sequence[errors.FieldError]) -> str:
    """The :data:`MD_FIELDS` value of ``fields``: each path and problem :func:`shown`, and the first
    fields that fit in :data:`MAX_STATUS_FIELDS` (the status message names them all, as far as
    it goes)."""
    kept: list[str] = []
    size = len("[]")
    for path, problem in fields:
        item = json.dumps([shown(path), shown(problem, 4 * SHOWN_CHARS)], separators=(",", ":"))
        size += len(item) + len(",")
        if size > MAX_STATUS_FIELDS:
            break
        kept.append(item)
    return "[" + ",".join(kept) + "]"


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
    #: Bounds of an int parameter (every one is a count or a number of seconds).
    minimum: int = 0
    maximum: int = 2**31 - 1
    #: The most characters of a str parameter (None: the message size is the limit). Names,
    #: paths and references are short (a path at most PATH_MAX); the bound keeps what the node
    #: does with them, and repeats of them in errors, small.
    max_length: int | None = 4096


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

    @property
    def legacy_method(self) -> str:
        """Its path on the JSON wire (:data:`LEGACY_SERVICE`)."""
        return f"/{LEGACY_SERVICE}/{self.name}"


APPLY_MODES = ("reboot", "immediate", "on-reboot", "no-reboot", "try")
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
            Param("data", str, required=True, max_length=None),
            Param("mode", str, default="reboot", choices=APPLY_MODES),
            Param("dry_run", bool, default=False),
            Param("try_seconds", int, minimum=1, maximum=3600),
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
    Call(
        "Events",
        "events",
        stream=True,
        params=(Param("since_seconds", int), Param("tail", int), Param("follow", bool, default=False)),
    ),
    Call("ServiceList", "service_list"),
    Call("Certificates", "certificates"),
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
    Call(
        "Reset",
        "reset",
        params=(
            Param("graceful", bool, default=True),
            Param("reboot", bool, default=False),
            Param("wipe", str, max_length=256),
            Param("dry_run", bool, default=False),
        ),
        access="admin",
    ),
    Call(
        "Upgrade",
        "upgrade",
        params=(
            Param("path", str, required=True),
            Param("stage", bool, default=False),
            Param("preserve", bool),
            Param("force", bool, default=False),
        ),
        access="admin",
    ),
    # Cluster formation (etcd, bootstrap) and the node's CRI containers.
    Call(
        "Bootstrap",
        "bootstrap",
        params=(
            Param("snapshot", str, max_length=None),
            Param("self_hosted", bool, default=False),
            Param("checkpointer_image", str),
            Param("checkpointer_grace_period", int),
        ),
        access="admin",
    ),
    Call("EtcdMembers", "etcd_members"),  # names and URLs, no secret: a reader may list them
    Call("EtcdLeave", "etcd_leave", params=(Param("force", bool, default=False),), access="admin"),
    Call(
        "EtcdRemoveMember",
        "etcd_remove_member",
        params=(Param("member", str, required=True, max_length=256),),
        access="admin",
    ),
    Call("EtcdForfeitLeadership", "etcd_forfeit_leadership", access="admin"),
    Call("EtcdSnapshot", "etcd_snapshot", stream=True, access="admin"),
    Call("Kubeconfig", "kubeconfig", access="admin"),
    Call(
        "KubernetesCertificatesRenew",
        "kubernetes_certificates_renew",
        params=(Param("not_before", int),),
        access="admin",
    ),
    Call(
        "ClientCertificate",
        "client_certificate",
        params=(
            Param("csr", str, required=True, max_length=16384),
            Param("roles", str, required=True, max_length=256),
            Param("lifetime_seconds", int, required=True, minimum=1),
        ),
        access="admin",
    ),
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
        (shown(name), f"unknown parameter (expected one of: {', '.join(sorted(known)) or 'none'})")
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
        problem = _problem(param, value)
        if problem is not None:
            problems.append((param.name, problem))
        kwargs[param.name] = value
    if problems:
        raise errors.InvalidArgumentError(f"invalid {call.name} request", fields=problems)
    return {**kwargs, **call.fixed}


def _problem(param: Param, value: object) -> str | None:
    """What is wrong with ``value`` for ``param`` (not None), or None."""
    if isinstance(value, Malformed):
        return value.problem
    # bool is a subclass of int in Python but not in JSON: refuse true for an int parameter.
    if not isinstance(value, param.kind) or (param.kind is int and isinstance(value, bool)):
        return f"must be a {param.kind.__name__}, got {type(value).__name__}"
    if isinstance(value, int) and not param.minimum <= value <= param.maximum:
        return f"must be from {param.minimum} to {param.maximum}, got {shown(str(value), 20)}"
    if isinstance(value, str):
        if param.max_length is not None and len(value) > param.max_length:
            return f"must be at most {param.max_length} characters, got {len(value)}"
        if "\x00" in value:
            return "must not contain NUL characters"
        if not _is_unicode(value):
            # JSON can escape half of a UTF-16 surrogate pair; no name, path or config holds one.
            return "must be valid Unicode, not hold a lone UTF-16 surrogate"
        if param.choices and value not in param.choices:
            return f"must be one of {', '.join(param.choices)}, got {shown(value)!r}"
    return None


def error_document(code: str, message: str, fields: tuple[errors.FieldError, ...] = ()) -> Document:
    """The in-band form of a per-node error in proxied replies."""
    return {"code": code, "message": message, "fields": [list(item) for item in fields]}
