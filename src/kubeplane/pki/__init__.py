"""kubeplane.pki: keys, CAs, certificates, CSRs, tokens and kubeconfigs, as pure functions on PEM bytes.

This layer does no I/O: it is handed PEM bytes and returns PEM bytes (or strings), and callers
decide where they are stored. Modules:

- :mod:`~kubeplane.pki.keys`: private key generation/parsing, public key export, service account key,
  WireGuard (X25519) key pairs in base64;
- :mod:`~kubeplane.pki.certs`: :class:`CertKey`, CAs, leaf certificates, CSRs and signing,
  :func:`cert_info`, renewal checks, the kubeadm-style CA hash;
- :mod:`~kubeplane.pki.tokens`: bootstrap tokens and random symmetric secrets;
- :mod:`~kubeplane.pki.kubeconfig`: kubeconfig rendering.

ECDSA P-256 is the default key algorithm; RSA 2048/4096 and Ed25519 are accepted everywhere.

Node API roles travel in the client certificate's Organization: :data:`ROLE_ADMIN` may do
everything, :data:`ROLE_READER` only read; :data:`NODE_ORG` (worker certificates from trustd) is
no role.

Exceptions (all from :mod:`kubeplane.pki.errors`)::

    PKIError                      base class; catch this to handle any PKI failure
    ├── InvalidPEMError           bytes are not a parseable PEM certificate / key / CSR
    ├── UnsupportedAlgorithmError key algorithm or key type not supported
    ├── InvalidRequestError       bad request parameters (IP address, usage, empty name)
    ├── CAError                   CA cannot sign: no key, mismatched key, not a CA
    └── InvalidCSRError           CSR self-signature does not verify
"""

from kubeplane.pki.certs import (
    AGGREGATOR_CA_CN,
    USAGES,
    CertInfo,
    CertKey,
    Usage,
    aggregator_ca,
    ca_cert_hash,
    cert_info,
    is_ip,
    is_issued_by,
    issue,
    load_certificate,
    needs_renewal,
    new_ca,
    new_csr,
    sign_csr,
    split_sans,
)
from kubeplane.pki.errors import (
    CAError,
    InvalidCSRError,
    InvalidPEMError,
    InvalidRequestError,
    PKIError,
    UnsupportedAlgorithmError,
)
from kubeplane.pki.keys import (
    KEY_ALGORITHMS,
    KeyAlgorithm,
    generate_key,
    load_private_key,
    public_key_pem,
    service_account_key,
    wireguard_private_key,
    wireguard_public_key,
)
from kubeplane.pki.kubeconfig import kubeconfig
from kubeplane.pki.tokens import BOOTSTRAP_TOKEN_RE, bootstrap_token, random_secret

#: Organization of node API client certificates allowed to do everything.
ROLE_ADMIN = "kubeplane:admin"
#: Organization of node API client certificates allowed read-only calls.
ROLE_READER = "kubeplane:reader"
ROLES = (ROLE_ADMIN, ROLE_READER)
#: Organization of the worker node certificates trustd signs: a node identity, deliberately no role.
NODE_ORG = "kubeplane:node"

__all__ = [
    "AGGREGATOR_CA_CN",
    "BOOTSTRAP_TOKEN_RE",
    "KEY_ALGORITHMS",
    "NODE_ORG",
    "ROLES",
    "ROLE_ADMIN",
    "ROLE_READER",
    "USAGES",
    "CAError",
    "CertInfo",
    "CertKey",
    "InvalidCSRError",
    "InvalidPEMError",
    "InvalidRequestError",
    "KeyAlgorithm",
    "PKIError",
    "UnsupportedAlgorithmError",
    "Usage",
    "aggregator_ca",
    "bootstrap_token",
    "ca_cert_hash",
    "cert_info",
    "generate_key",
    "is_ip",
    "is_issued_by",
    "issue",
    "kubeconfig",
    "load_certificate",
    "load_private_key",
    "needs_renewal",
    "new_ca",
    "new_csr",
    "public_key_pem",
    "random_secret",
    "service_account_key",
    "sign_csr",
    "split_sans",
    "wireguard_private_key",
    "wireguard_public_key",
]
