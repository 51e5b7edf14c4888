"""What a reader-role certificate gets from a real agent: every resource type and every read call,
scanned for secrets; admin calls, log paths and proxied calls refused.

The agent runs a control plane config with secrets of the user's own added (an Authorization
header for extra manifests, an inline manifest holding a Secret), so every kind of secret a node
holds is there to leak: PEM private keys, the machine token, the bootstrap token and its Secret,
the encryption secret, kubeconfigs with client keys. The secrets to look for are taken from the
applied config and from what the admin role reads of the sensitive types; the scans are checked
to find them in the admin's answers, so a scan that finds nothing in the reader's answers means
something.

Types and calls come from the catalog and the call table, not from lists here: a new resource
type is scanned as it appears, and a new read call fails :func:`read_calls` until this module
knows how to make it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import secrets
from collections.abc import Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from agent_harness import API_PORT, Agent, Cluster, wait_for

from kubeplane import api, pki
from kubeplane.api import transport, wire
from kubeplane.api.server import closing
from kubeplane.config import client as client_config
from kubeplane.provision import machine
from kubeplane.resources import Registry, catalog, default_registry

pytestmark = pytest.mark.integration

T = TypeVar("T")

#: How long the controllers may take to publish every secret-bearing resource after boot.
SETTLE_TIMEOUT = 60.0
CALL_TIMEOUT = 15.0
PEM_HEADERS = (
    "-----BEGIN PRIVATE KEY-----",
    "-----BEGIN EC PRIVATE KEY-----",
    "-----BEGIN RSA PRIVATE KEY-----",
)
#: What a private key looks like in clear or base64-encoded (each header cut to a multiple of
#: three characters, so its base64 is a prefix of the base64 of any PEM starting with it).
KEY_MARKERS = (
    "PRIVATE KEY",
    "client-key-data",
    *(base64.b64encode(header[: len(header) // 3 * 3].encode()).decode() for header in PEM_HEADERS),
)
#: Keys whose string values in a sensitive resource or the machine config are secrets.
SECRET_KEY = re.compile(r"token|key|secret|password|authorization", re.IGNORECASE)
NOT_SECRET_KEY = re.compile(r"crt|cert|pub|path|file|usage", re.IGNORECASE)
_BASE64 = re.compile(r"[A-Za-z0-9+/]{24,}={0,2}")
MIN_SECRET = 12


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# -- secrets and scanning -------------------------------------------------------------------


def strings(node: object, key: str = "") -> Iterator[tuple[str, str]]:
    """Every string leaf of a JSON-like document with the mapping key it sits under."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield from strings(value, str(name))
    elif isinstance(node, list):
        for item in node:
            yield from strings(item, key)
    elif isinstance(node, str):
        yield key, node


def decoded(text: str) -> str | None:
    try:
        return base64.b64decode(text, validate=True).decode()
    except (binascii.Error, ValueError):
        return None


def pem_needles(text: str) -> set[str]:
    """Lines of the bodies of the PEM private keys in ``text`` (each is unique to its key)."""
    needles: set[str] = set()
    for block in re.findall(r"-----BEGIN [A-Z ]*PRIVATE KEY-----(.*?)-----END", text, re.DOTALL):
        needles |= {line.strip() for line in block.splitlines() if len(line.strip()) >= MIN_SECRET}
    return needles


def secret_values(document: object, *, every_string: bool = False) -> set[str]:
    """The secrets in a document: PEM key bodies anywhere, kubeconfig client keys and tokens, and
    the values of secret-named keys (with their base64 decoded); ``every_string`` treats every
    string leaf as secret (a header value, say)."""
    needles: set[str] = set()
    for key, value in strings(document):
        plain = decoded(value)
        for text in (value, plain or ""):
            needles |= pem_needles(text)
            kubeconfig = yaml.safe_load(text) if "users:" in text else None
            if isinstance(kubeconfig, dict):
                for user in kubeconfig.get("users") or ():
                    credentials = user.get("user") or {}
                    needles |= secret_values(
                        {k: credentials[k] for k in ("client-key-data", "token") if k in credentials},
                        every_string=True,
                    )
        secret_named = SECRET_KEY.search(key) and not NOT_SECRET_KEY.search(key)
        if (every_string or secret_named) and len(value) >= MIN_SECRET:
            needles.add(value)
            if plain is not None and len(plain) >= MIN_SECRET and "PRIVATE KEY" not in plain:
                needles.add(plain)
            # A bootstrap or machine token is <id>.<secret>: the id is public (Secret names carry it).
            if re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", value):
                needles.add(value.split(".")[1])
    return needles


