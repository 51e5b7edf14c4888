"""The node's service specs rendered from a machine config (pure parts: no process is started)."""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from kubeplane import config, resources
from kubeplane.agent import containers
from kubeplane.agent import services as agent_services
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit

SECRETS = gen.new_secrets()
DOCUMENTS = gen.generate(
    gen.GenOptions(
        cluster_name="unit",
        endpoint="https://10.5.0.1:6443",
        registry_mirrors={"*": ("http://10.5.0.1:6000",)},
    ),
    SECRETS,
).documents


def node(tmp_path: Path, machine_type: str = "controlplane", **cluster: Any) -> agent_services.NodeServices:
    document = copy.deepcopy(DOCUMENTS[machine_type])
    document["cluster"].update(cluster)
    return agent_services.NodeServices(
        paths=NodePaths(tmp_path),
        document=config.load(yaml.safe_dump(document)),
        name="cp1",
        node_ip="10.5.0.2",
        state=resources.State(resources.default_registry()),
    )


def flags(args: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in args)


def test_control_plane_kubelet_bootstraps_with_a_token_and_registers_tainted(tmp_path: Path) -> None:
    services = node(tmp_path)
    args = flags(services.kubelet_args())
    assert args["bootstrap-kubeconfig"] == str(tmp_path / "etc/kubernetes/bootstrap-kubelet.conf")
    assert args["rotate-certificates"] == "true"
    assert args["read-only-port"] == "10255"
    assert args["network-plugin"] == "cni"
    assert args["cni-conf-dir"] == str(tmp_path / "etc/cni/net.d")
    assert args["cni-bin-dir"] == "/usr/lib/cni"
    assert args["register-with-taints"] == "node-role.kubernetes.io/master=:NoSchedule"
    assert args["pod-manifest-path"] == str(NodePaths(tmp_path).kubelet_manifests)
    assert args["cgroup-root"] == f"/{agent_services.NodeServices.cgroup_name(tmp_path)}"
    assert args["cgroup-driver"] == "cgroupfs"
    assert args["fail-swap-on"] == "false"
    # kubelet v1.20 refuses node-role labels on itself: the agent adds them after registration.
    assert "node-labels" not in args
    assert services.kubelet_version == "v1.20.2"
    assert [spec.id for spec in services.specs()] == ["containerd", "kubelet", "etcd"]
    assert services.specs()[1].depends_on == ("containerd",)


def test_workers_and_schedulable_masters_are_not_tainted(tmp_path: Path) -> None:
    assert "register-with-taints" not in flags(node(tmp_path, allowSchedulingOnMasters=True).kubelet_args())
    worker = node(tmp_path, "worker")
    assert "register-with-taints" not in flags(worker.kubelet_args())
    assert worker.etcd is None
    assert [spec.id for spec in worker.specs()] == ["containerd", "kubelet"]


def test_machine_extra_args_win(tmp_path: Path) -> None:
    document = copy.deepcopy(DOCUMENTS["controlplane"])
    document["machine"]["kubelet"]["extraArgs"] = {"read-only-port": "0", "max-pods": "20"}
    services = agent_services.NodeServices(
        paths=NodePaths(tmp_path),
        document=config.load(yaml.safe_dump(document)),
        name="cp1",
        node_ip="10.5.0.2",
        state=resources.State(resources.default_registry()),
    )
    args = flags(services.kubelet_args())
    assert (args["read-only-port"], args["max-pods"]) == ("0", "20")


def test_bootstrap_kubeconfig_carries_the_token_endpoint_and_cluster_ca() -> None:
    text = agent_services.bootstrap_kubeconfig(
        server="https://10.5.0.1:6443", ca=SECRETS.kubernetes_ca.cert, token="abc.def", cluster_name="unit"
    )
    document = yaml.safe_load(text)
    assert document["users"][0]["user"] == {"token": "abc.def"}
    cluster = document["clusters"][0]["cluster"]
    assert cluster["server"] == "https://10.5.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == SECRETS.kubernetes_ca.cert


