"""Malformed and oversized requests against real servers on loopback: every one gets a clear
error, none changes anything, and the servers keep serving.

Both wires are fuzzed: the typed one, ``kubeplane.node.v1`` (protobuf: bytes that are not the
method's message, unknown fields, known fields of another wire type, bad values, oversized
messages; the ``v1`` tests at the end of the node and trustd sections), and the JSON wire older
clients still speak (``kubeplane.machine.Machine``, ``kubeplane.trustd.Trustd``), which the other
tests send to.

The node API is a real ``kubeplaned --no-services`` agent (the acceptance tests' harness) booted
with the generated control plane config, so ApplyConfiguration is the real one with the real
config store behind it. The tests speak raw gRPC to it with the admin client certificate: the
request bytes are whatever the test makes them. trustd is a real
:class:`~kubeplane.api.trustd.TrustdServer` on a ``127.x.y.z`` address.

Hypothesis draws the requests with a fixed seed (``derandomize``), a bounded number of examples
and a time budget per test, so a run is reproducible and ends by itself.

What every answer must be: a reply, or a gRPC status whose code a caller can act on (never
UNKNOWN or INTERNAL, nor DEADLINE_EXCEEDED standing for a call the server never finished), with
no Python traceback in its details, marked as the node's own answer (:data:`wire.MD_ORIGIN`)
unless grpc refused the call before any handler (unknown method, oversized message). A request
malformed by construction must be INVALID_ARGUMENT naming the field that is wrong (or the request,
when it is not a JSON object at all).

Requests that would be valid are only sent to calls that change nothing: to the calls that would
reboot the node, control services, or reach etcd or containerd, only requests malformed by
construction are sent, and ApplyConfiguration only ever gets data that is not a valid config.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import importlib.util
import json
import os
import random
import string
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import grpc.aio
import pytest
import yaml
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kubeplane import api, config, pki
from kubeplane.api import schema, transport, trustd, wire
from kubeplane.config import client as client_config
from kubeplane.resources import catalog

pytestmark = pytest.mark.integration


def _agent_harness() -> ModuleType:
    """The acceptance tests' harness (tests/integration/agent/agent_harness.py); its directory is
    on ``sys.path`` only when pytest collects that directory, so it is loaded by path here."""
    module = sys.modules.get("agent_harness")
    if module is None:
        path = Path(__file__).parent / "agent" / "agent_harness.py"
        spec = importlib.util.spec_from_file_location("agent_harness", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["agent_harness"] = module
        spec.loader.exec_module(module)
    return module


harness = _agent_harness()

#: An answer slower than this is a call the server never finished.
CALL_TIMEOUT = 15.0
#: For the one call that is slow on purpose.
SLOW_TIMEOUT = 120.0
#: A valid streaming request may stream nothing for a while (a watch, a follow): it counts as
#: answered when neither a message nor a status came within this long.
STREAM_IDLE = 3.0
#: Wall-clock budget of one test's examples; the examples left when it is spent are skipped.
BUDGET = 40.0
#: Examples a test must have run within its budget for its verdict to mean something.
MIN_EXAMPLES = 20

#: Codes a caller can act on. UNKNOWN, INTERNAL, DEADLINE_EXCEEDED and CANCELLED are not among them.
ACTIONABLE = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "FAILED_PRECONDITION",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "UNAVAILABLE",
        "UNIMPLEMENTED",
        "RESOURCE_EXHAUSTED",
        "OUT_OF_RANGE",
    }
)
#: Codes grpc answers with itself, before a handler runs (so without the node's origin mark).
GRPC_OWN = frozenset({"UNIMPLEMENTED", "RESOURCE_EXHAUSTED"})
TRACEBACK_MARKS = ("Traceback (most recent call last)", 'File "', "<class '", "Unexpected <")

#: Admin calls whose valid request would change the node or reach beyond it (reboot, services,
#: etcd, containerd, image pulls): they only ever get requests malformed by construction.
ONLY_MALFORMED = frozenset(
    call.name
    for call in wire.CALLS
    if call.access == "admin"
    and call.name not in {"MachineConfig", "ReadFile", "Kubeconfig", "ApplyConfiguration"}
)
CALL_NAMES = tuple(call.name for call in wire.CALLS)

SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


# -- calls and answers ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answer:
    """What a call got: ``OK`` with its messages, ``STREAMING`` (a stream still open and silent
    after :data:`STREAM_IDLE`), or a status code name with its details and trailing metadata."""

    code: str
    details: str = ""
    trailing: tuple[tuple[str, str], ...] = ()
    messages: tuple[bytes, ...] = ()

    @property
    def from_node(self) -> bool:
        return any(key == wire.MD_ORIGIN for key, _ in self.trailing)

    @property
    def fields(self) -> dict[str, str]:
        for key, value in self.trailing:
            if key == wire.MD_FIELDS:
                return {str(path): str(problem) for path, problem in json.loads(value)}
        return {}

    def __str__(self) -> str:
        return f"{self.code}: {self.details[:500]!r} fields={self.fields} messages={self.messages[:2]!r}"


def _failed(exc: grpc.aio.AioRpcError) -> Answer:
    trailing = tuple((str(key), str(value)) for key, value in exc.trailing_metadata() or ())
    return Answer(exc.code().name, exc.details() or "", trailing)


def _identity(data: bytes) -> bytes:
    return data


@contextlib.contextmanager
def event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for every example of a test: grpc.aio channels belong to the loop they
    were made on."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


async def _channel(target: str, credentials: Any, options: tuple[tuple[str, Any], ...] = ()) -> Any:
    return grpc.aio.secure_channel(target, credentials, options=options)


class Wire:
    """Raw-bytes calls over one channel, run on ``loop``; :meth:`close` closes the channel."""

    def __init__(self, loop: asyncio.AbstractEventLoop, channel: Any) -> None:
        self._loop = loop
        self._channel = channel

    def close(self) -> None:
        self._loop.run_until_complete(self._channel.close())

    def call(self, name: str, body: bytes) -> Answer:
        """The node API call ``name`` (a table entry, or any other name as a unary call)."""
        method = f"/{wire.LEGACY_SERVICE}/{name}"
        entry = wire.CALLS_BY_NAME.get(name)
        return self.stream(method, body) if entry is not None and entry.stream else self.unary(method, body)

    def unary(self, method: str, body: bytes) -> Answer:
        return self._loop.run_until_complete(self._unary(method, body))

    def stream(self, method: str, body: bytes) -> Answer:
        return self._loop.run_until_complete(self._stream(method, body))

    def during(self, slow: tuple[str, bytes], other: tuple[str, bytes]) -> tuple[Answer, list[float]]:
        """Make the unary call ``slow`` and, until it is answered, the unary call ``other`` over and
        over; returns the slow call's answer and when each other call was answered (monotonic
        seconds from the start, ending with when the slow one was)."""
        return self._loop.run_until_complete(self._during(slow, other))

    async def _during(self, slow: tuple[str, bytes], other: tuple[str, bytes]) -> tuple[Answer, list[float]]:
        start = time.monotonic()
        slow_call = asyncio.ensure_future(self._unary(*slow, timeout=SLOW_TIMEOUT))
        answered: list[float] = []
        while not slow_call.done():
            answer = await self._unary(*other, timeout=SLOW_TIMEOUT)
            assert answer.code == "OK", answer
            answered.append(time.monotonic() - start)
        answer = await slow_call
        return answer, [*answered, time.monotonic() - start]

    async def _unary(self, method: str, body: bytes, timeout: float = CALL_TIMEOUT) -> Answer:
        rpc = self._channel.unary_unary(method, request_serializer=_identity, response_deserializer=_identity)
        try:
            reply = await rpc(body, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            return _failed(exc)
        return Answer("OK", messages=(reply,))

    async def _stream(self, method: str, body: bytes) -> Answer:
        """The first message or the status of a streaming call; the call is cancelled after."""
        rpc = self._channel.unary_stream(
            method, request_serializer=_identity, response_deserializer=_identity
        )(body, timeout=CALL_TIMEOUT)
        first = asyncio.ensure_future(rpc.read())
        try:
            done, _ = await asyncio.wait({first}, timeout=STREAM_IDLE)
            if not done:
                return Answer("STREAMING")
            try:
                message = first.result()
            except grpc.aio.AioRpcError as exc:
                return _failed(exc)
            if message is grpc.aio.EOF:
                return Answer("OK")
            return Answer("OK", messages=(message,))
        finally:
            rpc.cancel()
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await first


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a malformed-by-construction request must be refused for: ``fields`` it names (in
    :data:`wire.MD_FIELDS`), or ``whole`` when the request is not a JSON object at all."""

    fields: frozenset[str] = frozenset()
    whole: bool = False

    @property
    def malformed(self) -> bool:
        return self.whole or bool(self.fields)


