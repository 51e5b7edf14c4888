"""The node API's schema (kubeplane/node/v1/*.proto) against the call table, and its codec:
typed requests and answers, and malformed protobuf refused as clearly as malformed JSON."""

from __future__ import annotations

import base64

import pytest
from google.protobuf import descriptor

from kubeplane import api
from kubeplane.api import schema, trustd, wire
from kubeplane.api.proto.kubeplane.node.v1 import machine_pb2, trustd_pb2

pytestmark = pytest.mark.unit

_KINDS = {
    str: {descriptor.FieldDescriptor.TYPE_STRING, descriptor.FieldDescriptor.TYPE_BYTES},
    int: {descriptor.FieldDescriptor.TYPE_INT64},
    bool: {descriptor.FieldDescriptor.TYPE_BOOL},
}
SERVICE = machine_pb2.DESCRIPTOR.services_by_name["Machine"]


def test_every_call_is_a_method_of_the_versioned_service_with_one_field_per_parameter() -> None:
    assert SERVICE.full_name == wire.SERVICE == schema.SERVICE == "kubeplane.node.v1.Machine"
    assert {method.name for method in SERVICE.methods} == {call.name for call in wire.CALLS}
    for call in wire.CALLS:
        method = schema.method_descriptor(call)
        assert method.server_streaming == call.stream, call.name
        assert not method.client_streaming, call.name
        assert method.input_type.name == f"{call.name}Request", call.name
        assert method.output_type.name == ("StreamReply" if call.stream else "Replies"), call.name
        fields = {field.name: field for field in method.input_type.fields}
        assert set(fields) == {param.name for param in call.params}, call.name
        for param in call.params:
            field = fields[param.name]
            assert field.type in _KINDS[param.kind], f"{call.name}.{param.name}"
            # Absent is None (the default), so every parameter has explicit presence.
            assert field.has_presence, f"{call.name}.{param.name}"


def test_trustd_has_its_versioned_service() -> None:
    service = trustd_pb2.DESCRIPTOR.services_by_name["Trustd"]
    assert f"/{service.full_name}/Certificate" == trustd.METHOD == "/kubeplane.node.v1.Trustd/Certificate"
    assert {field.name for field in service.methods_by_name["Certificate"].input_type.fields} == {
        param.name for param in trustd.REQUEST.params
    }


def test_typed_requests_round_trip_and_absent_fields_are_none() -> None:
    call = wire.CALLS_BY_NAME["ResourceWatch"]
    body = schema.request_encoder(call)({"type": "Services", "namespace": None, "id": "etcd"})
    assert schema.request_decoder(call)(body) == {"type": "Services", "id": "etcd"}
    assert wire.validate(call, schema.request_decoder(call)(body)) == {  # type: ignore[arg-type]
        "type": "Services",
        "namespace": None,
        "id": "etcd",
    }
    bootstrap = wire.CALLS_BY_NAME["Bootstrap"]
    snapshot = base64.b64encode(bytes(range(256))).decode()
    body = schema.request_encoder(bootstrap)({"snapshot": snapshot, "checkpointer_grace_period": 0})
    assert machine_pb2.BootstrapRequest.FromString(body).snapshot == bytes(range(256))
    assert schema.request_decoder(bootstrap)(body) == {"snapshot": snapshot, "checkpointer_grace_period": 0}


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",  # a truncated varint tag
        b"\x0a\x05ab",  # a string shorter than its length
        b"\x0a\x02\xc3\x28",  # a string that is not UTF-8
        b"\x0b",  # a group start that never ends
        b"\x00",  # field number 0
    ],
)
def test_bytes_that_are_not_the_message_are_a_bad_request_naming_it(data: bytes) -> None:
    decoded = schema.request_decoder(wire.CALLS_BY_NAME["ResourceGet"])(data)
    assert isinstance(decoded, wire.BadRequest), decoded
    assert "request is not a valid kubeplane.node.v1.ResourceGetRequest message" in decoded.reason


def test_unknown_fields_and_wrong_wire_types_are_named() -> None:
    call = wire.CALLS_BY_NAME["ResourceGet"]
    # type=1 as a varint (wire type 0), id=2 a string, field 9 unknown.
    decoded = schema.request_decoder(call)(b"\x08\x05" + b"\x12\x01x" + b"\x48\x01")
    assert not isinstance(decoded, wire.BadRequest)
    with pytest.raises(api.InvalidArgumentError) as bad:
        wire.validate(call, decoded)
    problems = dict(bad.value.fields)
    assert problems.keys() == {"type", "#9"}
    assert problems["type"] == "must be a string field, got the varint wire type"
    assert problems["#9"].startswith("unknown parameter (expected one of: id, namespace, type)")


def test_the_client_refuses_what_the_server_would_with_the_same_fields() -> None:
    with pytest.raises(api.InvalidArgumentError) as bad:
        schema.request_encoder(wire.CALLS_BY_NAME["ResourceGet"])({"type": "Services", "tail": "x"})
    assert dict(bad.value.fields).keys() == {"id", "tail"}
    with pytest.raises(api.InvalidArgumentError, match="lone UTF-16 surrogate"):
        schema.request_encoder(wire.CALLS_BY_NAME["ReadFile"])({"path": "a\udcff"})


def test_answers_round_trip_results_errors_and_chunks() -> None:
    document = {
        "replies": [
            {"node": "a", "result": {"n": 2**60, "name": "bad-\udcff", "list": [1.5, None, True]}},
            {"node": "b", "error": wire.error_document("INVALID_ARGUMENT", "id \udcff", (("id", "no"),))},
            {"node": "c", "result": None},
        ]
    }
    decoded = schema.decode_replies(schema.encode_replies(document))
    assert decoded["replies"][0] == document["replies"][0]
    assert decoded["replies"][1]["error"] == {
        "code": "INVALID_ARGUMENT",
        "message": "id \\udcff",
        "fields": [["id", "no"]],
    }
    assert decoded["replies"][2] == {"node": "c", "result": None}
    chunk = {"node": "a", "result": bytes(range(256))}
    assert schema.decode_stream_reply(schema.encode_stream_reply(chunk)) == chunk
    line = {"node": "a", "result": "a log line"}
    assert schema.decode_stream_reply(schema.encode_stream_reply(line)) == line
    failed = {"node": "b", "error": wire.error_document("UNAVAILABLE", "down")}
    assert schema.decode_stream_reply(schema.encode_stream_reply(failed)) == failed


def test_the_json_wire_still_carries_chunks_as_base64() -> None:
    assert wire.decode(wire.encode({"node": "a", "result": b"\x00\xff"})) == {
        "node": "a",
        "result": {"data": "AP8="},
    }


def test_trustd_messages_round_trip() -> None:
    body = schema.encode_certificate_request({"token": "t", "csr": "PEM"})
    assert schema.decode_certificate_request(body) == {"token": "t", "csr": "PEM"}
    answer = schema.encode_certificate_response({"crt": "C", "ca": "A"})
    assert schema.decode_certificate_response(answer) == {"crt": "C", "ca": "A"}
    assert isinstance(schema.decode_certificate_request(b"\x12\x05ab"), wire.BadRequest)