def test_containerd_config_has_mirrors_conf_d_imports_and_own_paths(tmp_path: Path) -> None:
    document = copy.deepcopy(DOCUMENTS["controlplane"])
    document["machine"]["registries"]["config"] = {
        "10.5.0.1:6000": {
            "tls": {"insecureSkipVerify": True, "ca": base64.b64encode(SECRETS.os_ca.cert).decode()},
            "auth": {"username": "u", "password": "p"},
        }
    }
    services = agent_services.NodeServices(
        paths=NodePaths(tmp_path),
        document=config.load(yaml.safe_dump(document)),
        name="cp1",
        node_ip="10.5.0.2",
        state=resources.State(resources.default_registry()),
    )
    parsed = tomllib.loads(services.containerd_config())
    assert parsed["imports"] == [str(tmp_path / "var/cri/conf.d/*.toml")]
    assert parsed["grpc"]["address"] == str(NodePaths(tmp_path).containerd_socket)
    cri = parsed["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "k8s.gcr.io/pause:3.2"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["registry"]["mirrors"]["*"]["endpoint"] == ["http://10.5.0.1:6000"]
    registry = cri["registry"]["configs"]["10.5.0.1:6000"]
    assert registry["tls"]["insecure_skip_verify"] is True
    assert Path(registry["tls"]["ca_file"]).read_bytes() == SECRETS.os_ca.cert
    assert registry["auth"] == {"username": "u", "password": "p"}


def test_a_root_too_deep_for_the_kubelets_socket_fails_its_pre_state_with_the_reason(
    tmp_path: Path,
) -> None:
    assert len(str(tmp_path)) < 66, "pytest's tmp_path is too long for this test"
    root = tmp_path / ("d" * (66 - len(str(tmp_path))))  # 67 characters: one too many for the kubelet
    services = node(root)
    with pytest.raises(ValueError, match=r"kubelet's unix socket .* over the 107 .* shorter --root"):
        asyncio.run(services._kubelet_prepare())
    assert not (root / "var/lib/kubelet").exists()
    assert NodePaths(root).socket_problem("containerd") is None
    assert NodePaths(Path(str(root)[:-1])).socket_problem("kubelet") is None


def test_image_tags() -> None:
    assert agent_services.image_tag("ghcr.io/talos-systems/kubelet:v1.20.2") == "v1.20.2"
    assert agent_services.image_tag("10.5.0.1:6000/kubelet") == "latest"


def test_container_ids_and_cri_log_lines(tmp_path: Path) -> None:
    assert containers.parse_id("kube-system/kube-apiserver-cp1:kube-apiserver") == (
        "kube-system",
        "kube-apiserver-cp1",
        "kube-apiserver",
    )
    with pytest.raises(ValueError, match="NAMESPACE/POD:CONTAINER"):
        containers.parse_id("kube-apiserver")
    logs = tmp_path / "kube-system_kube-apiserver-cp1_0123" / "kube-apiserver"
    logs.mkdir(parents=True)
    (logs / "0.log").write_text("old\n")
    (logs / "1.log").write_text("new\n")
    os.utime(logs / "0.log", (1000, 1000))
    found = containers.log_file("kube-system/kube-apiserver-cp1:kube-apiserver", pod_logs=tmp_path)
    assert found == logs / "1.log"
    # Crash-looping: attempt 2 was just created and is empty; the last attempt that wrote says why.
    (logs / "2.log").write_text("")
    assert (
        containers.log_file("kube-system/kube-apiserver-cp1:kube-apiserver", pod_logs=tmp_path)
        == logs / "2.log"
    )
    written = containers.log_file(
        "kube-system/kube-apiserver-cp1:kube-apiserver", pod_logs=tmp_path, written=True
    )
    assert written == logs / "1.log"
    with pytest.raises(containers.ContainerNotFound):
        containers.log_file("kube-system/other:x", pod_logs=tmp_path)
    assert containers.cri_message("2021-01-01T00:00:00Z stderr F hello world") == "hello world"
    assert containers.cri_message("plain line") == "plain line"


def test_pod_network_namespaces_are_read_from_the_container_spec() -> None:
    info = {
        "Spec": {
            "linux": {
                "namespaces": [
                    {"type": "pid"},
                    {"type": "network", "path": "/var/run/netns/cni-1234"},
                    {"type": "ipc", "path": "/proc/1/ns/ipc"},
                ]
            }
        }
    }
    assert agent_services.pod_network_namespaces(info) == {"cni-1234"}
    # hostNetwork sandboxes join no named namespace; a process namespace path is not one either.
    host = {"Spec": {"linux": {"namespaces": [{"type": "network", "path": "/proc/42/ns/net"}]}}}
    assert agent_services.pod_network_namespaces(host) == set()
    assert agent_services.pod_network_namespaces({}) == set()


def test_containerd_puts_its_shims_in_the_nodes_own_cgroup(tmp_path: Path) -> None:
    services = node(tmp_path)
    rendered = tomllib.loads(services.containerd_config())
    runc = rendered["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]
    assert runc["options"]["ShimCgroup"] == services.shim_cgroup
    assert services.shim_cgroup == f"{services.cgroup_root}-shims"
    # The services own exactly the kubelet's and containerd's directories: never the node root.
    assert services.mounts.owned == (
        NodePaths(tmp_path).kubelet_root,
        NodePaths(tmp_path).containerd_root,
        NodePaths(tmp_path).containerd_state,
    )


PROXY_ENV = {
    "http_proxy": "http://10.5.0.1:8888",
    "https_proxy": "http://10.5.0.1:8888",
    "no_proxy": "10.5.0.1:6443,10.5.0.2",
}


def proxied_node(tmp_path: Path, machine_type: str = "worker") -> agent_services.NodeServices:
    """A node whose machine config carries the corporate proxy guide's ``machine.env``."""
    document = copy.deepcopy(DOCUMENTS[machine_type])
    document["machine"]["env"] = PROXY_ENV
    return agent_services.NodeServices(
        paths=NodePaths(tmp_path),
        document=config.load(yaml.safe_dump(document)),
        name="w1",
        node_ip="10.5.0.3",
        state=resources.State(resources.default_registry()),
    )


def test_machine_env_wins_over_the_inherited_variable_in_any_case() -> None:
    inherited = {"PATH": "/usr/bin", "HTTP_PROXY": "http://old:3128", "Https_Proxy": "http://old:3128"}
    merged = agent_services.service_environment(inherited, PROXY_ENV)
    # Go prefers HTTP_PROXY to http_proxy: an inherited upper-case form would hide the config.
    assert merged == {"PATH": "/usr/bin", **PROXY_ENV}


def test_machine_env_reaches_containerd_and_the_kubelet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://inherited:3128")
    monkeypatch.setenv("KUBEPLANE_UNIT_MARKER", "kept")
    monkeypatch.setattr(agent_services.shutil, "which", lambda name: f"/usr/bin/{name}")
    services = proxied_node(tmp_path)
    monkeypatch.setattr(services, "kubelet_binary", lambda: Path("/usr/bin/kubelet"))
    for command in (asyncio.run(services._containerd_command()), asyncio.run(services._kubelet_command())):
        assert command.env is not None
        assert {name: command.env[name] for name in PROXY_ENV} == PROXY_ENV
        assert "HTTPS_PROXY" not in command.env
        # The rest of the agent's environment (PATH above all) is still there.
        assert command.env["KUBEPLANE_UNIT_MARKER"] == "kept"
        assert command.env["PATH"] == os.environ["PATH"]


def test_without_machine_env_services_inherit_the_agents_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_services.shutil, "which", lambda name: f"/usr/bin/{name}")
    services = node(tmp_path, "worker")
    assert services.environment() is None
    assert asyncio.run(services._containerd_command()).env is None


FAKE_CTR = """#!/bin/sh
# Records the environment of each pull; lists no image, so every image must be pulled.
if [ "$5 $6" = "images pull" ]; then env > "$(dirname "$0")/pull.env"; fi
"""


def test_the_agents_own_pulls_run_with_machine_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ctr").write_text(FAKE_CTR)
    (bin_dir / "ctr").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    services = proxied_node(tmp_path / "node")
    assert asyncio.run(services.pull_image("k8s.gcr.io/pause:3.2")) is True
    recorded = dict(
        line.split("=", 1) for line in (bin_dir / "pull.env").read_text().splitlines() if "=" in line
    )
    assert {name: recorded[name] for name in PROXY_ENV} == PROXY_ENV


def _kubelet_files(services: agent_services.NodeServices, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_services.owned, "make_cgroup", lambda _: None)
    services._kubelet_files(SECRETS.kubernetes_ca.cert)


def test_a_control_plane_node_signs_its_kubelets_first_client_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kubelet then registers as soon as the API server answers, not after a bootstrap back-off.
    services = node(tmp_path)
    _kubelet_files(services, monkeypatch)
    kubeconfig = tmp_path / "etc/kubernetes/kubelet.conf"
    assert kubeconfig.stat().st_mode & 0o777 == 0o600
    document = yaml.safe_load(kubeconfig.read_text())
    assert document["clusters"][0]["cluster"]["server"] == "https://10.5.0.1:6443"
    user = document["users"][0]["user"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))
    assert cert.subject.rfc4514_string() == "CN=system:node:cp1,O=system:nodes"
    assert cert.issuer == x509.load_pem_x509_certificate(SECRETS.kubernetes_ca.cert).subject
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # Credentials the kubelet has (its own bootstrap's, or a rotated certificate) are never replaced.
    kubeconfig.write_text("the kubelet's own")
    _kubelet_files(services, monkeypatch)
    assert kubeconfig.read_text() == "the kubelet's own"