def leaks(document: object, needles: Iterable[str]) -> list[str]:
    """The secrets and key markers found in a document, in clear or in any base64 string in it."""
    text = json.dumps(document, ensure_ascii=False)
    texts = [text, *(plain for plain in map(decoded, _BASE64.findall(text)) if plain is not None)]
    found = [marker for marker in KEY_MARKERS if any(marker in t for t in texts)]
    found += [needle for needle in needles if any(needle in t for t in texts)]
    return found


# -- the agent under test --------------------------------------------------------------------


class UserSecrets:
    """Secrets the user puts in the config beside the generated ones."""

    def __init__(self) -> None:
        self.header = f"Bearer kp-header-{secrets.token_hex(16)}"
        self.password = f"kp-inline-{secrets.token_hex(16)}"

    def config(self, cluster: Cluster, directory: Path) -> Path:
        document = yaml.safe_load(cluster.gen.controlplane.read_text())
        document["cluster"]["extraManifestHeaders"] = {"Authorization": self.header}
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "registry-password", "namespace": "kube-system"},
            "stringData": {"password": self.password},
        }
        document["cluster"]["inlineManifests"] = [
            {"name": "registry-password", "contents": yaml.safe_dump(secret)}
        ]
        path = directory / "controlplane-with-user-secrets.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path


def credentials(config: Path) -> api.Credentials:
    """The credentials of the current context of a client config the harness made."""
    _, context = client_config.current(client_config.load(config))
    return api.Credentials(ca=context.ca_pem, cert=context.client.cert, key=context.client.key)


def node_client(agent: Agent, config: Path, nodes: Iterable[str] = ()) -> api.NodeClient:
    return api.NodeClient([f"{agent.address}:{API_PORT}"], credentials=credentials(config), nodes=list(nodes))


async def call(
    client: api.NodeClient, name: str, request: dict[str, Any] | None = None
) -> list[api.Reply[Any]]:
    """A unary or streaming call by name; a stream is read to its end or, for a watch, to the
    end of the current state (the ``bootstrapped`` event)."""
    if not wire.CALLS_BY_NAME[name].stream:
        return await client.call(name, request, timeout=CALL_TIMEOUT)
    replies: list[api.Reply[Any]] = []
    async with closing(client.stream(name, request, timeout=CALL_TIMEOUT)) as stream:
        async for reply in stream:
            replies.append(reply)
            if name == "ResourceWatch" and (reply.result or {}).get("event") == "bootstrapped":
                break
    return replies


async def refusal(client: api.NodeClient, name: str, request: dict[str, Any] | None = None) -> api.CallError:
    """The error of a call that must fail on the node that received it, or fail the test."""
    try:
        replies = await call(client, name, request)
    except api.CallError as exc:
        return exc
    pytest.fail(f"{name} {request} was not refused: {replies}", pytrace=False)


def registry() -> Registry:
    return default_registry()


def namespaces() -> list[str]:
    return [namespace.name for namespace in registry().namespaces()]


