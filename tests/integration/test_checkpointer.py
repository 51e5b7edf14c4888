"""The pod-checkpointer against a real kube-apiserver + etcd, with a stand-in kubelet ``/pods``.

The checkpointer runs as its own process (``python -m kubeplane.checkpointer``), once from the
venv and once inside its real image (the docker-archive's layer unpacked and entered with
``chroot``, so only Debian's python3 + python3-yaml are there). The kubelet's read-only
``/pods`` is a small HTTP server in the test on loopback whose answer the test sets, so the
test decides whether the parent pod "runs" on the node without running containers.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client as k8s_client
from official_client import api_client

from kubeplane.checkpointer import logic
from kubeplane.provision import checkpointer_image, images

if TYPE_CHECKING:
    from conftest import ApiServer, Processes

pytestmark = pytest.mark.integration

NODE = "cp1"
PARENT = "kube-apiserver-abcde"
GRACE = 3.0


class FakeKubelet:
    """``GET /pods`` answers a PodList of whatever ``pods`` holds right now."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"kind": "PodList", "items": owner.pods}).encode()
                self.send_response(200 if self.path == "/pods" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                del args

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pods"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def running(self, *names: str) -> None:
        self.pods = [
            {"metadata": {"name": n, "namespace": "kube-system"}, "status": {"phase": "Running"}}
            for n in names
        ]


@pytest.fixture
def fake_kubelet() -> Iterator[FakeKubelet]:
    kubelet = FakeKubelet()
    kubelet.thread.start()
    try:
        yield kubelet
    finally:
        kubelet.server.shutdown()
        kubelet.server.server_close()


def _core(apiserver: ApiServer) -> Any:
    return k8s_client.CoreV1Api(api_client(apiserver.admin_kubeconfig))


def _create_parent(core: Any, name: str = PARENT) -> None:
    with contextlib.suppress(k8s_client.ApiException):
        core.create_namespaced_service_account("kube-system", {"metadata": {"name": "default"}})
    with contextlib.suppress(k8s_client.ApiException):
        core.create_namespaced_secret(
            "kube-system",
            {
                "metadata": {"name": "kube-apiserver"},
                "stringData": {"apiserver.crt": "CERT", "apiserver.key": "KEY"},
            },
        )
    core.create_namespaced_pod(
        "kube-system",
        {
            "metadata": {"name": name, "annotations": {logic.ANNOTATION_CHECKPOINT: "true"}},
            "spec": {
                "nodeName": NODE,
                "hostNetwork": True,
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "kube-apiserver",
                        "image": "k8s.gcr.io/kube-apiserver:v1.20.2",
                        "volumeMounts": [{"name": "secrets", "mountPath": "/secrets"}],
                    }
                ],
                "volumes": [{"name": "secrets", "secret": {"secretName": "kube-apiserver"}}],
            },
        },
    )


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def test_checkpoints_follow_parent_and_survive_api_outage(
    tmp_path: Path,
    processes: Processes,
    start_apiserver: Callable[..., ApiServer],
    fake_kubelet: FakeKubelet,
    wait_until: Callable[..., Any],
) -> None:
    apiserver = start_apiserver()
    core = _core(apiserver)
    kubeconfig = tmp_path / "admin.kubeconfig"
    kubeconfig.write_text(apiserver.admin_kubeconfig)
    manifests, state = tmp_path / "manifests", tmp_path / "state"
    checkpointer = processes.start(
        [
            sys.executable,
            "-m",
            "kubeplane.checkpointer",
            f"--node={NODE}",
            f"--kubeconfig={kubeconfig}",
            f"--kubelet-url={fake_kubelet.url}",
            f"--manifest-dir={manifests}",
            f"--state-dir={state}",
            f"--grace-period={GRACE}",
            "--interval=0.3",
        ],
        name="checkpointer",
    )
    stored = state / "checkpoints" / f"kube-system-{PARENT}.json"
    active = manifests / f"kube-system-{PARENT}.json"
    secret = state / "files" / f"kube-system-{PARENT}" / "secrets" / "apiserver.key"

    # The parent runs here: a stored (inactive) checkpoint with its Secret copied.
    _create_parent(core)
    fake_kubelet.running(PARENT)
    wait_until(
        lambda: stored.exists() and secret.exists(),
        timeout=20,
        what="stored checkpoint",
        logs=checkpointer.tail,
    )
    assert secret.read_bytes() == b"KEY"
    time.sleep(1)
    assert not active.exists(), "a checkpoint must stay inactive while its parent runs"

    # The parent stops running: the checkpoint goes to the kubelet.
    fake_kubelet.running()
    pod = wait_until(lambda: _read(active), timeout=10, what="active checkpoint", logs=checkpointer.tail)
    assert pod["metadata"]["annotations"][logic.ANNOTATION_CHECKPOINT_OF] == PARENT
    assert "nodeName" not in pod["spec"] and "status" not in pod
    assert pod["spec"]["volumes"] == [
        {"name": "secrets", "hostPath": {"path": str(secret.parent), "type": "DirectoryOrCreate"}}
    ]

    # The parent is deleted: the checkpoint goes after the grace period, not before.
    core.delete_namespaced_pod(PARENT, "kube-system", grace_period_seconds=0)
    deleted = time.monotonic()
    wait_until(
        lambda: not active.exists() and not stored.exists(),
        timeout=20,
        what="checkpoint removal",
        logs=checkpointer.tail,
    )
    assert time.monotonic() - deleted >= GRACE - 0.5
    assert not secret.exists()

    # A new parent is checkpointed and activated; then the API server goes away for good.
    _create_parent(core)
    fake_kubelet.running(PARENT)
    wait_until(stored.exists, timeout=20, what="stored checkpoint of the new parent", logs=checkpointer.tail)
    fake_kubelet.running()
    wait_until(active.exists, timeout=10, what="active checkpoint of the new parent", logs=checkpointer.tail)
    processes.forget(apiserver.started)
    time.sleep(GRACE * 3)
    assert active.exists() and stored.exists() and secret.exists(), checkpointer.tail()
    assert "keeping checkpoints" in checkpointer.log.read_text()
    assert checkpointer.process.poll() is None, "the checkpointer must survive an API outage"