def check(answer: Answer, expect: Expect, *, what: str) -> None:
    """The rules of the module docstring for one answer."""
    context = f"{what} -> {answer}"
    if answer.code in ("OK", "STREAMING"):
        assert not expect.malformed, f"a malformed request was served: {context}"
        return
    assert answer.code in ACTIONABLE, f"not an actionable code: {context}"
    assert not any(mark in answer.details for mark in TRACEBACK_MARKS), f"Python internals leak: {context}"
    assert answer.details.strip(), f"an error without a message: {context}"
    if answer.code not in GRPC_OWN:
        assert answer.from_node, f"an error the node did not mark as its own: {context}"
    if expect.malformed:
        assert answer.code == "INVALID_ARGUMENT", f"malformed, so INVALID_ARGUMENT: {context}"
    if expect.whole:
        assert "request" in answer.details, f"the error does not say the request is wrong: {context}"
    missing = expect.fields - answer.fields.keys()
    assert not missing, f"the error does not name {sorted(missing)}: {context}"


class Budget:
    """Counts examples and their answers, and says when a test's time budget is spent."""

    def __init__(self, seconds: float = BUDGET) -> None:
        self.deadline = time.monotonic() + seconds
        self.ran = 0
        self.codes: collections.Counter[str] = collections.Counter()

    def take(self) -> bool:
        if time.monotonic() > self.deadline:
            return False
        self.ran += 1
        return True

    def seen(self, answer: Answer) -> Answer:
        """Counts the answer of an example (and tells hypothesis, for its statistics)."""
        event(answer.code)
        self.codes[answer.code] += 1
        return answer

    def enough(self, minimum: int = MIN_EXAMPLES) -> None:
        assert self.ran >= minimum, f"only {self.ran} examples ran within {BUDGET}s: {dict(self.codes)}"


# -- requests ---------------------------------------------------------------------------------


