"""`kubeplane gen`: generated machine configs (golden files), secrets bundles, patches, manual PKI flow.

Golden files live in tests/unit/golden/gen/; key material and tokens are replaced by placeholders
before comparing. Regenerate after an intended change with ``KUBEPLANE_UPDATE_GOLDEN=1`` and review
the diff.
"""

from __future__ import annotations

import base64
import copy
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner, Result

from kubeplane import pki
from kubeplane.cli import gen as gen_cli
from kubeplane.config import client, document, validate
from kubeplane.config import generate as gen
from kubeplane.config.errors import ConfigError

pytestmark = pytest.mark.unit

GOLDEN_DIR = Path(__file__).resolve().parent / "golden" / "gen"
UPDATE_ENV = "KUBEPLANE_UPDATE_GOLDEN"
SECRET_FIELDS = {"crt", "key", "token", "aescbcEncryptionSecret", "ca"}


def run(*args: str, cwd: Path | None = None) -> Result:
    root = click.Group()
    gen_cli.register(root)
    runner = CliRunner()
    if cwd is None:
        return runner.invoke(root, ["gen", *args])
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return runner.invoke(root, ["gen", *args])
    finally:
        os.chdir(old)


def normalise(node: Any) -> Any:
    """Replace generated secrets with placeholders that still show which fields are present."""
    if isinstance(node, dict):
        return {
            key: f"<{key}>" if key in SECRET_FIELDS and isinstance(value, str) and value else normalise(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [normalise(item) for item in node]
    return node


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN_DIR / name
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"golden file {path} missing: run with {UPDATE_ENV}=1 to create it"
    assert text == path.read_text(), f"{name} differs from its golden file (regenerate with {UPDATE_ENV}=1)"


def private_keys(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict):
        found = [f"{path}.{k}" for k, v in node.items() if k == "key" and v]
        return found + [p for k, v in node.items() for p in private_keys(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in private_keys(v, f"{path}[{i}]")]
    return []


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    result = run(
        "config",
        "demo",
        "https://10.5.0.1:6443",
        "-o",
        str(out),
        "--with-init",
        "--additional-sans",
        "demo.example.com,10.5.0.100",
        "--registry-mirror",
        "*=http://10.5.0.1:6000",
        "--registry-mirror",
        "docker.io=http://10.5.0.1:6001",
        "--config-patch",
        '[{"op": "add", "path": "/machine/network/nameservers", "value": ["10.5.0.1"]}]',
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("name", ["init.yaml", "controlplane.yaml", "worker.yaml", "kubeplaneconfig"])
def test_gen_config_golden(generated: Path, name: str) -> None:
    doc = yaml.safe_load((generated / name).read_text())
    assert_golden(name, gen.dump_yaml(normalise(doc)))
    assert stat.S_IMODE((generated / name).stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["init.yaml", "controlplane.yaml", "worker.yaml"])
def test_generated_configs_load_and_validate(generated: Path, name: str) -> None:
    loaded = document.load((generated / name).read_text())
    assert loaded.model.cluster.control_plane.endpoint == "https://10.5.0.1:6443"
    validate.validate(yaml.safe_load((generated / name).read_text()))


def test_worker_never_holds_private_keys(generated: Path) -> None:
    worker = yaml.safe_load((generated / "worker.yaml").read_text())
    assert private_keys(worker) == []
    for absent in ("aescbcEncryptionSecret", "aggregatorCA", "serviceAccount", "etcd"):
        assert absent not in worker["cluster"]
    control = yaml.safe_load((generated / "controlplane.yaml").read_text())
    assert sorted(private_keys(control)) == [
        ".cluster.aggregatorCA.key",
        ".cluster.ca.key",
        ".cluster.etcd.ca.key",
        ".cluster.serviceAccount.key",
        ".machine.ca.key",
    ]
    # Both node types trust the same CAs.
    assert worker["machine"]["ca"]["crt"] == control["machine"]["ca"]["crt"]
    assert worker["cluster"]["ca"]["crt"] == control["cluster"]["ca"]["crt"]


def test_client_config_holds_admin_cert_of_os_ca(generated: Path, tmp_path: Path) -> None:
    control = yaml.safe_load((generated / "controlplane.yaml").read_text())
    config = client.load(generated / "kubeplaneconfig")
    name, context = client.current(config)
    assert name == "demo"
    assert context.endpoints == ("10.5.0.1",)
    os_ca = base64.b64decode(control["machine"]["ca"]["crt"])
    assert context.ca_pem == os_ca
    info = pki.cert_info(context.client.cert)
    assert info.organizations == (pki.ROLE_ADMIN,)
    assert info.extended_key_usages == ("client",)
    (tmp_path / "ca.crt").write_bytes(os_ca)
    (tmp_path / "admin.crt").write_bytes(context.client.cert)
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "admin.crt")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr


def test_ca_key_pairs_in_controlplane_match(generated: Path) -> None:
    control = yaml.safe_load((generated / "controlplane.yaml").read_text())
    cluster = control["cluster"]
    for pair in (control["machine"]["ca"], cluster["ca"], cluster["aggregatorCA"], cluster["etcd"]["ca"]):
        ca = pki.CertKey(cert=base64.b64decode(pair["crt"]), key=base64.b64decode(pair["key"]))
        pki.issue(ca=ca, common_name="probe")  # raises CAError if the key does not match
    assert pki.cert_info(base64.b64decode(cluster["aggregatorCA"]["crt"])).subject_cn == "front-proxy"


def test_from_secrets_keeps_the_pki(tmp_path: Path) -> None:
    assert run("secrets", "-o", str(tmp_path / "s.yaml")).exit_code == 0
    assert stat.S_IMODE((tmp_path / "s.yaml").stat().st_mode) == 0o600
    bundle = gen.load_secrets((tmp_path / "s.yaml").read_text())
    for out in ("a", "b"):
        result = run(
            "config", "c", "10.5.0.1", "--from-secrets", str(tmp_path / "s.yaml"), "-o", str(tmp_path / out)
        )
        assert result.exit_code == 0, result.output
    a, b = (yaml.safe_load((tmp_path / d / "controlplane.yaml").read_text()) for d in ("a", "b"))
    assert a == b
    assert base64.b64decode(a["cluster"]["ca"]["key"]) == bundle.kubernetes_ca.key
    assert a["cluster"]["token"] == bundle.bootstrap_token
    assert a["machine"]["token"] == bundle.trustd_token


def test_secrets_bundle_roundtrip_and_errors() -> None:
    bundle = gen.new_secrets()
    assert gen.load_secrets(gen.dump_yaml(gen.secrets_to_dict(bundle))) == bundle
    broken = gen.secrets_to_dict(bundle)
    del broken["certs"]["etcd"]["key"]
    broken["secrets"]["bootstraptoken"] = ""
    with pytest.raises(gen.GenerateError) as info:
        gen.secrets_from_dict(broken, source="s.yaml")
    message = str(info.value)
    assert "s.yaml" in message
    assert "certs.etcd.key: missing" in message
    assert "secrets.bootstraptoken: missing" in message
    # Structural problems come first; PEM contents are checked once every field is present.
    unparsable = gen.secrets_to_dict(bundle)
    unparsable["certs"]["os"]["crt"] = base64.b64encode(b"junk").decode()
    with pytest.raises(gen.GenerateError, match=r"certs\.os: not a PEM certificate"):
        gen.secrets_from_dict(unparsable)


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    (tmp_path / "worker.yaml").write_text("mine\n")
    result = run("config", "c", "10.5.0.1", "-o", str(tmp_path))
    assert result.exit_code == 1
    assert "worker.yaml already exists" in result.output
    assert "--force" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker.yaml"]  # nothing else written
    assert run("config", "c", "10.5.0.1", "-o", str(tmp_path), "--force").exit_code == 0
    assert (tmp_path / "worker.yaml").read_text().startswith("version: v1alpha1")


def test_config_patches(tmp_path: Path) -> None:
    patch_file = tmp_path / "p.yaml"
    patch_file.write_text("cluster:\n  network:\n    dnsDomain: corp.local\n  extraManifests: null\n")
    result = run(
        "config",
        "c",
        "10.5.0.1",
        "-o",
        str(tmp_path / "out"),
        "--config-patch",
        f"@{patch_file}",
        "--config-patch",
        '[{"op": "replace", "path": "/machine/kubelet/image", "value": "kubeplane/kubelet:v1.20.5"}]',
    )
    assert result.exit_code == 0, result.output
    for name in ("controlplane.yaml", "worker.yaml"):
        doc = yaml.safe_load((tmp_path / "out" / name).read_text())
        assert doc["cluster"]["network"]["dnsDomain"] == "corp.local"
        assert doc["machine"]["kubelet"]["image"] == "kubeplane/kubelet:v1.20.5"
        assert "extraManifests" not in doc["cluster"]


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            '[{"op": "remove", "path": "/machine/nope"}]',
            "controlplane.yaml, config patch #1 (JSON patch)",
        ),
        ('{"machine": {"type": "bogus"}}', 'machine.type: "bogus" is not allowed'),
        ("42", "must be a list of JSON patch operations or a mapping"),
    ],
)
def test_bad_patches_write_nothing(tmp_path: Path, patch: str, expected: str) -> None:
    result = run("config", "c", "10.5.0.1", "-o", str(tmp_path / "out"), "--config-patch", patch)
    assert result.exit_code == 1
    assert expected in result.output
    assert not (tmp_path / "out").exists()