def test_a_workers_kubelet_gets_no_signed_certificate_and_waits_for_the_endpoint_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = node(tmp_path, "worker")
    _kubelet_files(worker, monkeypatch)
    assert not (tmp_path / "etc/kubernetes/kubelet.conf").exists()
    waited: list[str] = []

    async def wait_for_endpoint(endpoint: str, ca: bytes) -> None:
        waited.append(endpoint)

    monkeypatch.setattr(worker, "_wait_for_endpoint", wait_for_endpoint)
    monkeypatch.setattr(worker, "_require_socket_room", lambda _: None)
    monkeypatch.setattr(worker, "_kubelet_files", lambda _: None)
    asyncio.run(worker._kubelet_prepare())
    assert waited == ["https://10.5.0.1:6443"]
    # With credentials (a restart after its bootstrap) it starts at once.
    (tmp_path / "var/lib/kubelet/pki/kubelet-client-current.pem").write_text("")
    asyncio.run(worker._kubelet_prepare())
    assert waited == ["https://10.5.0.1:6443"]


def test_the_wait_for_the_endpoint_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_services, "BOOTSTRAP_WAIT", 0.3)
    monkeypatch.setattr(agent_services, "BOOTSTRAP_POLL", 0.05)
    worker = node(tmp_path, "worker")
    started = time.monotonic()
    # Nothing listens on port 1 of loopback: refused every time, until the wait gives up.
    asyncio.run(worker._wait_for_endpoint("https://127.0.0.1:1", SECRETS.kubernetes_ca.cert))
    assert 0.3 <= time.monotonic() - started < 5