def could_be_object(body: bytes) -> bool:
    """Whether any JSON reading of ``body`` (UTF-8, or whatever json.loads detects) is an object;
    the empty body is ``{}``. Conservative: a body for which this is False is malformed."""
    if not body:
        return True
    for attempt in (lambda: json.loads(body), lambda: json.loads(body.decode("utf-8"))):
        try:
            if isinstance(attempt(), dict):
                return True
        except Exception:  # any failure is a reading that gives no object
            continue
    return False


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def deep_object(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


#: Bodies that are not one JSON object: random bytes, fragments, other JSON types, raw invalid
#: UTF-8 and control characters inside strings, nesting deeper than any parser's stack.
RAW_BODIES = st.one_of(
    st.binary(max_size=300),
    st.sampled_from(
        [
            b"{",
            b"}",
            b"null",
            b"true",
            b"0",
            b"-1e999",
            b'"text"',
            b"[]",
            b"[{}]",
            b'{"type":',
            b"{'type': 'Services'}",
            b'{"type":"Services",}',
            b'{"type":"\xff\xfe"}',
            b'{"type":"a\x00b"}',
            b'{"\xc3\x28":1}',
            b"\xef\xbb\xbf{}",
            b"\x00",
            b" ",
            b'{"tail":' + b"9" * 5000 + b"}",
            b'{"a":NaN}',
        ]
    ),
    st.integers(min_value=1, max_value=200_000).map(nested),
    st.integers(min_value=900, max_value=200_000).map(deep_object),
    st.integers(min_value=900, max_value=100_000).map(lambda n: b'{"type":' + nested(n) + b"}"),
)

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
#: Text with at least one lone UTF-16 surrogate (JSON can escape one; UTF-8 cannot encode it).
SURROGATE_TEXT = st.tuples(
    st.text(max_size=8), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.text(max_size=8)
).map("".join)
NUL_TEXT = st.tuples(st.text(max_size=8), st.text(max_size=8)).map("\x00".join)

#: Realistic values, so valid requests reach the backend with names it knows.
LIKELY = {
    "type": ["Services", "MachineTypes", "mc", "rs", catalog.MACHINE_TYPES, "nope"],
    "namespace": ["config", "runtime", "secrets", "nope"],
    "id": [catalog.MACHINE_TYPE_ID, "etcd", "kubelet", "v1alpha1"],
    "path": [".", "etc", "..", "../..", "/etc/passwd", "system", "system/config.yaml/x", "y" * 256, "logs"],
    "service": ["kubeplaned", "etcd", "kubelet", "../x", "KUBEPLANED"],
}


def good_value(param: wire.Param) -> st.SearchStrategy[Any]:
    """Values of the parameter's JSON type that the wire accepts."""
    if param.kind is bool:
        return st.booleans()
    if param.kind is int:
        return st.integers(min_value=0, max_value=1000)
    if param.choices:
        return st.sampled_from(param.choices)
    clean = st.text(max_size=40).filter(lambda text: "\x00" not in text)
    return st.sampled_from(LIKELY[param.name]) | clean if param.name in LIKELY else clean


def bad_value(param: wire.Param) -> st.SearchStrategy[Any]:
    """Values the wire must refuse for the parameter: another JSON type, a NUL or a lone
    surrogate in a string, a string too long, a choice that is not one, a count out of range."""
    if param.kind is bool:
        wrong: st.SearchStrategy[Any] = st.integers() | st.text() | st.lists(JSON_SCALARS, max_size=2)
    elif param.kind is int:
        wrong = (
            st.booleans()
            | st.text()
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.integers(max_value=-1)
            | st.integers(min_value=2**31, max_value=2**200)
        )
    else:
        wrong = (
            st.booleans()
            | st.integers()
            | st.lists(JSON_SCALARS, max_size=2)
            | st.dictionaries(st.text(max_size=4), JSON_SCALARS, max_size=2)
            | NUL_TEXT
            | SURROGATE_TEXT
        )
        if param.choices:
            wrong = wrong | st.text(max_size=12).filter(lambda text: text not in param.choices)
        if param.max_length is not None:
            longest = param.max_length
            wrong = wrong | st.integers(min_value=longest + 1, max_value=4 * longest).map(lambda n: "x" * n)
    return wrong


@st.composite
def requests(draw: st.DrawFn, call: wire.Call) -> tuple[dict[str, Any], Expect]:
    """A request for ``call`` from its parameter list, with the fields that are malformed by
    construction: each parameter is left out, good or bad, and unknown ones may be added."""
    document: dict[str, Any] = {}
    bad: set[str] = set()
    for param in call.params:
        choice = draw(st.sampled_from(["omit", "null", "good", "good", "bad"]))
        if choice == "omit":
            if param.required:
                bad.add(param.name)
        elif choice == "null":
            document[param.name] = None
            if param.required:
                bad.add(param.name)
        elif choice == "good":
            document[param.name] = draw(good_value(param))
        else:
            document[param.name] = draw(bad_value(param))
            bad.add(param.name)
    known = {param.name for param in call.params}
    extra_names = st.text(max_size=12) | SURROGATE_TEXT | st.sampled_from(["nodes", "role", "Type"])
    extras = draw(
        st.dictionaries(extra_names.filter(lambda name: name not in known), JSON_VALUES, max_size=2)
    )
    document.update(extras)
    return document, Expect(fields=frozenset(_shown(name) for name in bad | set(extras)))


def _shown(name: str) -> str:
    """A field name as an error can print it: lone surrogates escaped."""
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


def dumps(document: object) -> bytes:
    """JSON as a client could send it; ``ensure_ascii`` so a lone surrogate travels as ``\\udXXX``."""
    return json.dumps(document).encode()


# -- the booted agent -------------------------------------------------------------------------


@dataclasses.dataclass
class Node:
    cluster: Any
    agent: Any
    credentials: api.Credentials

    @property
    def target(self) -> str:
        return f"{self.agent.address}:{harness.API_PORT}"

    def config_files(self) -> tuple[bytes | None, bytes | None]:
        return self.agent.config_bytes(), self.agent.staged_bytes()


@pytest.fixture
def node(tmp_path: Path, processes: Any) -> Node:
    """A ``kubeplaned --no-services`` agent booted with the generated control plane config; the
    ``processes`` fixture stops it, even when the test fails."""
    cluster = harness.Cluster(tmp_path=tmp_path, processes=processes)
    agent = cluster.boot_agent()
    _, context = client_config.current(client_config.load(cluster.admin))
    credentials = api.Credentials(ca=context.ca_pem, cert=context.client.cert, key=context.client.key)
    return Node(cluster=cluster, agent=agent, credentials=credentials)


@contextlib.contextmanager
def wire_to(node: Node) -> Iterator[Wire]:
    with event_loop() as loop:
        options = (("grpc.max_receive_message_length", transport.MAX_MESSAGE_BYTES),)
        credentials = transport.secure_credentials(node.credentials)
        channel = Wire(loop, loop.run_until_complete(_channel(node.target, credentials, options)))
        try:
            yield channel
        finally:
            channel.close()


@contextlib.contextmanager
def maintenance_wire(target: str) -> Iterator[Wire]:
    """A channel to a maintenance-mode server, trusting the certificate it presents."""
    with event_loop() as loop:
        credentials, options = loop.run_until_complete(
            transport.insecure_options(target, timeout=CALL_TIMEOUT)
        )
        channel = Wire(loop, loop.run_until_complete(_channel(target, credentials, options)))
        try:
            yield channel
        finally:
            channel.close()


def still_serving(node: Node, channel: Wire) -> None:
    """A normal version call and a resource read still work, and the config did not change."""
    version = channel.call("Version", b"{}")
    assert version.code == "OK", f"version after the run: {version}\n{node.agent.logs()}"
    assert json.loads(version.messages[0])["replies"][0]["result"]["maintenance"] is False
    request = dumps({"type": catalog.MACHINE_TYPES, "id": catalog.MACHINE_TYPE_ID})
    read = channel.call("ResourceGet", request)
    assert read.code == "OK", f"resource read after the run: {read}\n{node.agent.logs()}"
    assert json.loads(read.messages[0])["replies"][0]["result"]["metadata"]["id"] == catalog.MACHINE_TYPE_ID


def test_node_api_refuses_bytes_that_are_not_a_json_object_on_every_call(node: Node) -> None:
    before = node.config_files()
    budget = Budget()
    with wire_to(node) as channel:

        @settings(SETTINGS, max_examples=200)
        @given(name=st.sampled_from(CALL_NAMES), body=RAW_BODIES)
        def example(name: str, body: bytes) -> None:
            if could_be_object(body):
                assume(name not in ONLY_MALFORMED and name != "ApplyConfiguration")
            if not budget.take():
                return
            answer = budget.seen(channel.call(name, body))
            check(answer, Expect(whole=not could_be_object(body)), what=f"{name} {body[:80]!r}")

        example()
        still_serving(node, channel)
    assert node.config_files() == before
    budget.enough()


def test_node_api_names_every_malformed_parameter_on_every_call(node: Node) -> None:
    before = node.config_files()
    budget = Budget()
    with wire_to(node) as channel:

        @settings(SETTINGS, max_examples=200)
        @given(data=st.data(), name=st.sampled_from(CALL_NAMES))
        def example(data: st.DataObject, name: str) -> None:
            call = wire.CALLS_BY_NAME[name]
            document, expect = data.draw(requests(call), label="request")
            if name in ONLY_MALFORMED:
                assume(expect.malformed)
            if not budget.take():
                return
            answer = budget.seen(channel.call(name, dumps(document)))
            check(answer, expect, what=f"{name} {document!r:.300}")
            if name == "ApplyConfiguration" and not expect.malformed:
                # Random text is never a valid machine config: refused by the node, not applied.
                assert answer.code == "INVALID_ARGUMENT", answer

        example()
        still_serving(node, channel)
    assert node.config_files() == before
    budget.enough()


def test_unknown_methods_are_unimplemented_and_the_node_keeps_serving(node: Node) -> None:
    budget = Budget()
    names = st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1, max_size=30)
    with wire_to(node) as channel:

        @settings(SETTINGS, max_examples=60)
        @given(
            service=st.sampled_from(
                [
                    wire.SERVICE,
                    wire.LEGACY_SERVICE,
                    trustd.LEGACY_SERVICE,
                    schema.TRUSTD_SERVICE,
                    "grpc.health.v1.Health",
                ]
            )
            | names,
            name=names,
            body=st.binary(max_size=64),
            stream=st.booleans(),
        )
        def example(service: str, name: str, body: bytes, stream: bool) -> None:
            assume(not (service in (wire.SERVICE, wire.LEGACY_SERVICE) and name in wire.CALLS_BY_NAME))
            if not budget.take():
                return
            method = f"/{service}/{name}"
            answer = budget.seen(channel.stream(method, body) if stream else channel.unary(method, body))
            check(answer, Expect(), what=method)
            assert answer.code == "UNIMPLEMENTED", answer

        example()
        still_serving(node, channel)
    budget.enough()


