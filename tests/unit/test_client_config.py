"""The client config file: parsing, saving, context resolution, merging."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kubeplane import pki
from kubeplane.config import client

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def creds() -> tuple[bytes, pki.CertKey]:
    ca = pki.new_ca("machine")
    return ca.cert, pki.issue(ca=ca, common_name="admin", organizations=[pki.ROLE_ADMIN], usages=["client"])


def make_context(creds: tuple[bytes, pki.CertKey], *endpoints: str) -> client.Context:
    ca, admin = creds
    return client.Context.from_pem(endpoints=endpoints, ca=ca, client=admin)


def test_missing_file_is_empty_config(tmp_path: Path) -> None:
    assert client.load(tmp_path / "nope") == client.ClientConfig()


def test_save_load_roundtrip_is_atomic_and_private(tmp_path: Path, creds: tuple[bytes, pki.CertKey]) -> None:
    config = client.add_context(client.ClientConfig(), "demo", make_context(creds, "10.5.0.2"))
    config = client.set_nodes(config, ["10.5.0.2", "10.5.0.3"])
    path = tmp_path / "sub" / "config"
    client.save(config, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert client.load(path) == config
    assert os.listdir(path.parent) == ["config"]  # no temporary file left behind
    text = path.read_text()
    assert text.index("context:") < text.index("contexts:")
    assert (
        text.index("endpoints:")
        < text.index("nodes:")
        < text.index("ca:")
        < text.index("crt:")
        < text.index("key:")
    )
    name, ctx = client.current(client.load(path))
    assert name == "demo"
    assert ctx.ca_pem == creds[0]
    assert ctx.client == creds[1]
    assert pki.cert_info(ctx.client.cert).organizations == (pki.ROLE_ADMIN,)


def test_loads_reports_every_problem_with_its_path() -> None:
    text = """
context: 3
extra: 1
contexts:
  a:
    endpoints: 10.5.0.2
    ca: "!!!not base64"
    colour: blue
  b: []
"""
    with pytest.raises(client.ClientConfigError) as info:
        client.loads(text, source="cfg.yaml")
    message = str(info.value)
    for expected in (
        "cfg.yaml",
        "extra: unknown key",
        "context: expected a context name",
        "contexts.a.endpoints: expected a list",
        "contexts.a.ca: not valid base64",
        "contexts.a.colour: unknown key",
        "contexts.b: expected a mapping",
    ):
        assert expected in message
    with pytest.raises(client.ClientConfigError, match="not valid YAML"):
        client.loads("a: [", source="x")


def test_original_talosconfig_shape_loads() -> None:
    config = client.loads(
        "context: c\ncontexts:\n  c:\n    endpoints: [1.2.3.4]\n    ca: YQ==\n    crt: Yg==\n    key: Yw==\n"
    )
    assert client.current(config) == (
        "c",
        client.Context(endpoints=("1.2.3.4",), ca="YQ==", crt="Yg==", key="Yw=="),
    )


def test_current_context_errors_name_the_context(creds: tuple[bytes, pki.CertKey]) -> None:
    with pytest.raises(client.ClientConfigError, match="no contexts"):
        client.current(client.ClientConfig())
    config = client.ClientConfig(context="gone", contexts={"a": make_context(creds, "x")})
    with pytest.raises(
        client.ClientConfigError, match=r"'gone' is not in the client config \(available: a\)"
    ):
        client.current(config)
    assert client.current(config, "a")[0] == "a"
    with pytest.raises(client.ClientConfigError, match="no current context"):
        client.current(client.ClientConfig(contexts={"a": make_context(creds, "x")}))


def test_merge_renames_on_conflict(creds: tuple[bytes, pki.CertKey]) -> None:
    base = client.add_context(client.ClientConfig(), "demo", make_context(creds, "1.1.1.1"))
    base = client.add_context(base, "demo-1", make_context(creds, "2.2.2.2"), make_current=False)
    incoming = client.add_context(client.ClientConfig(), "demo", make_context(creds, "3.3.3.3"))
    merged, renames = client.merge(base, incoming)
    assert renames == {"demo": "demo-2"}
    assert merged.context == "demo-2"
    assert merged.contexts["demo-2"].endpoints == ("3.3.3.3",)
    assert merged.contexts["demo"].endpoints == ("1.1.1.1",)
    assert base.contexts.keys() == {"demo", "demo-1"}  # inputs are not mutated
    kept, none = client.merge(base, client.ClientConfig())
    assert (kept, none) == (base, {})


def test_add_remove_use_and_set(creds: tuple[bytes, pki.CertKey]) -> None:
    config = client.add_context(client.ClientConfig(), "a", make_context(creds, "1.1.1.1"))
    config = client.add_context(config, "b", make_context(creds, "2.2.2.2"), make_current=False)
    assert config.context == "a"
    with pytest.raises(client.ClientConfigError, match="'a' already exists"):
        client.add_context(config, "a", make_context(creds))
    config = client.set_endpoints(config, ["9.9.9.9"], context="b")
    assert config.contexts["b"].endpoints == ("9.9.9.9",)
    assert config.contexts["a"].endpoints == ("1.1.1.1",)
    config = client.use_context(config, "b")
    assert config.context == "b"
    config = client.remove_context(config, "b")
    assert config.context is None
    assert list(config.contexts) == ["a"]
    with pytest.raises(client.ClientConfigError, match="'b' is not in the client config"):
        client.remove_context(config, "b")


def test_resolve_path_precedence(tmp_path: Path) -> None:
    assert client.resolve_path("x/y", env={client.ENV_VAR: "z"}) == Path("x/y")
    assert client.resolve_path(None, env={client.ENV_VAR: str(tmp_path / "c")}) == tmp_path / "c"
    assert client.resolve_path(None, env={}) == Path.home() / ".kubeplane" / "config"
