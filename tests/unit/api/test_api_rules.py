"""Pure rules of the node API: request validation, the call table, roles and access."""

from __future__ import annotations

import inspect

import pytest

from kubeplane import api, pki
from kubeplane.api import auth, transport, wire
from kubeplane.api.backend import NodeBackend

pytestmark = pytest.mark.unit

CA = pki.new_ca("unit os ca")


def identity(*orgs: str) -> auth.Identity:
    cert = pki.issue(ca=CA, common_name="someone", organizations=orgs, usages=["client"])
    return auth.identity_from_pem(cert.cert)


def test_call_table_matches_the_backend_protocol() -> None:
    for call in wire.CALLS:
        method = getattr(NodeBackend, call.backend_method, None)
        assert method is not None, f"{call.name}: NodeBackend has no {call.backend_method}"
        params = inspect.signature(method).parameters
        expected = {p.name for p in call.params} | set(call.fixed)
        assert set(params) - {"self"} == expected, call.name
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for n, p in params.items() if n != "self")
        assert inspect.isasyncgenfunction(method) or call.stream != inspect.iscoroutinefunction(method)


def test_call_names_are_unique_and_client_has_a_method_per_call() -> None:
    names = [call.name for call in wire.CALLS]
    assert len(names) == len(set(names))
    snake = {
        "ResourceGet": "resource_get",
        "ResourceList": "resource_list",
        "ResourceWatch": "resource_watch",
    }
    for name in names:
        method = snake.get(name) or "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
        assert callable(getattr(api.NodeClient, method, None)), f"NodeClient lacks {method} for {name}"


def test_validate_fills_defaults_and_adds_fixed_arguments() -> None:
    assert wire.validate(wire.CALLS_BY_NAME["ServiceRestart"], {"id": "etcd"}) == {
        "id": "etcd",
        "action": "restart",
    }
    assert wire.validate(wire.CALLS_BY_NAME["ApplyConfiguration"], {"data": "x"}) == {
        "data": "x",
        "mode": "reboot",
        "dry_run": False,
        "try_seconds": None,
    }


def test_validate_reports_every_bad_field_at_once() -> None:
    with pytest.raises(api.InvalidArgumentError) as bad:
        wire.validate(wire.CALLS_BY_NAME["Logs"], {"tail": True, "follow": "yes", "colour": 1})
    assert dict(bad.value.fields).keys() == {"service", "tail", "follow", "colour"}
    assert "tail: must be a int, got bool" in str(bad.value)
    with pytest.raises(api.InvalidArgumentError, match="mode: must be one of reboot, immediate"):
        wire.validate(wire.CALLS_BY_NAME["ApplyConfiguration"], {"data": "x", "mode": "later"})


def test_bad_json_is_a_bad_request_not_an_exception() -> None:
    assert isinstance(wire.decode_request(b"{"), wire.BadRequest)
    assert isinstance(wire.decode_request(b"[1]"), wire.BadRequest)
    assert wire.decode_request(b"") == {}


def test_file_chunks_round_trip_binary_data() -> None:
    data = bytes(range(256))
    assert wire.decode_chunk(wire.decode(wire.encode(wire.encode_chunk(data)))) == data


@pytest.mark.parametrize(
    ("orgs", "claimed", "role", "forwarded"),
    [
        ((api.ROLE_ADMIN,), (), api.ROLE_ADMIN, False),
        # Claims are only believed from proxies: anyone else's certificate decides.
        ((api.ROLE_READER,), (api.ROLE_ADMIN,), api.ROLE_READER, False),
        ((api.ROLE_ADMIN,), (api.ROLE_READER,), api.ROLE_ADMIN, False),
        ((api.ROLE_READER, api.ROLE_ADMIN), (), api.ROLE_ADMIN, False),
        (("system:masters", api.ROLE_READER), (), api.ROLE_READER, False),
        # A proxy's call runs with exactly the role it states, never more.
        ((api.ROLE_PROXY,), (api.ROLE_READER,), api.ROLE_READER, True),
        ((api.ROLE_PROXY,), (api.ROLE_ADMIN,), api.ROLE_ADMIN, True),
        ((api.ROLE_PROXY,), (api.ROLE_READER, api.ROLE_READER), api.ROLE_READER, True),
    ],
)
def test_caller(orgs: tuple[str, ...], claimed: tuple[str, ...], role: str, forwarded: bool) -> None:
    assert auth.caller(identity(*orgs), claimed) == auth.Caller(role, forwarded=forwarded)