def _mutations(text: str) -> st.SearchStrategy[str]:
    """Ways to break a machine config: cut it, drop or garble a line, add junk, change the version."""
    lines = text.splitlines(keepends=True)

    def cut(at: int) -> str:
        return text[:at]

    def drop(index: int) -> str:
        return "".join(lines[:index] + lines[index + 1 :])

    def garble(index: int, junk: str) -> str:
        line = lines[index]
        indent = line[: len(line) - len(line.lstrip())]
        key = line.strip().split(":", 1)[0]
        return "".join([*lines[:index], f"{indent}{key}: {junk}\n", *lines[index + 1 :]])

    junk = st.sampled_from(
        ["[", "{", "*alias", "&a [*a, *a]", "!!python/object:os.system", "- x", "0x", "~", "'", '"\\']
    ) | st.text(max_size=20)
    index = st.integers(min_value=0, max_value=len(lines) - 1)
    return st.one_of(
        st.integers(min_value=0, max_value=len(text) - 1).map(cut),
        index.map(drop),
        st.builds(garble, index, junk),
        st.builds(lambda extra: text + extra, st.text(max_size=30)),
        st.builds(lambda extra: extra + text, st.sampled_from(["\t", "%YAML 9.9\n", "---\n- a\n", "\x00"])),
        st.just(text.replace("version: v1alpha1", "version: v9")),
        st.just(json.dumps(yaml.safe_load(text))[:-1]),
    )


def test_apply_configuration_with_a_broken_config_changes_nothing(node: Node) -> None:
    """Broken versions of the applied config itself, in every mode: refused, nothing applied or
    staged, the node neither reboots nor leaves its config."""
    before = node.config_files()
    applied = node.cluster.gen.controlplane.read_text()
    budget = Budget()
    with wire_to(node) as channel:

        @settings(SETTINGS, max_examples=60)
        @given(data=_mutations(applied), mode=st.sampled_from(wire.APPLY_MODES), dry_run=st.booleans())
        def example(data: str, mode: str, dry_run: bool) -> None:
            try:
                config.load(data)
            except config.ConfigError:
                pass
            else:
                assume(False)  # a mutation that is still a valid config would be applied
            if not budget.take():
                return
            request = {"data": data, "mode": mode, "dry_run": dry_run}
            answer = budget.seen(channel.call("ApplyConfiguration", dumps(request)))
            nul = "\x00" in data
            check(
                answer, Expect(fields=frozenset({"data"}) if nul else frozenset()), what=f"{request!r:.300}"
            )
            assert answer.code == "INVALID_ARGUMENT", answer
            assert node.config_files() == before, f"{request!r:.300} changed the config files"

        example()
        still_serving(node, channel)
    assert node.config_files() == before
    budget.enough()


def test_oversized_and_huge_requests_get_a_clear_error_and_change_nothing(node: Node) -> None:
    """Over the message limit: RESOURCE_EXHAUSTED from grpc. Under it but huge (a 4 MiB config,
    a long unknown parameter name, 20 000 of them, a long id echoed in the error): the node's own
    clear error, still readable by the caller (grpc drops trailers over 16 KiB)."""
    before = node.config_files()
    limit = transport.MAX_MESSAGE_BYTES
    with wire_to(node) as channel:
        over = [
            ("Version", b" " * (limit + 1)),
            ("ApplyConfiguration", dumps({"data": "x" * limit})),
            ("ResourceWatch", dumps({"type": "x" * limit})),
        ]
        for name, body in over:
            answer = channel.call(name, body)
            check(answer, Expect(), what=f"{name} of {len(body)} bytes")
            assert answer.code == "RESOURCE_EXHAUSTED", answer

        # (call, request, code, the start of a field the error must name)
        huge: list[tuple[str, dict[str, Any], str, str | None]] = [
            (
                "ApplyConfiguration",
                {"data": "version: v1alpha1\n" + "#" * (4 << 20)},
                "INVALID_ARGUMENT",
                None,
            ),
            # No error can carry a 100 000-character name whole: its start is named.
            ("Version", {"k" * 100_000: 1}, "INVALID_ARGUMENT", "k" * 100),
            ("Version", {f"k{n}": n for n in range(20_000)}, "INVALID_ARGUMENT", "k0"),
            # 4 000 characters, 8 000 bytes of UTF-8, 24 000 percent-encoded in the status.
            ("ResourceGet", {"type": catalog.MACHINE_TYPES, "id": "é" * 4000}, "NOT_FOUND", None),
            ("ResourceGet", {"type": "é" * 100_000, "id": "x"}, "INVALID_ARGUMENT", "type"),
        ]
        for name, document, code, field in huge:
            answer = channel.call(name, dumps(document))
            what = f"{name} {str(document)[:100]}"
            check(answer, Expect(), what=what)
            assert answer.code == code, f"{what}: {answer}"
            if field is not None:
                assert any(named.startswith(field) for named in answer.fields), f"{what}: {answer}"
            total = len(answer.details.encode()) + sum(len(k) + len(v) for k, v in answer.trailing)
            assert total < 16 << 10, f"{what}: {total} bytes of status"
        still_serving(node, channel)
    assert node.config_files() == before


def test_a_config_that_is_slow_to_refuse_does_not_stall_the_node(node: Node) -> None:
    """YAML is parsed in pure Python, so a big broken config takes seconds to refuse (40 000
    duplicate keys: about six here). Meanwhile the node answers other calls as usual."""
    before = node.config_files()
    slow = ("/" + wire.LEGACY_SERVICE + "/ApplyConfiguration", dumps({"data": "a:\n" * 40_000}))
    with wire_to(node) as channel:
        answer, answered = channel.during(slow, ("/" + wire.LEGACY_SERVICE + "/Version", b"{}"))
        check(answer, Expect(), what="ApplyConfiguration of 40 000 duplicate keys")
        assert answer.code == "INVALID_ARGUMENT" and "duplicate key" in answer.details, answer
        took = answered[-1]
        gaps = [later - earlier for earlier, later in zip([0.0, *answered], answered, strict=False)]
        # A node that stops serving while it parses answers nothing until the parse is done: one
        # gap as long as the whole call.
        assert len(answered) > 10 and max(gaps) < took / 2, (
            f"the node stalled: {len(answered) - 1} version calls answered in {took:.1f}s, "
            f"longest gap {max(gaps):.1f}s"
        )
        still_serving(node, channel)
    assert node.config_files() == before


def test_paths_the_file_system_refuses_get_a_clear_error(node: Node) -> None:
    """ReadFile and ListDir name paths under the node root that the file system may refuse to
    follow: through a file, a name over 255 bytes, a symlink loop, a path over PATH_MAX."""
    directory = node.agent.paths.root / "fuzz-paths"
    directory.mkdir()
    (directory / "file").write_text("")
    (directory / "loop").symlink_to("loop")
    paths = [
        "fuzz-paths/file/x",
        "fuzz-paths/" + "y" * 300,
        "fuzz-paths/loop",
        "fuzz-paths/loop/x",
        "fuzz-paths/" + "é/" * 2000,
        "x/" * 5000,
    ]
    with wire_to(node) as channel:
        for path in paths:
            for name in ("ReadFile", "ListDir"):
                answer = channel.call(name, dumps({"path": path}))
                what = f"{name} {path[:60]!r}"
                check(
                    answer, Expect(fields=frozenset({"path"}) if len(path) > 4096 else frozenset()), what=what
                )
                assert answer.code in {"NOT_FOUND", "INVALID_ARGUMENT"}, f"{what} -> {answer}"
        still_serving(node, channel)


