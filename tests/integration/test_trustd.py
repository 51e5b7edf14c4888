"""trustd on loopback: the machine token gets a node identity signed by the OS CA, nothing more.

A real :class:`~kubeplane.api.trustd.TrustdServer` listens on ``127.0.0.x``; requests come from
``127.0.0.1`` (Linux's source address for all of 127/8), so loopback addresses are what a
requester may have in its certificate, and ``10.5.0.2`` plays another node's address. The last
test runs a worker's side in a network namespace behind a load balancer: it reads ``Endpoints
default/kubernetes`` from a real kube-apiserver with a bootstrap token, as a worker does to find
the control plane nodes, and gets its certificate from trustd at the node listed there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import pytest

from kubeplane import api, pki
from kubeplane.agent import node as agent_node
from kubeplane.api import transport, trustd, wire
from kubeplane.clients import kube
from kubeplane.controllers.k8s import manifests, render

if TYPE_CHECKING:
    from conftest import ApiServer, NetNS

pytestmark = pytest.mark.integration

T = TypeVar("T")
TOKEN = "right.token"
ENDPOINT = "https://kube.example.test:6443"
BOOTSTRAP_TOKEN = "abcdef.0123456789abcdef"
#: Loopback addresses of this test session (Linux routes all of 127/8 to lo).
NET = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 60))


class OsCA:
    """The OS CA and the control plane node's credentials (server certificate for its address)."""

    def __init__(self) -> None:
        self.ca = pki.new_ca("trustd test os ca")

    def server(self, address: str, name: str = "cp-1") -> api.Credentials:
        pair = pki.issue(
            ca=self.ca,
            common_name=name,
            dns_names=[name, "localhost"],
            ip_addresses=[address, "127.0.0.1"],
            usages=["server"],
        )
        return api.Credentials(ca=self.ca.cert, cert=pair.cert, key=pair.key)

    def client(self, org: str) -> api.Credentials:
        pair = pki.issue(ca=self.ca, common_name=f"test {org}", organizations=[org], usages=["client"])
        return api.Credentials(ca=self.ca.cert, cert=pair.cert, key=pair.key)


@contextlib.asynccontextmanager
async def trustd_at(os_ca: OsCA, address: str, port: int = 0) -> AsyncIterator[str]:
    server = trustd.TrustdServer(
        token=TOKEN, ca=os_ca.ca, credentials=os_ca.server(address), endpoint=ENDPOINT
    )
    await server.start(f"{address}:{port}")
    try:
        yield f"{address}:{server.port}"
    finally:
        await server.stop()


def node_csr(
    key: bytes,
    *,
    organizations: tuple[str, ...] = (pki.NODE_ORG,),
    dns: tuple[str, ...] = ("worker-1", "localhost"),
    ips: tuple[str, ...] = ("127.0.0.1",),
) -> bytes:
    return pki.new_csr(
        key=key, common_name="worker-1", organizations=organizations, dns_names=dns, ip_addresses=ips
    )


def refusals(caplog: pytest.LogCaptureFixture) -> int:
    return sum("refused a certificate request" in r.getMessage() for r in caplog.records)


def test_trustd_signs_a_node_identity_for_the_machine_token_and_refuses_a_wrong_one() -> None:
    os_ca = OsCA()
    key = pki.generate_key()

    async def scenario() -> bytes:
        async with trustd_at(os_ca, "127.0.0.1") as target:
            with pytest.raises(trustd.TrustdError, match="refused the machine token"):
                await trustd.request_certificate(
                    targets=[target], token="wrong", csr=node_csr(key), ca=os_ca.ca.cert
                )
            # An unreachable target first is skipped over.
            return await trustd.request_certificate(
                targets=["127.0.0.1:1", target],
                token=TOKEN,
                csr=node_csr(key, ips=("127.0.0.1", "::1")),
                ca=os_ca.ca.cert,
            )

    crt = run(scenario())
    info = pki.cert_info(crt)
    assert pki.is_issued_by(crt, os_ca.ca.cert)
    assert (info.subject_cn, info.organizations) == ("worker-1", (pki.NODE_ORG,))
    assert (info.dns_names, info.ip_addresses) == (("worker-1", "localhost"), ("127.0.0.1", "::1"))
    assert info.extended_key_usages == ("server", "client")
    assert not info.is_ca


