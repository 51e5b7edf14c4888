"""KubeletCSRController: a joining kubelet's first client certificate, approved and signed on a
control plane node the moment its request appears.

A worker's kubelet asks for its first client certificate with a CertificateSigningRequest made
with the bootstrap token. kube-controller-manager approves and signs those, but only once its
informers run, which on a new cluster is seconds after its API server answers (10 s more while
its node IPAM controller ran, which first waits a fixed 10 s; :mod:`.node_cidr` replaced it). A
kubelet meanwhile works as ``system:anonymous``; it keeps that connection until its transport
notices the certificate (4-5.5 s) and registers at its next back-off step (up to 7 s): a worker
joined 10 s or more after it could (docs/architecture.md, Cluster create performance).

Every control plane node holds the cluster CA (``RootSecrets k8s``) and a local admin kubeconfig
(``KubernetesSecrets k8s-certs``), so this controller watches the requests through its own API
server (a background task) and handles exactly what kube-controller-manager's node-client
approver would, and nothing more (:func:`bootstrap_request`):

- signer ``kubernetes.io/kube-apiserver-client-kubelet``;
- asked by a bootstrap token (user ``system:bootstrap:<id>`` in group ``system:bootstrappers``,
  set by the API server from the requester's credentials; a kubelet renewing its certificate is
  left to kube-controller-manager: nothing waits on that);
- a request whose signature verifies, with subject exactly Organization ``system:nodes`` and
  CommonName ``system:node:<name>`` (a valid node name), no subject alternative names, and the
  usages ``digital signature``, ``client auth`` and optionally ``key encipherment``;
- neither approved, denied nor failed yet, and no certificate yet;
- and, as kube-controller-manager asks too, the cluster's RBAC lets the requester ``create``
  ``certificatesigningrequests/nodeclient`` (a SubjectAccessReview): an operator who deleted
  the binding that grants it (to approve by hand) stops this controller as well.

It approves such a request (condition ``Approved``, reason :data:`REASON`) and signs it: the
subject is set from the checked name, never copied from the request, the usages are client
authentication only, the lifetime a year (kube-controller-manager's default). Whichever of the
control plane nodes and kube-controller-manager writes first wins: the API server refuses the
other writes as conflicts, which are ignored, and a request approved here but not signed (an
agent stopped in between) is signed on the next pass. Anything else is left to
kube-controller-manager, which keeps doing all of this as before.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

from kubeplane import pki
from kubeplane.clients import errors as client_errors
from kubeplane.clients import kube
from kubeplane.controllers.k8s import api_watch
from kubeplane.controllers.secrets import common, root
from kubeplane.controllers.secrets import kubernetes as kubernetes_secrets
from kubeplane.resources import catalog
from kubeplane.runtime import ControllerLogger, Input, Output, ReconcileContext

CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
BOOTSTRAP_USER_PREFIX = "system:bootstrap:"
BOOTSTRAPPERS_GROUP = "system:bootstrappers"
NODE_USER_PREFIX = "system:node:"
#: The reason of the ``Approved`` condition this controller writes.
REASON = "KubeplaneAutoApproved"
#: What kube-controller-manager signs for by default (``--cluster-signing-duration``).
LIFETIME = timedelta(days=365)
WATCH_TASK = "csrs"
_USAGES = (
    frozenset({"digital signature", "key encipherment", "client auth"}),
    frozenset({"digital signature", "client auth"}),
)
# A node name: a DNS-1123 subdomain (lower case alphanumerics, '-' and '.', at most 253 characters).
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclasses.dataclass(frozen=True)
class BootstrapRequest:
    """A request this controller may approve and sign: the node it names, and its PEM request."""

    node: str
    request: bytes


def bootstrap_request(csr: Mapping[str, Any]) -> BootstrapRequest | str:
    """The checked request of a CertificateSigningRequest this controller handles, or why not.

    The checks are those of kube-controller-manager's node-client approver (module docstring);
    the reason is for a debug log, never for the requester.
    """
    spec = csr.get("spec") or {}
    status = csr.get("status") or {}
    if spec.get("signerName") != SIGNER:
        return f"signer {spec.get('signerName')!r}"
    if status.get("certificate"):
        return "already signed"
    conditions = {str(c.get("type")): c for c in status.get("conditions") or () if isinstance(c, dict)}
    if "Denied" in conditions or "Failed" in conditions:
        return "denied or failed"
    if "Approved" in conditions and conditions["Approved"].get("reason") != REASON:
        return "approved by another approver"
    username = str(spec.get("username") or "")
    groups = spec.get("groups") or ()
    if not username.startswith(BOOTSTRAP_USER_PREFIX) or BOOTSTRAPPERS_GROUP not in groups:
        return f"asked by {username!r}, not a bootstrap token"
    if frozenset(spec.get("usages") or ()) not in _USAGES:
        return f"usages {sorted(spec.get('usages') or ())}"
    try:
        pem = base64.b64decode(str(spec.get("request") or ""), validate=True)
        request = x509.load_pem_x509_csr(pem)
        valid = request.is_signature_valid
    except ValueError:
        return "the request is not a PEM certificate request"
    if not valid:
        return "the request's signature does not verify"
    subject = request.subject
    organizations = [str(a.value) for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    common_names = [str(a.value) for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if organizations != [kube.NODES_GROUP] or len(common_names) != 1:
        return f"subject {subject.rfc4514_string()!r}"
    node = common_names[0].removeprefix(NODE_USER_PREFIX)
    if not common_names[0].startswith(NODE_USER_PREFIX) or len(node) > 253 or not _NODE_NAME.fullmatch(node):
        return f"common name {common_names[0]!r} is not system:node:<node name>"
    with contextlib.suppress(x509.ExtensionNotFound):
        request.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        return "the request asks for subject alternative names"
    return BootstrapRequest(node=node, request=pem)


def sign(ca: pki.CertKey, checked: BootstrapRequest) -> bytes:
    """The kubelet's client certificate for ``checked`` (PEM), signed by ``ca``."""
    return pki.sign_csr(
        ca=ca,
        csr=checked.request,
        usages=("client",),
        lifetime=LIFETIME,
        common_name=NODE_USER_PREFIX + checked.node,
        organizations=(kube.NODES_GROUP,),
    )


