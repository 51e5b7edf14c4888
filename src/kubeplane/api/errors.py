"""Exceptions of the node API (the tree is drawn in the :mod:`kubeplane.api` docstring).

A :class:`NodeBackend <kubeplane.api.backend.NodeBackend>` raises the :class:`BackendError`
subclasses; the server turns each into the gRPC status named by its ``code`` and the client turns
that status back into a :class:`CallError` carrying the same code, message and field paths, so an
error keeps its meaning end to end without either side depending on grpc types.
"""

from __future__ import annotations

from collections.abc import Sequence

#: (field path, what was wrong there), e.g. ``("cluster.controlPlane.endpoint", "required")``.
FieldError = tuple[str, str]


class APIError(Exception):
    """Base class of every error the node API raises."""


class BackendError(APIError):
    """An error a node backend reports to the caller; ``code`` is the gRPC status it maps to."""

    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFoundError(BackendError):
    """The resource, file, service or log the caller named does not exist on the node."""

    code = "NOT_FOUND"


class InvalidArgumentError(BackendError):
    """The request (a config, a patch, a parameter) is invalid; ``fields`` says where and why."""

    code = "INVALID_ARGUMENT"

    def __init__(self, message: str, *, fields: Sequence[FieldError] = ()) -> None:
        self.fields: tuple[FieldError, ...] = tuple(fields)
        details = "; ".join(f"{path}: {problem}" for path, problem in self.fields)
        super().__init__(f"{message}: {details}" if details else message)


class FailedPreconditionError(BackendError):
    """The request is valid but the node is not in a state to do it (mode needs a reboot, ...)."""

    code = "FAILED_PRECONDITION"


class PermissionDeniedError(BackendError):
    """The caller's role does not allow the call (also raised by the server's role checks)."""

    code = "PERMISSION_DENIED"


class UnavailableError(BackendError):
    """The node cannot serve the call right now (service starting, shutting down); retry later."""

    code = "UNAVAILABLE"


class CallError(APIError):
    """A call failed on a node: ``code`` is the gRPC status name, ``node`` the node it failed on."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        node: str | None = None,
        fields: Sequence[FieldError] = (),
    ) -> None:
        where = f"node {node}: " if node else ""
        super().__init__(f"{where}{message} ({code})")
        self.code = code
        self.message = message
        self.node = node
        self.fields: tuple[FieldError, ...] = tuple(fields)


class ConnectError(APIError):
    """No endpoint could be reached; ``attempts`` lists each endpoint tried and why it failed."""

    def __init__(self, attempts: Sequence[tuple[str, str]]) -> None:
        self.attempts = tuple(attempts)
        tried = "; ".join(f"{endpoint}: {reason}" for endpoint, reason in self.attempts)
        super().__init__(
            f"could not reach the node API at any endpoint ({tried}); check the endpoints "
            "(-e / client config), that kubeplaned is running there, and the client certificates"
        )


class ListenError(APIError):
    """The server could not bind its listen address (in use, not an address of this host)."""
