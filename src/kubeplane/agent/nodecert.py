"""The node API certificate a worker got from trustd, kept on disk for its next boots.

A worker holds no OS CA key: each boot it asks trustd on the control plane for a new certificate.
If that cannot succeed (a wrong ``cluster.controlPlane.endpoint``, the control plane down), the
worker still serves its secure API with the certificate it got last, so an operator can reach it
with a client certificate and fix its config (README "Recovering a node that cannot boot").

The certificate and key live under the node's secret directory (mode 0600), are used only while
valid and issued by the current ``machine.ca``, and are replaced by every new one trustd signs.
"""

from __future__ import annotations

import contextlib
import datetime

from kubeplane import api, fileio, pki
from kubeplane.config.paths import NodePaths


def load(paths: NodePaths, ca: bytes) -> api.Credentials | None:
    """The held certificate, if there is one still valid and issued by ``ca`` (blocking I/O)."""
    directory = paths.secrets / "node-api"
    with contextlib.suppress(OSError, ValueError, pki.PKIError):
        cert = (directory / "node.crt").read_bytes()
        key = (directory / "node.key").read_bytes()
        if pki.is_issued_by(cert, ca) and pki.cert_info(cert).not_after > datetime.datetime.now(datetime.UTC):
            return api.Credentials(ca=ca, cert=cert, key=key)
    return None


def save(paths: NodePaths, credentials: api.Credentials) -> None:
    """Keep ``credentials`` for the next boots (blocking I/O)."""
    directory = paths.secrets / "node-api"
    directory.mkdir(mode=fileio.PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    fileio.write_atomic(directory / "node.key", credentials.key, mode=fileio.SECRET_MODE)
    fileio.write_atomic(directory / "node.crt", credentials.cert, mode=fileio.SECRET_MODE)