async def allowed(api: kube.KubeClient, csr: Mapping[str, Any]) -> bool:
    """Whether the cluster's policy lets the requester have its node client certificate
    approved: the SubjectAccessReview kube-controller-manager's approver makes (``create`` on
    ``certificatesigningrequests/nodeclient``), so deleting the binding that grants it (the
    ``01-csr-approver-role-binding`` manifest) stops this controller too."""
    spec = csr.get("spec") or {}
    review = await api.create(
        SUBJECT_ACCESS_REVIEWS,
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": spec.get("username") or "",
                "groups": list(spec.get("groups") or ()),
                "uid": spec.get("uid") or "",
                "extra": dict(spec.get("extra") or {}),
                "resourceAttributes": {
                    "group": "certificates.k8s.io",
                    "resource": "certificatesigningrequests",
                    "subresource": "nodeclient",
                    "verb": "create",
                },
            },
        },
    )
    return (review.get("status") or {}).get("allowed") is True


async def handle(
    api: kube.KubeClient, csr: Mapping[str, Any], ca: pki.CertKey, logger: ControllerLogger
) -> bool:
    """Approve and sign ``csr`` when :func:`bootstrap_request` accepts it; whether it was signed here."""
    checked = bootstrap_request(csr)
    name = str((csr.get("metadata") or {}).get("name") or "")
    if isinstance(checked, str):
        logger.debug("CSR %s left to kube-controller-manager: %s", name, checked)
        return False
    if not await allowed(api, csr):
        logger.debug("CSR %s left to kube-controller-manager: its requester may not ask for it", name)
        return False
    try:
        # Signed first: nothing is approved here that could not be signed here.
        certificate = await asyncio.to_thread(sign, ca, checked)
    except pki.PKIError as exc:  # a key type this signer does not take, say
        logger.warning("CSR %s left to kube-controller-manager: %s", name, exc)
        return False
    path = f"{CSR_PATH}/{name}"
    current = copy.deepcopy(dict(csr))
    conditions = current.setdefault("status", {}).setdefault("conditions", [])
    try:
        if not any(c.get("type") == "Approved" for c in conditions):
            conditions.append(
                {
                    "type": "Approved",
                    "status": "True",
                    "reason": REASON,
                    "message": "kubeplane approved this kubelet bootstrap client certificate",
                }
            )
            current = await api.replace(f"{path}/approval", current)
        current.setdefault("status", {})["certificate"] = base64.b64encode(certificate).decode()
        await api.replace(f"{path}/status", current)
    except (client_errors.KubeConflict, client_errors.KubeNotFound):
        # Another control plane node or kube-controller-manager got there first, or the
        # request is gone: whatever it is now comes back through the watch.
        return False
    logger.info("approved and signed CSR %s for node %s (kubelet bootstrap)", name, checked.node)
    return True