@pytest.mark.parametrize(
    ("orgs", "claimed", "message"),
    [
        (("system:masters",), (api.ROLE_ADMIN,), "no kubeplane role"),
        ((), (), "organizations: none"),
        # Worker certificates from trustd identify a node; they are no role and no proxy.
        ((auth.NODE_ORG,), (api.ROLE_ADMIN,), "kubeplane:node certificates identify a node"),
        ((api.ROLE_PROXY,), (), "without a valid caller role"),
        ((api.ROLE_PROXY,), (api.ROLE_PROXY,), "without a valid caller role"),
        ((api.ROLE_PROXY,), ("root",), "got 'root'"),
        ((api.ROLE_PROXY,), (f"{api.ROLE_READER},{api.ROLE_ADMIN}",), "without a valid caller role"),
        # Two different claims: neither is believed.
        ((api.ROLE_PROXY,), (api.ROLE_READER, api.ROLE_ADMIN), "got 'kubeplane:admin', 'kubeplane:reader'"),
        # Proxy must stand alone: what a call runs as never depends on whether a header was sent.
        ((api.ROLE_PROXY, api.ROLE_ADMIN), (api.ROLE_READER,), "mixes O=kubeplane:proxy with kubeplane:adm"),
        ((api.ROLE_PROXY, api.ROLE_ADMIN), (), "mixes O=kubeplane:proxy"),
        ((api.ROLE_READER, api.ROLE_PROXY), (api.ROLE_ADMIN,), "mixes O=kubeplane:proxy with kubeplane:re"),
    ],
)
def test_callers_that_are_refused(orgs: tuple[str, ...], claimed: tuple[str, ...], message: str) -> None:
    with pytest.raises(api.PermissionDeniedError, match=message):
        auth.caller(identity(*orgs), claimed)


def test_identity_roles_are_ordered_most_privileged_first() -> None:
    assert identity(api.ROLE_READER, "x", api.ROLE_PROXY, api.ROLE_ADMIN).roles == (
        api.ROLE_ADMIN,
        api.ROLE_PROXY,
        api.ROLE_READER,
    )


def test_access_matrix() -> None:
    reader_calls = {
        "Version",
        "ResourceGet",
        "ResourceList",
        "ResourceWatch",
        "ListDir",
        "Logs",
        "Events",
        "Certificates",
        "ServiceList",
        "EtcdMembers",
    }
    for call in wire.CALLS:
        auth.check_access(call, api.ROLE_ADMIN)
        for role, allowed in (
            (api.ROLE_READER, reader_calls),
            (auth.ROLE_MAINTENANCE, {"Version", "ApplyConfiguration"}),
        ):
            if call.name in allowed:
                auth.check_access(call, role)
            else:
                with pytest.raises(api.PermissionDeniedError, match=call.name):
                    auth.check_access(call, role)


def test_maintenance_certificate_is_a_self_signed_server_certificate() -> None:
    info = pki.cert_info(auth.maintenance_certificate().cert)
    assert info.dns_names == (auth.MAINTENANCE_NAME,)
    assert info.issuer_cn == info.subject_cn
    assert not info.is_ca


@pytest.mark.parametrize(
    ("address", "target"),
    [
        ("10.5.0.2", "10.5.0.2:50000"),
        ("10.5.0.2:6000", "10.5.0.2:6000"),
        ("node-1", "node-1:50000"),
        ("fd00::2", "[fd00::2]:50000"),
        ("[fd00::2]", "[fd00::2]:50000"),
        ("[fd00::2]:7", "[fd00::2]:7"),
    ],
)
def test_with_port(address: str, target: str) -> None:
    assert transport.with_port(address) == target


def test_invalid_argument_error_names_fields_in_its_message() -> None:
    error = api.InvalidArgumentError(
        "invalid config", fields=[("machine.type", "must be init, controlplane or join")]
    )
    assert str(error) == "invalid config: machine.type: must be init, controlplane or join"
    assert error.code == "INVALID_ARGUMENT"
