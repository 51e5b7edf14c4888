"""The root command loads command families on demand: its table must say what each registers."""

from __future__ import annotations

import importlib
import subprocess
import sys

import click
import pytest

from kubeplane.cli import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("family", sorted(main.FAMILIES))
def test_each_family_registers_exactly_the_commands_the_table_names(family: str) -> None:
    group = click.Group()
    importlib.import_module(family).register(group)
    assert tuple(group.commands) == main.FAMILIES[family]


def test_a_command_imports_its_family_and_not_the_provisioner() -> None:
    script = (
        "import sys\n"
        "from kubeplane.cli.main import cli\n"
        "import click\n"
        "with click.Context(cli) as ctx:\n"
        "    assert cli.get_command(ctx, 'get') is not None\n"
        "print('kubeplane.provision.create' in sys.modules, 'kubeplane.cli.node' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
