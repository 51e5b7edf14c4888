"""Where ``machine.files`` may write, checked at validation (pure: no I/O).

A node writes its ``machine.files`` as root, so the places are few and named here, each one a
place the node owns (on a local cluster each is bind-mounted from the node's own directory, so a
node never writes into the host's or another node's files):

- ``/var/cri/`` and below: containerd config fragments (``/var/cri/conf.d/*.toml``, which the
  containerd config imports, as the containerd guide shows), and files beside them;
- ``/var/local/`` and below: the machine's own data, e.g. for pods through kubelet ``extraMounts``;
- the CA bundle, ``/etc/ssl/certs/ca-certificates.crt`` (Debian's, read by containerd's pulls and
  by OpenSSL) and ``/etc/ssl/certs/ca-certificates`` (the certificate authorities guide's name;
  Go programs such as containerd read every file of ``/etc/ssl/certs``).

Everything else (``/system``, ``/proc``, ``/etc/kubernetes`` ...) is refused, and so is any path
that is not plain: relative, with ``.``, ``..`` or empty components, or ending in ``/``. Symlinks
are the writer's business (``kubeplane.agent.machine_files`` never follows one).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kubeplane.config.errors import FieldError
from kubeplane.config.models import File

#: Directories below which machine.files may write (the directories themselves are not files).
ALLOWED_DIRECTORIES = ("/var/cri/", "/var/local/")
#: Single files machine.files may write.
ALLOWED_FILES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates")
#: The default mode of a created or overwritten file.
DEFAULT_PERMISSIONS = 0o644


def allowed_places() -> str:
    """The allow-list as the error messages show it."""
    return ", ".join([f"{directory}..." for directory in ALLOWED_DIRECTORIES] + list(ALLOWED_FILES))


def path_problem(path: str) -> str | None:
    """Why ``path`` may not be written by machine.files, or None when it may."""
    if not path.startswith("/"):
        return "is not an absolute path (expected it to start with /)"
    if "\0" in path:
        return "contains a NUL character"
    if path.endswith("/"):
        return "ends with / (expected the path of a file)"
    if any(part in ("", ".", "..") for part in path[1:].split("/")):
        return "has empty, . or .. components (expected a plain path such as /var/cri/conf.d/x.toml)"
    if path in ALLOWED_FILES or any(
        path.startswith(directory) and len(path) > len(directory) for directory in ALLOWED_DIRECTORIES
    ):
        return None
    return f"is not a place machine.files may write (allowed: {allowed_places()})"


def check(files: Sequence[File]) -> Iterator[FieldError]:
    """Path rules of ``machine.files``: allowed places, and one writer per path but for appends."""
    first: dict[str, int] = {}
    for index, file in enumerate(files):
        problem = path_problem(file.path)
        if problem is not None:
            yield FieldError(f"machine.files[{index}].path", f'"{file.path}" {problem}')
            continue
        if file.path not in first:
            first[file.path] = index
            continue
        other = files[first[file.path]]
        if file.op != "append" or other.op != "append":
            yield FieldError(
                f"machine.files[{index}].path",
                f'"{file.path}" is also written by machine.files[{first[file.path]}] '
                "(only appends may share a path)",
            )