@pytest.mark.parametrize(
    ("asked", "message", "final"),
    [
        ({"organizations": (api.ROLE_ADMIN,)}, "O=kubeplane:admin", True),
        ({"organizations": (api.ROLE_PROXY,)}, "O=kubeplane:proxy", True),
        ({"organizations": ("system:masters",)}, "O=system:masters", True),
        (
            {"ips": ("127.0.0.1", "10.5.0.2")},
            "asks for the IP address 10.5.0.2, but the request comes from 127.0.0.1",
            False,
        ),
        ({"dns": ("worker-1", "kube.example.test")}, "'kube.example.test'", True),
        ({"dns": ("cp-1",)}, "'cp-1'", True),
    ],
    ids=["admin", "proxy", "system-masters", "other-node-ip", "endpoint-host", "control-plane-name"],
)
def test_trustd_refuses_roles_other_addresses_and_control_plane_names(
    asked: dict[str, Any], message: str, final: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal signs nothing. PERMISSION_DENIED stops at once; an address mismatch moves on."""
    os_ca = OsCA()
    csr = node_csr(pki.generate_key(), **asked)

    async def scenario() -> None:
        async with trustd_at(os_ca, f"{NET}.2") as first, trustd_at(os_ca, f"{NET}.3") as second:
            with pytest.raises(trustd.TrustdError) as refused:
                await trustd.request_certificate(
                    targets=[first, second], token=TOKEN, csr=csr, ca=os_ca.ca.cert
                )
        assert message in str(refused.value)
        if not final:
            assert "not through a load balancer" in str(refused.value)
            assert first in str(refused.value) and second in str(refused.value)

    with caplog.at_level(logging.WARNING, logger="kubeplaned.trustd"):
        run(scenario())
    assert refusals(caplog) == (1 if final else 2)


class VersionOnly:
    """A node backend that answers Version and records who got an answer."""

    def __init__(self) -> None:
        self.answered = 0

    async def version(self) -> dict[str, Any]:
        self.answered += 1
        return {"tag": "test"}


def test_a_node_certificate_from_trustd_can_neither_call_the_node_api_nor_proxy() -> None:
    os_ca = OsCA()
    key = pki.generate_key()
    version = wire.CALLS_BY_NAME["Version"]

    async def outcome(target: str, credentials: api.Credentials, role: str | None) -> str:
        connection = transport.Connection.open(target, credentials)
        try:
            await connection.unary(version, {}, metadata=((wire.MD_ROLE, role),) if role else (), timeout=5)
        except api.CallError as exc:
            return f"{exc.code}: {exc.message}"
        finally:
            await connection.close()
        return "OK"

    async def scenario() -> dict[str, str]:
        async with trustd_at(os_ca, "127.0.0.1") as target:
            crt = await trustd.request_certificate(
                targets=[target], token=TOKEN, csr=node_csr(key), ca=os_ca.ca.cert
            )
        node = api.Credentials(ca=os_ca.ca.cert, cert=crt, key=key)
        backend = VersionOnly()
        address = f"{NET}.4"
        server = await api.serve(
            backend=backend,
            node=address,
            credentials=os_ca.server(address),
            proxy_credentials=os_ca.client(api.ROLE_PROXY),
            listen=f"{address}:0",
        )
        try:
            where = f"{address}:{server.port}"
            results = {
                "node": await outcome(where, node, None),
                "node claiming admin as proxy": await outcome(where, node, api.ROLE_ADMIN),
                # Controls: the server answers real roles, and a real proxy's claim.
                "admin": await outcome(where, os_ca.client(api.ROLE_ADMIN), None),
                "proxy claiming admin": await outcome(where, os_ca.client(api.ROLE_PROXY), api.ROLE_ADMIN),
            }
        finally:
            await server.stop(grace=0)
        assert backend.answered == 2
        return results

    results = run(scenario())
    assert results["admin"] == "OK" and results["proxy claiming admin"] == "OK"
    for who in ("node", "node claiming admin as proxy"):
        assert results[who].startswith("PERMISSION_DENIED"), results[who]
        assert pki.NODE_ORG in results[who]


@contextlib.asynccontextmanager
async def load_balancer(listen: str, upstream: tuple[str, int]) -> AsyncIterator[str]:
    """A TCP load balancer on ``listen``: what reaches it is sent on from this host to ``upstream``."""
    writers: list[asyncio.StreamWriter] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        up_reader, up_writer = await asyncio.open_connection(*upstream)
        writers.append(up_writer)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, listen, 0)
    try:
        yield f"{listen}:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


#: A worker's side, run inside the test's network namespace: the agent's own CSR and discovery.
WORKER = """
import asyncio, functools, json, logging, sys
from kubeplane import pki
from kubeplane.agent import node
from kubeplane.api import trustd

args = json.loads(sys.argv[1])
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
sources = []

def csr(source):
    sources.append(source)
    return node.node_csr(pki.generate_key(), source, name="worker-1", own=[])

def discover():
    return node.control_plane_addresses(
        endpoint=args["endpoint"], token=args["bootstrap_token"], ca=args["kubernetes_ca"].encode()
    )

crt = asyncio.run(trustd.request_certificate(
    targets=args["targets"], token=args["token"], csr=csr, ca=args["os_ca"].encode(), discover=discover
))
print(json.dumps({"crt": crt.decode(), "sources": sources}))
"""


def create(server: ApiServer, objects: list[dict[str, Any]]) -> None:
    async def scenario() -> None:
        async with kube.KubeClient(server.admin_kubeconfig) as api:
            for obj in objects:
                resource = await api.resource(obj["apiVersion"], obj["kind"])
                path = resource.path(namespace=obj["metadata"].get("namespace"))
                created = await api.create(path, obj)  # raises unless the server created it
                assert created["metadata"]["name"] == obj["metadata"]["name"]

    run(scenario())


def test_a_worker_behind_a_load_balancer_finds_trustd_through_endpoints(
    start_apiserver: Callable[..., ApiServer],
    netns: NetNS,
    wait_until: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The control plane node is the host side of the namespace's veth pair, the worker inside."""
    address = netns.host_ip
    server = start_apiserver(address)
    rendered = manifests.render_bootstrap_manifests(
        manifests.ManifestInputs(
            kubernetes_version=render.KubeVersion(1, 20, 2),
            server=server.url,
            bootstrap_token=BOOTSTRAP_TOKEN,
            pod_cidrs=("10.244.0.0/16",),
            dns_service_ip="10.96.0.10",
            proxy_image="k8s.gcr.io/kube-proxy:v1.20.2",
        )
    )

    def discover(token: str = BOOTSTRAP_TOKEN) -> Awaitable[list[str]]:
        return agent_node.control_plane_addresses(endpoint=server.url, token=token, ca=server.ca.cert)

    def discovery_error(token: str = BOOTSTRAP_TOKEN) -> str:
        with pytest.raises(trustd.TrustdError) as failed:
            run(discover(token))
        return str(failed.value)

    # The token is known to the API server, but without the manifest's RBAC it may read nothing.
    create(server, rendered["00-kubelet-bootstrapping-token"])
    wait_until(lambda: "403" in discovery_error(), timeout=30, what="the bootstrap token to authenticate")
    assert "401" in discovery_error("abcdef.wrongwrongwrongw")

    create(server, rendered["01-trustd-discovery"])
    assert wait_until(lambda: run(discover()), timeout=30, what="Endpoints default/kubernetes") == [address]
    # That one object only: not the list, not another namespace's endpoints.
    bootstrap = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
    trust = ssl.create_default_context(cadata=server.ca.cert.decode())
    for path in ("/api/v1/namespaces/default/endpoints", "/api/v1/namespaces/kube-system/endpoints/kube-dns"):
        response = httpx.get(f"{server.url}{path}", headers=bootstrap, verify=trust, timeout=10)
        assert response.status_code == httpx.codes.FORBIDDEN, path

    # The worker asks through the load balancer first: trustd sees the balancer's address and
    # refuses, and the worker moves on to the control plane node Endpoints lists.
    os_ca = OsCA()

    async def scenario() -> tuple[int | None, bytes, bytes]:
        async with (
            trustd_at(os_ca, address, trustd.PORT) as direct,
            load_balancer(address, (address, trustd.PORT)) as balancer,
        ):
            args = {
                "targets": [balancer],
                "token": TOKEN,
                "os_ca": os_ca.ca.cert.decode(),
                "endpoint": server.url,
                "bootstrap_token": BOOTSTRAP_TOKEN,
                "kubernetes_ca": server.ca.cert.decode(),
            }
            assert direct == f"{address}:{trustd.PORT}"
            worker = await asyncio.create_subprocess_exec(
                "ip",
                "netns",
                "exec",
                netns.name,
                sys.executable,
                "-c",
                WORKER,
                json.dumps(args),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(worker.communicate(), 45)
            finally:
                if worker.returncode is None:
                    worker.kill()
                    await worker.wait()
            return worker.returncode, out, err

    with caplog.at_level(logging.INFO, logger="kubeplaned.trustd"):
        returncode, out, err = run(scenario())
    assert returncode == 0, err.decode()
    result = json.loads(out)
    assert result["sources"] == [netns.node_ip, netns.node_ip]  # one CSR per target, its own address
    info = pki.cert_info(result["crt"].encode())
    assert (info.subject_cn, info.organizations) == ("worker-1", (pki.NODE_ORG,))
    assert (info.dns_names, info.ip_addresses) == (("worker-1", "localhost"), (netns.node_ip, "127.0.0.1"))
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"the request comes from {address}" in m and "load balancer" in m for m in messages), messages
    assert any("signed a node certificate for worker-1" in m and netns.node_ip in m for m in messages), (
        messages
    )
    assert f"trustd at {address}:{trustd.PORT} signed the node API certificate" in err.decode()
