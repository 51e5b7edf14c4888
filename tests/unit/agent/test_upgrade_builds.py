"""The node side of ``kubeplane upgrade`` (:mod:`kubeplane.agent.upgrade`): which paths a build
may come from, how a wheel or a directory is taken in (hostile input refused, nothing left
behind), the check that refuses a broken build, and when a starting agent execs into a build."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kubeplane.agent import upgrade
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit


@pytest.fixture
def paths(tmp_path: Path) -> NodePaths:
    node = NodePaths(tmp_path / "node")
    node.agent_uploads.mkdir(parents=True)
    return node


def package(directory: Path, *, version: str = "9.9.9", main: str = "def main() -> None: ...\n") -> Path:
    """A minimal kubeplane package whose agent entry point imports."""
    (directory / "kubeplane" / "agent").mkdir(parents=True)
    (directory / "kubeplane" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (directory / "kubeplane" / "agent" / "__init__.py").write_text("")
    (directory / "kubeplane" / "agent" / "main.py").write_text(main)
    return directory


def wheel(path: Path, members: dict[str, str], *, links: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return path


GOOD = {
    "kubeplane/__init__.py": '__version__ = "9.9.9"\n',
    "kubeplane/agent/__init__.py": "",
    "kubeplane/agent/main.py": "def main() -> None: ...\n",
}


def leftovers(paths: NodePaths) -> list[str]:
    return sorted(p.name for p in paths.agent_builds.iterdir()) if paths.agent_builds.exists() else []


def test_a_directory_build_is_checked_installed_under_its_version_and_recorded(paths: NodePaths) -> None:
    package(paths.agent_uploads / "next")
    build = upgrade.install(paths, upgrade.source_path(paths, "/var/lib/kubeplane/uploads/next"))
    assert build.version == "9.9.9"
    assert build.path == paths.agent_builds / "9.9.9"
    assert (build.path / "kubeplane" / "agent" / "main.py").is_file()
    assert upgrade.active(paths) is None  # installing is not activating
    upgrade.record_active(paths, build)
    assert upgrade.active(paths) == upgrade.Build("9.9.9", build.path.resolve())
    assert leftovers(paths) == ["9.9.9", "active.json"]


def test_a_wheel_build_is_unpacked_and_installed(paths: NodePaths) -> None:
    wheel(paths.agent_uploads / "kubeplane-9.9.9-py3-none-any.whl", GOOD)
    source = upgrade.source_path(paths, "var/lib/kubeplane/uploads/kubeplane-9.9.9-py3-none-any.whl")
    assert upgrade.install(paths, source).version == "9.9.9"


@pytest.mark.parametrize(
    "given",
    ["/etc/passwd", "/var/lib/kubeplane/uploads/../agent", "/var/lib/kubeplane/uploads", "../outside"],
)
def test_a_build_must_come_from_the_uploads_directory(paths: NodePaths, given: str) -> None:
    (paths.root / "etc").mkdir()
    (paths.root / "etc" / "passwd").write_text("x")
    paths.agent_builds.mkdir(parents=True)
    (paths.root.parent / "outside").mkdir()
    with pytest.raises(upgrade.UpgradeRefused, match=r"not under /var/lib/kubeplane/uploads|no such file"):
        upgrade.source_path(paths, given)


def test_a_symlink_in_uploads_cannot_escape_it(paths: NodePaths, tmp_path: Path) -> None:
    elsewhere = package(tmp_path / "elsewhere")
    (paths.agent_uploads / "link").symlink_to(elsewhere)
    with pytest.raises(upgrade.UpgradeRefused, match="not under"):
        upgrade.source_path(paths, "/var/lib/kubeplane/uploads/link")


def test_a_directory_holding_a_symlink_is_refused(paths: NodePaths, tmp_path: Path) -> None:
    build = package(paths.agent_uploads / "next")
    (tmp_path / "secret").write_text("s")
    (build / "kubeplane" / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(upgrade.UpgradeRefused, match="not a regular file or directory"):
        upgrade.install(paths, build)
    assert leftovers(paths) == []


@pytest.mark.parametrize(
    ("members", "links", "refused"),
    [
        ({**GOOD, "../../escaped.py": "x"}, (), "leaves the build directory"),
        ({**GOOD, "/abs.py": "x"}, (), "leaves the build directory"),
        ({**GOOD, "kubeplane\\..\\..\\x.py": "x"}, (), "leaves the build directory"),
        (GOOD, ("kubeplane/passwd",), "not a file or directory"),
        ({"other/__init__.py": ""}, (), "no kubeplane package"),
    ],
)
def test_a_hostile_or_wrong_wheel_is_refused_and_nothing_is_left(
    paths: NodePaths, members: dict[str, str], links: tuple[str, ...], refused: str
) -> None:
    source = wheel(paths.agent_uploads / "bad.whl", members, links=links)
    with pytest.raises(upgrade.UpgradeRefused, match=refused):
        upgrade.install(paths, source)
    assert leftovers(paths) == []
    assert not (paths.root / "escaped.py").exists() and not (paths.root.parent / "escaped.py").exists()


def test_a_file_that_is_not_a_zip_is_refused(paths: NodePaths) -> None:
    (paths.agent_uploads / "fake.whl").write_text("not a zip")
    with pytest.raises(upgrade.UpgradeRefused, match="not a wheel"):
        upgrade.install(paths, paths.agent_uploads / "fake.whl")
    (paths.agent_uploads / "notes.txt").write_text("hello")
    with pytest.raises(upgrade.UpgradeRefused, match="neither a wheel"):
        upgrade.install(paths, paths.agent_uploads / "notes.txt")


def test_an_oversized_wheel_is_refused(paths: NodePaths, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upgrade, "MAX_UNPACKED", 10)
    source = wheel(paths.agent_uploads / "big.whl", GOOD)
    with pytest.raises(upgrade.UpgradeRefused, match="unpacks to more than"):
        upgrade.install(paths, source)


@pytest.mark.parametrize(
    ("version", "main", "refused"),
    [
        ("9.9.9", "raise SystemExit('broken build')\n", "fails its check"),
        ("9.9.9", "import no_such_module_here\n", "No module named 'no_such_module_here'"),
        # The agent imports this one only when the node boots (kubeplane.lazy): the check still does.
        (
            "9.9.9",
            "def main() -> None: ...\ndef check() -> None:\n    import no_such_booted_module\n",
            "No module named 'no_such_booted_module'",
        ),
        ("../../x", "def main() -> None: ...\n", "is not a version string"),
    ],
)
def test_a_build_that_fails_its_check_is_refused_and_changes_nothing(
    paths: NodePaths, version: str, main: str, refused: str
) -> None:
    good = upgrade.install(paths, package(paths.agent_uploads / "good"))
    upgrade.record_active(paths, good)
    bad = package(paths.agent_uploads / "bad", version=version, main=main)
    with pytest.raises(upgrade.UpgradeRefused, match=refused):
        upgrade.install(paths, bad)
    assert leftovers(paths) == ["9.9.9", "active.json"]
    assert upgrade.active(paths) == upgrade.Build("9.9.9", good.path.resolve())


def test_an_active_record_naming_a_path_outside_the_builds_is_ignored(paths: NodePaths) -> None:
    paths.agent_builds.mkdir(parents=True)
    paths.active_build.write_text('{"version": "1", "path": "../../.."}')
    assert upgrade.active(paths) is None
    paths.active_build.write_text("not json")
    assert upgrade.active(paths) is None


def test_a_starting_agent_execs_into_the_active_build_once(paths: NodePaths) -> None:
    assert upgrade.startup_target(paths, {}) is None  # nothing recorded: run what was started
    build = upgrade.install(paths, package(paths.agent_uploads / "next"))
    upgrade.record_active(paths, build)
    target = upgrade.startup_target(paths, {})
    assert target is not None and target.path == build.path.resolve()
    # Exec'd into it already (the marker) yet not running it: carry on instead of looping.
    assert upgrade.startup_target(paths, {upgrade.BUILD_ENV: str(target.path)}) is None
    # Exec'd into an earlier build: go on to the new one.
    assert upgrade.startup_target(paths, {upgrade.BUILD_ENV: "/elsewhere"}) == target


def test_the_exec_environment_puts_the_build_first_and_drops_an_earlier_one() -> None:
    build = upgrade.Build("2", Path("/builds/2"))
    environ = {"PYTHONPATH": os.pathsep.join(["/builds/1", "/src"]), upgrade.BUILD_ENV: "/builds/1", "X": "y"}
    found = upgrade.exec_environment(build, environ)
    assert found["PYTHONPATH"] == os.pathsep.join(["/builds/2", "/src"])
    assert found[upgrade.BUILD_ENV] == "/builds/2"
    assert found["X"] == "y"


REPORT = (
    "import os, sys, kubeplane\n"
    "def main() -> None:\n"
    "    marker = os.environ['KUBEPLANED_BUILD']\n"
    "    print(os.getpid(), kubeplane.__version__, sys.argv[1:], marker, flush=True)\n"
)


def test_a_starting_agent_runs_the_active_build_in_place(paths: NodePaths) -> None:
    """``kubeplaned`` started on a node with an active build execs into it at once: the same PID,
    the same arguments, the build's code (here an agent that only reports itself)."""
    build = upgrade.install(paths, package(paths.agent_uploads / "next", main=REPORT))
    upgrade.record_active(paths, build)
    source = Path(upgrade.__file__).resolve().parents[2]
    program = (
        "import os, sys; print(os.getpid(), flush=True); from kubeplane.agent.main import run; "
        "run(sys.argv[1:])"
    )
    arguments = ["--root", str(paths.root), "--metrics-port", "0"]
    environment = {k: v for k, v in os.environ.items() if k != upgrade.BUILD_ENV}
    result = subprocess.run(
        [sys.executable, "-c", program, *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**environment, "PYTHONPATH": str(source)},
    )
    pid, reported = result.stdout.splitlines()
    assert reported == f"{pid} 9.9.9 {arguments} {build.path.resolve()}"
