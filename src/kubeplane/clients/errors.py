"""Exceptions raised by :mod:`kubeplane.clients` (the tree is drawn in the package docstring).

Every error carries a ``retryable`` flag: ``True`` means the same request may succeed if sent
again later (the server was unreachable, had no leader, was overloaded), ``False`` means sending
it again unchanged will fail the same way. Callers loop on ``retryable`` and nothing else, so
the classification lives here, next to the errors, instead of in every retry loop.
"""

from __future__ import annotations


class ClientError(Exception):
    """Base class of every error the thin clients raise."""

    retryable: bool = False


class EtcdError(ClientError):
    """etcd refused or failed a request.

    ``code`` is the gRPC status code etcd's gateway reported (``None`` for transport errors),
    ``endpoint`` the URL that answered (or the last one tried).
    """

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        endpoint: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.endpoint = endpoint
        if retryable is not None:
            self.retryable = retryable

    def __str__(self) -> str:
        where = f" (endpoint {self.endpoint})" if self.endpoint else ""
        return f"{self.message}{where}"


class EtcdUnavailable(EtcdError):
    """No endpoint answered, or the cluster cannot serve right now (no leader, overloaded)."""

    retryable = True


class EtcdLearnerRefused(EtcdUnavailable):
    """A learner refused a call only voting members serve (member list, linearizable reads): ask
    a voting member instead."""


class EtcdNotFound(EtcdError):
    """The lease or member the request names does not exist."""


class EtcdConflict(EtcdError):
    """The cluster's state forbids the change (e.g. duplicate peer URL, too many learners)."""


class EtcdLearnerNotReady(EtcdConflict):
    """etcd refused to promote a learner that has not caught up with the leader's log yet.

    Retryable: the learner catches up by itself; ask again later.
    """

    retryable = True


class EtcdMemberNotLearner(EtcdConflict):
    """A promotion named a member that is not a learner (it already votes)."""


class EtcdCompacted(EtcdError):
    """The revision a read or watch asked for has been compacted away; read the current state."""


class EtcdLeaseLost(EtcdError):
    """A lease (and everything held under it, such as a lock) was lost while a block relied on it.

    Raised in place of the block's work when a keep-alive failed for longer than the lease's TTL
    or etcd said the lease is gone. Retryable: grant a new lease (take the lock again).
    """

    retryable = True


class EtcdInvalidRequest(EtcdError):
    """etcd rejected the request as malformed; this is a bug in the caller."""


class EtcdPermissionDenied(EtcdError):
    """The client certificate is not allowed to do this (authentication or RBAC)."""


class KubeError(ClientError):
    """The Kubernetes API refused or failed a request.

    ``status`` is the HTTP status (0: no answer), ``verb`` and ``path`` the request, ``reason``
    the server's ``Status.message`` (or why there was no answer); the message names all of them.
    Subclasses by status: see the package docstring; another 4xx is a plain ``KubeError``.
    """

    def __init__(
        self, message: str, *, status: int = 0, verb: str = "", path: str = "", reason: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.verb = verb
        self.path = path
        self.reason = reason or message

    @property
    def answer(self) -> str:
        """``<status> <reason>`` of an answer, the message when there was none."""
        return f"{self.status} {self.reason}" if self.status else str(self)


class KubeUnavailable(KubeError):
    """The Kubernetes API could not serve a request now: a 5xx or 429 answer, a timeout, a refused
    or reset connection, an early EOF."""

    retryable = True


class KubeGone(KubeError):
    """410: the ``resourceVersion`` a watch named is too old (compacted away); list again and
    watch from the list's version. Raised for a 410 answer and for a watch ``ERROR`` event with
    code 410."""


class KubeNotFound(KubeError):
    """404: the object (or the kind, in discovery) does not exist."""


class KubeConflict(KubeError):
    """409: the object exists already, or changed since the ``resourceVersion`` the request named."""


class KubeForbidden(KubeError):
    """401/403, or TLS failed: the credentials are not accepted or not allowed to do this."""


class KubeInvalid(KubeError):
    """400/422: the server rejected the request or object as malformed (a bug in the caller)."""


class KubeconfigError(KubeError, ValueError):
    """The kubeconfig text cannot make a client; the message names the missing or wrong field."""
