"""The secrets controller chain on a real Runtime + State: machine config → secrets resources → files.

Each test runs the five controllers the agent registers on a control plane node, against a
generated machine config and a node root under ``tmp_path``, with an injectable clock.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from kubeplane import pki
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import files
from kubeplane.controllers.secrets import common, render_etcd
from kubeplane.controllers.secrets.etcd import EtcdSecretsController
from kubeplane.controllers.secrets.kubernetes import KubernetesSecretsController
from kubeplane.controllers.secrets.render import RenderSecretsStaticPodController
from kubeplane.controllers.secrets.render_etcd import RenderEtcdSecretsController
from kubeplane.controllers.secrets.root import RootSecretsController
from kubeplane.resources import State, catalog, default_registry
from kubeplane.runtime import LOGGER_NAME, Runtime

pytestmark = pytest.mark.unit

HOSTNAME = "cp-1"
NODE_IP = "10.5.0.2"
ENDPOINT_HOST = "10.5.0.1"
# Long enough for every controller of the chain to have run after an input change.
SETTLE = 0.3


@pytest.fixture(scope="module")
def bundle() -> gen.SecretsBundle:
    return gen.new_secrets()


def config_document(bundle: gen.SecretsBundle, machine_type: str = "controlplane") -> dict[str, Any]:
    options = gen.GenOptions(
        cluster_name="demo", endpoint=ENDPOINT_HOST, additional_sans=("api.example.org",)
    )
    return copy.deepcopy(dict(gen.generate(options, bundle).documents[machine_type]))


@dataclass
class Clock:
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Node:
    """A state, a runtime with the secrets chain, and the node root on disk."""

    state: State
    runtime: Runtime
    paths: NodePaths
    clock: Clock

    def apply(self, document: dict[str, Any]) -> None:
        self.state.modify(
            catalog.CONFIG_NAMESPACE,
            catalog.MACHINE_CONFIGS,
            catalog.MACHINE_CONFIG_ID,
            lambda _: catalog.MachineConfigSpec(data=document),
        )

    def spec(self, namespace: str, type_name: str, resource_id: str) -> dict[str, Any] | None:
        resource = self.state.find(namespace, type_name, resource_id)
        return None if resource is None else resource.spec.to_dict()

    def root_secrets(self, resource_id: str) -> dict[str, Any] | None:
        return self.spec(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, resource_id)

    def etcd_secrets(self) -> dict[str, Any] | None:
        return self.spec(catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS, "etcd")

    def k8s_certs(self) -> dict[str, Any]:
        spec = self.spec(catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, "k8s-certs")
        assert spec is not None
        return spec

    def status(self, resource_id: str = catalog.STATIC_POD_SECRETS_ID) -> dict[str, Any] | None:
        return self.spec(catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, resource_id)

    def component_dir(self, component: str) -> Path:
        return Path(files.secrets_dir(component, node_root=PurePosixPath(self.paths.root)))

    async def wait_for(self, predicate: Callable[[], object], what: str, timeout: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                pytest.fail(f"timed out waiting for {what}")
            await asyncio.sleep(0.01)

    async def wait_ready(self) -> dict[str, Any]:
        """Both rendering controllers done; returns the static pods' status.

        The two render independently, so one being ready says nothing of the other.
        """
        await self.wait_for(lambda: (self.status() or {}).get("ready"), "SecretStatuses static-pods ready")
        await self.wait_for(lambda: (self.status("etcd") or {}).get("ready"), "SecretStatuses etcd ready")
        status = self.status()
        assert status is not None
        return status


def run_node(tmp_path: Path, scenario: Callable[[Node], Any], *, clock: Clock | None = None) -> None:
    async def main() -> None:
        state = State(default_registry())
        state.create(
            catalog.NETWORK_NAMESPACE,
            catalog.NODE_ADDRESSES,
            catalog.NODE_ADDRESSES_ID,
            spec=catalog.NodeAddressesSpec(hostname=HOSTNAME, addresses=[NODE_IP]),
        )
        node = Node(
            state,
            Runtime(state, backoff_initial=0.02, backoff_max=0.1),
            NodePaths(tmp_path),
            clock or Clock(),
        )
        for controller in controllers(node.paths, node.clock):
            node.runtime.register(controller)
        async with node.runtime:
            await scenario(node)

    asyncio.run(main())


def controllers(paths: NodePaths, clock: Clock) -> Iterator[Any]:
    yield RootSecretsController()
    yield EtcdSecretsController(clock=clock)
    yield KubernetesSecretsController(clock=clock)
    yield RenderSecretsStaticPodController(paths=paths)
    yield RenderEtcdSecretsController(paths=paths)


def kubeconfig_of(text: str) -> tuple[str, pki.CertInfo]:
    document = yaml.safe_load(text)
    cert = base64.b64decode(document["users"][0]["user"]["client-certificate-data"])
    return document["clusters"][0]["cluster"]["server"], pki.cert_info(cert)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- a control plane node --------------------------------------------------------------------


def test_control_plane_node_gets_every_secret_resource(tmp_path: Path, bundle: gen.SecretsBundle) -> None:
    async def scenario(node: Node) -> None:
        node.apply(config_document(bundle))
        assert await node.wait_ready() == {
            "ready": True,
            "version": "1",
            "issued": node.k8s_certs()["issued"],
        }

        root_k8s = node.root_secrets("k8s")
        root_etcd = node.root_secrets("etcd")
        assert root_k8s is not None and root_etcd is not None
        assert root_k8s["endpoint"] == f"https://{ENDPOINT_HOST}:6443"
        assert root_k8s["localEndpoint"] == "https://localhost:6443"
        assert root_k8s["certSANs"] == [ENDPOINT_HOST, "api.example.org"]
        assert root_k8s["apiServiceIP"] == "10.96.0.1"
        assert root_k8s["ca"]["crt"].encode() == bundle.kubernetes_ca.cert
        assert root_k8s["aggregatorCA"]["key"].encode() == bundle.aggregator_ca.key
        assert root_k8s["serviceAccount"]["key"].encode() == bundle.service_account_key
        assert root_k8s["bootstrapToken"] == bundle.bootstrap_token
        assert root_etcd["ca"]["crt"].encode() == bundle.etcd_ca.cert

        certs = node.k8s_certs()
        api_server = pki.cert_info(certs["apiServer"]["crt"].encode())
        assert api_server.subject_cn == "kube-apiserver"
        assert api_server.extended_key_usages == ("server",)
        assert set(api_server.ip_addresses) == {ENDPOINT_HOST, "10.96.0.1", "127.0.0.1", NODE_IP}
        assert set(api_server.dns_names) == {
            "api.example.org",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
            HOSTNAME,
        }
        assert pki.is_issued_by(certs["apiServer"]["crt"].encode(), bundle.kubernetes_ca.cert)

        kubelet_client = pki.cert_info(certs["apiServerKubeletClient"]["crt"].encode())
        assert kubelet_client.organizations == ("system:masters",)
        front_proxy = certs["frontProxyClient"]["crt"].encode()
        assert pki.cert_info(front_proxy).subject_cn == "front-proxy-client"
        assert pki.is_issued_by(front_proxy, bundle.aggregator_ca.cert)
        assert not pki.is_issued_by(front_proxy, bundle.kubernetes_ca.cert)

        server, admin = kubeconfig_of(certs["adminKubeconfig"])
        assert server == f"https://{ENDPOINT_HOST}:6443"
        assert admin.organizations == ("system:masters",)
        assert admin.lifetime == timedelta(days=365) + timedelta(minutes=5)
        assert kubeconfig_of(certs["localAdminKubeconfig"])[0] == "https://127.0.0.1:6443"
        for key, cn in (
            ("controllerManagerKubeconfig", "system:kube-controller-manager"),
            ("schedulerKubeconfig", "system:kube-scheduler"),
        ):
            server, info = kubeconfig_of(certs[key])
            assert (server, info.subject_cn) == ("https://127.0.0.1:6443", cn)

        etcd = node.etcd_secrets()
        assert etcd is not None and etcd["ca"].encode() == bundle.etcd_ca.cert
        for kind in ("server", "peer"):
            info = pki.cert_info(etcd[kind]["crt"].encode())
            assert set(info.ip_addresses) == {NODE_IP, "127.0.0.1"}
            assert set(info.dns_names) == {HOSTNAME, "localhost"}
            assert set(info.extended_key_usages) == {"server", "client"}
        assert pki.cert_info(etcd["client"]["crt"].encode()).extended_key_usages == ("client",)
        assert node.status("etcd") == {"ready": True, "version": "1", "issued": ""}

    run_node(tmp_path, scenario)


def test_files_follow_the_layout_with_restrictive_modes(tmp_path: Path, bundle: gen.SecretsBundle) -> None:
    async def scenario(node: Node) -> None:
        node.apply(config_document(bundle))
        await node.wait_ready()
        certs = node.k8s_certs()
        for component, layout in files.LAYOUT.items():
            directory = node.component_dir(component)
            assert directory == node.paths.secrets / "kubernetes" / component
            assert mode(directory) == 0o700
            assert sorted(p.name for p in directory.iterdir()) == sorted(f.name for f in layout)
            for file in layout:
                assert mode(directory / file.name) == (0o400 if file.private else 0o444), file.name
        apiserver = node.component_dir(files.APISERVER)
        assert (apiserver / "apiserver.crt").read_text() == certs["apiServer"]["crt"]
        assert (apiserver / "ca.crt").read_bytes() == bundle.kubernetes_ca.cert
        assert (apiserver / "service-account.pub").read_bytes() == pki.public_key_pem(
            bundle.service_account_key
        )
        assert (apiserver / "aggregator-ca.crt").read_bytes() == bundle.aggregator_ca.cert
        encryption = yaml.safe_load((apiserver / "encryptionconfig.yaml").read_text())
        providers = encryption["resources"][0]["providers"]
        assert providers[0]["aescbc"]["keys"][0]["secret"] == bundle.aescbc_encryption_secret
        assert yaml.safe_load((apiserver / "auditpolicy.yaml").read_text())["rules"] == [
            {"level": "Metadata"}
        ]
        assert (node.component_dir(files.SCHEDULER) / "kubeconfig").read_text() == certs[
            "schedulerKubeconfig"
        ]
        controller_manager = node.component_dir(files.CONTROLLER_MANAGER)
        assert (controller_manager / "ca.key").read_bytes() == bundle.kubernetes_ca.key

        etcd_dir = render_etcd.etcd_secrets_dir(node.paths)
        assert mode(etcd_dir) == 0o700
        expected = {"ca.crt", "server.crt", "server.key", "peer.crt", "peer.key", "client.crt", "client.key"}
        assert {p.name for p in etcd_dir.iterdir()} == expected
        for name in expected:
            assert mode(etcd_dir / name) == (0o400 if name.endswith(".key") else 0o444), name
        assert (etcd_dir / "ca.crt").read_bytes() == bundle.etcd_ca.cert
        assert mode(node.paths.secrets) == 0o700

    run_node(tmp_path, scenario)


# -- nodes that must not have control plane secrets -----------------------------------------


def test_worker_gets_nothing_and_a_former_control_plane_is_cleaned_up(
    tmp_path: Path, bundle: gen.SecretsBundle
) -> None:
    secret_types = (
        (catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS),
        (catalog.SECRETS_NAMESPACE, catalog.ETCD_SECRETS),
        (catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS),
        (catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES),
    )

    def nothing_left(node: Node) -> bool:
        return not any(node.state.list(namespace, type_name) for namespace, type_name in secret_types)

    async def scenario(node: Node) -> None:
        node.apply(config_document(bundle, "worker"))
        await asyncio.sleep(SETTLE)
        assert nothing_left(node)
        assert not node.paths.secrets.exists()

        node.apply(config_document(bundle, "controlplane"))
        await node.wait_ready()
        node.apply(config_document(bundle, "worker"))
        await node.wait_for(lambda: nothing_left(node), "every secrets resource to be removed")

    run_node(tmp_path, scenario)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("aggregatorCA", "missing cluster.aggregatorCA secret"),
        ("serviceAccount", "missing cluster.serviceAccount secret"),
    ],
)
def test_missing_root_secret_fails_and_tears_down_outputs(
    tmp_path: Path, bundle: gen.SecretsBundle, caplog: pytest.LogCaptureFixture, field: str, message: str
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)

    async def scenario(node: Node) -> None:
        document = config_document(bundle)
        node.apply(document)
        await node.wait_ready()
        del document["cluster"][field]
        node.apply(document)
        await node.wait_for(lambda: node.root_secrets("k8s") is None, "RootSecrets k8s to be removed")
        # etcd keeps its secrets: converting a self-hosted control plane needs etcd running.
        assert node.root_secrets("etcd") is not None
        assert node.status("etcd") == {"ready": True, "version": "1", "issued": ""}
        await node.wait_for(lambda: node.status() is None, "SecretStatuses static-pods to be removed")
        assert not node.state.list(catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS)
        await node.wait_for(lambda: message in caplog.text, f"{message!r} in the controller-runtime log")

    run_node(tmp_path, scenario)
    failures = [r.getMessage() for r in caplog.records if "controller failed" in r.getMessage()]
    assert failures
    assert failures[0].startswith(f"secrets.RootSecretsController: controller failed: {message}: ")
    assert "kubeplane convert-k8s" in failures[0]


# -- issuing only when needed -----------------------------------------------------------------


def test_unrelated_change_keeps_certificates_and_sans_change_reissues(
    tmp_path: Path, bundle: gen.SecretsBundle
) -> None:
    async def scenario(node: Node) -> None:
        document = config_document(bundle)
        node.apply(document)
        status = await node.wait_ready()
        before = node.k8s_certs()
        etcd_before = node.etcd_secrets()
        file_before = (node.component_dir(files.APISERVER) / "apiserver.crt").stat()

        # The bootstrap token reaches RootSecrets but no certificate, file or kubeconfig.
        document["cluster"]["token"] = pki.bootstrap_token()
        document["cluster"]["apiServer"]["image"] = "registry.example.org/kube-apiserver:v1.20.3"
        node.apply(document)
        token = document["cluster"]["token"]
        await node.wait_for(
            lambda: (node.root_secrets("k8s") or {}).get("bootstrapToken") == token,
            "the new token in RootSecrets",
        )
        await asyncio.sleep(SETTLE)
        assert node.k8s_certs() == before
        assert node.etcd_secrets() == etcd_before
        assert node.status() == status
        file_after = (node.component_dir(files.APISERVER) / "apiserver.crt").stat()
        assert (file_after.st_ino, file_after.st_mtime_ns) == (file_before.st_ino, file_before.st_mtime_ns)

        document["cluster"]["apiServer"]["certSANs"].append("new-name.example.org")
        node.apply(document)
        await node.wait_for(lambda: node.k8s_certs() != before, "re-issued Kubernetes certificates")
        info = pki.cert_info(node.k8s_certs()["apiServer"]["crt"].encode())
        assert "new-name.example.org" in info.dns_names
        await node.wait_for(
            lambda: node.status() == {"ready": True, "version": "2", "issued": node.k8s_certs()["issued"]},
            "secrets version 2",
        )
        crt = (node.component_dir(files.APISERVER) / "apiserver.crt").read_text()
        assert crt == node.k8s_certs()["apiServer"]["crt"]
        # etcd certificates do not depend on the API server SANs.
        assert node.etcd_secrets() == etcd_before
        assert node.status("etcd") == {"ready": True, "version": "1", "issued": ""}

    run_node(tmp_path, scenario)


def test_certificates_are_renewed_before_they_expire(tmp_path: Path, bundle: gen.SecretsBundle) -> None:
    clock = Clock()

    async def scenario(node: Node) -> None:
        node.apply(config_document(bundle))
        await node.wait_ready()
        before = node.k8s_certs()["apiServer"]["crt"].encode()
        etcd_before = node.etcd_secrets()

        clock.now += timedelta(days=300)  # one-year certificates are not due yet
        node.runtime.queue(KubernetesSecretsController.name)
        await asyncio.sleep(SETTLE)
        assert node.k8s_certs()["apiServer"]["crt"].encode() == before

        clock.now += timedelta(days=40)  # within the 30-day window before expiry
        node.runtime.queue(KubernetesSecretsController.name)
        node.runtime.queue(EtcdSecretsController.name)
        await node.wait_for(lambda: node.k8s_certs()["apiServer"]["crt"].encode() != before, "renewal")
        renewed = pki.cert_info(node.k8s_certs()["apiServer"]["crt"].encode())
        assert renewed.not_before == (clock.now - timedelta(minutes=5)).replace(microsecond=0)
        assert not pki.needs_renewal(node.k8s_certs()["apiServer"]["crt"].encode(), now=clock.now)
        await node.wait_for(lambda: node.etcd_secrets() != etcd_before, "etcd renewal")
        await node.wait_for(
            lambda: node.status() == {"ready": True, "version": "2", "issued": node.k8s_certs()["issued"]},
            "secrets version 2",
        )

    run_node(tmp_path, scenario, clock=clock)


def test_admin_kubeconfig_lifetime_comes_from_the_config(tmp_path: Path, bundle: gen.SecretsBundle) -> None:
    async def scenario(node: Node) -> None:
        document = config_document(bundle)
        document["cluster"]["adminKubeconfig"] = {"certLifetime": "2h30m"}
        node.apply(document)
        await node.wait_ready()
        _, admin = kubeconfig_of(node.k8s_certs()["adminKubeconfig"])
        assert admin.lifetime == timedelta(hours=2, minutes=30, seconds=0) + timedelta(minutes=5)

    run_node(tmp_path, scenario)


def test_renewal_time_matches_needs_renewal(bundle: gen.SecretsBundle) -> None:
    now = datetime.now(UTC)
    cert = pki.issue(ca=bundle.kubernetes_ca, common_name="x", lifetime=timedelta(days=365), now=now).cert
    due = common.renewal_time(cert)
    assert due == pki.cert_info(cert).not_after - timedelta(days=30)
    assert not pki.needs_renewal(cert, now=due - timedelta(seconds=1))
    assert pki.needs_renewal(cert, now=due)


# -- renewal an operator asks for (kubeplane certs renew) --------------------------------------


def request_renewal(node: Node, not_before: datetime) -> None:
    """What the node API's KubernetesCertificatesRenew call writes."""
    node.state.modify(
        catalog.CONTROLPLANE_NAMESPACE,
        catalog.CERTIFICATE_RENEWALS,
        "k8s-certs",
        lambda _: catalog.CertificateRenewalSpec(not_before=not_before.isoformat()),
    )


