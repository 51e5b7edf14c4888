"""The DNS add-on's image holds Debian's python3 with dnspython, httpx and PyYAML: nothing else."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import kubeplane

pytestmark = pytest.mark.unit

SRC = Path(kubeplane.__file__).parent.parent
ALLOWED_THIRD_PARTY = {"dns", "httpx", "yaml"}
#: What the image may carry of kubeplane: the package, its client for the API server (the watch) with
#: what that client imports (clients.errors, clients.etcd for its TLS context, guard), and retry
#: (the reflectors' backoff).
ALLOWED_KUBEPLANE = ("kubeplane.dns", "kubeplane.clients", "kubeplane.retry", "kubeplane.guard")


def module_file(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def imported(path: Path) -> set[str]:
    """Absolute module names a file imports (``from a import b`` counts ``a.b`` when it is a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if module_file(f"{node.module}.{alias.name}")
            )
    return names


def closure() -> tuple[set[str], set[str]]:
    """(kubeplane modules, third-party top-level names) reachable from kubeplane.dns."""
    package = SRC / "kubeplane" / "dns"
    todo = [
        f"kubeplane.dns.{path.stem}" if path.stem != "__init__" else "kubeplane.dns"
        for path in package.glob("*.py")
    ]
    seen: set[str] = set()
    third_party: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_file(module)
        assert path is not None, module
        for name in imported(path):
            top = name.split(".")[0]
            if top == "kubeplane":
                todo.extend(part for part in (name, name.rpartition(".")[0]) if module_file(part))
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    return seen, third_party


def test_the_dns_closure_needs_only_dnspython_httpx_and_yaml() -> None:
    modules, third_party = closure()
    assert third_party <= ALLOWED_THIRD_PARTY, f"the image has only {ALLOWED_THIRD_PARTY}: {third_party}"
    outside = sorted(m for m in modules if m != "kubeplane" and not m.startswith(ALLOWED_KUBEPLANE))
    assert not outside, f"kubeplane.dns reaches beyond its image: {outside}"
    assert {"kubeplane.dns.answer", "kubeplane.dns.records", "kubeplane.dns.corefile"} <= modules
    # What the image builder must pack besides the package: exactly this closure today.
    assert {m for m in modules if not m.startswith("kubeplane.dns")} == {
        "kubeplane",
        "kubeplane.clients",
        "kubeplane.clients.errors",
        "kubeplane.clients.etcd",
        "kubeplane.clients.kube",
        "kubeplane.guard",
        "kubeplane.retry",
    }
