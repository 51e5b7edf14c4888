"""ManifestController and ExtraManifestController on a real runtime; pure parts of ManifestApply."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from k8s_harness import LocalServer, eventually, publish_addresses, publish_config, put, run, settle

from kubeplane import pki
from kubeplane.clients import kube
from kubeplane.config.paths import NodePaths
from kubeplane.controllers.k8s import manifest_apply
from kubeplane.controllers.k8s.control_plane import K8sControlPlaneController
from kubeplane.controllers.k8s.extra_manifest import ExtraManifestController
from kubeplane.controllers.k8s.manifest import ManifestController
from kubeplane.resources import State, catalog

pytestmark = pytest.mark.unit

BOOTSTRAP_TOKEN = "abcdef.0123456789abcdef"
GUIDE_IDS = [
    "00-kubelet-bootstrapping-token",
    "01-csr-approver-role-binding",
    "01-csr-node-bootstrap",
    "01-csr-renewal-role-binding",
    "01-trustd-discovery",
    "02-kube-system-sa-role-binding",
    "03-default-pod-security-policy",
    "10-kube-proxy",
    "11-core-dns",
    "11-core-dns-svc",
    "11-kube-config-in-cluster",
]


def ids(state: State, namespace: str) -> list[str]:
    return [resource.id for resource in state.list(namespace, catalog.MANIFESTS)]


def test_bootstrap_manifest_ids(doc: dict[str, Any]) -> None:
    async def body(state: State) -> None:
        publish_addresses(state)
        publish_config(state, doc)
        await settle()
        assert ids(state, catalog.CONTROLPLANE_NAMESPACE) == [], "no manifests without the bootstrap token"
        root = catalog.RootSecretSpec(data={"bootstrapToken": BOOTSTRAP_TOKEN})
        put(state, catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, "k8s", root)
        expected = sorted([*GUIDE_IDS, "05-flannel"])
        await eventually(lambda: ids(state, catalog.CONTROLPLANE_NAMESPACE) == expected, what="flannel ids")
        token = state.get(catalog.CONTROLPLANE_NAMESPACE, catalog.MANIFESTS, "00-kubelet-bootstrapping-token")
        assert token.spec.to_dict()["items"][0]["stringData"]["token-id"] == "abcdef"

        # The guide's list is a cluster with a custom CNI: no flannel manifest.
        doc["cluster"]["network"] = {"cni": {"name": "custom", "urls": ["https://example.test/cni.yaml"]}}
        publish_config(state, doc)
        await eventually(lambda: ids(state, catalog.CONTROLPLANE_NAMESPACE) == GUIDE_IDS, what="guide ids")

    run([K8sControlPlaneController(), ManifestController()], body)


def test_bad_extra_manifest_does_not_block_the_others(
    doc: dict[str, Any], local_server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    good = local_server.serve(
        "/good.yaml", b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\n---\nkind: ConfigMap\n"
    )
    missing = local_server.url("/missing.yaml")
    unreachable = "http://127.0.0.1:9/nothing.yaml"
    doc["cluster"]["extraManifests"] = [good, missing, unreachable]
    doc["cluster"]["extraManifestHeaders"] = {"X-Token": "secret-header"}
    doc["cluster"]["inlineManifests"] = [
        {"name": "valid", "contents": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n"},
        {"name": "broken", "contents": "kind: [unclosed\n"},
        {"name": "scalar", "contents": "just a string\n"},
    ]

    async def body(state: State) -> None:
        publish_addresses(state)
        publish_config(state, doc)
        expected = [f"99-{good}", "99-valid"]
        await eventually(lambda: ids(state, catalog.EXTRAS_NAMESPACE) == expected, what="good extras")
        downloaded = state.get(catalog.EXTRAS_NAMESPACE, catalog.MANIFESTS, f"99-{good}")
        assert downloaded.spec.to_dict()["items"] == [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
            {"kind": "ConfigMap"},
        ]
        await eventually(
            lambda: all(
                any(text in record.getMessage() for record in caplog.records)
                for text in (missing, unreachable, "'broken' is not valid YAML", "'scalar'")
            ),
            what="an error per bad manifest",
        )

    with caplog.at_level("ERROR", logger="controller-runtime"):
        run([K8sControlPlaneController(), ExtraManifestController(retry_interval=60)], body)
    assert any(headers.get("X-Token") == "secret-header" for headers in local_server.seen_headers)
    assert "404" in next(r.getMessage() for r in caplog.records if missing in r.getMessage())


def test_credentials_in_an_extra_manifest_url_stay_out_of_ids_and_logs(
    doc: dict[str, Any], local_server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    served = local_server.serve("/private.yaml?token=s3cr3t", b"kind: ConfigMap\n")
    scheme, rest = served.split("://", 1)
    private = f"{scheme}://deploy:hunter2@{rest}"
    failing = private.replace("private", "gone")
    doc["cluster"]["extraManifests"] = [private, failing]

    async def body(state: State) -> None:
        publish_addresses(state)
        publish_config(state, doc)
        shown = f"99-{scheme}://***@{rest.split('?')[0]}?***"
        await eventually(lambda: ids(state, catalog.EXTRAS_NAMESPACE) == [shown], what="the private manifest")
        await eventually(lambda: any("404" in r.getMessage() for r in caplog.records), what="the 404 logged")

    with caplog.at_level("ERROR", logger="controller-runtime"):
        run([K8sControlPlaneController(), ExtraManifestController(retry_interval=60)], body)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "hunter2" not in logged and "s3cr3t" not in logged and "***@" in logged
    # The download itself used them: basic auth from the URL's user info.
    assert any(headers.get("Authorization", "").startswith("Basic ") for headers in local_server.seen_headers)


def test_an_https_extra_manifest_is_trusted_once_its_ca_is_in_the_machines_bundle(
    doc: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The custom-CA guide: a PEM appended to the machine's CA bundle is trusted by the agent's own
    downloads, as by containerd's pulls."""
    ca = pki.new_ca("internal-ca")
    served = pki.issue(ca=ca, common_name="manifests", ip_addresses=["127.0.0.1"], usages=("server",))
    (tmp_path / "server.crt").write_bytes(served.cert)
    (tmp_path / "server.key").write_bytes(served.key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    paths = NodePaths(root=tmp_path / "node")
    bundle = paths.ca_bundles[1]  # the guide's /etc/ssl/certs/ca-certificates
    bundle.parent.mkdir(parents=True)
    bundle.write_bytes(pki.new_ca("some-other-ca").cert)
    paths.ca_bundles[0].write_text("not a certificate\n")  # a broken bundle does not stop the other
    server = LocalServer(tls=context)
    server.thread.start()
    try:
        url = server.serve("/cni.yaml", b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cni\n")
        doc["cluster"]["extraManifests"] = [url]

        async def body(state: State) -> None:
            publish_addresses(state)
            publish_config(state, doc)
            await eventually(
                lambda: any("CERTIFICATE_VERIFY_FAILED" in r.getMessage() for r in caplog.records),
                what="the download refused while the machine does not trust the CA",
            )
            assert ids(state, catalog.EXTRAS_NAMESPACE) == []
            with bundle.open("ab") as handle:  # what machine.files' `op: append` does
                handle.write(ca.cert)
            expected = [f"99-{url}"]
            await eventually(lambda: ids(state, catalog.EXTRAS_NAMESPACE) == expected, what="the manifest")

        controller = ExtraManifestController(ca_bundles=paths.ca_bundles, retry_interval=0.2)
        with caplog.at_level("WARNING"):
            run([K8sControlPlaneController(), controller], body)
    finally:
        server.server.shutdown()
        server.server.server_close()
    assert any(f"CA bundle {paths.ca_bundles[0]} not used" in r.getMessage() for r in caplog.records)


def test_apply_order_puts_namespaces_and_crds_first() -> None:
    ns = {"kind": "Namespace", "metadata": {"name": "x"}}
    crd = {"kind": "CustomResourceDefinition", "metadata": {"name": "c"}}
    cm = {"kind": "ConfigMap", "metadata": {"name": "m"}}
    sa = {"kind": "ServiceAccount", "metadata": {"name": "s"}}
    order = manifest_apply.apply_order([("99-b", [cm, crd]), ("10-a", [sa, ns])])
    assert order == [("10-a", ns), ("99-b", crd), ("10-a", sa), ("99-b", cm)]


def test_describe_and_resource_paths() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t", "namespace": "kube-system"}}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}}
    assert manifest_apply.describe(secret) == "v1/Secret/kube-system/t"
    assert manifest_apply.describe(role) == "rbac.authorization.k8s.io/v1/ClusterRole/r"
    secrets = kube.ApiResource(base="/api/v1", plural="secrets", namespaced=True)
    assert secrets.path(namespace="kube-system") == "/api/v1/namespaces/kube-system/secrets"
    assert secrets.path(namespace="kube-system", name="t") == "/api/v1/namespaces/kube-system/secrets/t"
    roles = kube.ApiResource(
        base="/apis/rbac.authorization.k8s.io/v1", plural="clusterroles", namespaced=False
    )
    assert roles.path(namespace=None, name="r") == "/apis/rbac.authorization.k8s.io/v1/clusterroles/r"
