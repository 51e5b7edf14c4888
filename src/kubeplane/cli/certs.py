"""``kubeplane certs``: every certificate on the nodes and in the client config, soonest expiry first.

The nodes report what they keep on disk (:mod:`kubeplane.agent.certs`: etcd, the Kubernetes
components, the kubelet's kubeconfigs and rotated certificates); the client config adds each
context's client certificate and OS CA. Expired ones and those expiring within ``--warn`` (30 days
by default) are flagged in the table and counted in a warning, so a renewal is planned before an
outage, not after.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Iterable
from typing import Any

import click

from kubeplane import pki
from kubeplane.api import NodeClient
from kubeplane.cli import connect, output

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


@click.command()
@click.option(
    "--warn",
    default="720h",
    show_default=True,
    metavar="DURATION",
    help="Flag certificates that expire within DURATION (RENEW) or have expired (EXPIRED).",
)
@output.output_option
def certs(*, warn: str, fmt: output.Format) -> None:
    """List the certificates of the nodes (-n A,B) and of the client config, soonest expiry first.

    Each node reports those it keeps on disk: etcd's, the Kubernetes components', the kubelet's
    kubeconfigs and rotated certificates; only public parts (subject, issuer, expiry), never keys.
    """
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
