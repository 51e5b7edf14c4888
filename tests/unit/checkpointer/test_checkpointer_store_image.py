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
from kubeplane.provision import checkpointer_image, python_image

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


def test_image_spec_holds_rootfs_links_and_sources(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/python3.11").write_text("elf")
    (rootfs / "usr/bin/python3").symlink_to("python3.11")
    (rootfs / "bin").symlink_to("usr/bin")
    recipe = checkpointer_image.RECIPE
    spec = python_image.image_spec(recipe, rootfs, python_image.closure_files(recipe.package))
    by_path = {entry.path: entry for entry in spec.entries}
    assert by_path["/bin"].kind == "symlink" and by_path["/bin"].target == "usr/bin"
    assert by_path["/usr/bin/python3"].target == "python3.11"
    main_py = str(PurePosixPath(python_image.PYTHON_PATH) / "kubeplane/checkpointer/__main__.py")
    assert by_path[main_py].kind == "file"
    assert str(python_image.PYTHON_PATH / "kubeplane/__init__.py") in by_path
    assert spec.ref == f"kubeplane/pod-checkpointer:{kubeplane.__version__}"
    assert spec.ref == checkpointer_image.image_ref()
    assert spec.entrypoint == ("/usr/bin/python3", "-m", "kubeplane.checkpointer")
    assert "PYTHONDONTWRITEBYTECODE=1" in spec.env


def test_the_image_carries_the_checkpointer_package_and_kubeplane_init_only() -> None:
    # What the image held before the builder was shared: kubeplane/__init__.py and every module of
    # kubeplane/checkpointer (it imports nothing else of kubeplane).
    package = Path(kubeplane.__file__).parent
    expected = {python_image.PYTHON_PATH / "kubeplane/__init__.py": package / "__init__.py"}
    for path in sorted((package / "checkpointer").glob("*.py")):
        expected[python_image.PYTHON_PATH / "kubeplane/checkpointer" / path.name] = path
    assert python_image.closure_files(checkpointer_image.RECIPE.package) == expected
