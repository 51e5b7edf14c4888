"""Malformed requests on the node API wire: what the decoder, the validator and the server's
status make of them (each case is one the fuzzing in tests/integration/test_fuzz_wire.py found)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

from kubeplane import api
from kubeplane.api import auth, errors, transport, wire
from kubeplane.api.server import NodeAPIServer, _Failure

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        # json.loads raised RecursionError: grpc answered UNKNOWN with the exception's text.
        (b"[" * 100_000, "nested too deeply"),
        (b'{"a":' * 100_000, "nested too deeply"),
        (b'{"type":"\xff"}', "not UTF-8 text: byte 0xff at offset 9"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b'{"tail":' + b"9" * 5000 + b"}", "a number has too many digits"),
        (b"[]", "must be a JSON object, got an array"),
        (b"null", "must be a JSON object, got null"),
        (b"7", "must be a JSON object, got a number"),
        (b"true", "must be a JSON object, got a boolean"),
        (b'"x"', "must be a JSON object, got a string"),
        # UTF-16: json.loads(bytes) guessed the encoding and read it as an object.
        ('{"a":1}'.encode("utf-16-le"), "not valid JSON"),
        ('{"é":1}'.encode("utf-16"), "not UTF-8 text"),
    ],
)
def test_bytes_that_are_not_a_json_object_are_a_bad_request(data: bytes, reason: str) -> None:
    decoded = wire.decode_request(data)
    assert isinstance(decoded, wire.BadRequest)
    assert reason in decoded.reason
    assert "Traceback" not in decoded.reason and "sys.set_int_max_str_digits" not in decoded.reason


def test_the_empty_message_and_objects_decode() -> None:
    assert wire.decode_request(b"") == {}
    assert wire.decode_request(b' {"type": "Services"} ') == {"type": "Services"}
    # A lone surrogate is valid JSON; validate refuses it where it matters (see below).
    assert wire.decode_request(b'{"id": "\\ud800"}') == {"id": "\ud800"}


def invalid(call: str, request: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(api.InvalidArgumentError) as bad:
        wire.validate(wire.CALLS_BY_NAME[call], request)
    return dict(bad.value.fields)


@pytest.mark.parametrize(
    ("call", "document", "field", "problem"),
    [
        ("ResourceGet", {"type": "Services", "id": "a\x00b"}, "id", "must not contain NUL characters"),
        ("ReadFile", {"path": "etc\x00"}, "path", "must not contain NUL characters"),
        # A lone surrogate reached the backend and, echoed in an error, made grpc fail to send
        # the status: the call never finished.
        ("ResourceGet", {"type": "Services", "id": "\ud800"}, "id", "lone UTF-16 surrogate"),
        ("ApplyConfiguration", {"data": "\udfff"}, "data", "lone UTF-16 surrogate"),
        # A tail beyond a C ssize_t made the log reader raise OverflowError: INTERNAL.
        ("Logs", {"service": "kubeplaned", "tail": 2**70}, "tail", "must be from 0 to 2147483647"),
        ("Logs", {"service": "kubeplaned", "tail": -1}, "tail", "must be from 0 to 2147483647"),
        (
            "Bootstrap",
            {"self_hosted": True, "checkpointer_grace_period": -5},
            "checkpointer_grace_period",
            "from 0",
        ),
        # A 100 000-character path took the backend minutes (the root check is quadratic).
        ("ReadFile", {"path": "x/" * 5000}, "path", "must be at most 4096 characters, got 10000"),
        ("ResourceGet", {"type": "t" * 4097, "id": "x"}, "type", "must be at most 4096 characters"),
    ],
)
def test_strings_and_counts_the_node_cannot_use_are_refused(
    call: str, document: dict[str, Any], field: str, problem: str
) -> None:
    assert problem in invalid(call, document)[field]


def test_long_strings_are_fine_where_they_are_documents() -> None:
    big = "x" * 100_000
    assert wire.validate(wire.CALLS_BY_NAME["ApplyConfiguration"], {"data": big})["data"] == big
    assert wire.validate(wire.CALLS_BY_NAME["Bootstrap"], {"snapshot": big})["snapshot"] == big
    assert wire.validate(wire.CALLS_BY_NAME["ReadFile"], {"path": "p" * 4096})["path"] == "p" * 4096


def test_what_a_caller_sent_is_repeated_escaped_and_short() -> None:
    fields = invalid("Version", {"k" * 10_000: 1, "\ud800x": 2})
    assert set(fields) == {"k" * 100 + "... (9900 more characters)", "\\ud800x"}
    mode = invalid("ApplyConfiguration", {"data": "x", "mode": "m" * 1000})["mode"]
    assert len(mode) < 300 and "more characters" in mode


def test_a_document_with_a_lone_surrogate_still_encodes() -> None:
    # A file name that is not UTF-8 (Python decodes it with surrogateescape) made the response
    # serializer raise: the caller got UNKNOWN with the exception's text.
    document = {"name": "bad-\udcff", "ok": "é"}
    assert wire.decode(wire.encode(document)) == document
    assert wire.encode({"ok": "é"}) == '{"ok":"é"}'.encode()  # the usual case stays compact


def test_status_messages_are_bounded_and_encodable() -> None:
    assert wire.status_message("plain") == "plain"
    assert wire.status_message("id \ud800") == "id \\ud800"
    long = wire.status_message("é" * 100_000)
    assert len(long.encode()) <= wire.MAX_STATUS_MESSAGE
    assert long.endswith("(message cut: 200000 bytes)")
    long.encode("utf-8")  # no half character left at the cut


def test_status_fields_are_bounded_json() -> None:
    fields = [(f"name-{n}", "unknown parameter " * 5) for n in range(1000)]
    value = wire.status_fields(fields)
    assert len(value) <= wire.MAX_STATUS_FIELDS
    kept = json.loads(value)
    assert kept and kept[0] == ["name-0", ("unknown parameter " * 5)]
    assert json.loads(wire.status_fields([("x" * 10_000, "\ud800")])) == [
        ["x" * 100 + "... (9900 more characters)", "\\ud800"]
    ]
    value.encode("ascii")  # metadata values must be ASCII


@dataclass
class Context:
    """The parts of a grpc servicer context the server uses; records the abort."""

    metadata: tuple[tuple[str, str], ...] = ()
    aborted: list[tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]] = field(default_factory=list)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def auth_context(self) -> dict[str, Any]:
        return {}

    async def abort(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...]) -> None:
        self.aborted.append((code, details, trailing))
        raise RuntimeError("aborted")


def test_the_server_sends_bounded_escaped_statuses() -> None:
    # grpc could not encode a lone surrogate (the call hung) and clients drop trailers over
    # 16 KiB whole (the caller saw RESOURCE_EXHAUSTED, and none of the error).
    context = Context()
    failure = _Failure(
        "INVALID_ARGUMENT", "bad \ud800 " + "x" * 100_000, tuple((f"k{n}", "unknown") for n in range(5000))
    )
    with pytest.raises(RuntimeError, match="aborted"):
        asyncio.run(NodeAPIServer._abort(context, failure))
    [(code, details, trailing)] = context.aborted
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("bad \\ud800 x") and len(details.encode()) <= wire.MAX_STATUS_MESSAGE
    metadata = dict(trailing)
    assert metadata[wire.MD_ORIGIN] == "node"
    assert len(metadata[wire.MD_FIELDS]) <= wire.MAX_STATUS_FIELDS
    assert json.loads(metadata[wire.MD_FIELDS])[0] == ["k0", "unknown"]


def test_who_may_call_is_settled_before_the_request_is_read() -> None:
    server = NodeAPIServer(backend=None, node="n", maintenance=True)  # type: ignore[arg-type]
    reboot, version = wire.CALLS_BY_NAME["Reboot"], wire.CALLS_BY_NAME["Version"]
    bad = wire.BadRequest("request is not valid JSON: x")
    with pytest.raises(errors.PermissionDeniedError, match=auth.MAINTENANCE_MESSAGE):
        server._prepare(reboot, bad, Context())
    with pytest.raises(
        errors.InvalidArgumentError, match="invalid Version request: request is not valid JSON"
    ):
        server._prepare(version, bad, Context())


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "SERVER: Received message larger than max (67108865 vs. 67108864)",
        ),
        (grpc.StatusCode.UNIMPLEMENTED, "Method not found!"),
    ],
)
def test_a_call_grpc_refused_is_an_answer_not_an_unreachable_endpoint(
    code: grpc.StatusCode, details: str
) -> None:
    # The client tried every other endpoint and then said none could be reached.
    failure = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)
    error = transport.call_error(failure, endpoint="10.5.0.2:50000")
    assert isinstance(error, errors.CallError)
    assert (error.code, error.message) == (code.name, details)


def test_a_connection_failure_is_still_unreachable() -> None:
    failure = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="connection refused"
    )
    assert isinstance(transport.call_error(failure, endpoint="10.5.0.2:50000"), transport.Unreachable)