def test_a_file_name_that_is_not_utf8_is_listed_not_an_error(node: Node) -> None:
    """File names are bytes; the one that is not UTF-8 still travels (JSON escapes it)."""
    # The agent runs at / of its machine node; the node's /var/lib/kubeplane is this directory.
    directory = node.agent.paths.root / "var/lib/kubeplane/fuzz-names"
    directory.mkdir(parents=True)
    (directory / "ok").write_text("")
    (directory / os.fsdecode(b"bad-\xff")).write_text("")
    with wire_to(node) as channel:
        answer = channel.call("ListDir", dumps({"path": "/var/lib/kubeplane/fuzz-names"}))
        check(answer, Expect(), what="ListDir fuzz-names")
        assert answer.code == "OK", answer
        names = [entry["name"] for entry in json.loads(answer.messages[0])["replies"][0]["result"]]
        assert names == ["var/lib/kubeplane/fuzz-names/bad-\udcff", "var/lib/kubeplane/fuzz-names/ok"]
        still_serving(node, channel)


# -- the typed wire (kubeplane.node.v1) -------------------------------------------------------


def varint(number: int) -> bytes:
    """A protobuf varint; a negative number as its 64-bit two's complement, as protobuf sends it."""
    number &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = number & 0x7F
        number >>= 7
        if number:
            out.append(0x80 | low)
        else:
            out.append(low)
            return bytes(out)


def pb_field(number: int, wire_type: int, payload: bytes | int) -> bytes:
    """One protobuf field: its tag, then a varint, or a length and bytes (wire type 2), or raw bytes."""
    tag = varint(number << 3 | wire_type)
    if wire_type == 0:
        assert isinstance(payload, int)
        return tag + varint(payload)
    assert isinstance(payload, bytes)
    return tag + (varint(len(payload)) + payload if wire_type == 2 else payload)


def pb_value(param: wire.Param, number: int, value: object) -> bytes:
    """``value`` as the parameter's own field."""
    if isinstance(value, bool | int):
        return pb_field(number, 0, int(value))
    assert isinstance(value, str)
    return pb_field(number, 2, value.encode("utf-8", "surrogatepass"))


def typed(call: wire.Call, document: dict[str, Any]) -> bytes:
    """A well-formed typed request (a client's own encoding)."""
    cls = schema.request_class(call)
    return cls(**{name: value for name, value in document.items() if value is not None}).SerializeToString()


@st.composite
def typed_requests(draw: st.DrawFn, call: wire.Call, message: Any = None) -> tuple[bytes, Expect]:
    """A protobuf request for ``call`` with what is malformed by construction: each parameter left
    out, good, out of its bounds (a NUL, too long, not a choice, a count out of range), sent with
    another wire type or as text that is not UTF-8 (then the whole message is not one); and fields
    the method does not know."""
    cls = message or schema.request_class(call)
    fields = {field.name: field.number for field in cls.DESCRIPTOR.fields}
    parts: list[bytes] = []
    bad: set[str] = set()
    whole = False
    for param in call.params:
        number = fields[param.name]
        choice = draw(st.sampled_from(["omit", "good", "good", "bad", "wire-type", "not-utf8"]))
        if choice == "omit":
            if param.required:
                bad.add(param.name)
        elif choice == "good" or (choice == "bad" and (param.kind is bool or param.name == "snapshot")):
            # A bool has no bad value, nor bytes (the snapshot): any are some snapshot's.
            parts.append(pb_value(param, number, draw(good_value(param))))
        elif choice == "bad":
            if param.kind is int:
                value = draw(st.integers(max_value=-1) | st.integers(min_value=2**31, max_value=2**63 - 1))
            else:
                options = NUL_TEXT
                if param.choices:
                    options = options | st.text(max_size=12).filter(
                        lambda text, bad=param.choices: text not in bad
                    )
                if param.max_length is not None:
                    too_long = param.max_length + 1
                    options = options | st.integers(too_long, 2 * too_long).map(lambda n: "x" * n)
                value = draw(options)
            parts.append(pb_value(param, number, value))
            bad.add(param.name)
        elif choice == "wire-type":
            if param.kind is str:
                parts.append(pb_field(number, 0, draw(st.integers(0, 2**64 - 1))))
            else:
                wire_type = draw(st.sampled_from([1, 2, 5]))
                payload = draw(st.binary(min_size=8, max_size=8))
                parts.append(pb_field(number, wire_type, payload[:4] if wire_type == 5 else payload))
            bad.add(param.name)
        elif param.kind is str and param.name != "snapshot":
            parts.append(pb_field(number, 2, b"\xc3\x28" + draw(st.binary(max_size=4))))
            whole = True
        else:
            parts.append(pb_value(param, number, draw(good_value(param))))
    unknown = draw(st.lists(st.integers(min_value=len(fields) + 1, max_value=2**29 - 1), max_size=2))
    for number in unknown:
        parts.append(pb_field(number, 0, draw(st.integers(0, 2**32))))
    order = draw(st.permutations(range(len(parts))))
    body = b"".join(parts[index] for index in order)
    if whole:
        return body, Expect(whole=True)
    return body, Expect(fields=frozenset(bad | {f"#{number}" for number in unknown}))


def v1_expect(call: wire.Call, body: bytes) -> Expect:
    """What the node must say to arbitrary bytes, from how protobuf reads them."""
    decoded = schema.request_decoder(call)(body)
    if isinstance(decoded, wire.BadRequest):
        return Expect(whole=True)
    try:
        wire.validate(call, decoded)
    except api.InvalidArgumentError as exc:
        return Expect(fields=frozenset(path for path, _ in exc.fields))
    return Expect()


class TypedWire(Wire):
    """Raw-bytes calls on the typed service; answers decode with the schema."""

    def call(self, name: str, body: bytes) -> Answer:
        method = f"/{wire.SERVICE}/{name}"
        entry = wire.CALLS_BY_NAME.get(name)
        return self.stream(method, body) if entry is not None and entry.stream else self.unary(method, body)


@contextlib.contextmanager
def typed_wire_to(node: Node) -> Iterator[TypedWire]:
    with event_loop() as loop:
        options = (("grpc.max_receive_message_length", transport.MAX_MESSAGE_BYTES),)
        credentials = transport.secure_credentials(node.credentials)
        channel = TypedWire(loop, loop.run_until_complete(_channel(node.target, credentials, options)))
        try:
            yield channel
        finally:
            channel.close()


def still_serving_v1(node: Node, channel: TypedWire) -> None:
    """The typed Version and ResourceGet still work, and the config did not change."""
    version = channel.call("Version", b"")
    assert version.code == "OK", f"version after the run: {version}\n{node.agent.logs()}"
    (reply,) = schema.decode_replies(version.messages[0])["replies"]
    assert reply["result"]["maintenance"] is False, reply
    get = wire.CALLS_BY_NAME["ResourceGet"]
    read = channel.call(
        "ResourceGet", typed(get, {"type": catalog.MACHINE_TYPES, "id": catalog.MACHINE_TYPE_ID})
    )
    assert read.code == "OK", f"resource read after the run: {read}\n{node.agent.logs()}"
    (reply,) = schema.decode_replies(read.messages[0])["replies"]
    assert reply["result"]["metadata"]["id"] == catalog.MACHINE_TYPE_ID