def test_apply_patches_is_atomic_and_never_changes_its_input() -> None:
    original = gen.generate(gen.GenOptions(cluster_name="c", endpoint="10.5.0.1"), gen.new_secrets())
    doc = original.documents["worker"]
    before = copy.deepcopy(doc)
    good = {"op": "add", "path": "/machine/certSANs/-", "value": "x"}
    with pytest.raises(ConfigError, match=r"config patch #2 \(JSON patch\)"):
        gen.apply_patches(doc, [[good], [good, {"op": "remove", "path": "/zz"}]])
    patched = gen.apply_patches(doc, [[good], {"machine": {"certSANs": ["y"], "registries": None}}])
    assert patched["machine"]["certSANs"] == ["y"]
    assert "registries" not in patched["machine"]
    assert doc == before


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("10.5.0.1", "https://10.5.0.1:6443"),
        ("lb.example.com:443", "https://lb.example.com:443"),
        ("https://10.5.0.1:6443", "https://10.5.0.1:6443"),
        ("https://[fd00::1]", "https://[fd00::1]:6443"),
    ],
)
def test_normalize_endpoint(endpoint: str, expected: str) -> None:
    assert gen.normalize_endpoint(endpoint) == expected


@pytest.mark.parametrize(
    "endpoint", ["http://10.5.0.1:6443", "https://", "https://a:99999", "https://a/path"]
)
def test_bad_endpoints(endpoint: str) -> None:
    with pytest.raises(gen.GenerateError, match="endpoint"):
        gen.normalize_endpoint(endpoint)