@dataclasses.dataclass(frozen=True)
class _Settings:
    kubeconfig: str = dataclasses.field(repr=False)
    ca: pki.CertKey = dataclasses.field(repr=False)


class KubeletCSRController(api_watch.WatchingController[_Settings]):
    """Approves and signs kubelet bootstrap client certificates (see module docstring)."""

    name = "k8s.KubeletCSRController"
    inputs = (
        Input(catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, root.K8S_ID),
        Input(
            catalog.SECRETS_NAMESPACE, catalog.KUBERNETES_SECRETS, kubernetes_secrets.KUBERNETES_SECRETS_ID
        ),
    )
    outputs: tuple[Output, ...] = ()  # it writes to the API server only
    task_name = WATCH_TASK
    task_what = "watching CSRs"

    def __init__(
        self,
        *,
        retry_interval: float = 2.0,
        watch_timeout: int = 300,
        kube_client: Callable[[str], kube.KubeClient] = kube.KubeClient,
    ) -> None:
        super().__init__()
        self.retry_interval = retry_interval
        self.watch_timeout = watch_timeout
        self.kube_client = kube_client

    @staticmethod
    def _read_settings(ctx: ReconcileContext) -> _Settings | None:
        secrets = common.running_spec(ctx, catalog.SECRETS_NAMESPACE, catalog.ROOT_SECRETS, root.K8S_ID)
        kubeconfig = kubernetes_secrets.local_admin_kubeconfig(ctx)
        if secrets is None or kubeconfig is None:
            return None
        ca = common.cert_key(secrets.get("ca") or {})
        if not ca.cert or not ca.key:
            return None
        return _Settings(kubeconfig=kubeconfig, ca=ca)

    async def _watch(self, settings: _Settings, logger: ControllerLogger) -> None:
        """List the requests, handle each, then follow the changes; again after any break."""
        signed: set[str] = set()  # UIDs: the watch then shows each again, still unsigned, once

        async def handle_once(api: kube.KubeClient, csr: Mapping[str, Any]) -> None:
            uid = str((csr.get("metadata") or {}).get("uid") or "")
            if uid not in signed and await handle(api, csr, settings.ca, logger) and uid:
                signed.add(uid)

        async def listed(api: kube.KubeClient, items: api_watch.Items) -> None:
            for csr in items:
                await handle_once(api, csr)

        async def changed(api: kube.KubeClient, kind: str, csr: dict[str, Any]) -> None:
            if kind in ("ADDED", "MODIFIED"):
                await handle_once(api, csr)

        await api_watch.follow(
            lambda: self.kube_client(settings.kubeconfig),
            CSR_PATH,
            listed=listed,
            changed=changed,
            logger=logger,
            retry_interval=self.retry_interval,
            watch_timeout=self.watch_timeout,
            what="CSR watch",
        )
