"""Checkpoints on disk, the package's import discipline, and the image recipe's pure parts."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path, PurePosixPath

import pytest

import kubeplane
from kubeplane.checkpointer import logic
from kubeplane.checkpointer.store import CheckpointStore
from kubeplane.provision import checkpointer_image

pytestmark = pytest.mark.unit

PARENT = "kube-system/kube-scheduler-abc"


def checkpoint(files: dict[str, tuple[bytes, int]] | None = None, image: str = "img:1") -> logic.Checkpoint:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kube-scheduler-abc",
            "namespace": "kube-system",
            "annotations": {logic.ANNOTATION_CHECKPOINT_OF: "kube-scheduler-abc"},
        },
        "spec": {"containers": [{"name": "s", "image": image}]},
    }
    return logic.Checkpoint(
        PARENT, pod, files if files is not None else {"secrets/kubeconfig": (b"KC", 0o400)}
    )


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(manifest_dir=tmp_path / "manifests", state_dir=tmp_path / "state")


def test_write_activate_deactivate_remove(store: CheckpointStore, tmp_path: Path) -> None:
    assert store.write(checkpoint()) is True
    assert store.write(checkpoint()) is False, "unchanged bytes must not be rewritten"
    assert store.stored() == {PARENT} and store.active() == frozenset()
    secret = tmp_path / "state/files/kube-system-kube-scheduler-abc/secrets/kubeconfig"
    assert secret.read_bytes() == b"KC" and secret.stat().st_mode & 0o777 == 0o400
    store.activate(PARENT)
    active = tmp_path / "manifests/kube-system-kube-scheduler-abc.json"
    assert json.loads(active.read_text())["metadata"]["name"] == "kube-scheduler-abc"
    assert store.active() == {PARENT}
    store.write(checkpoint(image="img:2"))
    assert json.loads(active.read_text())["spec"]["containers"][0]["image"] == "img:2", (
        "active copy refreshed"
    )
    store.deactivate(PARENT)
    assert not active.exists() and store.stored() == {PARENT}
    store.activate(PARENT)
    store.remove(PARENT)
    assert store.stored() == frozenset() and store.active() == frozenset()
    assert not secret.parent.parent.exists()


def test_stale_files_are_removed_on_rewrite(store: CheckpointStore, tmp_path: Path) -> None:
    store.write(checkpoint({"a/x": (b"1", 0o600), "b/y": (b"2", 0o600)}))
    store.write(checkpoint({"a/x": (b"1", 0o600)}))
    assert not (tmp_path / "state/files/kube-system-kube-scheduler-abc/b/y").exists()


def test_other_manifests_are_not_checkpoints(store: CheckpointStore, tmp_path: Path) -> None:
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests/kubeplane-kube-apiserver.json").write_text(
        json.dumps({"metadata": {"name": "kube-apiserver", "namespace": "kube-system"}})
    )
    (tmp_path / "manifests/garbage.json").write_text("{not json")
    assert store.active() == frozenset()


def test_host_state_dir_is_used_for_volume_paths(tmp_path: Path) -> None:
    store = CheckpointStore(
        manifest_dir=tmp_path / "m", state_dir=tmp_path / "s", host_state_dir=Path("/node/s")
    )
    assert store.host_files_dir(PARENT) == "/node/s/files/kube-system-kube-scheduler-abc"


# -- import discipline -----------------------------------------------------------------------------

ALLOWED_THIRD_PARTY = {"yaml"}


def test_checkpointer_imports_only_stdlib_yaml_and_itself() -> None:
    package = Path(kubeplane.__file__).parent / "checkpointer"
    offenders = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                inside = name == "kubeplane.checkpointer" or name.startswith("kubeplane.checkpointer.")
                if not (inside or top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY):
                    offenders.append(f"{path.name}: {name}")
    assert not offenders, f"the checkpointer image has only stdlib + PyYAML: {offenders}"


def test_kubeplane_init_is_importable_without_dependencies() -> None:
    # The image ships kubeplane/__init__.py as is; it must not import anything third-party.
    tree = ast.parse((Path(kubeplane.__file__)).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


# -- image recipe ---------------------------------------------------------------------------------


def test_mirror_comes_from_the_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d/debian.sources").write_text(
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert checkpointer_image.debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_no_bookworm_mirror_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb http://old.example/debian bullseye main\n")
    with pytest.raises(checkpointer_image.CheckpointerImageError, match="bookworm mirror"):
        checkpointer_image.debian_mirror(tmp_path)


def test_rootfs_key_depends_on_the_mirror() -> None:
    assert checkpointer_image.rootfs_key("http://a/") != checkpointer_image.rootfs_key("http://b/")
    assert checkpointer_image.rootfs_key("http://a/") == checkpointer_image.rootfs_key("http://a/")


def test_strip_keeps_copyright_and_python(tmp_path: Path) -> None:
    for rel in (
        "usr/share/doc/python3/copyright",
        "usr/share/doc/python3/changelog.gz",
        "usr/share/man/man1/python3.1.gz",
        "var/lib/apt/lists/deb.debian.org_InRelease",
        "usr/lib/python3.11/os.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x" * 10)
    assert checkpointer_image.strip_rootfs(tmp_path) == 30
    assert (tmp_path / "usr/share/doc/python3/copyright").exists()
    assert (tmp_path / "usr/lib/python3.11/os.py").exists()
    assert not (tmp_path / "usr/share/man/man1").exists()
    assert not (tmp_path / "var/lib/apt/lists/deb.debian.org_InRelease").exists()


def test_image_spec_holds_rootfs_links_and_sources(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/python3.11").write_text("elf")
    (rootfs / "usr/bin/python3").symlink_to("python3.11")
    (rootfs / "bin").symlink_to("usr/bin")
    spec = checkpointer_image.image_spec(rootfs, checkpointer_image.source_files())
    by_path = {entry.path: entry for entry in spec.entries}
    assert by_path["/bin"].kind == "symlink" and by_path["/bin"].target == "usr/bin"
    assert by_path["/usr/bin/python3"].target == "python3.11"
    main_py = str(PurePosixPath(checkpointer_image.PYTHON_PATH) / "kubeplane/checkpointer/__main__.py")
    assert by_path[main_py].kind == "file"
    assert str(checkpointer_image.PYTHON_PATH / "kubeplane/__init__.py") in by_path
    assert spec.ref == f"kubeplane/pod-checkpointer:{kubeplane.__version__}"
    assert spec.entrypoint == ("/usr/bin/python3", "-m", "kubeplane.checkpointer")
