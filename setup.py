"""Build step of kubeplane: the node API's Python message modules are generated from its .proto
files (``src/kubeplane/api/proto``) with grpcio-tools whenever the project is built or installed,
editable installs included, and are never committed. Everything else is in pyproject.toml."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROTO_ROOT = Path(__file__).resolve().parent / "src" / "kubeplane" / "api" / "proto"


def generate_messages() -> None:
    """``*_pb2.py`` and ``*_pb2.pyi`` next to each ``.proto`` (its import path is its path below
    PROTO_ROOT, e.g. ``kubeplane/node/v1/machine.proto``)."""
    from grpc_tools import protoc  # noqa: PLC0415 (a build requirement, not installed at run time)

    protos = sorted(str(path.relative_to(PROTO_ROOT)) for path in PROTO_ROOT.rglob("*.proto"))
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={PROTO_ROOT}",
        f"--pyi_out={PROTO_ROOT}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(protos)}; its message is above")


class BuildPy(build_py):
    """build_py that generates the message modules first, so they are collected like any module."""

    def run(self) -> None:
        generate_messages()
        super().run()


setup(cmdclass={"build_py": BuildPy})