def test_bad_inputs() -> None:
    with pytest.raises(gen.GenerateError, match="HOST=URL"):
        gen.parse_mirrors(["docker.io"])
    assert gen.parse_mirrors(["a=u1", "a=u2", "*=u3"]) == {"a": ("u1", "u2"), "*": ("u3",)}
    assert gen.normalize_version("1.20.2") == "v1.20.2"
    with pytest.raises(gen.GenerateError, match="not a version"):
        gen.normalize_version("latest")
    result = run("config", "c", "10.5.0.1", "--kubernetes-version", "latest")
    assert result.exit_code == 1
    assert "'latest' is not a version" in result.output


def test_manual_admin_certificate_flow(tmp_path: Path) -> None:
    for args in (
        ["ca", "--organization", "ca"],
        ["key", "--name", "admin"],
        ["csr", "--key", "admin.key", "--ip", "127.0.0.1"],
        ["crt", "--ca", "ca", "--csr", "admin.csr", "--name", "admin", "--hours", "48"],
    ):
        result = run(*args, cwd=tmp_path)
        assert result.exit_code == 0, result.output
    for name in ("ca.key", "admin.key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", "ca.crt", "admin.crt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    info = pki.cert_info((tmp_path / "admin.crt").read_bytes())
    assert info.organizations == (pki.ROLE_ADMIN,)
    assert info.ip_addresses == ("127.0.0.1",)
    assert info.lifetime.total_seconds() / 3600 <= 48.1
    assert (tmp_path / "ca.sha256").read_text().strip() == pki.ca_cert_hash(
        (tmp_path / "ca.crt").read_bytes()
    )
    # Renewal with the same key: a new certificate, refused without --force.
    again = run("crt", "--ca", "ca", "--csr", "admin.csr", "--name", "admin", cwd=tmp_path)
    assert again.exit_code == 1
    assert "admin.crt already exists" in again.output


def test_manual_pki_errors(tmp_path: Path) -> None:
    assert run("key", "--name", "k", cwd=tmp_path).exit_code == 0
    bad_role = run("csr", "--key", "k.key", "--ip", "1.2.3.4", "--roles", "root", cwd=tmp_path)
    assert bad_role.exit_code == 2
    assert "unknown role(s) root" in bad_role.output
    missing = run("crt", "--ca", "nope", "--csr", "k.csr", "--name", "x", cwd=tmp_path)
    assert missing.exit_code == 1
    assert "cannot read CA certificate nope.crt" in missing.output
