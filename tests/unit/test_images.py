"""Docker-archive packing: structure, determinism, names, symlink-preserving host file closure."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from kubeplane.provision import images, toolchain

pytestmark = pytest.mark.unit


def _binary(tmp_path: Path, name: str = "kube-apiserver", content: bytes = b"\x7fELF fake") -> Path:
    path = tmp_path / "in" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar}  # type: ignore[union-attr]


def _pack(tmp_path: Path, name: str, out: str, content: bytes = b"\x7fELF fake") -> Path:
    ref = toolchain.image_ref(name, "v1.20.2")
    spec = images.component_image(name=name, ref=ref, binary=_binary(tmp_path, name, content))
    dest = tmp_path / out
    images.write_docker_archive(spec, dest)
    return dest


def test_archive_has_manifest_config_and_layer_named_by_digest(tmp_path: Path) -> None:
    dest = _pack(tmp_path, "kube-apiserver", "apiserver.tar")
    members = _members(dest)
    manifest = json.loads(members["manifest.json"])
    assert len(manifest) == 1
    entry = manifest[0]
    assert entry["RepoTags"] == ["k8s.gcr.io/kube-apiserver:v1.20.2"]
    config_bytes = members[entry["Config"]]
    assert entry["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json"
    (layer_name,) = entry["Layers"]
    layer_bytes = members[layer_name]
    layer_digest = hashlib.sha256(layer_bytes).hexdigest()
    assert layer_name == f"{layer_digest}/layer.tar"
    config = json.loads(config_bytes)
    assert config["rootfs"] == {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]}
    assert config["config"]["Entrypoint"] == ["/usr/local/bin/kube-apiserver"]
    assert config["os"] == "linux"
    assert images.read_manifest(dest) == manifest

    with tarfile.open(fileobj=io.BytesIO(layer_bytes)) as layer:
        infos = {m.name: m for m in layer}
    assert list(infos) == ["usr", "usr/local", "usr/local/bin", "usr/local/bin/kube-apiserver"]
    binary = infos["usr/local/bin/kube-apiserver"]
    assert binary.mode == 0o755 and binary.uid == 0 and binary.mtime == 0
    assert all(m.isdir() for name, m in infos.items() if name != "usr/local/bin/kube-apiserver")


def test_pause_image_puts_the_binary_at_root(tmp_path: Path) -> None:
    dest = _pack(tmp_path, "pause", "pause.tar")
    members = _members(dest)
    entry = json.loads(members["manifest.json"])[0]
    assert entry["RepoTags"] == ["k8s.gcr.io/pause:3.2"]
    assert json.loads(members[entry["Config"]])["config"]["Entrypoint"] == ["/pause"]
    with tarfile.open(fileobj=io.BytesIO(members[entry["Layers"][0]])) as layer:
        assert layer.getnames() == ["pause"]


def test_packing_twice_is_byte_identical_even_after_touching_inputs(tmp_path: Path) -> None:
    first = _pack(tmp_path, "kube-scheduler", "one.tar")
    first_bytes = first.read_bytes()
    os.utime(tmp_path / "in" / "kube-scheduler", (12345, 12345))
    second = images.write_docker_archive(
        images.component_image(
            name="kube-scheduler",
            ref=toolchain.image_ref("kube-scheduler", "v1.20.2"),
            binary=tmp_path / "in" / "kube-scheduler",
        ),
        tmp_path / "two.tar",
    )
    assert second == json.loads(_members(first)["manifest.json"])[0]["Config"].removesuffix(".json")
    assert first_bytes == (tmp_path / "two.tar").read_bytes()


def test_different_content_gives_a_different_image(tmp_path: Path) -> None:
    first = _pack(tmp_path, "kube-scheduler", "one.tar")
    second = _pack(tmp_path, "kube-scheduler", "two.tar", content=b"other")
    assert first.read_bytes() != second.read_bytes()


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(images.ImageError, match=r"kube-proxy.*does not exist; build it first"):
        images.component_image(name="kube-proxy", ref="k8s.gcr.io/kube-proxy:v1", binary=tmp_path / "nope")


def test_upstream_image_names() -> None:
    paths = toolchain.Toolchain(Path("cache")).paths("v1.20.2-kp.1")
    assert paths.image_refs == {
        "pause": "k8s.gcr.io/pause:3.2",
        "kube-apiserver": "k8s.gcr.io/kube-apiserver:v1.20.2-kp.1",
        "kube-controller-manager": "k8s.gcr.io/kube-controller-manager:v1.20.2-kp.1",
        "kube-scheduler": "k8s.gcr.io/kube-scheduler:v1.20.2-kp.1",
        "kube-proxy": "k8s.gcr.io/kube-proxy:v1.20.2-kp.1",
    }
    assert paths.image("kube-proxy") == Path("cache/kubernetes/v1.20.2-kp.1/images/kube-proxy.tar")


def test_links_on_the_way_to_a_file_are_kept(tmp_path: Path) -> None:
    # sbin/tool -> /abs/alt/tool (absolute) -> ../real/multi via a directory symlink lib -> real
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "multi").write_bytes(b"bin")
    (tmp_path / "real" / "multi").chmod(0o750)
    (tmp_path / "lib").symlink_to("real")
    (tmp_path / "alt").mkdir()
    (tmp_path / "alt" / "tool").symlink_to("../lib/multi")
    (tmp_path / "sbin").mkdir()
    (tmp_path / "sbin" / "tool").symlink_to(tmp_path / "alt" / "tool")
    entries: dict[str, images.LayerEntry] = {}
    final = images.add_with_links(str(tmp_path / "sbin" / "tool"), entries)
    assert final == str(tmp_path / "real" / "multi")
    assert entries[str(tmp_path / "sbin" / "tool")].target == str(tmp_path / "alt" / "tool")
    assert entries[str(tmp_path / "alt" / "tool")].target == "../lib/multi"
    assert entries[str(tmp_path / "lib")] == images.LayerEntry(
        str(tmp_path / "lib"), "symlink", 0o777, target="real"
    )
    assert entries[final].kind == "file" and entries[final].mode == 0o750


def test_layer_keeps_symlinks_and_adds_parents(tmp_path: Path) -> None:
    real = _binary(tmp_path, "multi")
    entries = [
        images.LayerEntry("/usr/sbin/multi", "file", 0o755, real),
        images.LayerEntry("/usr/sbin/iptables", "symlink", 0o777, target="multi"),
        images.LayerEntry("/lib", "symlink", 0o777, target="usr/lib"),
    ]
    buffer = io.BytesIO()
    images.write_layer(entries, buffer)
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as layer:
        infos = {m.name: m for m in layer}
    assert sorted(infos) == ["lib", "usr", "usr/sbin", "usr/sbin/iptables", "usr/sbin/multi"]
    assert infos["lib"].issym() and infos["lib"].linkname == "usr/lib"
    assert infos["usr/sbin/iptables"].linkname == "multi"


def test_parse_ldd_finds_libraries_and_loader() -> None:
    out = (
        "/usr/sbin/a:\n"
        "\tlinux-vdso.so.1 (0x00007ffd)\n"
        "\tlibmnl.so.0 => /lib/x86_64-linux-gnu/libmnl.so.0 (0x00007f98)\n"
        "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f98)\n"
        "\t/lib64/ld-linux-x86-64.so.2 (0x00007f98)\n"
        "/usr/sbin/b:\n"
        "\tnot a dynamic executable\n"
        "\tlibgone.so.1 => not found\n"
    )
    assert images.parse_ldd(out) == [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libmnl.so.0",
        "/lib64/ld-linux-x86-64.so.2",
    ]
