"""machine.files paths: only the node's allowed places, refused at validation with the field path."""

from __future__ import annotations

import json

import pytest

from kubeplane import config
from kubeplane.config import machine_files

pytestmark = pytest.mark.unit


def document(*files: dict[str, object]) -> str:
    return json.dumps(
        {
            "version": "v1alpha1",
            "machine": {"type": "worker", "files": list(files)},
            "cluster": {"controlPlane": {"endpoint": "https://10.5.0.1:6443"}},
        }
    )


def errors_of(text: str) -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        config.load(text)
    return [str(error) for error in caught.value.errors]


@pytest.mark.parametrize(
    "path",
    [
        "/var/cri/conf.d/metrics.toml",  # the containerd guide
        "/etc/ssl/certs/ca-certificates",  # the certificate authorities guide
        "/etc/ssl/certs/ca-certificates.crt",  # Debian's bundle
        "/var/local/data/settings.json",
    ],
)
def test_the_guides_paths_and_the_allowed_places_validate(path: str) -> None:
    loaded = config.load(document({"content": "x", "path": path, "op": "append"}))
    assert loaded.model.machine.files is not None and loaded.model.machine.files[0].path == path


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/system/config.yaml", "is not a place machine.files may write"),
        ("/proc/sys/kernel/hostname", "is not a place machine.files may write"),
        ("/etc/kubernetes/manifests/evil.yaml", "is not a place machine.files may write"),
        ("/etc/ssl/certs/other.pem", "is not a place machine.files may write"),
        ("/var/lib/kubelet/config.yaml", "is not a place machine.files may write"),
        ("/var/cri", "is not a place machine.files may write"),  # the directory itself
        ("/var/cri/../../system/config.yaml", "has empty, . or .. components"),
        ("/var/cri/./x.toml", "has empty, . or .. components"),
        ("/var/cri//x.toml", "has empty, . or .. components"),
        ("/var/cri/conf.d/", "ends with /"),
    ],
)
def test_other_places_and_unplain_paths_are_refused_with_the_field_path(path: str, problem: str) -> None:
    ok = {"content": "x", "path": "/var/cri/conf.d/a.toml", "op": "create"}
    errors = errors_of(document(ok, {"content": "x", "path": path, "op": "create"}))
    assert errors == [f'machine.files[1].path: "{path}" {machine_files.path_problem(path)}']
    assert problem in errors[0]


def test_a_relative_path_is_refused_with_the_field_path() -> None:
    errors = errors_of(document({"content": "x", "path": "var/cri/x.toml", "op": "create"}))
    assert errors == [
        'machine.files[0].path: "var/cri/x.toml" is not an absolute path (expected it to start with /)'
    ]
    assert machine_files.path_problem("var/cri/x.toml") is not None


def test_the_refusal_names_the_allowed_places() -> None:
    problem = machine_files.path_problem("/etc/passwd")
    assert problem is not None
    for place in ("/var/cri/...", "/var/local/...", "/etc/ssl/certs/ca-certificates.crt"):
        assert place in problem


def test_only_appends_may_share_a_path() -> None:
    bundle = "/etc/ssl/certs/ca-certificates.crt"
    appends = [{"content": f"{n}\n", "path": bundle, "op": "append"} for n in (1, 2)]
    assert config.load(document(*appends)).model.machine.files is not None
    errors = errors_of(
        document(
            {"content": "a", "path": "/var/cri/conf.d/a.toml", "op": "create"},
            {"content": "b", "path": "/var/cri/conf.d/a.toml", "op": "append"},
        )
    )
    assert errors == [
        'machine.files[1].path: "/var/cri/conf.d/a.toml" is also written by machine.files[0] '
        "(only appends may share a path)"
    ]


def test_every_bad_entry_is_reported_at_once() -> None:
    errors = errors_of(
        document(
            {"content": "x", "path": "/system/a", "op": "create"},
            {"content": "x", "path": "/var/cri/conf.d/ok.toml", "op": "create"},
            {"content": "x", "path": "/var/../etc/shadow", "op": "overwrite"},
        )
    )
    assert [error.split(":")[0] for error in errors] == ["machine.files[0].path", "machine.files[2].path"]