def settled(
    cluster: Cluster, agent: Agent, *, extras: bool = False
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Wait until the controllers published the secret-bearing resources (with ``extras``, the
    inline manifests too); returns what the admin lists of every type in every namespace."""
    wanted = {
        (catalog.ROOT_SECRETS, catalog.SECRETS_NAMESPACE),
        (catalog.KUBERNETES_SECRETS, catalog.SECRETS_NAMESPACE),
        (catalog.ETCD_SECRETS, catalog.SECRETS_NAMESPACE),
        (catalog.MANIFESTS, catalog.CONTROLPLANE_NAMESPACE),
        (catalog.KUBERNETES_CONTROL_PLANE_CONFIGS, catalog.CONFIG_NAMESPACE),
        (catalog.MACHINE_CONFIGS, catalog.CONFIG_NAMESPACE),
    }
    if extras:
        wanted.add((catalog.MANIFESTS, catalog.EXTRAS_NAMESPACE))

    async def everything() -> dict[tuple[str, str], list[dict[str, Any]]]:
        listed = {}
        async with node_client(agent, cluster.admin) as admin:
            for definition in registry().definitions():
                for namespace in namespaces():
                    (reply,) = await admin.resource_list(definition.type, namespace=namespace)
                    listed[(definition.type, namespace)] = reply.unwrap()
        return listed

    def ready() -> dict[tuple[str, str], list[dict[str, Any]]] | None:
        listed = run(everything())
        return listed if all(listed[key] for key in wanted) else None

    result: dict[tuple[str, str], list[dict[str, Any]]] = wait_for(
        ready, timeout=SETTLE_TIMEOUT, what="the secret-bearing resources", logs=cluster.logs
    )
    return result


# -- reader calls ---------------------------------------------------------------------------


#: Read calls that need the node's etcd, which the agent of this module does not run.
READ_NEEDING_ETCD = frozenset({"EtcdMembers"})


def read_calls(
    agent_listing: dict[tuple[str, str], list[dict[str, Any]]], log_ids: Iterable[str]
) -> dict[str, list[dict[str, Any]]]:
    """The requests a reader makes for each read call of the table; fails on a call it does not
    know, so a new read call cannot go unscanned."""
    types = [definition.type for definition in registry().definitions()]
    requests: dict[str, list[dict[str, Any]]] = {
        "Version": [{}],
        "ServiceList": [{}],
        # The node's own directories whole, and the machine's root (names only, not recursive:
        # recursively it is the whole host's file system).
        "ListDir": [{"path": "/", "recurse": False}]
        + [{"path": f"/{directory}", "recurse": True} for directory in machine.MACHINE_DIRS],
        "Logs": [{"service": log_id} for log_id in sorted(log_ids)],
        # Every event the node kept: config applies, boot phases, controller errors.
        "Events": [{}],
        # Subjects, issuers and expiries of the node's certificates (never their keys).
        "Certificates": [{}],
        # The etcd cluster's members: this agent runs no etcd, so the call passes the reader's
        # authorization and finds no service (READ_NEEDING_ETCD); tests/e2e/test_client_roles.py
        # reads it as a reader from a running cluster.
        "EtcdMembers": [{}],
        "ResourceList": [{"type": t, "namespace": ns} for t in types for ns in namespaces()],
        "ResourceWatch": [{"type": t, "namespace": ns} for t in types for ns in namespaces()],
        "ResourceGet": [
            {"type": t, "namespace": ns, "id": resource["metadata"]["id"]}
            for (t, ns), listed in sorted(agent_listing.items())
            for resource in listed
        ],
    }
    table = {call.name for call in wire.CALLS if call.access == "read"}
    unknown = table - set(requests)
    assert not unknown, f"read calls this test does not make yet (add them to read_calls): {sorted(unknown)}"
    assert set(requests) == table, f"calls that are no longer read calls: {sorted(set(requests) - table)}"
    return requests


@pytest.fixture
def user_secrets() -> UserSecrets:
    return UserSecrets()


def test_a_reader_reads_no_secret_from_any_type_or_read_call(
    cluster: Cluster, tmp_path: Path, user_secrets: UserSecrets
) -> None:
    config = user_secrets.config(cluster, tmp_path)
    agent = cluster.boot_agent(config)
    reader = cluster.client_config(name="reader", roles=pki.ROLE_READER)
    listing = settled(cluster, agent, extras=True)

    # The secrets to look for, and proof that the scan finds them where they are.
    needles = secret_values(yaml.safe_load(config.read_text()))
    needles |= secret_values(
        {"header": user_secrets.header, "password": user_secrets.password}, every_string=True
    )
    sensitive = {definition.type for definition in registry().definitions() if definition.sensitive}
    for (type_name, _), listed in listing.items():
        if type_name in sensitive:
            needles |= secret_values(listed)
    admin_view = {f"{t} {ns}": listed for (t, ns), listed in listing.items()}
    for needle in (user_secrets.header, user_secrets.password, "PRIVATE KEY"):
        assert leaks(admin_view, [needle]), f"the admin's view should hold {needle!r}: the scan is broken"
    bootstrap_token = yaml.safe_load(config.read_text())["cluster"]["token"]
    manifests = listing[(catalog.MANIFESTS, catalog.CONTROLPLANE_NAMESPACE)]
    assert leaks(manifests, [bootstrap_token.split(".")[1]]), "the bootstrap token Secret is not in Manifests"

    async def scenario() -> dict[str, int]:
        answered: dict[str, int] = {}
        async with node_client(agent, reader) as client:
            (listed_logs,) = await client.list_dir("var/log/kubeplane")
            log_ids = {Path(entry["name"]).name.removesuffix(".log") for entry in listed_logs.unwrap()}
            log_ids = {log_id for log_id in log_ids if re.fullmatch(r"[a-z0-9-]+", log_id)}
            assert {"kubeplaned", "controller-runtime"} <= log_ids
            for name, requests in read_calls(listing, log_ids).items():
                for request in requests:
                    where = f"{name} {request}"
                    if request.get("type") in sensitive:
                        refused = await refusal(client, name, request)
                        assert refused.code == "PERMISSION_DENIED", where
                        assert pki.ROLE_READER in refused.message and "hold secrets" in refused.message, where
                        continue
                    if name in READ_NEEDING_ETCD:
                        unavailable = await refusal(client, name, request)
                        assert unavailable.code == "UNAVAILABLE", (where, unavailable)
                        assert "runs no services" in unavailable.message, (where, unavailable)
                        continue
                    replies = await call(client, name, request)
                    results = [reply.unwrap() for reply in replies]
                    assert not leaks(results, needles), (
                        f"{where} showed a reader secrets: {leaks(results, needles)}"
                    )
                    answered[name] = answered.get(name, 0) + len(results)
        return answered

    answered = run(scenario())
    # Every read call answered the reader something (the scans above looked at real data).
    assert set(answered) == {call.name for call in wire.CALLS if call.access == "read"} - READ_NEEDING_ETCD, (
        answered
    )
    assert all(answered.values()), answered


def test_a_reader_is_refused_admin_calls_and_log_paths_and_the_node_keeps_serving(cluster: Cluster) -> None:
    agent = cluster.boot_agent()
    reader = cluster.client_config(name="reader", roles=pki.ROLE_READER)
    before = (agent.config_bytes(), agent.staged_bytes())

    async def scenario() -> None:
        async with node_client(agent, reader) as client:
            for admin_call in (c for c in wire.CALLS if c.access == "admin"):
                refused = await refusal(client, admin_call.name)
                assert refused.code == "PERMISSION_DENIED", admin_call.name
                assert admin_call.name in refused.message and pki.ROLE_READER in refused.message

            for service in (
                "../../etc/passwd",
                "../../../../../../etc/passwd",
                "/etc/passwd",
                "kubeplaned/../../../system/config",
                "../../../system/config.yaml",
            ):
                for follow in (False, True):
                    refused = await refusal(client, "Logs", {"service": service, "follow": follow})
                    assert refused.code == "INVALID_ARGUMENT", service
                    assert f"{service!r} is not a service id" in refused.message
                    assert "not a path" in refused.message
                    assert [field for field, _ in refused.fields] == ["service"]
            refused = await refusal(client, "Logs", {"service": "no-such-service"})
            assert refused.code == "NOT_FOUND"
            assert "'no-such-service'" in refused.message and "kubeplaned" in refused.message

            # Still serving, the reader included.
            (version,) = await client.version()
            assert version.unwrap()["node"] == agent.address
            lines = await call(client, "Logs", {"service": "kubeplaned", "tail": 1})
            assert len(lines) == 1 and lines[0].error is None

        async with node_client(agent, cluster.admin) as admin:
            for reference in (
                "kube-system/../../etc:passwd",
                "kube-system/pod:../../../etc/passwd",
                "/etc/passwd",
            ):
                refused = await refusal(admin, "ContainerLogs", {"id": reference})
                assert refused.code == "INVALID_ARGUMENT", reference
                assert (
                    "NAMESPACE/POD:CONTAINER" in refused.message or "not a Kubernetes name" in refused.message
                )
            # The agent's root is the machine's /, so ".." ends there, and what it reads is the
            # machine's own: its machine ID, not the host's. (Escapes from a narrower --root are
            # refused: tests/unit/agent/test_backend_reads.py.)
            own_id = (agent.root / "etc/machine-id").read_bytes()
            assert own_id != Path("/etc/machine-id").read_bytes()
            for path in ("../../etc/machine-id", "system/../../../etc/machine-id", "/etc/machine-id"):
                replies = await call(admin, "ReadFile", {"path": path})
                assert b"".join(r.unwrap() for r in replies) == own_id, path
            (version,) = await admin.version()
            assert version.unwrap()["node"] == agent.address

    run(scenario())
    assert (agent.config_bytes(), agent.staged_bytes()) == before


def proxy_connection(cluster: Cluster, target: Agent, *organizations: str) -> transport.Connection:
    """A connection to ``target`` with a certificate of ``organizations`` issued from the OS CA key."""
    crt, key = cluster.gen.os_ca()
    issued = pki.issue(
        ca=pki.CertKey(cert=crt, key=key),
        common_name="test-peer",
        organizations=organizations,
        usages=("client",),
    )
    return transport.Connection.open(
        f"{target.address}:{API_PORT}", api.Credentials(ca=crt, cert=issued.cert, key=issued.key)
    )


async def as_peer(connection: transport.Connection, name: str, request: dict[str, Any], *roles: str) -> str:
    """Make a call stating ``roles`` in the role metadata; "OK" or the error code."""
    try:
        await connection.unary(
            wire.CALLS_BY_NAME[name],
            request,
            metadata=tuple((wire.MD_ROLE, role) for role in roles),
            timeout=10,
        )
    except api.CallError as exc:
        return exc.code
    finally:
        await connection.close()
    return "OK"


def test_a_reader_stays_a_reader_through_a_proxy_and_proxies_get_what_they_state(cluster: Cluster) -> None:
    first, second = cluster.boot_agent(), cluster.boot_agent()
    reader = cluster.client_config(name="reader", roles=pki.ROLE_READER)
    settled(cluster, second)
    sensitive = [definition.type for definition in registry().definitions() if definition.sensitive]
    mc = {"type": catalog.MACHINE_CONFIGS, "id": catalog.MACHINE_CONFIG_ID}

    async def scenario() -> None:
        async with node_client(first, reader, nodes=[second.address]) as through_first:
            for type_name in sensitive:
                (reply,) = await through_first.resource_list(type_name)
                assert reply.node == second.address and reply.error is not None, type_name
                assert reply.error.code == "PERMISSION_DENIED" and pki.ROLE_READER in reply.error.message
            (bad_log,) = await call(through_first, "Logs", {"service": "../../etc/passwd"})
            assert bad_log.error is not None and bad_log.error.code == "INVALID_ARGUMENT"
            # The same reader reads what readers may, through the same path (a working control).
            (types,) = await through_first.resource_list(catalog.MACHINE_TYPES)
            assert types.node == second.address and types.unwrap()[0]["spec"] == {
                "machineType": "controlplane"
            }
        async with node_client(first, reader, nodes=[first.address, second.address]) as both:
            replies = await both.resource_list(catalog.MANIFESTS)
            assert {r.node for r in replies} == {first.address, second.address}
            assert all(r.error is not None and r.error.code == "PERMISSION_DENIED" for r in replies)

        # A proxy's call runs with exactly the role it states; anything else is refused.
        for organizations, roles, expected in (
            ((api.ROLE_PROXY,), (api.ROLE_READER,), "PERMISSION_DENIED"),
            ((api.ROLE_PROXY,), (), "PERMISSION_DENIED"),
            ((api.ROLE_PROXY,), (api.ROLE_READER, api.ROLE_ADMIN), "PERMISSION_DENIED"),
            ((api.ROLE_PROXY, api.ROLE_READER), (api.ROLE_ADMIN,), "PERMISSION_DENIED"),
            ((api.ROLE_PROXY, api.ROLE_ADMIN), (api.ROLE_READER,), "PERMISSION_DENIED"),
            ((pki.NODE_ORG,), (api.ROLE_ADMIN,), "PERMISSION_DENIED"),
            ((pki.ROLE_READER,), (api.ROLE_ADMIN,), "PERMISSION_DENIED"),
            ((api.ROLE_PROXY,), (api.ROLE_ADMIN,), "OK"),  # the control: the same call can succeed
        ):
            outcome = await as_peer(
                proxy_connection(cluster, second, *organizations), "ResourceGet", mc, *roles
            )
            assert outcome == expected, (organizations, roles)

    run(scenario())