def _unpack_image(archive: Path, dest: Path) -> None:
    manifest = images.read_manifest(archive)
    with tarfile.open(archive) as outer:
        layer = outer.extractfile(manifest[0]["Layers"][0])
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            inner.extractall(dest, filter="fully_trusted")


def test_image_runs_the_checkpointer_with_debian_python_only(
    tmp_path: Path,
    processes: Processes,
    start_apiserver: Callable[..., ApiServer],
    fake_kubelet: FakeKubelet,
    wait_until: Callable[..., Any],
) -> None:
    try:
        image = checkpointer_image.Builder().ensure()
    except Exception as exc:
        pytest.fail(f"cannot build the pod-checkpointer image (needs debootstrap and a Debian mirror): {exc}")
    rootfs = tmp_path / "rootfs"
    _unpack_image(image.archive, rootfs)
    apiserver = start_apiserver()
    _create_parent(_core(apiserver))
    fake_kubelet.running()
    (rootfs / "kubeconfig").write_text(apiserver.admin_kubeconfig)
    argv: list[str | Path] = [
        "chroot",
        rootfs,
        "/usr/bin/python3",
        "-m",
        "kubeplane.checkpointer",
        f"--node={NODE}",
        "--kubeconfig=/kubeconfig",
        f"--kubelet-url={fake_kubelet.url}",
        "--manifest-dir=/manifests",
        "--state-dir=/state",
        "--once",
    ]
    started = processes.start(argv, name="checkpointer-image")
    started.process.wait(timeout=60)
    # Parent never ran here, so one round stores nothing; a clean exit proves imports and API access.
    assert started.process.returncode == 0, started.tail()
    assert "API server:" not in started.log.read_text(), started.tail()
    fake_kubelet.running(PARENT)
    again = processes.start(argv, name="checkpointer-image-2")
    again.process.wait(timeout=60)
    assert again.process.returncode == 0, again.tail()
    assert (rootfs / "state/checkpoints" / f"kube-system-{PARENT}.json").is_file(), again.tail()
