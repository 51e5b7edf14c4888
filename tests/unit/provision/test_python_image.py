"""The shared Python image builder: mirror, rootfs key, strip list, import closure, recipes."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

import kubeplane
from kubeplane.provision import checkpointer_image, dns_image, python_image

pytestmark = pytest.mark.unit


def test_mirror_comes_from_the_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d/debian.sources").write_text(
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert python_image.debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_no_bookworm_mirror_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb http://old.example/debian bullseye main\n")
    with pytest.raises(python_image.PythonImageError, match="bookworm mirror"):
        python_image.debian_mirror(tmp_path)


def test_rootfs_key_depends_on_the_mirror_and_the_package_list() -> None:
    assert python_image.rootfs_key("http://a/") != python_image.rootfs_key("http://b/")
    assert python_image.rootfs_key("http://a/") == python_image.rootfs_key("http://a/")
    assert python_image.rootfs_key("http://a/") != python_image.rootfs_key("http://a/", ("python3",))


def test_one_rootfs_holds_every_library_the_recipes_import() -> None:
    debian = {"yaml": "python3-yaml", "dns": "python3-dnspython", "httpx": "python3-httpx"}
    for recipe in (checkpointer_image.RECIPE, dns_image.RECIPE):
        _, third_party = python_image.import_closure(recipe.package)
        assert {debian[name] for name in third_party} <= set(python_image.PACKAGES), recipe.name
    assert "python3" in python_image.PACKAGES


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
    assert python_image.strip_rootfs(tmp_path) == 30
    assert (tmp_path / "usr/share/doc/python3/copyright").exists()
    assert (tmp_path / "usr/lib/python3.11/os.py").exists()
    assert not (tmp_path / "usr/share/man/man1").exists()
    assert not (tmp_path / "var/lib/apt/lists/deb.debian.org_InRelease").exists()


def test_the_dns_image_carries_exactly_the_import_closure_of_kubeplane_dns() -> None:
    package = Path(kubeplane.__file__).parent
    files = python_image.closure_files(dns_image.RECIPE.package)
    expected = {"kubeplane/__init__.py", "kubeplane/guard.py", "kubeplane/retry.py"}
    expected |= {f"kubeplane/clients/{name}.py" for name in ("__init__", "errors", "etcd", "kube")}
    expected |= {f"kubeplane/dns/{path.name}" for path in (package / "dns").glob("*.py")}
    assert {str(path.relative_to(python_image.PYTHON_PATH)) for path in files} == expected
    assert all(files[python_image.PYTHON_PATH / rel] == package.parent / rel for rel in expected)
    _, third_party = python_image.import_closure("kubeplane.dns")
    assert third_party == {"dns", "httpx", "yaml"}


def _package(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_closure_follows_from_imports_and_adds_parent_packages(tmp_path: Path) -> None:
    _package(
        tmp_path,
        {
            "kubeplane/__init__.py": "",
            "kubeplane/app/__init__.py": "",
            "kubeplane/app/main.py": "import json\nimport yaml\nfrom kubeplane.lib import util\n",
            "kubeplane/lib/__init__.py": "from kubeplane.lib.inner import x\n",
            "kubeplane/lib/util.py": "from kubeplane.deep.leaf import VALUE\n",
            "kubeplane/lib/inner.py": "x = 1\n",
            "kubeplane/deep/__init__.py": "",
            "kubeplane/deep/leaf.py": "VALUE = 1\n",
            "kubeplane/unused.py": "import requests\n",
        },
    )
    modules, third_party = python_image.import_closure("kubeplane.app", tmp_path)
    assert set(modules) == {
        "kubeplane",
        "kubeplane.app",
        "kubeplane.app.main",
        "kubeplane.lib",
        "kubeplane.lib.inner",
        "kubeplane.lib.util",
        "kubeplane.deep",
        "kubeplane.deep.leaf",
    }
    assert third_party == {"yaml"}
    files = python_image.closure_files("kubeplane.app", tmp_path)
    assert files[PurePosixPath("/usr/lib/python3/dist-packages/kubeplane/deep/leaf.py")] == (
        tmp_path / "kubeplane/deep/leaf.py"
    )


def test_closure_refuses_relative_imports_and_missing_modules(tmp_path: Path) -> None:
    _package(tmp_path, {"kubeplane/__init__.py": "", "kubeplane/app/__init__.py": "from . import x\n"})
    with pytest.raises(python_image.PythonImageError, match="relative import"):
        python_image.import_closure("kubeplane.app", tmp_path)
    with pytest.raises(python_image.PythonImageError, match="not a package"):
        python_image.import_closure("kubeplane.nothing", tmp_path)


def test_dns_image_ref_and_spec(tmp_path: Path) -> None:
    assert dns_image.image_ref() == f"kubeplane/cluster-dns:{kubeplane.__version__}"
    assert dns_image.image_ref("1.2.3") == "kubeplane/cluster-dns:1.2.3"
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/python3").write_text("elf")
    spec = python_image.image_spec(
        dns_image.RECIPE, rootfs, python_image.closure_files(dns_image.RECIPE.package)
    )
    assert spec.ref == dns_image.image_ref()
    assert spec.entrypoint == ("/usr/bin/python3", "-m", "kubeplane.dns")
    assert "PYTHONDONTWRITEBYTECODE=1" in spec.env
    paths = {entry.path for entry in spec.entries}
    assert "/usr/lib/python3/dist-packages/kubeplane/dns/__main__.py" in paths
    assert not any("/kubeplane/provision/" in path or "/kubeplane/checkpointer/" in path for path in paths)


def test_recipes_share_the_rootfs_but_not_archives_or_stamps(tmp_path: Path) -> None:
    dns = dns_image.Builder(tmp_path)
    checkpointer = checkpointer_image.Builder(tmp_path)
    assert dns.rootfs_dir("http://m/") == checkpointer.rootfs_dir("http://m/")
    assert dns.rootfs_dir("http://m/").parent == tmp_path / "python-images"
    assert dns.archive != checkpointer.archive and dns.stamp != checkpointer.stamp
    with pytest.raises(python_image.PythonImageError, match="cluster-dns"):
        dns_image.Builder(tmp_path, apt_dir=_apt(tmp_path)).require()


def _apt(tmp_path: Path) -> Path:
    apt = tmp_path / "apt"
    apt.mkdir()
    (apt / "sources.list").write_text("deb http://mirror.example/debian bookworm main\n")
    return apt


def test_one_debootstrap_serves_both_recipes_and_warm_runs_run_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[list[str]] = []

    def run(self: object, argv: list[str], **_: object) -> str:
        ran.append(list(argv))
        if argv[0] == "debootstrap":
            (Path(argv[-2]) / "usr/bin").mkdir(parents=True)
            (Path(argv[-2]) / "usr/bin/python3").write_text("elf")
        return ""

    monkeypatch.setattr(python_image.steps_mod.Steps, "run", run)
    apt = _apt(tmp_path)
    dns = dns_image.Builder(tmp_path / "cache", apt_dir=apt).ensure()
    assert [argv[0] for argv in ran] == ["debootstrap"]
    assert f"--include={','.join(python_image.PACKAGES)}" in ran[0]
    checkpointer = checkpointer_image.Builder(tmp_path / "cache", apt_dir=apt).ensure()
    assert len(ran) == 1, "the second recipe reuses the rootfs"
    assert dns.ref == dns_image.image_ref() and checkpointer.ref == checkpointer_image.image_ref()
    assert dns_image.Builder(tmp_path / "cache", apt_dir=apt).ensure() == dns
    assert dns_image.Builder(tmp_path / "cache", apt_dir=apt).require() == dns
    assert len(ran) == 1
    # A damaged archive is repacked from the cached rootfs.
    dns.archive.write_bytes(b"broken")
    with pytest.raises(python_image.PythonImageError):
        dns_image.Builder(tmp_path / "cache", apt_dir=apt).require()
    assert dns_image.Builder(tmp_path / "cache", apt_dir=apt).ensure().size == dns.size
    assert len(ran) == 1
