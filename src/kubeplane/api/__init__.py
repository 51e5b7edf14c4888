"""kubeplane.api: the node API — gRPC over mutual TLS, roles, multi-node proxying, and its client.

Modules:

- :mod:`~kubeplane.api.wire`: service name, JSON codec, metadata keys and the call table
  (:data:`~kubeplane.api.wire.CALLS`); adding a call is one entry there plus a backend method;
- :mod:`~kubeplane.api.backend`: :class:`NodeBackend`, what the agent implements;
- :mod:`~kubeplane.api.auth`: credentials, roles from certificate organizations, access rules;
- :mod:`~kubeplane.api.server`: :func:`serve`, :func:`serve_maintenance`;
- :mod:`~kubeplane.api.client`: :class:`NodeClient`;
- :mod:`~kubeplane.api.transport`: one channel to one endpoint (shared by client and proxy).

Transport. Service ``kubeplane.machine.Machine`` on port 50000 (``machine.ports.nodeAPI``; the
client takes ``host:port`` endpoints for another port), registered without generated
code: requests and responses are JSON documents (see :mod:`kubeplane.api.wire`). The secure
server requires client certificates signed by the OS CA; the maintenance server (a node without
a machine config) speaks TLS with a self-signed certificate, takes no client certificates and
accepts only Version and ApplyConfiguration (the original's ``apply-config --insecure``).

Roles. The client certificate's Organization: ``kubeplane:admin`` may make every call;
``kubeplane:reader`` may not change anything (apply, services, reboot), read the machine config,
read files, or touch resource types the node flags as sensitive. Refusals are PERMISSION_DENIED
naming the role and the call; a certificate with no kubeplane role is refused outright.

Proxying. A call whose metadata has ``nodes: a,b,c`` is checked against the caller's role on the
receiving node, then sent concurrently to each node (``a`` → ``a:PORT``, the receiving node's own
``machine.ports.nodeAPI`` unless the entry is ``a:port``; a name of the receiving node itself is
served in-process). Unary answers are ``{"replies": [{node, result | error}]}``,
stream messages each carry their ``node``; one node failing (down, refusing, erroring) is an
error entry for that node and the others still answer. The receiving node forwards with its own
client certificate (O=``kubeplane:proxy``, issued by the OS CA) and adds ``kubeplane-role: ROLE``
(the caller's role). A target believes that header only from a proxy certificate — from anyone
else it is ignored and their own certificate decides — and a proxy certificate without a valid
caller role gets nothing, so forwarding can never raise a caller above the role their own
certificate gave them. Targets never forward again (a forwarded call is always served locally),
so node lists cannot loop.

Exceptions (all from :mod:`kubeplane.api.errors`)::

    APIError                        base class of the node API
    ├── BackendError                raised by a NodeBackend; ``code`` is the gRPC status sent
    │   ├── NotFoundError           NOT_FOUND: no such resource / file / service
    │   ├── InvalidArgumentError    INVALID_ARGUMENT: ``fields`` = [(path, problem)]
    │   ├── FailedPreconditionError FAILED_PRECONDITION: valid, but not in this state/mode
    │   ├── PermissionDeniedError   PERMISSION_DENIED: the role may not do this
    │   └── UnavailableError        UNAVAILABLE: try again later
    ├── CallError                   client side: a call failed on a node (``code``, ``node``, ``fields``)
    ├── ConnectError                client side: no endpoint reachable (``attempts``)
    └── ListenError                 server side: cannot bind the listen address
"""

from kubeplane.api.auth import ROLE_ADMIN, ROLE_PROXY, ROLE_READER, Credentials
from kubeplane.api.backend import NodeBackend
from kubeplane.api.client import NodeClient, Reply
from kubeplane.api.errors import (
    APIError,
    BackendError,
    CallError,
    ConnectError,
    FailedPreconditionError,
    InvalidArgumentError,
    ListenError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
)
from kubeplane.api.server import NodeAPIServer, serve, serve_maintenance
from kubeplane.api.wire import APPLY_MODES, CALLS, DEFAULT_PORT, SERVICE

__all__ = [
    "APPLY_MODES",
    "CALLS",
    "DEFAULT_PORT",
    "ROLE_ADMIN",
    "ROLE_PROXY",
    "ROLE_READER",
    "SERVICE",
    "APIError",
    "BackendError",
    "CallError",
    "ConnectError",
    "Credentials",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "ListenError",
    "NodeAPIServer",
    "NodeBackend",
    "NodeClient",
    "NotFoundError",
    "PermissionDeniedError",
    "Reply",
    "UnavailableError",
    "serve",
    "serve_maintenance",
]
