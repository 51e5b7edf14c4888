"""`kubeplane validate`: check a machine configuration file and print every problem."""

from __future__ import annotations

import click

from kubeplane import config


@click.command("validate")
@click.option(
    "-f", "--file", "path", required=True, type=click.Path(dir_okay=False), help="Machine config to check."
)
@click.option(
    "-m",
    "--mode",
    type=click.Choice(config.MODES),
    default="local",
    show_default=True,
    help="Where the config will run: a real machine, a container, or a kubeplane local cluster.",
)
def validate(path: str, mode: config.Mode) -> None:
    """Validate a machine configuration file (all problems are reported at once)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read()
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc.strerror}") from None
    try:
        document = config.load(text, mode=mode)
    except config.ConfigError as exc:
        for error in exc.errors:
            click.echo(str(error), err=True)
        count = len(exc.errors)
        noun = "problem" if count == 1 else "problems"
        raise click.ClickException(f"{path} is not valid for {mode} mode ({count} {noun})") from None
    for warning in document.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{path} is valid for {mode} mode")


def register(group: click.Group) -> None:
    """Add ``validate`` to the root group."""
    group.add_command(validate)
