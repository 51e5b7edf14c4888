"""What the e2e tests use to drive a cluster as a user would: the CLI (optionally SIGKILLed at a
line of its output) and a Kubernetes API client polling through the endpoint during an operation.

Imported by the test modules of this directory (pytest puts it on ``sys.path``).
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import urllib3
import yaml
from cryptography import x509
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

if TYPE_CHECKING:
    from conftest import E2ECluster

#: The ``kubeplane`` console script next to this interpreter (the project's venv).
KUBEPLANE = str(Path(sys.executable).with_name("kubeplane"))


def wait_until(what: str, check: Callable[[], bool], *, timeout: float = 180) -> None:
    """Poll ``check`` every 2 s until it holds; fail the test naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def api_client(kubeconfig: Path, *, retries: bool = True) -> Any:
    """A Kubernetes client; without retries every failed request is seen as one."""
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
        yaml.safe_load(kubeconfig.read_text()), client_configuration=configuration, persist_config=False
    )
    if not retries:
        configuration.retries = False
    return k8s_client.ApiClient(configuration)


#: The port every node's kube-apiserver serves on.
APISERVER_PORT = 6443


def serving_certificate(address: str) -> x509.Certificate:
    """The certificate the kube-apiserver on ``address`` presents (read without verifying it)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection((address, APISERVER_PORT), timeout=10) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def closed_before_response(exc: BaseException) -> bool:
    """Whether the server closed a reused keep-alive connection as the request went out.

    An API server shutting down closes its idle connections; one that a client reuses at that
    instant fails without a response. HTTP lets a client retry such an idempotent request
    (RFC 9112 §9.3.1) and client-go does; haproxy in TCP mode cannot, it never sees requests.
    """
    cause = exc.args[1] if isinstance(exc, urllib3.exceptions.ProtocolError) and len(exc.args) > 1 else None
    return isinstance(cause, http.client.RemoteDisconnected | ConnectionResetError)


def describe_failure(exc: BaseException) -> str:
    """One line for a failed request: the exception, and for an HTTP error the API's message."""
    if isinstance(exc, k8s_client.ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message", "")
        except ValueError:
            message = str(exc.body)[:200]
        return f"HTTP {exc.status} {exc.reason}: {message}"
    return f"{type(exc).__name__}: {str(exc)[:200]}"


class ApiPoller:
    """Lists kube-system pods through the endpoint every ``interval`` s in a thread.

    ``failures`` are all failed requests, ``closed`` the subset :func:`closed_before_response`;
    ``longest_gap`` is the longest time without a successful request.
    """

    def __init__(self, kubeconfig: Path, *, interval: float = 0.1) -> None:
        self._core = k8s_client.CoreV1Api(api_client(kubeconfig, retries=False))
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="api-poller", daemon=True)
        self.requests = 0
        self.failures: list[str] = []
        self.closed: list[str] = []
        self.longest_gap = 0.0

    def _loop(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.is_set():
            self.requests += 1
            try:
                self._core.list_namespaced_pod("kube-system", _request_timeout=5)
                last_ok = time.monotonic()
            except Exception as exc:
                failure = f"{time.strftime('%H:%M:%S')} {describe_failure(exc)}"
                self.failures.append(failure)
                if closed_before_response(exc):
                    self.closed.append(failure)
            self.longest_gap = max(self.longest_gap, time.monotonic() - last_ok)
            self._stop.wait(self._interval)

    def __enter__(self) -> ApiPoller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _kubeconfig_tls(kubeconfig: Path) -> tuple[str, ssl.SSLContext]:
    """The current context's server URL and a TLS context with its CA and client certificate."""
    document = yaml.safe_load(kubeconfig.read_text())
    context_name = document["current-context"]
    context = next(c["context"] for c in document["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in document["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in document["users"] if u["name"] == context["user"])
    tls = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    # load_cert_chain reads files only: a private directory, gone once they are loaded.
    with tempfile.TemporaryDirectory() as directory:
        cert, key = Path(directory, "client.crt"), Path(directory, "client.key")
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.touch(mode=0o600)
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        tls.load_cert_chain(cert, key)
    return cluster["server"], tls


def _unanswered(exc: BaseException) -> bool:
    """Whether an HTTP/2 request failed only because the server ended the connection (GOAWAY
    with NO_ERROR) before it answered: it sent no error for this request."""
    return isinstance(exc, httpx.RemoteProtocolError) and "ConnectionTerminated error_code:0" in str(exc)


class Http2Poller:
    """Like :class:`ApiPoller`, over HTTP/2 as kubectl and client-go talk to an API server.

    An API server that shuts down sends HTTP/2's GOAWAY with the last request it will answer;
    requests after it go to a new connection (httpcore does this, as Go's client). httpcore
    also gives up on a request the GOAWAY said would still be answered (a known limitation of
    its GOAWAY handling; Go's client waits for the answer): such a GET, which HTTP lets a client
    send again (it is idempotent), is sent once more and counted in ``retried``. Anything else
    (an error status, a refused connection, a timeout, a second failure) is a failure.
    ``versions`` counts the HTTP versions the answers came in (all ``HTTP/2``, or the test is
    not testing this).
    """

    def __init__(self, kubeconfig: Path, *, interval: float = 0.1) -> None:
        server, tls = _kubeconfig_tls(kubeconfig)
        self._client = httpx.Client(base_url=server, verify=tls, http2=True, timeout=5, trust_env=False)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="api-poller-h2", daemon=True)
        self.requests = 0
        self.failures: list[str] = []
        self.retried: list[str] = []
        self.versions: Counter[str] = Counter()
        self.longest_gap = 0.0

    def _get(self) -> httpx.Response:
        path = "/api/v1/namespaces/kube-system/pods"
        try:
            return self._client.get(path)
        except httpx.RemoteProtocolError as exc:
            if not _unanswered(exc):
                raise
            self.retried.append(f"{time.strftime('%H:%M:%S')} {exc}")
            return self._client.get(path)

    def _loop(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.is_set():
            self.requests += 1
            try:
                response = self._get()
                if response.is_error:
                    message = response.json().get("message", "") if response.content else ""
                    raise RuntimeError(f"HTTP {response.status_code}: {message}")
                self.versions[response.http_version] += 1
                last_ok = time.monotonic()
            except Exception as exc:
                self.failures.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {str(exc)[:200]}")
            self.longest_gap = max(self.longest_gap, time.monotonic() - last_ok)
            self._stop.wait(self._interval)

    def __enter__(self) -> Http2Poller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._client.close()


@dataclasses.dataclass
class Run:
    """One CLI run: its output lines, exit code, whether it was killed, how long it took."""

    lines: list[str]
    returncode: int
    killed: bool
    seconds: float


def run_cli(
    env: Mapping[str, str],
    *args: str,
    kill_when: Callable[[list[str]], bool] | None = None,
    timeout: float = 900,
    echo: bool = False,
) -> Run:
    """Run ``kubeplane ARGS``; SIGKILL it as soon as ``kill_when(lines so far)`` is true, or
    after ``timeout`` s. ``echo`` prints each line as it comes (``  | line``)."""
    started = time.monotonic()
    process = subprocess.Popen(
        [KUBEPLANE, *args],
        # Unbuffered: each line arrives as it is printed, so a kill lands at its point.
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    killed = False
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if echo:
                print(f"  | {lines[-1]}")
            if kill_when is not None and not killed and kill_when(lines):
                process.send_signal(signal.SIGKILL)
                killed = True
        process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
    return Run(lines=lines, returncode=process.returncode, killed=killed, seconds=time.monotonic() - started)


def explain(cluster: E2ECluster) -> tuple[int, dict[str, Any], float]:
    """``kubeplane health --explain -o json``: its exit code, its document, the seconds it took."""
    started = time.monotonic()
    result = cluster.cli("health", "--explain", "-o", "json", timeout=120)
    elapsed = time.monotonic() - started
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout), elapsed


def wait_for_diagnosis(
    cluster: E2ECluster,
    diagnosis: str,
    node: str | None,
    *,
    quoting: str = "",
    timeout: float = 180,
) -> dict[str, Any]:
    """Run ``health --explain`` until it reports ``diagnosis`` on ``node``, with an evidence line
    containing ``quoting`` (a failure takes a while to show: a container has to crash and log, a
    status has to be reported); return that diagnosis."""
    found: list[dict[str, Any]] = []
    last: dict[str, Any] = {}

    def reported() -> bool:
        nonlocal last
        code, last, elapsed = explain(cluster)
        found[:] = [
            d
            for d in last["diagnoses"]
            if d["id"] == diagnosis and d["node"] == node and any(quoting in line for line in d["evidence"])
        ]
        if found:
            print(f"health --explain found {diagnosis} in {elapsed:.1f}s (exit {code})")
            print(json.dumps(last["diagnoses"], indent=2))
            assert code == 1 and last["healthy"] is False
        return bool(found)

    try:
        wait_until(f"health --explain to diagnose {diagnosis} on {node}", reported, timeout=timeout)
    except (AssertionError, pytest.fail.Exception):
        print(json.dumps(last.get("diagnoses"), indent=2))
        raise
    return found[0]
