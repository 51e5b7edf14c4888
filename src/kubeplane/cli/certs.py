"""``kubeplane certs``: every certificate on the nodes and in the client config, soonest expiry
first; ``kubeplane certs renew``: a rolling renewal of the control plane's Kubernetes certificates.

The report. The nodes report what they keep on disk (:mod:`kubeplane.agent.certs`: etcd, the
Kubernetes components, the kubelet's kubeconfigs and rotated certificates); the client config adds
each context's client certificate and OS CA. Expired ones and those expiring within ``--warn`` (30
days by default) are flagged in the table and counted in a warning, so a renewal is planned before
an outage, not after.

The renewal is :mod:`kubeplane.ops.renew`, run like ``upgrade-k8s`` (:mod:`kubeplane.cli.upgrade`,
whose node API, Kubernetes API and load balancer adapters it reuses): control plane nodes are
discovered from Kubernetes Nodes, ``-n`` only names the node to talk through, the cluster
operation Lease is held, and a failed run prints the command that continues it.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from kubeplane import pki
from kubeplane import plan as plan_module
from kubeplane.api import CallError, NodeClient
from kubeplane.cli import connect, output, progress
from kubeplane.cli import upgrade as cli_upgrade
from kubeplane.controllers.secrets.kubernetes import APISERVER_CN
from kubeplane.ops import oplock, renew
from kubeplane.ops.errors import OpsError
from kubeplane.resources import catalog

HEADERS = ("NODE", "EXPIRES", "LEFT", "", "SUBJECT", "ISSUER", "WHAT", "PATH")
#: Where the client config's certificates show up in the NODE column.
CLIENT_CONFIG = "(client config)"


def register(group: click.Group) -> None:
    """Add this family's commands to the root group."""
    group.add_command(certs)


def _client_config_certificates() -> list[dict[str, Any]]:
    path, config = connect.load_client_config(connect.options())
    found = []
    for name, context in sorted(config.contexts.items()):
        for what, text in (("client certificate", context.crt), ("OS CA", context.ca)):
            try:
                info = pki.cert_info(base64.b64decode(text))
            except (ValueError, binascii.Error, pki.PKIError):
                continue
            found.append(
                {
                    "node": CLIENT_CONFIG,
                    "path": path,
                    "what": f"{what} of context {name}",
                    "subject": info.subject_cn,
                    "issuer": info.issuer_cn,
                    "not_after": info.not_after.isoformat(timespec="seconds"),
                    "is_ca": info.is_ca,
                }
            )
    return found


def _flag(left: datetime.timedelta, warn: datetime.timedelta) -> str:
    if left.total_seconds() <= 0:
        return "EXPIRED"
    return "RENEW" if left <= warn else ""


def _rows(
    items: Iterable[dict[str, Any]], now: datetime.datetime, warn: datetime.timedelta
) -> list[list[str]]:
    rows = []
    for item in items:
        left = datetime.datetime.fromisoformat(str(item["not_after"])) - now
        rows.append(
            [
                str(item["node"]),
                str(item["not_after"]),
                output.duration(left.total_seconds()) if left.total_seconds() > 0 else "-",
                _flag(left, warn),
                str(item["subject"]),
                str(item["issuer"]),
                str(item["what"]),
                str(item["path"]),
            ]
        )
    return rows


@click.group(invoke_without_command=True)
@click.option(
    "--warn",
    default="720h",
    show_default=True,
    metavar="DURATION",
    help="Flag certificates that expire within DURATION (RENEW) or have expired (EXPIRED).",
)
@output.output_option
@click.pass_context
def certs(ctx: click.Context, *, warn: str, fmt: output.Format) -> None:
    """List the certificates of the nodes (-n A,B) and of the client config, soonest expiry first.

    Each node reports those it keeps on disk: etcd's, the Kubernetes components', the kubelet's
    kubeconfigs and rotated certificates; only public parts (subject, issuer, expiry), never keys.
    `kubeplane certs renew` renews the control plane's Kubernetes certificates.
    """
    if ctx.invoked_subcommand is not None:
        return
    window = datetime.timedelta(seconds=output.parse_duration(warn))
    target = connect.resolve(connect.options())
    outcome = connect.Outcome()
    listed = outcome.results(connect.with_client(target, NodeClient.certificates))
    items = [{"node": node, **item} for node, found in listed for item in found]
    items += _client_config_certificates()
    items.sort(key=lambda item: (str(item["not_after"]), str(item["node"]), str(item["path"])))
    now = datetime.datetime.now(datetime.UTC)
    rows = _rows(items, now, window)
    if fmt != "table":
        click.echo(output.documents(items, fmt), nl=False)
    else:
        click.echo(output.table(HEADERS, rows), nl=False)
    flagged = [row for row in rows if row[3]]
    if flagged:
        expired = sum(1 for row in flagged if row[3] == "EXPIRED")
        click.echo(
            f"warning: {expired} certificate(s) expired and {len(flagged) - expired} expire within {warn}",
            err=True,
        )
    outcome.finish()


# --- certs renew ------------------------------------------------------------------------------


