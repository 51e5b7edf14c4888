"""Node API transport on loopback: real gRPC servers with mutual TLS, an in-memory node backend.

Each test starts its servers on free ports of 127.0.0.x and stops them even when it fails.
Proxy tests give every node its own loopback address with the same port, as real nodes have.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest

from kubeplane import api, pki
from kubeplane.api import transport, wire

pytestmark = pytest.mark.integration

T = TypeVar("T")
SENSITIVE = {"RootSecrets", "rs", "MachineConfigs", "mc"}
MUTATIONS = {
    "apply_configuration",
    "service_control",
    "reboot",
    "reset",
    "upgrade",
    "bootstrap",
    "etcd_leave",
    "etcd_remove_member",
    "etcd_forfeit_leadership",
    "image_pull",
    "client_certificate",
    "kubernetes_certificates_renew",
}


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 60))


@dataclass
class FakeNode:
    """An in-memory NodeBackend recording every call it serves."""

    name: str
    calls: list[str] = field(default_factory=list)
    resources: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    changes: asyncio.Queue[dict[str, Any]] | None = None
    watches_closed: int = 0
    config: str = "version: v1alpha1\n"

    def __post_init__(self) -> None:
        self.resources.setdefault(
            "Services", [self.resource("runtime", "Services", name) for name in ("etcd", "kubelet")]
        )
        self.resources.setdefault("RootSecrets", [self.resource("secrets", "RootSecrets", "k8s")])

    def resource(self, namespace: str, type_: str, id_: str) -> dict[str, Any]:
        return {
            "node": self.name,
            "metadata": {"namespace": namespace, "type": type_, "id": id_, "version": 1},
            "spec": {"id": id_},
        }

    def _record(self, name: str) -> None:
        self.calls.append(name)

    async def version(self) -> dict[str, Any]:
        self._record("version")
        return {"tag": "test", "node": self.name}

    async def resource_sensitive(self, *, type: str) -> bool:
        if type not in self.resources and type not in SENSITIVE:
            raise api.NotFoundError(f"resource type {type!r} is not defined")
        return type in SENSITIVE

    async def resource_get(self, *, type: str, id: str, namespace: str | None) -> dict[str, Any]:
        self._record("resource_get")
        for item in self.resources.get(type, []):
            if item["metadata"]["id"] == id:
                return item
        raise api.NotFoundError(f"resource {type}/{id} not found")

    async def resource_list(self, *, type: str, namespace: str | None) -> list[dict[str, Any]]:
        self._record("resource_list")
        return self.resources.get(type, [])

    async def resource_watch(
        self, *, type: str, namespace: str | None, id: str | None
    ) -> AsyncIterator[dict[str, Any]]:
        self._record("resource_watch")
        for item in self.resources.get(type, []):
            yield {"event": "created", "resource": item}
        self.changes = asyncio.Queue()
        try:
            while True:
                yield {"event": "updated", "resource": await self.changes.get()}
        finally:
            self.watches_closed += 1

    async def apply_configuration(
        self, *, data: str, mode: str, dry_run: bool, try_seconds: int | None = None
    ) -> dict[str, Any]:
        if not data.startswith("version:"):
            raise api.InvalidArgumentError("invalid machine config", fields=[("version", "required")])
        if not dry_run:
            self._record("apply_configuration")
            self.config = data
        return {"mode": mode, "diff": "", "message": f"applied in mode {mode}"}

    async def machine_config(self) -> dict[str, Any]:
        self._record("machine_config")
        return {"current": self.config, "staged": None}

    async def read_file(self, *, path: str) -> AsyncIterator[bytes]:
        self._record("read_file")
        if path.startswith("/") or ".." in path:
            raise api.InvalidArgumentError("path escapes the node root", fields=[("path", path)])
        yield b"hello "
        yield b"\x00world"

    async def list_dir(self, *, path: str, recurse: bool) -> list[dict[str, Any]]:
        self._record("list_dir")
        return [{"name": "etc", "is_dir": True}]

    async def logs(self, *, service: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        self._record("logs")
        lines = [f"{service} line {n}" for n in range(5)]
        for line in lines[-tail:] if tail else lines:
            yield line

    async def service_list(self) -> list[dict[str, Any]]:
        self._record("service_list")
        return [{"id": "etcd", "state": "Running", "health": "OK"}]

    async def events(
        self, *, since_seconds: int | None, tail: int | None, follow: bool
    ) -> AsyncIterator[dict[str, Any]]:
        self._record("events")
        yield {"id": 1, "timestamp": 0.0, "kind": "sequence", "subject": "boot", "message": "booted"}

    async def certificates(self) -> list[dict[str, Any]]:
        self._record("certificates")
        return [
            {"path": "/system/secrets/etcd/ca.crt", "subject": "etcd", "not_after": "2036-01-01T00:00:00"}
        ]

    async def service_control(self, *, id: str, action: str) -> dict[str, Any]:
        self._record("service_control")
        return {"message": f"{action} {id}"}

    async def reboot(self) -> dict[str, Any]:
        self._record("reboot")
        return {"message": "rebooting"}

    async def reset(self, *, graceful: bool, reboot: bool, wipe: str | None, dry_run: bool) -> dict[str, Any]:
        self._record("reset")
        return {"message": "reset"}

    async def upgrade(self, *, path: str, stage: bool, preserve: bool | None, force: bool) -> dict[str, Any]:
        self._record("upgrade")
        return {"message": f"upgrade from {path}"}

    async def bootstrap(
        self,
        *,
        snapshot: str | None,
        self_hosted: bool = False,
        checkpointer_image: str | None = None,
        checkpointer_grace_period: int | None = None,
    ) -> dict[str, Any]:
        self._record("bootstrap")
        return {"message": "bootstrapped"}

    async def etcd_members(self) -> list[dict[str, Any]]:
        self._record("etcd_members")
        return [{"id": "1", "name": self.name}]

    async def etcd_leave(self, *, force: bool) -> dict[str, Any]:
        self._record("etcd_leave")
        return {"message": "left"}

    async def etcd_remove_member(self, *, member: str) -> dict[str, Any]:
        self._record("etcd_remove_member")
        return {"message": f"removed {member}"}

    async def etcd_forfeit_leadership(self) -> dict[str, Any]:
        self._record("etcd_forfeit_leadership")
        return {"message": "not the leader"}

    async def etcd_snapshot(self) -> AsyncIterator[bytes]:
        self._record("etcd_snapshot")
        yield b"snapshot"

    async def kubeconfig(self) -> dict[str, Any]:
        self._record("kubeconfig")
        return {"kubeconfig": "apiVersion: v1\n"}

    async def client_certificate(self, *, csr: str, roles: str, lifetime_seconds: int) -> dict[str, Any]:
        self._record("client_certificate")
        return {"crt": "signed", "ca": "ca"}

    async def kubernetes_certificates_renew(self, *, not_before: int | None) -> dict[str, Any]:
        self._record("kubernetes_certificates_renew")
        return {
            "notBefore": "2026-01-01T00:00:00+00:00",
            "issued": "2025-01-01T00:00:00+00:00",
            "renewing": True,
        }

    async def image_pull(self, *, image: str) -> dict[str, Any]:
        self._record("image_pull")
        return {"image": image, "pulled": True}

    async def containers(self) -> list[dict[str, Any]]:
        self._record("containers")
        return [{"namespace": "kube-system", "pod": "p", "name": "c"}]

    async def container_logs(self, *, id: str, tail: int | None, follow: bool) -> AsyncIterator[str]:
        self._record("container_logs")
        yield f"{id} line"


@dataclass(frozen=True)
class PKI:
    ca: pki.CertKey
    admin: api.Credentials
    reader: api.Credentials
    proxy: api.Credentials
    nobody: api.Credentials
    foreign: api.Credentials
    expired: api.Credentials

    def server(self, address: str) -> api.Credentials:
        cert = pki.issue(
            ca=self.ca,
            common_name=address,
            ip_addresses=[address],
            dns_names=["localhost"],
            usages=["server"],
        )
        return api.Credentials(ca=self.ca.cert, cert=cert.cert, key=cert.key)


def _client(ca: pki.CertKey, org: str, *, trust: bytes | None = None, **kwargs: Any) -> api.Credentials:
    cert = pki.issue(ca=ca, common_name=f"test {org}", organizations=[org], usages=["client"], **kwargs)
    return api.Credentials(ca=trust or ca.cert, cert=cert.cert, key=cert.key)


@pytest.fixture(scope="module")
def certs() -> PKI:
    ca = pki.new_ca("kubeplane os")
    other = pki.new_ca("someone else")
    long_ago = datetime.now(UTC) - timedelta(days=30)
    return PKI(
        ca=ca,
        admin=_client(ca, api.ROLE_ADMIN),
        reader=_client(ca, api.ROLE_READER),
        proxy=_client(ca, api.ROLE_PROXY),
        nobody=_client(ca, "example:nobody"),
        foreign=_client(other, api.ROLE_ADMIN, trust=ca.cert),
        expired=_client(ca, api.ROLE_ADMIN, now=long_ago, lifetime=timedelta(days=1)),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def nodes(
    certs: PKI, addresses: Sequence[str], *, port: int | None = None
) -> AsyncIterator[tuple[list[api.NodeAPIServer], list[FakeNode]]]:
    """Secure servers, one per loopback address, all on the same port."""
    port = port or free_port()
    servers: list[api.NodeAPIServer] = []
    backends = [FakeNode(address) for address in addresses]
    try:
        for address, backend in zip(addresses, backends, strict=True):
            servers.append(
                await api.serve(
                    backend=backend,
                    node=address,
                    credentials=certs.server(address),
                    proxy_credentials=certs.proxy,
                    listen=f"{address}:{port}",
                    proxy_port=port,
                )
            )
        yield servers, backends
    finally:
        for server in servers:
            await server.stop(0)


def endpoint(server: api.NodeAPIServer) -> str:
    return f"{server.node}:{server.port}"


def client(server: api.NodeAPIServer, credentials: api.Credentials, **kwargs: Any) -> api.NodeClient:
    return api.NodeClient([endpoint(server)], credentials=credentials, **kwargs)


async def collect(stream: AsyncIterator[api.Reply[T]], limit: int = 100) -> list[api.Reply[T]]:
    replies = []
    async for reply in stream:
        replies.append(reply)
        if len(replies) >= limit:
            break
    return replies


async def every_call(c: api.NodeClient) -> dict[str, Callable[[], Awaitable[Any]]]:
    """One invocation per call of the table, keyed by call name."""
    return {
        "Version": c.version,
        "ResourceGet": lambda: c.resource_get("RootSecrets", "k8s"),
        "ResourceList": lambda: c.resource_list("RootSecrets"),
        "ResourceWatch": lambda: collect(c.resource_watch("RootSecrets"), limit=1),
        "ApplyConfiguration": lambda: c.apply_configuration("version: v1alpha1\n# new\n", mode="immediate"),
        "MachineConfig": c.machine_config,
        "ReadFile": lambda: collect(c.read_file("etc/hosts")),
        "ListDir": lambda: c.list_dir("."),
        "Logs": lambda: collect(c.logs("etcd", tail=2)),
        "ServiceList": c.service_list,
        "Events": lambda: collect(c.events(tail=1)),
        "Certificates": c.certificates,
        "ClientCertificate": lambda: c.client_certificate(
            b"csr", roles=["kubeplane:reader"], lifetime_seconds=60
        ),
        "ServiceStart": lambda: c.service_start("etcd"),
        "ServiceStop": lambda: c.service_stop("etcd"),
        "ServiceRestart": lambda: c.service_restart("etcd"),
        "Reboot": c.reboot,
        "Reset": lambda: c.reset(dry_run=True),
        "Upgrade": lambda: c.upgrade(path="/var/lib/kubeplane/uploads/build", stage=True),
        "Bootstrap": c.bootstrap,
        "EtcdMembers": c.etcd_members,
        "EtcdLeave": c.etcd_leave,
        "EtcdRemoveMember": lambda: c.etcd_remove_member("cp-2"),
        "EtcdForfeitLeadership": c.etcd_forfeit_leadership,
        "EtcdSnapshot": lambda: collect(c.etcd_snapshot()),
        "Kubeconfig": c.kubeconfig,
        "KubernetesCertificatesRenew": lambda: c.kubernetes_certificates_renew(not_before=1767225600),
        "ImagePull": lambda: c.image_pull("k8s.gcr.io/pause:3.2"),
        "Containers": c.containers,
        "ContainerLogs": lambda: collect(c.container_logs("kube-system/p:c")),
    }


def test_every_call_is_exercised_by_these_tests(certs: PKI) -> None:
    async def scenario() -> set[str]:
        async with api.NodeClient(["127.0.0.1:1"], credentials=certs.admin) as c:
            return set(await every_call(c))

    assert run(scenario()) == {call.name for call in wire.CALLS}


def test_admin_can_make_every_call(certs: PKI) -> None:
    async def scenario() -> None:
        async with nodes(certs, ["127.0.0.1"]) as (servers, backends), client(servers[0], certs.admin) as c:
            results = {name: await invoke() for name, invoke in (await every_call(c)).items()}
        assert results["Version"][0].unwrap() == {"tag": "test", "node": "127.0.0.1"}
        assert results["Version"][0].node == "127.0.0.1"
        assert results["ResourceGet"][0].unwrap()["metadata"]["id"] == "k8s"
        assert results["ResourceWatch"][0].unwrap()["event"] == "created"
        assert results["ApplyConfiguration"][0].unwrap()["mode"] == "immediate"
        assert b"".join(r.unwrap() for r in results["ReadFile"]) == b"hello \x00world"
        assert [r.unwrap() for r in results["Logs"]] == ["etcd line 3", "etcd line 4"]
        assert results["ServiceRestart"][0].unwrap() == {"message": "restart etcd"}
        assert set(backends[0].calls) >= MUTATIONS

    run(scenario())


def test_reader_reads_but_is_refused_secrets_config_and_changes(certs: PKI) -> None:
    allowed = {"Version", "ListDir", "Logs", "ServiceList", "Events", "Certificates", "EtcdMembers"}

    async def scenario() -> None:
        async with nodes(certs, ["127.0.0.1"]) as (servers, backends):
            async with client(servers[0], certs.reader) as c:
                calls = await every_call(c)
                for name in allowed:
                    await calls[name]()
                assert (await c.resource_list("Services"))[0].unwrap()[0]["metadata"]["id"] == "etcd"
                for name in set(calls) - allowed:
                    with pytest.raises(api.CallError) as refused:
                        await calls[name]()
                    assert refused.value.code == "PERMISSION_DENIED", name
                    assert api.ROLE_READER in refused.value.message
                    assert name in refused.value.message
            assert not MUTATIONS & set(backends[0].calls)
            assert backends[0].config == "version: v1alpha1\n"

    run(scenario())


def test_reader_cannot_claim_a_role_only_proxies_may_pass_on(certs: PKI) -> None:
    async def scenario() -> None:
        async with nodes(certs, ["127.0.0.1"]) as (servers, backends):
            target = endpoint(servers[0])
            for credentials, role, expected in [
                (certs.reader, api.ROLE_ADMIN, "PERMISSION_DENIED"),  # claim ignored: still a reader
                (certs.proxy, None, "PERMISSION_DENIED"),  # a proxy with no caller gets nothing
                (certs.proxy, "kubeplane:proxy", "PERMISSION_DENIED"),
                (certs.proxy, api.ROLE_READER, "PERMISSION_DENIED"),
                (certs.proxy, api.ROLE_ADMIN, "OK"),
            ]:
                connection = transport.Connection.open(target, credentials)
                metadata = ((wire.MD_ROLE, role),) if role else ()
                try:
                    await connection.unary(wire.CALLS_BY_NAME["Reboot"], {}, metadata=metadata, timeout=5)
                    outcome = "OK"
                except api.CallError as exc:
                    outcome = exc.code
                finally:
                    await connection.close()
                assert outcome == expected, (credentials is certs.proxy, role)
            assert backends[0].calls.count("reboot") == 1

    run(scenario())


def test_certificate_without_a_kubeplane_role_is_refused(certs: PKI) -> None:
    async def scenario() -> None:
        async with nodes(certs, ["127.0.0.1"]) as (servers, backends):
            async with client(servers[0], certs.nobody) as c:
                with pytest.raises(api.CallError) as refused:
                    await c.version()
            assert refused.value.code == "PERMISSION_DENIED"
            assert "example:nobody" in refused.value.message
            assert backends[0].calls == []

    run(scenario())


@pytest.mark.parametrize("who", ["no client certificate", "another CA", "expired"])
def test_unauthenticated_clients_are_refused_at_the_handshake(certs: PKI, who: str) -> None:
    async def scenario() -> None:
        async with nodes(certs, ["127.0.0.1"]) as (servers, backends):
            target = endpoint(servers[0])
            if who == "no client certificate":
                channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(certs.ca.cert))
                connection = transport.Connection(target, channel)
            else:
                credentials = certs.foreign if who == "another CA" else certs.expired
                connection = transport.Connection.open(target, credentials)
            try:
                with pytest.raises(transport.Unreachable):
                    await connection.unary(wire.CALLS_BY_NAME["Reboot"], {}, timeout=5)
            finally:
                await connection.close()
            assert backends[0].calls == []

    run(scenario())


def test_client_tries_endpoints_in_order_and_names_each_failure(certs: PKI) -> None:
    async def scenario() -> None:
        dead = f"127.0.0.1:{free_port()}"
        async with nodes(certs, ["127.0.0.1"]) as (servers, _):
            async with api.NodeClient([dead, endpoint(servers[0])], credentials=certs.admin) as c:
                assert (await c.version())[0].unwrap()["tag"] == "test"
            async with api.NodeClient([dead, endpoint(servers[0])], credentials=certs.expired) as c:
                with pytest.raises(api.ConnectError) as failed:
                    await c.version()
        assert [attempt[0] for attempt in failed.value.attempts] == [dead, endpoint(servers[0])]
        assert dead in str(failed.value)

    run(scenario())


def test_invalid_requests_name_the_fields(certs: PKI) -> None:
    async def scenario() -> None:
        async with nodes(certs, ["127.0.0.1"]) as (servers, backends):
            async with client(servers[0], certs.admin) as c:
                with pytest.raises(api.CallError) as missing:
                    await c.call("ResourceGet", {"type": "Services", "tail": "x"})
                with pytest.raises(api.CallError) as bad_config:
                    await c.apply_configuration("machine: {}\n")
                with pytest.raises(api.CallError) as not_found:
                    await c.resource_get("Services", "nope")
            assert backends[0].config == "version: v1alpha1\n"
        assert missing.value.code == "INVALID_ARGUMENT"
        assert dict(missing.value.fields).keys() == {"id", "tail"}
        assert bad_config.value.fields == (("version", "required"),)
        assert "version: required" in bad_config.value.message
        assert not_found.value.code == "NOT_FOUND"
        assert "Services/nope" in not_found.value.message

    run(scenario())


def test_maintenance_mode_accepts_only_insecure_apply_and_version(certs: PKI) -> None:
    async def scenario() -> None:
        backend = FakeNode("maint")
        server = await api.serve_maintenance(backend=backend, node="maint", listen=f"127.0.0.1:{free_port()}")
        try:
            async with api.NodeClient.insecure([f"127.0.0.1:{server.port}"]) as c:
                assert (await c.version())[0].unwrap()["tag"] == "test"
                result = (await c.apply_configuration("version: v1alpha1\nmachine: {}\n"))[0].unwrap()
                assert result["mode"] == "reboot"
                calls = await every_call(c)
                for name in set(calls) - {"Version", "ApplyConfiguration"}:
                    with pytest.raises(api.CallError) as refused:
                        await calls[name]()
                    assert refused.value.code == "PERMISSION_DENIED"
                    assert "node is in maintenance mode: only apply-config --insecure is accepted" in str(
                        refused.value
                    )
            # A client holding real certificates cannot verify the maintenance certificate.
            async with api.NodeClient([f"127.0.0.1:{server.port}"], credentials=certs.admin) as c:
                with pytest.raises(api.ConnectError):
                    await c.version()
        finally:
            await server.stop(0)
        assert backend.calls == ["version", "apply_configuration"]
        assert backend.config == "version: v1alpha1\nmachine: {}\n"

    run(scenario())


THREE = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


def test_proxy_labels_replies_and_isolates_a_dead_node(certs: PKI) -> None:
    async def scenario() -> None:
        async with nodes(certs, THREE) as (servers, backends):
            await servers[2].stop(0)
            async with client(servers[0], certs.admin, nodes=THREE) as c:
                replies = await c.version()
                services = await c.resource_list("Services")
            async with client(servers[0], certs.reader, nodes=THREE[:2]) as c:
                secrets = await c.resource_list("RootSecrets")
                with pytest.raises(api.CallError) as refused:
                    await c.reboot()
        assert [r.node for r in replies] == THREE
        assert [r.unwrap()["node"] for r in replies[:2]] == THREE[:2]
        dead = replies[2].error
        assert dead is not None and dead.code == "UNAVAILABLE" and dead.node == "127.0.0.4"
        assert "127.0.0.4" in str(dead)
        assert [s[0]["node"] for s in (r.unwrap() for r in services[:2])] == THREE[:2]
        # The reader's role travelled with the call: every node refused its secrets.
        assert [r.error.code if r.error else None for r in secrets] == ["PERMISSION_DENIED"] * 2
        assert refused.value.code == "PERMISSION_DENIED"
        assert "reboot" not in backends[0].calls + backends[1].calls
        assert backends[1].calls.count("version") == 1

    run(scenario())


def test_watch_streams_through_the_proxy(certs: PKI) -> None:
    async def scenario() -> None:
        async with nodes(certs, THREE) as (servers, backends):
            await servers[2].stop(0)
            async with client(servers[0], certs.admin, nodes=THREE) as c:
                stream = c.resource_watch("Services")
                seen: list[api.Reply[Any]] = []
                async for reply in stream:
                    seen.append(reply)
                    if len(seen) == 5:  # 2 nodes x 2 services + the dead node's error
                        break
                while backends[1].changes is None:
                    await asyncio.sleep(0.01)
                backends[1].changes.put_nowait(backends[1].resource("runtime", "Services", "apid"))
                update = await anext(aiter(stream))
                await stream.aclose()  # type: ignore[attr-defined]
                # Closing the client's stream releases the watch on the entry node and behind the proxy.
                for _ in range(200):
                    if backends[0].watches_closed and backends[1].watches_closed:
                        break
                    await asyncio.sleep(0.01)
                assert (backends[0].watches_closed, backends[1].watches_closed) == (1, 1)
        errors = [r for r in seen if r.error]
        assert [r.node for r in errors] == ["127.0.0.4"]
        created = sorted((r.node, r.unwrap()["resource"]["metadata"]["id"]) for r in seen if not r.error)
        assert created == [(n, s) for n in THREE[:2] for s in ("etcd", "kubelet")]
        assert update.node == "127.0.0.3"
        assert update.unwrap()["event"] == "updated"
        assert update.unwrap()["resource"]["metadata"]["id"] == "apid"

    run(scenario())


def test_listening_on_a_busy_port_is_a_clear_error(certs: PKI) -> None:
    async def scenario() -> None:
        async with nodes(certs, ["127.0.0.1"]) as (servers, _):
            with pytest.raises(api.ListenError, match=str(servers[0].port)):
                await api.serve(
                    backend=FakeNode("x"),
                    node="x",
                    credentials=certs.server("127.0.0.1"),
                    listen=endpoint(servers[0]),
                )

    run(scenario())
