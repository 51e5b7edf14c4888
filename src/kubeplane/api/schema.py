"""The node API's typed wire, ``kubeplane.node.v1`` (``proto/kubeplane/node/v1/*.proto``).

The server, the client and the backend work with the documents of :mod:`kubeplane.api.wire`
(a request is a dict of parameters; a unary answer ``{"replies": [...]}``, a stream message
``{"node", "result" | "error"}``). This module converts them to and from the protobuf messages
generated from the .proto files at build time (``setup.py``):

- a request is the method's own message, one field per parameter, each with explicit presence
  (an absent field is None, the parameter's default); a ``bytes`` field is the parameter's
  base64 text;
- a unary answer is ``Replies``, a stream message ``StreamReply``: the node, then a JSON
  ``result_json``, raw ``chunk`` bytes (file and snapshot contents) or a typed ``Error``.

Malformed requests never raise (grpc would turn that into an opaque UNKNOWN): bytes that are not
the method's message (:func:`request_decoder`) are a :class:`~kubeplane.api.wire.BadRequest`; a
field the method does not know becomes the parameter ``#N`` (its field number), which
:func:`~kubeplane.api.wire.validate` refuses as unknown, and a known field sent with another wire
type a :class:`~kubeplane.api.wire.Malformed` value it refuses naming the field. So every malformed
request is INVALID_ARGUMENT naming the request or the fields, as on the JSON wire.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf import descriptor, message_factory
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from kubeplane.api import errors, wire
from kubeplane.api.proto.kubeplane.node.v1 import machine_pb2, trustd_pb2

PACKAGE = "kubeplane.node.v1"
#: The node API service (port 50000).
SERVICE = wire.SERVICE
#: trustd (port 50001).
TRUSTD_SERVICE = f"{PACKAGE}.Trustd"
TRUSTD_METHOD = f"/{TRUSTD_SERVICE}/Certificate"

_MACHINE = machine_pb2.DESCRIPTOR.services_by_name["Machine"]
_WIRE_TYPES = {0: "varint", 1: "64-bit", 2: "length-delimited", 3: "group", 4: "group end", 5: "32-bit"}
_PROTO_TYPES = {
    descriptor.FieldDescriptor.TYPE_STRING: "string",
    descriptor.FieldDescriptor.TYPE_BYTES: "bytes",
    descriptor.FieldDescriptor.TYPE_BOOL: "bool",
    descriptor.FieldDescriptor.TYPE_INT64: "int64",
}


def method_descriptor(call: wire.Call) -> descriptor.MethodDescriptor:
    """The .proto method of ``call``; KeyError when the schema lacks it (a unit test checks it never does)."""
    return _MACHINE.methods_by_name[call.name]


def request_class(call: wire.Call) -> type[Message]:
    """The request message class of ``call``."""
    return _request_class(call.name)


@functools.cache
def _request_class(name: str) -> type[Message]:
    return message_factory.GetMessageClass(_MACHINE.methods_by_name[name].input_type)


def _text(value: object) -> str:
    """Text a protobuf string field can hold: lone surrogates escaped (they have no UTF-8 form)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


# -- requests -----------------------------------------------------------------------------------


def decode_message(cls: type[Message], data: bytes) -> wire.Document | wire.BadRequest:
    """The parameters of a serialized ``cls`` (see the module docstring); never raises."""
    request = cls()
    try:
        request.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError) as exc:
        reason = str(exc) or type(exc).__name__
        return wire.BadRequest(f"request is not a valid {cls.DESCRIPTOR.full_name} message: {reason}")
    document: wire.Document = {}
    for field in cls.DESCRIPTOR.fields:
        if request.HasField(field.name):
            value = getattr(request, field.name)
            if field.type == descriptor.FieldDescriptor.TYPE_BYTES:
                value = base64.b64encode(value).decode("ascii")
            document[field.name] = value
    known = cls.DESCRIPTOR.fields_by_number
    unknown = UnknownFieldSet(request)
    for index in range(len(unknown)):
        item = unknown[index]
        named = known.get(item.field_number)
        if named is None:
            document[f"#{item.field_number}"] = None
        else:
            document[named.name] = wire.Malformed(
                f"must be a {_PROTO_TYPES.get(named.type, 'message')} field, "
                f"got the {_WIRE_TYPES.get(item.wire_type, str(item.wire_type))} wire type"
            )
    return document


def request_decoder(call: wire.Call) -> Callable[[bytes], wire.Document | wire.BadRequest]:
    """The server's request deserializer for ``call``."""
    cls = request_class(call)
    return lambda data: decode_message(cls, data)