class RenewalNodeAPI(cli_upgrade.NodeAPIAdapter):
    """:class:`kubeplane.ops.renew.NodeAPI` over the node API (one forwarding client per node)."""

    async def cert_state(self, node: str) -> renew.CertState:
        try:
            status = await self.ask(
                node,
                lambda c: c.resource_get(
                    catalog.SECRET_STATUSES,
                    catalog.STATIC_POD_SECRETS_ID,
                    namespace=catalog.CONTROLPLANE_NAMESPACE,
                ),
            )
        except CallError as exc:
            if exc.code != "NOT_FOUND":
                raise
            raise OpsError(
                f"node {node} has no control plane secrets on disk (SecretStatuses "
                f"{catalog.STATIC_POD_SECRETS_ID}): is its control plane running?"
            ) from exc
        spec = status.get("spec") or {}
        issued = str(spec.get("issued") or "")
        found = await self.ask(node, lambda c: c.certificates())
        serving = [
            str(item["not_after"])
            for item in found
            if item.get("subject") == APISERVER_CN and not item.get("is_ca")
        ]
        return renew.CertState(
            issued=datetime.datetime.fromisoformat(issued) if issued else None,
            secrets_version=int(spec.get("version") or 0),
            expires=min(serving, default=""),
        )

    async def renew(self, node: str, *, not_before: datetime.datetime) -> datetime.datetime:
        seconds = int(not_before.timestamp())
        result = await self.ask(node, lambda c: c.kubernetes_certificates_renew(not_before=seconds))
        return datetime.datetime.fromisoformat(str(result["notBefore"]))


def _cutoff(text: str | None) -> datetime.datetime:
    """``--issued-before`` (ISO 8601, UTC without an offset), or now; whole seconds, never ahead."""
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    if text is None:
        return now
    try:
        value = datetime.datetime.fromisoformat(text)
    except ValueError as exc:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 time", param_hint="--issued-before") from exc
    value = (value if value.tzinfo else value.replace(tzinfo=datetime.UTC)).replace(microsecond=0)
    if value > now:
        raise click.BadParameter(f"{text} is in the future", param_hint="--issued-before")
    return value


def _resume_command(*, cutoff: datetime.datetime, endpoint: str | None, kubeconfig: str | None) -> str:
    words = ["certs", "renew", "--issued-before", renew.timestamp(cutoff)]
    words += ["--endpoint", endpoint] if endpoint else []
    words += ["--kubeconfig", kubeconfig] if kubeconfig else []
    return connect.command_line(*words)


async def _renew(
    *,
    options: renew.Options,
    target: connect.Target,
    kubeconfig: str | None,
    endpoint: str | None,
    dry_run: bool,
    fmt: output.Format,
    resume: str,
) -> None:
    node_api = RenewalNodeAPI(target)
    kube: cli_upgrade.KubeAPIAdapter | None = None
    try:
        kubeconfig_text = kubeconfig or await node_api.kubeconfig(options.via[0] if options.via else None)
        kube = cli_upgrade.kube_api(kubeconfig_text, endpoint)
        observed = await renew.prepare(options=options, node_api=node_api, kube=kube)
        plan = renew.build_plan(observed)
        if cli_upgrade.show_plan(plan, observed.control_plane, fmt=fmt, dry_run=dry_run):
            return
        rotation = cli_upgrade.rotation_of(observed.control_plane)
        click.echo(plan.render())
        # Printed before any change: a run killed outright prints no resume message of its own.
        click.echo(f"to continue this renewal if it is interrupted: {resume}")
        with progress.display() as shown:
            renewer = renew.Renewer(
                observed=observed,
                node_api=node_api,
                kube=kube,
                rotation=rotation,
                progress=shown,
                timing=cli_upgrade.TIMING,
            )
            async with oplock.held(kube.lease_store(), operation="certs-renew"):
                results = await renewer.run(plan, resume=resume)
        rows = [
            [expiry.node.name, expiry.node.address, expiry.before or "-", expiry.after or "-", result.outcome]
            for expiry, result in zip(renewer.expiries, results, strict=True)
        ]
        click.echo(output.table(("NODE", "ADDRESS", "EXPIRY BEFORE", "EXPIRY AFTER", "STEP"), rows), nl=False)
        changed = len(plan_module.changed_steps(results))
        click.echo(
            f"renewal completed: {changed} node(s) renewed, {len(results) - changed} already renewed "
            f"(issued at or after {renew.timestamp(observed.cutoff)})"
        )
    finally:
        await node_api.close()
        if kube is not None:
            await kube.close()


@certs.command("renew")
@click.option(
    "--issued-before",
    metavar="TIME",
    help="Renew the certificates issued before TIME (ISO 8601, UTC without an offset; default: now). "
    "A failed run prints the command that continues it with this set.",
)
@click.option(
    "--endpoint", metavar="URL", help="Kubernetes API endpoint to use instead of the kubeconfig's server."
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, exists=True),
    help="Admin kubeconfig (default: asked from a node).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@output.output_option
def renew_command(
    *,
    issued_before: str | None,
    endpoint: str | None,
    kubeconfig: str | None,
    dry_run: bool,
    fmt: output.Format,
) -> None:
    """Renew the control plane's Kubernetes certificates, one node at a time, with the same CAs.

    Every control plane node (-n only names the node to talk through) in turn leaves the load
    balancer's rotation (when another API server serves), re-issues its kube-apiserver serving
    certificate, its kubelet and front-proxy client certificates and the admin,
    kube-controller-manager and kube-scheduler kubeconfigs, and returns once its kube-apiserver,
    kube-controller-manager and kube-scheduler run with them and are Ready. The CAs, etcd's and
    the kubelets' certificates are not renewed. Prints each node's serving certificate expiry
    before and after.
    """
    obj = connect.options()
    target = connect.resolve(obj)
    cutoff = _cutoff(issued_before)
    options = renew.Options(cutoff=cutoff, via=obj.nodes)
    kubeconfig_text = Path(kubeconfig).read_text(encoding="utf-8") if kubeconfig else None
    cli_upgrade.run_operation(
        _renew(
            options=options,
            target=target,
            kubeconfig=kubeconfig_text,
            endpoint=endpoint,
            dry_run=dry_run,
            fmt=fmt,
            resume=_resume_command(cutoff=cutoff, endpoint=endpoint, kubeconfig=kubeconfig),
        ),
        target=target,
    )