def test_v1_node_api_refuses_bytes_that_are_not_the_message_on_every_call(node: Node) -> None:
    before = node.config_files()
    budget = Budget()
    with typed_wire_to(node) as channel:

        @settings(SETTINGS, max_examples=200)
        @given(name=st.sampled_from(CALL_NAMES), body=st.binary(max_size=300) | RAW_BODIES)
        def example(name: str, body: bytes) -> None:
            expect = v1_expect(wire.CALLS_BY_NAME[name], body)
            if name in ONLY_MALFORMED or name == "ApplyConfiguration":
                assume(expect.malformed)
            if not budget.take():
                return
            answer = budget.seen(channel.call(name, body))
            check(answer, expect, what=f"v1 {name} {body[:80]!r}")

        example()
        still_serving_v1(node, channel)
    assert node.config_files() == before
    budget.enough()
    assert budget.codes["INVALID_ARGUMENT"], dict(budget.codes)


def test_v1_node_api_names_every_malformed_field_on_every_call(node: Node) -> None:
    before = node.config_files()
    budget = Budget()
    with typed_wire_to(node) as channel:

        @settings(SETTINGS, max_examples=200)
        @given(data=st.data(), name=st.sampled_from(CALL_NAMES))
        def example(data: st.DataObject, name: str) -> None:
            call = wire.CALLS_BY_NAME[name]
            body, expect = data.draw(typed_requests(call), label="request")
            if name in ONLY_MALFORMED:
                assume(expect.malformed)
            if not budget.take():
                return
            answer = budget.seen(channel.call(name, body))
            check(answer, expect, what=f"v1 {name} {body[:200]!r}")
            if name == "ApplyConfiguration" and not expect.malformed:
                # Random text is never a valid machine config: refused by the node, not applied.
                assert answer.code == "INVALID_ARGUMENT", answer

        example()
        still_serving_v1(node, channel)
    assert node.config_files() == before
    budget.enough()


def test_v1_oversized_requests_are_resource_exhausted_and_change_nothing(node: Node) -> None:
    before = node.config_files()
    limit = transport.MAX_MESSAGE_BYTES
    apply = wire.CALLS_BY_NAME["ApplyConfiguration"]
    with typed_wire_to(node) as channel:
        over = [
            ("Version", pb_field(99, 2, b"x" * limit)),
            ("ApplyConfiguration", typed(apply, {"data": "x" * limit})),
            ("ResourceWatch", pb_field(1, 2, b"x" * limit)),
        ]
        for name, body in over:
            answer = channel.call(name, body)
            check(answer, Expect(), what=f"v1 {name} of {len(body)} bytes")
            assert answer.code == "RESOURCE_EXHAUSTED", answer
        # Under the limit but huge: the node's own clear error, small enough to be delivered.
        answer = channel.call("Version", b"".join(pb_field(n, 0, n) for n in range(1, 20_001)))
        check(answer, Expect(fields=frozenset({"#1"})), what="v1 Version with 20 000 unknown fields")
        total = len(answer.details.encode()) + sum(len(k) + len(v) for k, v in answer.trailing)
        assert total < 16 << 10, f"{total} bytes of status"
        still_serving_v1(node, channel)
    assert node.config_files() == before


def test_maintenance_mode_refuses_malformed_requests_and_stays_in_maintenance(
    tmp_path: Path, processes: Any
) -> None:
    """Before its first config a node accepts anyone's ApplyConfiguration: malformed ones and
    configs that are not valid leave it without a config, in maintenance mode."""
    cluster = harness.Cluster(tmp_path=tmp_path, processes=processes)
    agent = cluster.start_agent()
    budget = Budget()
    with maintenance_wire(f"{agent.address}:{harness.API_PORT}") as channel:

        @settings(SETTINGS, max_examples=120)
        @given(
            data=st.data(), name=st.sampled_from(["Version", "ApplyConfiguration", "ResourceList", "Reboot"])
        )
        def example(data: st.DataObject, name: str) -> None:
            call = wire.CALLS_BY_NAME[name]
            if data.draw(st.booleans(), label="raw"):
                body = data.draw(RAW_BODIES, label="body")
                expect = Expect(whole=not could_be_object(body))
                if name == "ApplyConfiguration":
                    assume(expect.malformed)
            else:
                document, expect = data.draw(requests(call), label="request")
                body = dumps(document)
            if not budget.take():
                return
            answer = budget.seen(channel.call(name, body))
            what = f"maintenance {name} {body[:100]!r}"
            if name in ("ResourceList", "Reboot"):
                # Refused in maintenance mode whatever the request holds.
                check(answer, Expect(), what=what)
                assert answer.code == "PERMISSION_DENIED", f"{what} -> {answer}"
            else:
                check(answer, expect, what=what)
            if name == "ApplyConfiguration":
                assert answer.code == "INVALID_ARGUMENT", answer
            assert agent.config_bytes() is None, f"{name} {body[:100]!r} saved a config"

        example()
        version = channel.call("Version", b"")
        assert version.code == "OK", version
        assert json.loads(version.messages[0])["replies"][0]["result"]["maintenance"] is True
    budget.enough()
    # And the node still takes its real first config.
    cluster.kp(
        "-n", agent.address, "apply-config", "--insecure", "-f", str(cluster.gen.controlplane), config=None
    )
    cluster.wait_booted(agent)


# -- trustd -----------------------------------------------------------------------------------

TOKEN = "fuzz.token"
NET = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
OID_CN = "2.5.4.3"
OID_O = "2.5.4.10"
OID_OU = "2.5.4.11"
OID_SAN = "2.5.29.17"
OID_BASIC_CONSTRAINTS = "2.5.29.19"
OID_EXTENSION_REQUEST = "1.2.840.113549.1.9.14"
OID_ECDSA_SHA256 = "1.2.840.10045.4.3.2"
OID_ED25519 = "1.3.101.112"


@dataclasses.dataclass(frozen=True)
class Trustd:
    target: str
    ca: pki.CertKey


@contextlib.contextmanager
def running_trustd(address: str) -> Iterator[tuple[Trustd, Wire]]:
    """A real trustd on ``address`` and a channel to it, both on one event loop."""
    ca = pki.new_ca("fuzz os ca")
    pair = pki.issue(
        ca=ca, common_name="cp-1", dns_names=["cp-1", "localhost"], ip_addresses=[address], usages=["server"]
    )
    server = trustd.TrustdServer(
        token=TOKEN,
        ca=ca,
        credentials=api.Credentials(ca=ca.cert, cert=pair.cert, key=pair.key),
        endpoint="https://kube.example.test:6443",
    )
    with event_loop() as loop:
        loop.run_until_complete(server.start(f"{address}:0"))
        try:
            target = f"{address}:{server.port}"
            credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert)
            channel = Wire(loop, loop.run_until_complete(_channel(target, credentials)))
            try:
                yield Trustd(target, ca), channel
            finally:
                channel.close()
        finally:
            loop.run_until_complete(server.stop())


def good_request(key: bytes) -> bytes:
    csr = pki.new_csr(
        key=key,
        common_name="worker-1",
        organizations=(pki.NODE_ORG,),
        dns_names=["worker-1", "localhost"],
        ip_addresses=["127.0.0.1"],
    )
    return dumps({"token": TOKEN, "csr": csr.decode()})


