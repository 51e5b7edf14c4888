"""`kubeplane clientconfig` commands."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add this family's commands to the root group."""
    del group
