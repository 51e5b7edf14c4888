"""Agent upgrade: replace the running ``kubeplaned`` with another build of kubeplane.

There is no OS image here, so a *build* is the kubeplane package itself, given as a wheel
(``*.whl``, a zip) or a directory holding a ``kubeplane`` package, placed on the node under
:attr:`~kubeplane.config.paths.NodePaths.agent_uploads` (``/var/lib/kubeplane/uploads``; the
caller names it relative to the node root). The node:

1. :func:`source_path`: refuses a path outside the uploads directory, symlinks included;
2. :func:`install`: unpacks the wheel (refusing absolute names, ``..``, links and oversized
   archives) or copies the directory (refusing any symlink in it) into a temporary directory
   under :attr:`~kubeplane.config.paths.NodePaths.agent_builds`, then *checks* it by importing
   ``kubeplane.agent.main`` from it in a fresh interpreter (the same Python and dependencies as
   the running agent) and reading its ``__version__``; only a build that passes is moved to
   ``agent_builds/<version>``;
3. :func:`record_active` names it the active build (``agent_builds/active.json``);
4. the node stops its services as a reboot does and :func:`exec_into` re-executes the agent in
   place (``os.execv``: the same PID, the same arguments) with the build first on ``PYTHONPATH``.

At start (:func:`startup_target`), an agent whose active build is not the code it runs re-execs
into it: that is how ``--stage`` (record only) takes effect at the next restart, and how a
restarted agent process keeps its upgrade. :data:`INSTANCE` (in ``version``) tells a restarted
agent from the one before, also when both run the same version. :data:`BUILD_ENV` marks a
process started into a build, so an agent that still does not run it after the exec (a broken
environment) carries on with the code it has instead of looping.

Rollback: a build that fails its check is refused and nothing changes (the temporary copy is
removed, the active record is untouched). Installed builds stay under ``agent_builds``: upgrading
to an earlier one again (its directory or wheel) goes back; removing ``active.json`` and
restarting the agent goes back to the agent as it was installed. The builds live outside
``/system`` so a reset's ``state`` wipe does not remove the agent that runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import kubeplane
from kubeplane import fileio
from kubeplane.config.paths import NodePaths

#: Set in the environment of an agent exec'd into a build: that build's directory.
BUILD_ENV = "KUBEPLANED_BUILD"
#: A random id of this agent process, made when it imports this code: every start of the agent,
#: and every exec into a build, gets a new one. ``version`` answers it, so whoever upgraded a node
#: can tell the agent that answers from the one it asked, whatever version both say.
INSTANCE = uuid.uuid4().hex
#: The most bytes a wheel may unpack to (kubeplane is a few MB; this bounds a zip bomb).
MAX_UNPACKED = 256 * 1024 * 1024
#: The most members a wheel may have.
MAX_MEMBERS = 20_000
#: How long the check of a build (a fresh interpreter importing it) may take, in seconds.
CHECK_TIMEOUT = 60.0
#: What a build's ``__version__`` may look like: it names its directory.
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
#: What the check runs in the build's interpreter: import the agent and, through its ``check()``,
#: every module it imports on first use (a build without one imports all with the agent), then
#: print where and which version.
_CHECK = (
    "import sys; sys.path.insert(0, sys.argv[1]); import kubeplane, kubeplane.agent.main; "
    "getattr(kubeplane.agent.main, 'check', lambda: None)(); "
    "print(kubeplane.__file__); print(kubeplane.__version__)"
)


class UpgradeRefused(ValueError):
    """A build the node will not install: the message says why; nothing was changed."""


@dataclass(frozen=True)
class Build:
    """An installed build: its version and the directory to put first on ``PYTHONPATH``."""

    version: str
    path: Path


def source_path(paths: NodePaths, given: str) -> Path:
    """The build ``given`` (relative to the node root) names, after checking that it is under
    the uploads directory once every symlink is resolved."""
    root = paths.root.resolve()
    uploads = paths.agent_uploads.resolve()
    try:
        candidate = (root / given.lstrip("/")).resolve(strict=True)
    except FileNotFoundError:
        raise UpgradeRefused(f"{given}: no such file or directory on the node") from None
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise UpgradeRefused(f"{given} cannot be followed: {exc}") from exc
    where = "/" + str(paths.agent_uploads.relative_to(paths.root))
    if uploads not in candidate.parents:
        raise UpgradeRefused(f"{given} is not under {where}: put the build there first")
    return candidate


def install(paths: NodePaths, source: Path) -> Build:
    """Unpack or copy ``source`` (from :func:`source_path`), check it and install it under
    ``agent_builds/<version>``; raises :class:`UpgradeRefused` (leaving nothing behind)."""
    paths.agent_builds.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".incoming-", dir=paths.agent_builds))
    try:
        if source.is_dir():
            _copy_tree(source, staging)
        elif source.is_file() and source.name.endswith(".whl"):
            _unpack_wheel(source, staging)
        else:
            raise UpgradeRefused(f"{source.name} is neither a wheel (*.whl) nor a directory")
        if not (staging / "kubeplane" / "__init__.py").is_file():
            raise UpgradeRefused(f"{source.name} holds no kubeplane package (kubeplane/__init__.py)")
        version = check(staging)
        final = paths.agent_builds / version
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Build(version=version, path=final)


def check(build: Path) -> str:
    """Import the agent from ``build`` in a fresh interpreter (isolated: no user site, no
    environment, no current directory) and return its version; refused when that fails or the
    import did not come from ``build``."""
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-c", _CHECK, str(build)],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise UpgradeRefused(f"the build's check took over {CHECK_TIMEOUT:.0f}s: refused") from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise UpgradeRefused(f"the build fails its check (importing kubeplane.agent.main): {last}")
    lines = result.stdout.strip().splitlines()
    if len(lines) < 2 or build.resolve() not in Path(lines[-2]).resolve().parents:
        raise UpgradeRefused("the build's check imported kubeplane from somewhere else: refused")
    version = lines[-1].strip()
    if not _VERSION.fullmatch(version):
        raise UpgradeRefused(f"the build's version {version[:80]!r} is not a version string")
    return version


def _copy_tree(source: Path, target: Path) -> None:
    """Copy a build directory; any symlink or special file in it is refused (it could point out
    of the uploads directory), caches are left out."""
    for directory, dirs, files in os.walk(source):
        here = Path(directory)
        dirs[:] = [name for name in dirs if name != "__pycache__"]
        for name in [*dirs, *files]:
            mode = (here / name).lstat().st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise UpgradeRefused(
                    f"{(here / name).relative_to(source)} is not a regular file or directory"
                )
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))


def _unpack_wheel(source: Path, target: Path) -> None:
    """Extract a wheel member by member, refusing names that leave ``target``, links and
    archives that unpack to more than :data:`MAX_UNPACKED` bytes."""
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UpgradeRefused(f"{source.name} is not a wheel (a zip archive): {exc}") from exc
    with archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise UpgradeRefused(f"{source.name} has {len(members)} members, over {MAX_MEMBERS}")
        if sum(member.file_size for member in members) > MAX_UNPACKED:
            raise UpgradeRefused(f"{source.name} unpacks to more than {MAX_UNPACKED} bytes")
        for member in members:
            name = PurePosixPath(member.filename)
            if not name.parts or name.is_absolute() or ".." in name.parts or "\\" in member.filename:
                raise UpgradeRefused(f"{source.name}: member {member.filename!r} leaves the build directory")
            kind = stat.S_IFMT(member.external_attr >> 16)
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise UpgradeRefused(f"{source.name}: member {member.filename!r} is not a file or directory")
            destination = target.joinpath(*name.parts)
            if member.is_dir():
                destination.mkdir(parents=True, exist_ok=True)
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as reader, destination.open("wb") as writer:
                shutil.copyfileobj(reader, writer)


def record_active(paths: NodePaths, build: Build) -> None:
    """Make ``build`` the one the agent runs from its next start (or exec) on."""
    document = {"version": build.version, "path": str(build.path.relative_to(paths.agent_builds))}
    fileio.write_atomic(paths.active_build, json.dumps(document) + "\n", mode=0o644)


def active(paths: NodePaths) -> Build | None:
    """The recorded active build, or None (none recorded, unreadable, or naming a directory
    that is not an installed build)."""
    try:
        document = json.loads(paths.active_build.read_text())
        version, relative = str(document["version"]), str(document["path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    build = (paths.agent_builds / relative).resolve()
    if paths.agent_builds.resolve() not in build.parents or not (build / "kubeplane").is_dir():
        return None
    return Build(version=version, path=build)


def running_build() -> Path:
    """The directory the running kubeplane package was imported from (its parent)."""
    return Path(kubeplane.__file__).resolve().parent.parent


def startup_target(paths: NodePaths, environ: dict[str, str]) -> Build | None:
    """The build a starting agent must exec into: the active one when it is not the running code
    and this process was not already exec'd into it (the loop guard); else None."""
    build = active(paths)
    if build is None or build.path == running_build():
        return None
    if environ.get(BUILD_ENV) == str(build.path):
        return None  # exec'd into it and still not running it: carry on rather than loop
    return build


def exec_environment(build: Build, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ``build`` first on ``PYTHONPATH`` (replacing an earlier build) and marked."""
    earlier = environ.get(BUILD_ENV)
    kept = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != earlier]
    return {**environ, "PYTHONPATH": os.pathsep.join([str(build.path), *kept]), BUILD_ENV: str(build.path)}


def exec_into(build: Build, arguments: list[str]) -> None:
    """Replace this process with the agent of ``build``, same PID and ``arguments``; never returns."""
    program = "from kubeplane.agent.main import main; main()"
    environment = exec_environment(build, dict(os.environ))
    os.execve(sys.executable, [sys.executable, "-c", program, *arguments], environment)  # noqa: S606