def signed_node_certificate(answer: Answer, ca: pki.CertKey) -> pki.CertInfo:
    assert answer.code == "OK", answer
    crt = json.loads(answer.messages[0])["crt"].encode()
    assert pki.is_issued_by(crt, ca.cert)
    info = pki.cert_info(crt)
    assert info.organizations == (pki.NODE_ORG,), info
    assert not info.is_ca
    return info


def test_trustd_refuses_malformed_requests_and_keeps_signing() -> None:
    key = pki.generate_key()
    shapes = st.one_of(
        RAW_BODIES,
        JSON_VALUES.map(dumps),
        st.fixed_dictionaries(
            {},
            optional={
                "token": st.just(TOKEN) | JSON_VALUES | SURROGATE_TEXT | NUL_TEXT,
                "csr": JSON_VALUES | SURROGATE_TEXT | NUL_TEXT | st.text(max_size=200),
                "extra": JSON_VALUES,
            },
        ).map(dumps),
        st.integers(min_value=1, max_value=60_000).map(lambda n: dumps({"token": TOKEN, "csr": "A" * n})),
    )
    _fuzz_trustd(
        shapes,
        address=f"{NET}.2",
        method=trustd.LEGACY_METHOD,
        label="trustd",
        signs=lambda channel, ca: signed_node_certificate(
            channel.unary(trustd.LEGACY_METHOD, good_request(key)), ca
        ),
    ).enough()


def _fuzz_trustd(
    shapes: st.SearchStrategy[bytes],
    *,
    address: str,
    method: str,
    label: str,
    signs: Callable[[Wire, pki.CertKey], object],
) -> Budget:
    """Send trustd ``method`` the drawn bodies: each gets a clear refusal (an oversized one
    RESOURCE_EXHAUSTED), and a good request is still signed afterwards. The spent budget."""
    budget = Budget()
    with running_trustd(address) as (server, channel):

        @settings(SETTINGS, max_examples=150)
        @given(body=shapes)
        def example(body: bytes) -> None:
            if not budget.take():
                return
            answer = budget.seen(channel.unary(method, body))
            what = f"{label} {body[:120]!r}"
            if len(body) > trustd.MAX_REQUEST_BYTES:
                assert answer.code == "RESOURCE_EXHAUSTED", f"{what} -> {answer}"
                return
            assert answer.code in {"INVALID_ARGUMENT", "PERMISSION_DENIED"}, f"{what} -> {answer}"
            _check_trustd(answer, what)

        example()
        signs(channel, server.ca)
    return budget


def _check_trustd(answer: Answer, what: str) -> None:
    context = f"{what} -> {answer}"
    assert not any(mark in answer.details for mark in TRACEBACK_MARKS), f"Python internals leak: {context}"
    assert answer.details.strip(), f"an error without a message: {context}"
    assert len(answer.details.encode()) < 8 << 10, f"an error too long to deliver: {context}"


# A minimal DER writer, to make CSRs no well-behaved library would: odd strings, odd SANs,
# duplicate or garbage extensions, signed so that trustd's checks past the signature run.


