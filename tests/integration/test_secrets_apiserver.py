"""Real etcd + kube-apiserver started from nothing but what the secrets controllers rendered.

The secrets chain runs on a generated control plane config with a node root under ``tmp_path``;
etcd then starts from ``<secrets>/etcd`` and kube-apiserver with the flags the static pod renderer
gives it (the container's binary path swapped for the toolchain's, bound to loopback). If a file,
SAN, key usage or kubeconfig were wrong, one of the components would refuse it here.
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import ssl
import uuid
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from kubernetes import client as k8s
from official_client import api_client

from kubeplane import pki
from kubeplane.clients import etcd as etcd_client
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import files, render
from kubeplane.controllers.secrets import render_etcd
from kubeplane.controllers.secrets.etcd import EtcdSecretsController
from kubeplane.controllers.secrets.kubernetes import KubernetesSecretsController
from kubeplane.controllers.secrets.render import RenderSecretsStaticPodController
from kubeplane.controllers.secrets.render_etcd import RenderEtcdSecretsController
from kubeplane.controllers.secrets.root import RootSecretsController
from kubeplane.provision import toolchain
from kubeplane.resources import State, catalog, default_registry
from kubeplane.runtime import Runtime

if TYPE_CHECKING:
    from conftest import Processes

pytestmark = pytest.mark.integration

KUBERNETES_VERSION = "v1.20.2"


def run_secrets_chain(paths: NodePaths, document: dict[str, Any]) -> dict[str, Any]:
    """Run the secrets controllers until both statuses are ready; the KubernetesSecrets spec."""

    async def main() -> dict[str, Any]:
        state = State(default_registry())
        state.create(
            catalog.NETWORK_NAMESPACE,
            catalog.NODE_ADDRESSES,
            catalog.NODE_ADDRESSES_ID,
            spec=catalog.NodeAddressesSpec(hostname="cp-test", addresses=["10.213.255.2"]),
        )
        state.create(
            catalog.CONFIG_NAMESPACE,
            catalog.MACHINE_CONFIGS,
            catalog.MACHINE_CONFIG_ID,
            spec=catalog.MachineConfigSpec(data=document),
        )
        runtime = Runtime(state)
        for controller in (
            RootSecretsController(),
            EtcdSecretsController(),
            KubernetesSecretsController(),
            RenderSecretsStaticPodController(paths=paths),
            RenderEtcdSecretsController(paths=paths),
        ):
            runtime.register(controller)

        def ready(resource_id: str) -> bool:
            status = state.find(catalog.CONTROLPLANE_NAMESPACE, catalog.SECRET_STATUSES, resource_id)
            return status is not None and status.spec.to_dict()["ready"] is True

        async with runtime:
            for _ in range(500):
                if ready(catalog.STATIC_POD_SECRETS_ID) and ready(render_etcd.ETCD_STATUS_ID):
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the secrets controllers did not report both SecretStatuses ready within 5 s")
        return state.get(catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, "k8s-certs").spec.to_dict()

    return asyncio.run(main())


def etcd_binary() -> Path:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if found is None:
        pytest.fail("etcd is missing; run scripts/setup to install the real components", pytrace=False)
    return Path(found)


def apiserver_binary() -> Path:
    path = toolchain.Toolchain().paths(KUBERNETES_VERSION).binary("kube-apiserver")
    if not path.is_file():
        pytest.fail(f"{path} is missing; run scripts/setup to build the Kubernetes toolchain", pytrace=False)
    return path


def test_apiserver_runs_on_rendered_secrets_only(
    tmp_path: Path,
    processes: Processes,
    free_port: Callable[..., int],
    wait_until: Callable[..., Any],
) -> None:
    paths = NodePaths(tmp_path / "node")
    api_port, etcd_port, peer_port = free_port(), free_port(), free_port()
    options = gen.GenOptions(cluster_name="secrets-it", endpoint=f"127.0.0.1:{api_port}")
    document = copy.deepcopy(dict(gen.generate(options, gen.new_secrets()).documents["controlplane"]))
    document["cluster"]["controlPlane"]["localAPIServerPort"] = api_port
    k8s_certs = run_secrets_chain(paths, document)

    etcd_dir = render_etcd.etcd_secrets_dir(paths)
    etcd_url, peer_url = f"https://127.0.0.1:{etcd_port}", f"https://127.0.0.1:{peer_port}"
    etcd = processes.start(
        [
            etcd_binary(),
            "--name=cp-test",
            f"--data-dir={tmp_path / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=cp-test={peer_url}",
            "--client-cert-auth=true",
            "--peer-client-cert-auth=true",
            f"--trusted-ca-file={etcd_dir / 'ca.crt'}",
            f"--cert-file={etcd_dir / 'server.crt'}",
            f"--key-file={etcd_dir / 'server.key'}",
            f"--peer-trusted-ca-file={etcd_dir / 'ca.crt'}",
            f"--peer-cert-file={etcd_dir / 'peer.crt'}",
            f"--peer-key-file={etcd_dir / 'peer.key'}",
        ],
        name="etcd",
    )
    etcd_tls = etcd_client.tls_context(
        ca=(etcd_dir / "ca.crt").read_bytes(),
        cert=(etcd_dir / "client.crt").read_bytes(),
        key=(etcd_dir / "client.key").read_bytes(),
    )

    async def etcd_call(call: Callable[[etcd_client.EtcdClient], Any]) -> Any:
        async with etcd_client.EtcdClient([etcd_url], tls=etcd_tls) as client:
            return await call(client)

    wait_until(
        lambda: asyncio.run(etcd_call(lambda c: c.status())).leader != 0,
        timeout=30,
        what="etcd (rendered certificates) to elect itself leader",
        logs=etcd.tail,
    )

    image = document["cluster"]["apiServer"]["image"]
    pod = render.render_apiserver(
        render.ControlPlaneInputs(
            advertise_address="127.0.0.1",
            pod_cidrs=("10.244.0.0/16",),
            service_cidrs=("10.96.0.0/12",),
            # Loopback only: the test must not listen on the machine's addresses.
            apiserver=render.ComponentInputs(image, "1", extra_args={"bind-address": "127.0.0.1"}),
            controller_manager=render.ComponentInputs(image, "1"),
            scheduler=render.ComponentInputs(image, "1"),
            secrets_version="1",
            local_api_port=api_port,
            etcd_servers=(etcd_url,),
        ),
        node_root=PurePosixPath(paths.root),
    )
    (paths.root / render.DEFAULT_AUDIT_LOG_DIR).mkdir(parents=True, exist_ok=True)
    command = pod["spec"]["containers"][0]["command"]
    apiserver = processes.start([apiserver_binary(), *command[1:]], name="kube-apiserver")

    apiserver_dir = Path(files.secrets_dir(files.APISERVER, node_root=PurePosixPath(paths.root)))
    trust = ssl.create_default_context(cadata=(apiserver_dir / "ca.crt").read_text())

    def readyz() -> bool:
        if apiserver.process.poll() is not None:
            pytest.fail(f"kube-apiserver exited\n{apiserver.tail()}", pytrace=False)
        response = httpx.get(f"https://127.0.0.1:{api_port}/readyz", verify=trust, timeout=5)
        return response.status_code == httpx.codes.OK

    wait_until(readyz, timeout=90, what="kube-apiserver /readyz (verified with ca.crt)", logs=apiserver.tail)

    # The admin kubeconfig's endpoint, CA and system:masters certificate all work.
    admin = api_client(k8s_certs["adminKubeconfig"])
    core = k8s.CoreV1Api(admin)
    assert "kube-system" in {item.metadata.name for item in core.list_namespace().items}

    # The scheduler's kubeconfig, read from disk, authenticates as system:kube-scheduler.
    scheduler_kubeconfig = apiserver_dir.parent / files.SCHEDULER / files.KUBECONFIG.name
    k8s.CoreV1Api(api_client(scheduler_kubeconfig.read_text())).list_node()
    with pytest.raises(k8s.ApiException) as caught:
        k8s.CoreV1Api(api_client(scheduler_kubeconfig.read_text())).list_namespaced_secret("kube-system")
    assert caught.value.status == 403

    # Secrets are encrypted at rest with the rendered encryption config.
    name = f"it-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_secret("default", k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), data={}))
    raw = asyncio.run(etcd_call(lambda c: c.get_value(f"/registry/secrets/default/{name}".encode())))
    assert raw is not None and raw.startswith(b"k8s:enc:aescbc:v1:key1:")

    # The serving certificate the API server presents is the rendered one.
    served = ssl.get_server_certificate(("127.0.0.1", api_port))
    assert (
        pki.cert_info(served.encode()).serial_number
        == pki.cert_info((apiserver_dir / "apiserver.crt").read_bytes()).serial_number
    )
