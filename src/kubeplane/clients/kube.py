"""Small helpers over the official ``kubernetes`` client: clients from kubeconfig text, waits.

- :func:`api_client` builds an ``ApiClient`` from kubeconfig text handed in by the caller, never
  from ``~/.kube`` or ``$KUBECONFIG``, so a process managing several clusters cannot pick up the
  wrong one by accident.
- :func:`is_retryable` says whether an exception from the client (or from the network under it)
  is worth retrying: timeouts, refused or reset connections, early EOF, 5xx answers, 429. A 4xx
  answer means the request itself is wrong and fails the same way next time.
- :func:`call` runs a blocking call of the client in a thread; what :func:`is_retryable` accepts
  leaves it as the typed :class:`~kubeplane.clients.errors.KubeUnavailable` (:data:`RETRYABLE`),
  so waits retry by type.
- :func:`wait_for` polls a predicate with :meth:`kubeplane.retry.Wait.poll` until it returns something
  truthy, retrying retryable errors with a ``retrying error: ...`` log line and raising
  :class:`~kubeplane.clients.errors.WaitTimeout` that names what was awaited and the last error.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3.exceptions
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from kubeplane import retry
from kubeplane.clients import errors

log = logging.getLogger(__name__)

T = TypeVar("T")

# HTTP statuses that mean "the server could not serve this now" rather than "this is wrong".
_RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})

_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,  # refused, reset, aborted, broken pipe
    TimeoutError,
    socket.timeout,
    EOFError,
    http.client.RemoteDisconnected,
    http.client.IncompleteRead,
    ssl.SSLEOFError,
    urllib3.exceptions.TimeoutError,
    urllib3.exceptions.ProtocolError,
    urllib3.exceptions.NewConnectionError,
)


#: Seconds one request of the official client may take (every call made through :func:`call`).
REQUEST_TIMEOUT = 10


#: What a wait over Kubernetes API calls retries: the boundary's typed errors (see :func:`call`).
RETRYABLE: tuple[type[BaseException], ...] = (errors.KubeUnavailable, errors.EtcdUnavailable)


async def call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a call of the official (blocking) client in a thread, bounded by :data:`REQUEST_TIMEOUT`.

    An error worth retrying (:func:`is_retryable`) is raised as
    :class:`~kubeplane.clients.errors.KubeUnavailable`; any other propagates as it is.
    """
    try:
        return await asyncio.to_thread(function, *args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
    except Exception as exc:
        mapped = unavailable(exc)
        if mapped is exc:
            raise
        raise mapped from exc


def api_client(kubeconfig: str | bytes, *, context: str | None = None) -> Any:
    """A ``kubernetes.client.ApiClient`` for the cluster ``kubeconfig`` (text) describes.

    Inline certificate data is written by the library to private temporary files; nothing is
    read from or written to the user's kubeconfig.
    """
    text = kubeconfig.decode() if isinstance(kubeconfig, bytes) else kubeconfig
    document = yaml.safe_load(text)
    if not isinstance(document, dict) or not document.get("clusters"):
        raise ValueError("kubeconfig has no clusters; pass the text of a kubeconfig file, not a path")
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
        document, context=context, client_configuration=configuration, persist_config=False
    )
    return k8s_client.ApiClient(configuration)


def is_retryable(exc: BaseException) -> bool:
    """Whether sending the same request again later may succeed."""
    if isinstance(exc, errors.ClientError):
        return exc.retryable
    status = getattr(exc, "status", None)
    if isinstance(exc, k8s_client.ApiException) and isinstance(status, int) and status:
        return status in _RETRYABLE_STATUSES
    if isinstance(exc, _NETWORK_ERRORS):
        return True
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        return exc.reason is None or is_retryable(exc.reason)
    # An ApiException without status wraps a transport failure; look at what caused it.
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and is_retryable(cause)


def unavailable(exc: BaseException) -> BaseException:
    """``exc`` as the client boundary reports it: :class:`~kubeplane.clients.errors.KubeUnavailable`
    when :func:`is_retryable` says so (and it is not a typed client error already), else ``exc``."""
    if isinstance(exc, errors.ClientError) or not is_retryable(exc):
        return exc
    mapped = errors.KubeUnavailable(_one_line(exc))
    mapped.__cause__ = exc
    return mapped


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float,
    interval: float = 1.0,
    describe: str,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value; return it.

    Retryable exceptions are logged (``retrying error: <describe>: <error>``) and retried; any
    other exception propagates at once. After ``timeout`` seconds raises ``WaitTimeout`` saying
    what ``describe`` names and the last error or value seen.
    """

    def attempt() -> T:
        try:
            return predicate()
        except Exception as exc:
            mapped = unavailable(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    def progress(failed: retry.Attempt) -> None:
        if failed.error is not None:
            log.info("retrying error: %s: %s", describe, failed.reason)

    return retry.Wait(
        what=describe,
        timeout=timeout,
        backoff=retry.fixed(interval),
        retry_on=RETRYABLE,
        progress=progress,
        error=errors.WaitTimeout,
        clock=clock,
    ).poll(attempt, sleep=sleep)


def _one_line(exc: BaseException) -> str:
    return retry.one_line(exc)
