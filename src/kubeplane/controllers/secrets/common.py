"""What the secrets controllers share: reading inputs, PEM pairs, fingerprints and renewal timing.

Issued certificates are kept until either an input that went into them changes (detected by a
fingerprint of those inputs stored beside the certificates) or one of them enters its renewal
window; the controllers then ask to be woken up when the earliest one does, so renewal needs no
input change. An operator can also ask for a renewal now (``kubeplane certs renew``): a
``CertificateRenewals`` resource whose ``notBefore`` is later than the certificates' ``issued``
time re-issues them once (:func:`renewal_requested`). It is compared with ``issued``, never mixed
into the inputs fingerprint, so the same request made twice, or still present after the
certificates were re-issued for it, re-issues nothing more.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from kubeplane import pki
from kubeplane.pki import certs
from kubeplane.resources import Phase
from kubeplane.runtime import ReconcileContext

#: Returns the current time (timezone-aware UTC); tests inject a fixed one.
Clock = Callable[[], datetime]

#: Spec key under which issuing controllers store the fingerprint of their inputs.
FINGERPRINT_KEY = "inputsFingerprint"

# Renewal is re-checked at least this often, so a suspended machine or a stepped clock cannot
# leave a certificate expired for long.
MAX_RENEWAL_CHECK = timedelta(hours=1)


def utc_now() -> datetime:
    """The default clock."""
    return datetime.now(UTC)


def running_spec(
    ctx: ReconcileContext, namespace: str, type_name: str, resource_id: str
) -> dict[str, Any] | None:
    """The spec of a resource as a plain dict, None when it is missing or being torn down.

    Positional like ``ctx.find``, whose arguments it takes.
    """
    resource = ctx.find(namespace, type_name, resource_id)
    if resource is None or resource.metadata.phase is not Phase.RUNNING:
        return None
    return resource.spec.to_dict()


def pair(cert_key: pki.CertKey) -> dict[str, str]:
    """A certificate and key as the ``{crt, key}`` PEM strings the secrets resources hold."""
    return {"crt": cert_key.cert.decode(), "key": cert_key.key.decode()}


def cert_key(data: Mapping[str, Any]) -> pki.CertKey:
    """The inverse of :func:`pair` (``key`` may be absent)."""
    return pki.CertKey(cert=str(data.get("crt", "")).encode(), key=str(data.get("key", "")).encode())


def fingerprint(inputs: Mapping[str, Any]) -> str:
    """A stable digest of the JSON-able issuing inputs (key order does not matter)."""
    encoded = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()


def renewal_time(cert_pem: bytes) -> datetime:
    """When :func:`kubeplane.pki.needs_renewal` (default window) starts saying yes for this certificate."""
    info = pki.cert_info(cert_pem)
    return info.not_after - min(certs.MAX_RENEWAL_WINDOW, info.lifetime / 3)


def reissue_reason(
    existing: Mapping[str, Any] | None, *, inputs_fingerprint: str, issued: Mapping[str, bytes], now: datetime
) -> str | None:
    """Why the certificates in ``existing`` must be issued again, or None to keep them.

    ``issued`` maps a certificate's name to its PEM as read back from ``existing``.
    """
    if existing is None:
        return "none issued yet"
    if existing.get(FINGERPRINT_KEY) != inputs_fingerprint:
        return "inputs changed"
    for name, cert_pem in issued.items():
        if not cert_pem:
            return f"{name} certificate missing"
        if pki.needs_renewal(cert_pem, now=now):
            return f"{name} certificate is due for renewal"
    return None


def renewal_requested(existing: Mapping[str, Any] | None, request: Mapping[str, Any] | None) -> str | None:
    """Why an operator's renewal request re-issues the certificates in ``existing``, or None.

    ``request`` is a ``CertificateRenewals`` spec; it asks for certificates issued at or after its
    ``notBefore``. Certificates without a readable ``issued`` time count as older than any request.
    """
    if existing is None or request is None or not request.get("notBefore"):
        return None
    not_before = datetime.fromisoformat(str(request["notBefore"]))
    try:
        issued: datetime | None = datetime.fromisoformat(str(existing.get("issued")))
    except ValueError:
        issued = None
    if issued is not None and issued >= not_before:
        return None
    return f"renewal requested for certificates issued before {not_before.isoformat()}"


def requeue_for_renewal(ctx: ReconcileContext, cert_pems: Iterable[bytes], *, now: datetime) -> None:
    """Wake the controller when the first of these certificates is due for renewal (re-checked hourly)."""
    first = min(renewal_time(pem) for pem in cert_pems)
    delay = min(max(first - now, timedelta(seconds=1)), MAX_RENEWAL_CHECK)
    ctx.requeue_after(delay.total_seconds())


def next_version(existing: Mapping[str, Any] | None, *, changed: bool, last: int) -> int:
    """The secrets version to publish: +1 whenever file contents changed, never going backwards.

    ``existing`` is the current status spec (its ``version`` wins over ``last``, the version this
    controller published before, which survives the status being torn down and re-created).
    """
    previous = int(existing.get("version") or 0) if existing is not None else last
    return previous + 1 if changed or previous == 0 else previous
