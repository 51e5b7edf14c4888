"""ExtraManifestController: ``extra-manifests`` kcpc → ``extras/Manifests``.

Downloads every URL (custom CNI manifests, ``cluster.extraManifests``) with the configured
``cluster.extraManifestHeaders`` and parses them, and the inline manifests, as multi-document YAML;
each source becomes one Manifest whose id is ``<priority>-<url or name>``.

Failures are per manifest: a URL that cannot be downloaded (the message names it) or YAML that
does not parse into objects is logged as an error and leaves every other manifest published. The
failed manifest keeps its previously published content, if any, so a flaky server does not make a
manifest disappear, and the controller tries again after ``retry_interval`` seconds.

HTTPS downloads trust what the machine trusts, as containerd's pulls do: the machine's CA
bundles (``/etc/ssl/certs/ca-certificates.crt`` and the custom-CA guide's
``/etc/ssl/certs/ca-certificates``, where ``machine.files`` appends a PEM) on top of OpenSSL's
defaults, not only the CA list bundled with the HTTP library. They are read at each reconcile,
so an appended CA counts from the next download on.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kubeplane.controllers import ControllerError
from kubeplane.controllers.k8s import control_plane, outputs
from kubeplane.resources import catalog
from kubeplane.runtime import Input, Output, OutputKind, ReconcileContext

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)


def machine_trust(bundles: Sequence[Path]) -> ssl.SSLContext:
    """A client TLS context trusting OpenSSL's defaults and every CA in ``bundles`` that exists
    (one that does not parse is skipped and logged: the others still count)."""
    context = ssl.create_default_context()
    for bundle in bundles:
        if not bundle.is_file():
            continue
        try:
            context.load_verify_locations(cafile=str(bundle))
        except (ssl.SSLError, OSError) as exc:
            log.warning("CA bundle %s not used: %s", bundle, exc)
    return context


class ManifestSourceError(ControllerError):
    """One extra manifest could not be fetched or parsed; the message names it and says why."""


def parse_documents(text: str, *, source: str) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML stream (empty documents skipped)."""
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ManifestSourceError(f"{source} is not valid YAML: {' '.join(str(exc).split())}") from exc
    objects = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise ManifestSourceError(
                f"{source}: document {index} is a {type(document).__name__}, not a Kubernetes object"
            )
        objects.append(document)
    return objects


async def download(client: httpx.AsyncClient, url: str, *, headers: Mapping[str, str]) -> str:
    """The body of ``url``; any failure raises :class:`ManifestSourceError` naming the URL (without
    its credentials)."""
    import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

    shown = control_plane.redact_url(url)
    try:
        response = await client.get(url, headers=dict(headers))
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise ManifestSourceError(
            f"downloading extra manifest {shown} failed: HTTP {exc.response.status_code}; "
            "check the URL and cluster.extraManifestHeaders"
        ) from None
    except httpx.HTTPError as exc:
        reason = str(exc).replace(url, shown) or type(exc).__name__
        raise ManifestSourceError(
            f"downloading extra manifest {shown} failed: {reason}; check the URL"
        ) from None
    return response.text


class ExtraManifestController:
    """Publishes downloaded and inline extra manifests (see module docstring)."""

    name = "k8s.ExtraManifestController"
    inputs = (
        Input(
            catalog.CONFIG_NAMESPACE, catalog.KUBERNETES_CONTROL_PLANE_CONFIGS, control_plane.EXTRA_MANIFESTS
        ),
    )
    # Shared: ManifestController writes the same type in the ``controlplane`` namespace.
    outputs = (Output(catalog.MANIFESTS, OutputKind.SHARED),)

    def __init__(
        self, *, ca_bundles: Sequence[Path] = (), timeout: float = 30.0, retry_interval: float = 30.0
    ) -> None:
        self.ca_bundles = tuple(ca_bundles)
        self.timeout = timeout
        self.retry_interval = retry_interval

    async def reconcile(self, ctx: ReconcileContext) -> None:
        namespace = catalog.EXTRAS_NAMESPACE
        config = ctx.find(
            catalog.CONFIG_NAMESPACE, catalog.KUBERNETES_CONTROL_PLANE_CONFIGS, control_plane.EXTRA_MANIFESTS
        )
        if config is None:
            ctx.cleanup(namespace, catalog.MANIFESTS, ())
            return
        data = config.spec.to_dict()
        headers = {str(k): str(v) for k, v in (data.get("headers") or {}).items()}
        results: dict[str, list[dict[str, Any]] | ManifestSourceError] = {}

        # Off the event loop: loading the bundle takes tens of milliseconds.
        trust = await asyncio.to_thread(machine_trust, self.ca_bundles)
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        async with httpx.AsyncClient(verify=trust, timeout=self.timeout, follow_redirects=True) as client:

            async def fetch(entry: Mapping[str, Any]) -> None:
                url = str(entry["url"])
                shown = control_plane.redact_url(url)
                try:
                    results[entry["id"]] = parse_documents(
                        await download(client, url, headers=headers), source=f"extra manifest {shown}"
                    )
                except ManifestSourceError as exc:
                    results[entry["id"]] = exc

            await asyncio.gather(*(fetch(entry) for entry in data.get("urls") or ()))
        for entry in data.get("inline") or ():
            try:
                source = f"inline manifest {entry['name']!r}"
                results[entry["id"]] = parse_documents(str(entry["contents"]), source=source)
            except ManifestSourceError as exc:
                results[entry["id"]] = exc

        failed = False
        for manifest_id, result in results.items():
            if isinstance(result, ManifestSourceError):
                ctx.logger.error("%s", result)
                failed = True
                continue
            outputs.publish(
                ctx, namespace, catalog.MANIFESTS, manifest_id, catalog.ManifestSpec(items=result)
            )
        ctx.cleanup(namespace, catalog.MANIFESTS, results)
        if failed:
            ctx.requeue_after(self.retry_interval)