def encode_message(cls: type[Message], call: wire.Call, request: Mapping[str, Any]) -> bytes:
    """Serialize ``request`` as ``cls``.

    A request the typed message cannot carry (a parameter it has no field for, a value of another
    type) raises InvalidArgumentError naming every bad field, as the server would
    (:func:`wire.validate`). Anything it can carry is sent, and judged by the server: a caller
    refused the call is refused whatever the request holds, as on the wire.
    """
    message = cls()
    fields = cls.DESCRIPTOR.fields_by_name
    try:
        for name, value in request.items():
            if value is None:
                continue
            if name not in fields:
                raise TypeError(name)
            bytes_field = fields[name].type == descriptor.FieldDescriptor.TYPE_BYTES
            setattr(message, name, base64.b64decode(value) if bytes_field else value)
    except (TypeError, ValueError) as exc:
        wire.validate(call, request)
        raise errors.InvalidArgumentError(
            f"invalid {call.name} request: it cannot be sent as {cls.DESCRIPTOR.full_name}: {exc}"
        ) from None
    return message.SerializeToString()


def request_encoder(call: wire.Call) -> Callable[[Mapping[str, Any]], bytes]:
    """The client's request serializer for ``call``."""
    cls = request_class(call)
    return lambda request: encode_message(cls, call, request)


# -- answers ------------------------------------------------------------------------------------


def _set_error(target: Any, error: Mapping[str, Any]) -> None:
    target.code = _text(error.get("code", "UNKNOWN"))
    target.message = _text(error.get("message", ""))
    for path, problem in error.get("fields", ()):
        target.fields.add(path=_text(path), problem=_text(problem))


def _error(source: Any) -> wire.Document:
    return wire.error_document(
        source.code, source.message, tuple((item.path, item.problem) for item in source.fields)
    )


def _json_text(result: object) -> str:
    return wire.encode(result).decode("utf-8")


def encode_replies(document: Mapping[str, Any]) -> bytes:
    """``{"replies": [...]}`` as ``Replies``."""
    answer = machine_pb2.Replies()
    for reply in document["replies"]:
        item = answer.replies.add(node=_text(reply["node"]))
        if "error" in reply:
            _set_error(item.error, reply["error"])
        else:
            item.result_json = _json_text(reply.get("result"))
    return answer.SerializeToString()


def decode_replies(data: bytes) -> wire.Document:
    """``Replies`` as ``{"replies": [...]}``."""
    answer = machine_pb2.Replies.FromString(data)
    replies: list[wire.Document] = []
    for item in answer.replies:
        if item.WhichOneof("outcome") == "error":
            replies.append({"node": item.node, "error": _error(item.error)})
        else:
            replies.append({"node": item.node, "result": _result(item.result_json)})
    return {"replies": replies}


def encode_stream_reply(document: Mapping[str, Any]) -> bytes:
    """``{"node", "result" | "error"}`` as ``StreamReply`` (bytes results as ``chunk``)."""
    item = machine_pb2.StreamReply(node=_text(document["node"]))
    if "error" in document:
        _set_error(item.error, document["error"])
    elif isinstance(document.get("result"), bytes):
        item.chunk = document["result"]
    else:
        item.result_json = _json_text(document.get("result"))
    return item.SerializeToString()


def decode_stream_reply(data: bytes) -> wire.Document:
    """``StreamReply`` as ``{"node", "result" | "error"}``."""
    item = machine_pb2.StreamReply.FromString(data)
    outcome = item.WhichOneof("outcome")
    if outcome == "error":
        return {"node": item.node, "error": _error(item.error)}
    if outcome == "chunk":
        return {"node": item.node, "result": item.chunk}
    return {"node": item.node, "result": _result(item.result_json)}


def _result(text: str) -> Any:
    return json.loads(text) if text else None


# -- trustd -------------------------------------------------------------------------------------


def decode_certificate_request(data: bytes) -> wire.Document | wire.BadRequest:
    """trustd's request deserializer."""
    return decode_message(trustd_pb2.CertificateRequest, data)


def encode_certificate_request(request: Mapping[str, Any]) -> bytes:
    """The worker's request serializer (``{"token", "csr"}``)."""
    return trustd_pb2.CertificateRequest(token=request["token"], csr=request["csr"]).SerializeToString()


def encode_certificate_response(document: Mapping[str, str]) -> bytes:
    """trustd's response serializer (``{"crt", "ca"}``)."""
    return trustd_pb2.CertificateResponse(crt=document["crt"], ca=document["ca"]).SerializeToString()


def decode_certificate_response(data: bytes) -> dict[str, str]:
    """The worker's response deserializer."""
    response = trustd_pb2.CertificateResponse.FromString(data)
    return {"crt": response.crt, "ca": response.ca}