def der(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        length = bytes([size])
    else:
        raw = size.to_bytes((size.bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(raw)]) + raw
    return bytes([tag]) + length + content


def seq(*items: bytes) -> bytes:
    return der(0x30, b"".join(items))


def oid(dotted: str) -> bytes:
    first, second, *rest = (int(part) for part in dotted.split("."))
    body = bytearray([first * 40 + second])
    for number in rest:
        chunk = [number & 0x7F]
        remaining = number >> 7
        while remaining:
            chunk.append(0x80 | (remaining & 0x7F))
            remaining >>= 7
        body += bytes(reversed(chunk))
    return der(0x06, bytes(body))


def pem(der_bytes: bytes, label: str = "CERTIFICATE REQUEST") -> str:
    body = base64.b64encode(der_bytes).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----\n"


def sometimes(one_in: int) -> st.SearchStrategy[bool]:
    """True about once in ``one_in`` draws (an integer draw would favour its bounds)."""
    return st.sampled_from([False] * (one_in - 1) + [True])


UTF8 = 0x0C
STRING_TAGS = st.sampled_from([UTF8, UTF8, 0x13, 0x16, 0x1E, 0x14, 0x04, 0x02])
STRING_BYTES = st.one_of(
    st.sampled_from(
        ["worker-1", "localhost", "127.0.0.1", "10.5.0.2", "cp-1", "kube.example.test", "*.x", "a..b", ""]
    ).map(str.encode),
    st.text(max_size=20).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.binary(max_size=20),
)
ATTRIBUTE_OIDS = st.sampled_from([OID_CN, OID_O, OID_OU, "1.2.3.4", "2.5.4.3.1"])
ATTRIBUTES = st.tuples(ATTRIBUTE_OIDS, STRING_TAGS, STRING_BYTES)
#: The subject a worker asks for; most crafted CSRs start from it, so the checks after it run.
NODE_SUBJECT = ((OID_CN, UTF8, b"worker-1"), (OID_O, UTF8, pki.NODE_ORG.encode()))


@st.composite
def subjects(draw: st.DrawFn) -> bytes:
    """Mostly the node's subject, with an odd attribute now and then; sometimes anything."""
    if not draw(sometimes(4)):
        attributes = [*NODE_SUBJECT, *draw(st.lists(ATTRIBUTES, max_size=1))]
    else:
        attributes = draw(st.lists(ATTRIBUTES, max_size=4))
    return seq(*(der(0x31, seq(oid(name), der(tag, value))) for name, tag, value in attributes))


DNS_NAME, IP_ADDRESS = 0x82, 0x87


@st.composite
def general_names(draw: st.DrawFn) -> bytes:
    """Mostly DNS names and IP addresses a node may or may not ask for; other kinds, other lengths."""
    tag = draw(
        st.sampled_from(
            [DNS_NAME, DNS_NAME, IP_ADDRESS, IP_ADDRESS, 0x81, 0x86, 0x88, 0x85, 0xA0, 0xA4, 0x9F]
        )
    )
    if tag == IP_ADDRESS:
        value = draw(
            st.sampled_from(
                [bytes([127, 0, 0, 1]), bytes([10, 5, 0, 2]), bytes(16), bytes([127, 0, 0, 1, 0])]
            )
            | st.binary(max_size=17)
        )
    elif tag in (0xA0, 0xA4):
        value = draw(st.binary(max_size=12))
    else:
        value = draw(STRING_BYTES)
    return der(tag, value)


@st.composite
def extensions(draw: st.DrawFn) -> bytes:
    """Mostly one SAN extension; sometimes two (a duplicate), garbage, or others, critical or not."""
    kinds = draw(
        st.sampled_from(
            [["san"], ["san"], ["san"], ["san", "san"], ["garbage-san"], ["other", "san"], ["basic"], []]
        )
    )
    items = []
    for kind in kinds:
        critical = der(0x01, b"\xff") if draw(st.booleans()) else b""
        if kind == "san":
            value = seq(*draw(st.lists(general_names(), max_size=4)))
            items.append(seq(oid(OID_SAN), critical, der(0x04, value)))
        elif kind == "garbage-san":
            items.append(seq(oid(OID_SAN), critical, der(0x04, draw(st.binary(max_size=16)))))
        elif kind == "basic":
            items.append(seq(oid(OID_BASIC_CONSTRAINTS), critical, der(0x04, seq(der(0x01, b"\xff")))))
        else:
            items.append(seq(oid("1.3.6.1.4.1.99999.1"), critical, der(0x04, draw(st.binary(max_size=8)))))
    return seq(*items)


KEYS: dict[str, Any] = {
    "ec": ec.generate_private_key(ec.SECP256R1()),
    "ed25519": ed25519.Ed25519PrivateKey.generate(),
    "rsa": rsa.generate_private_key(public_exponent=65537, key_size=1024),
}


@st.composite
def crafted_csrs(draw: st.DrawFn) -> str:
    """PEM CSRs made byte by byte: valid or broken subject, SANs and extensions; a valid
    signature most of the time, so the checks after it run."""
    kind = draw(st.sampled_from(["ec", "ed25519", "rsa"]))
    key = KEYS[kind]
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if draw(sometimes(10)):
        spki = seq(seq(oid("1.2.840.10045.2.1")), der(0x03, b"\x00" + draw(st.binary(max_size=20))))
    attributes = b""
    if not draw(sometimes(4)):
        attributes = seq(oid(OID_EXTENSION_REQUEST), der(0x31, draw(extensions())))
    info = seq(der(0x02, b"\x00"), draw(subjects()), spki, der(0xA0, attributes))
    if kind == "ec":
        algorithm = seq(oid(OID_ECDSA_SHA256))
        signature = key.sign(info, ec.ECDSA(hashes.SHA256()))
    elif kind == "ed25519":
        algorithm = seq(oid(OID_ED25519))
        signature = key.sign(info)
    else:
        algorithm = seq(oid("1.2.840.113549.1.1.11"), der(0x05, b""))
        signature = key.sign(info, padding.PKCS1v15(), hashes.SHA256())
    if draw(sometimes(8)):
        signature = draw(st.binary(max_size=72))
    request = seq(info, algorithm, der(0x03, b"\x00" + signature))
    if draw(sometimes(8)):
        # Drawn independently of the length: ECDSA signatures vary in length from run to run.
        cut = draw(st.integers(min_value=0, max_value=1 << 16)) % (len(request) + 1)
        request = request[:cut] + draw(st.binary(max_size=4)) + request[cut + 1 :]
    return pem(request)


def other_pems(ca: pki.CertKey) -> st.SearchStrategy[str]:
    """PEM that is not a CSR, or a CSR PEM around something else."""
    return st.sampled_from(
        [
            ca.cert.decode(),
            pki.generate_key().decode(),
            pem(b"\x30\x00"),
            pem(b""),
            pem(b"junk"),
            "-----BEGIN CERTIFICATE REQUEST-----\n!!!!\n-----END CERTIFICATE REQUEST-----\n",
            "-----BEGIN CERTIFICATE REQUEST-----\n",
            pem(ca.cert.replace(b"-", b"")),
        ]
    ) | st.binary(max_size=300).map(pem)


# cryptography warns about the empty names it is made to read.
@pytest.mark.filterwarnings("ignore:Attribute's length:UserWarning")
def test_trustd_refuses_malformed_csrs_with_the_right_token_and_signs_only_node_identities() -> None:
    """With the machine token, the CSR is all that is left to get wrong: every answer is a clear
    refusal, or a node certificate (O=node, no CA) signed by the OS CA."""
    budget = Budget()
    key = pki.generate_key()
    with running_trustd(f"{NET}.3") as (server, channel):

        @settings(SETTINGS, max_examples=150)
        @given(csr=st.one_of(crafted_csrs(), crafted_csrs(), crafted_csrs(), other_pems(server.ca)))
        def example(csr: str) -> None:
            if not budget.take():
                return
            answer = budget.seen(channel.unary(trustd.LEGACY_METHOD, dumps({"token": TOKEN, "csr": csr})))
            what = f"trustd csr {csr[:200]!r}"
            if answer.code == "OK":
                signed_node_certificate(answer, server.ca)
                return
            assert answer.code in {"INVALID_ARGUMENT", "PERMISSION_DENIED", "FAILED_PRECONDITION"}, (
                f"{what} -> {answer}"
            )
            _check_trustd(answer, what)

        example()
        signed_node_certificate(channel.unary(trustd.LEGACY_METHOD, good_request(key)), server.ca)
    budget.enough()
    # The crafted CSRs got past the parsing to the policy: some signed, some refused by it.
    assert budget.codes["OK"] and budget.codes["PERMISSION_DENIED"] + budget.codes["FAILED_PRECONDITION"], (
        dict(budget.codes)
    )


def test_trustd_refuses_oversized_requests_and_keeps_signing() -> None:
    key = pki.generate_key()
    _oversized_trustd(
        address=f"{NET}.4",
        method=trustd.LEGACY_METHOD,
        encode=dumps,
        signs=lambda channel, ca: signed_node_certificate(
            channel.unary(trustd.LEGACY_METHOD, good_request(key)), ca
        ),
    )


def _oversized_trustd(
    *,
    address: str,
    method: str,
    encode: Callable[[dict[str, Any]], bytes],
    signs: Callable[[Wire, pki.CertKey], object],
) -> None:
    """Requests over trustd's limit get RESOURCE_EXHAUSTED, and a good request is still signed."""
    with running_trustd(address) as (server, channel):
        for size in (trustd.MAX_REQUEST_BYTES + 1, 8 << 20):
            answer = channel.unary(method, encode({"token": TOKEN, "csr": "A" * size}))
            assert answer.code == "RESOURCE_EXHAUSTED", answer
        signs(channel, server.ca)


# -- trustd on the typed wire (kubeplane.node.v1.Trustd) ----------------------------------------


def signed_v1(answer: Answer, ca: pki.CertKey) -> pki.CertInfo:
    """:func:`signed_node_certificate` of a typed CertificateResponse."""
    assert answer.code == "OK", answer
    response = schema.decode_certificate_response(answer.messages[0])
    return signed_node_certificate(Answer("OK", messages=(json.dumps(response).encode(),)), ca)


def good_typed_request(key: bytes) -> bytes:
    return schema.encode_certificate_request(json.loads(good_request(key)))


def test_v1_trustd_refuses_malformed_requests_and_keeps_signing() -> None:
    key = pki.generate_key()
    certificate_request = schema.trustd_pb2.CertificateRequest
    shapes = st.one_of(
        st.binary(max_size=300),
        RAW_BODIES,
        typed_requests(trustd.REQUEST, certificate_request).map(lambda drawn: drawn[0]),
        st.integers(min_value=1, max_value=60_000).map(
            lambda n: schema.encode_certificate_request({"token": TOKEN, "csr": "A" * n})
        ),
    )
    budget = _fuzz_trustd(
        shapes,
        address=f"{NET}.5",
        method=trustd.METHOD,
        label="v1 trustd",
        signs=lambda channel, ca: signed_v1(channel.unary(trustd.METHOD, good_typed_request(key)), ca),
    )
    budget.enough()
    assert budget.codes["INVALID_ARGUMENT"] and budget.codes["PERMISSION_DENIED"], dict(budget.codes)


def test_v1_trustd_refuses_oversized_requests_and_keeps_signing() -> None:
    key = pki.generate_key()
    _oversized_trustd(
        address=f"{NET}.6",
        method=trustd.METHOD,
        encode=schema.encode_certificate_request,
        signs=lambda channel, ca: signed_v1(channel.unary(trustd.METHOD, good_typed_request(key)), ca),
    )
