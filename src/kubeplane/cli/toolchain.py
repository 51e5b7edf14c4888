"""`kubeplane toolchain` commands: build and show the cache of real Kubernetes components."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import yaml

import kubeplane
from kubeplane.cli import progress
from kubeplane.provision import checkpointer_image, dns_image, python_image, steps, toolchain, workload_images

CACHE_OPTION = click.option(
    "--cache",
    "cache_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Cache directory (default ${toolchain.CACHE_ENV} or {toolchain.DEFAULT_CACHE}).",
)


@click.group("toolchain")
def group() -> None:
    """Build and inspect the real Kubernetes components (binaries and images) kubeplane runs."""


@group.command("build")
@click.option(
    "--version",
    "versions",
    multiple=True,
    metavar="VERSION",
    help=f"Kubernetes version string to build (repeatable; default {kubeplane.DEFAULT_KUBERNETES_VERSION}). "
    "A suffix (v1.20.2-kp.1) builds a distinct build of the same source.",
)
@click.option(
    "--with-images",
    is_flag=True,
    help="Also build the images kubeplane makes besides Kubernetes' own, which cluster create pushes: "
    "the cluster DNS and pod-checkpointer images (one Debian minbase rootfs with Python, about a "
    "minute cold), busybox (from Debian's busybox-static) and agnhost (from the Kubernetes source "
    "tree; seconds after a Kubernetes build). Each is built once per machine and cached.",
)
@CACHE_OPTION
def build(versions: tuple[str, ...], with_images: bool, cache_dir: Path | None) -> None:
    """Fetch Debian's kubernetes source, build binaries and images, and cache them by version."""
    tc = toolchain.Toolchain(cache_dir)
    versions = versions or (kubeplane.DEFAULT_KUBERNETES_VERSION,)
    for version in versions:
        # Reject a mistyped version before spending minutes on the others.
        try:
            toolchain.parse_version(version)
        except toolchain.ToolchainError as exc:
            raise click.ClickException(f"--version: {exc}") from exc
    for version in versions:
        started = time.monotonic()
        click.echo(f"toolchain {version} in {tc.cache_dir}", err=True)
        try:
            with progress.display() as shown:
                paths = tc.ensure(version, progress=shown)
        except (toolchain.ToolchainError, steps.StepError) as exc:
            raise click.ClickException(f"toolchain build {version}: {exc}") from exc
        click.echo(f"toolchain {version} ready in {time.monotonic() - started:.1f}s: {paths.root}", err=True)
    if with_images:
        _build_images(tc.cache_dir)


def _build_images(cache_dir: Path) -> None:
    """The Python images, then the workload images (agnhost needs the source tree a build left)."""
    for builder in (dns_image.Builder(cache_dir), checkpointer_image.Builder(cache_dir)):
        started = time.monotonic()
        try:
            with progress.display() as shown:
                image = builder.ensure(progress=shown)
        except (python_image.PythonImageError, steps.StepError) as exc:
            raise click.ClickException(f"image {builder.recipe.ref()}: {exc}") from exc
        click.echo(f"image {image.ref} ready in {time.monotonic() - started:.1f}s", err=True)
    started = time.monotonic()
    try:
        with progress.display() as shown:
            workloads = workload_images.Builder(cache_dir).ensure(progress=shown)
    except (workload_images.WorkloadImageError, steps.StepError) as exc:
        raise click.ClickException(f"workload images: {exc}") from exc
    refs = ", ".join(ref for image in workloads for ref in image.refs)
    click.echo(f"workload images {refs} ready in {time.monotonic() - started:.1f}s", err=True)


@group.command("show")
@click.option(
    "-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True
)
@CACHE_OPTION
def show(output: str, cache_dir: Path | None) -> None:
    """List cached versions and their artifacts (verifying each against its stamp)."""
    tc = toolchain.Toolchain(cache_dir)
    entries = [tc.status(version) for version in tc.versions()]
    if output == "json":
        click.echo(json.dumps(entries, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(entries, sort_keys=False), nl=False)
    else:
        click.echo(f"{'VERSION':<16} {'COMPLETE':<9} {'SOURCE PACKAGE':<36} ROOT")
        for entry in entries:
            complete = "yes" if entry["complete"] else "no"
            click.echo(f"{entry['version']:<16} {complete:<9} {entry['source_package']:<36} {entry['root']}")


def register(group_: click.Group) -> None:
    """Add this family's commands to the root group."""
    group_.add_command(group)