def test_renewal_request_reissues_once_with_the_same_cas(tmp_path: Path, bundle: gen.SecretsBundle) -> None:
    clock = Clock()

    async def scenario(node: Node) -> None:
        node.apply(config_document(bundle))
        await node.wait_ready()
        before = node.k8s_certs()
        etcd_before = node.etcd_secrets()

        clock.now += timedelta(hours=1)
        request_renewal(node, clock.now)
        await node.wait_for(lambda: node.k8s_certs() != before, "re-issued Kubernetes certificates")
        renewed = node.k8s_certs()
        assert renewed["issued"] == clock.now.isoformat()
        for name in ("apiServer", "apiServerKubeletClient", "frontProxyClient"):
            assert renewed[name]["crt"] != before[name]["crt"], name
        for name in ("adminKubeconfig", "controllerManagerKubeconfig", "schedulerKubeconfig"):
            assert kubeconfig_of(renewed[name])[1] != kubeconfig_of(before[name])[1], name
        assert pki.is_issued_by(renewed["apiServer"]["crt"].encode(), bundle.kubernetes_ca.cert)
        assert node.root_secrets("k8s") is not None
        await node.wait_for(
            lambda: node.status() == {"ready": True, "version": "2", "issued": renewed["issued"]},
            "secrets version 2 carrying the renewal",
        )
        # etcd's certificates are not part of it.
        assert node.etcd_secrets() == etcd_before

        # The same request again, and the controller woken up for it: nothing more is issued.
        clock.now += timedelta(minutes=5)
        request_renewal(node, clock.now - timedelta(minutes=5))
        node.runtime.queue(KubernetesSecretsController.name)
        await asyncio.sleep(SETTLE)
        assert node.k8s_certs() == renewed
        assert node.status() == {"ready": True, "version": "2", "issued": renewed["issued"]}

    run_node(tmp_path, scenario, clock=clock)


