"""Retryable-error classification, waits, and ApiClient construction from kubeconfig text."""

from __future__ import annotations

import http.client
import logging
from pathlib import Path

import pytest
import urllib3.exceptions
from kubernetes.client import ApiException

from kubeplane import pki
from kubeplane.clients import errors, kube

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ApiException(status=503, reason="Service Unavailable"), True),
        (ApiException(status=500, reason="Internal Server Error"), True),
        (ApiException(status=429, reason="Too Many Requests"), True),
        (ApiException(status=504, reason="Gateway Timeout"), True),
        (ApiException(status=404, reason="Not Found"), False),
        (ApiException(status=409, reason="Conflict"), False),
        (ApiException(status=403, reason="Forbidden"), False),
        (ConnectionRefusedError(111, "Connection refused"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (TimeoutError("timed out"), True),
        (http.client.RemoteDisconnected("Remote end closed connection without response"), True),
        (urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError()), True),
        (urllib3.exceptions.MaxRetryError(None, "/version", ConnectionRefusedError()), True),  # type: ignore[arg-type]
        (urllib3.exceptions.ReadTimeoutError(None, "/version", "read timed out"), True),  # type: ignore[arg-type]
        (errors.EtcdUnavailable("no leader"), True),
        (errors.EtcdConflict("lost"), False),
        (ValueError("bad manifest"), False),
        (KeyError("metadata"), False),
    ],
)
def test_is_retryable(exc: BaseException, expected: bool) -> None:
    assert kube.is_retryable(exc) is expected


def test_is_retryable_follows_the_cause() -> None:
    try:
        try:
            raise ConnectionResetError(104, "reset")
        except ConnectionResetError as inner:
            raise RuntimeError("request failed") from inner
    except RuntimeError as outer:
        assert kube.is_retryable(outer)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_for_retries_retryable_errors_and_logs_them(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    outcomes: list[object] = [ConnectionRefusedError(111, "refused"), None, "ready"]

    def predicate() -> object:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    with caplog.at_level(logging.INFO, logger="kubeplane.clients.kube"):
        result = kube.wait_for(
            predicate, timeout=10, interval=1, describe="the API server", clock=clock, sleep=clock.sleep
        )
    assert result == "ready"
    assert clock.now == 2
    assert [r.getMessage() for r in caplog.records] == ["retrying error: the API server: [Errno 111] refused"]


def test_wait_for_raises_non_retryable_errors_at_once() -> None:
    clock = FakeClock()

    def predicate() -> bool:
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException):
        kube.wait_for(predicate, timeout=10, describe="x", clock=clock, sleep=clock.sleep)
    assert clock.now == 0


def test_wait_for_timeout_names_what_and_last_error() -> None:
    clock = FakeClock()

    def predicate() -> bool:
        raise ApiException(status=503, reason="Service Unavailable")

    with pytest.raises(
        errors.WaitTimeout, match=r"after 3s waiting for node n1 to be Ready \(last error: .*503"
    ):
        kube.wait_for(
            predicate, timeout=3, interval=1, describe="node n1 to be Ready", clock=clock, sleep=clock.sleep
        )


def test_api_client_from_kubeconfig_text_does_not_touch_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "must-not-be-read"))
    ca = pki.new_ca("kubernetes")
    admin = pki.issue(ca=ca, common_name="admin", organizations=["system:masters"], usages=("client",))
    text = pki.kubeconfig(
        cluster_name="c1", server="https://10.5.0.1:6443", ca_cert=ca.cert, user="admin", client=admin
    )
    api = kube.api_client(text.encode())
    assert api.configuration.host == "https://10.5.0.1:6443"
    assert Path(api.configuration.cert_file).read_bytes() == admin.cert
    assert Path(api.configuration.ssl_ca_cert).read_bytes() == ca.cert
    assert list(tmp_path.iterdir()) == []


def test_api_client_rejects_a_path() -> None:
    with pytest.raises(ValueError, match="not a path"):
        kube.api_client("/etc/kubernetes/admin.conf")