def test_a_restarted_chain_does_not_renew_again_for_an_answered_request(
    tmp_path: Path, bundle: gen.SecretsBundle
) -> None:
    """The request stays in the state; fresh controllers (an agent restart keeping the state) only
    compare it with ``issued``, so they issue nothing."""
    clock = Clock()

    async def main() -> None:
        state = State(default_registry())
        state.create(
            catalog.NETWORK_NAMESPACE,
            catalog.NODE_ADDRESSES,
            catalog.NODE_ADDRESSES_ID,
            spec=catalog.NodeAddressesSpec(hostname=HOSTNAME, addresses=[NODE_IP]),
        )

        def node() -> Node:
            started = Node(
                state, Runtime(state, backoff_initial=0.02, backoff_max=0.1), NodePaths(tmp_path), clock
            )
            for controller in controllers(started.paths, clock):
                started.runtime.register(controller)
            return started

        first = node()
        async with first.runtime:
            first.apply(config_document(bundle))
            await first.wait_ready()
            clock.now += timedelta(hours=1)
            request_renewal(first, clock.now)
            await first.wait_for(
                lambda: first.k8s_certs()["issued"] == clock.now.isoformat(), "renewal for the request"
            )
            await first.wait_for(lambda: (first.status() or {}).get("version") == "2", "secrets version 2")
            renewed = first.k8s_certs()
        clock.now += timedelta(hours=1)
        second = node()
        async with second.runtime:
            await asyncio.sleep(SETTLE)
            assert second.k8s_certs() == renewed
            assert second.status() == {"ready": True, "version": "2", "issued": renewed["issued"]}

    asyncio.run(main())


def test_renewal_requested_compares_the_request_with_the_issue_time() -> None:
    issued = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    existing = {"issued": issued.isoformat()}
    assert common.renewal_requested(existing, None) is None
    assert common.renewal_requested(None, {"notBefore": issued.isoformat()}) is None
    assert common.renewal_requested(existing, {"notBefore": issued.isoformat()}) is None
    assert common.renewal_requested(existing, {"notBefore": (issued - timedelta(days=1)).isoformat()}) is None
    later = (issued + timedelta(seconds=1)).isoformat()
    assert common.renewal_requested(existing, {"notBefore": later}) == (
        f"renewal requested for certificates issued before {later}"
    )
    # Certificates without a readable issue time are older than any request.
    assert common.renewal_requested({}, {"notBefore": later}) is not None
