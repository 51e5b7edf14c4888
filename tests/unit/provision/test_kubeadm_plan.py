"""``cluster create --kubeadm``: its plan, what goes on a node (kubelet flags, sshd, kubeadm's
configuration) and the node init's units (kubeadm's kubelet unit, ``systemctl``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from kubeplane.provision import kubeadm, kubeadm_node, netns
from kubeplane.provision.cluster import PlanError
from kubeplane.services import supervisor as sup

pytestmark = pytest.mark.unit


def test_plan_names_one_control_plane_node_and_the_workers_with_their_pod_subnets() -> None:
    plan = kubeadm.plan(
        kubeadm.KubeadmRequest(name="ka", workers=2, cidr="10.5.40.0/24", service_subnet="10.97.0.0/16")
    )
    assert [(n.name, n.role, n.ip) for n in plan.nodes] == [
        ("ka-controlplane-1", "controlplane", "10.5.40.2"),
        ("ka-worker-1", "worker", "10.5.40.3"),
        ("ka-worker-2", "worker", "10.5.40.4"),
    ]
    assert [n.pod_cidr for n in plan.nodes] == ["10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"]
    assert plan.endpoint == "https://10.5.40.2:6443"
    assert plan.registry_url == "http://10.5.40.1:6000"
    # The host reaches Services through the control plane node, as for kubeplane clusters.
    assert plan.network.routes == (("10.97.0.0/16", "10.5.40.2"),)


def test_plan_refuses_bad_requests_by_name() -> None:
    with pytest.raises(PlanError, match="--workers is -1"):
        kubeadm.plan(kubeadm.KubeadmRequest(name="ka", workers=-1))
    with pytest.raises(PlanError, match="invalid Kubernetes version"):
        kubeadm.plan(kubeadm.KubeadmRequest(name="ka", kubernetes_version="1.20"))
    with pytest.raises(PlanError):
        kubeadm.plan(kubeadm.KubeadmRequest(name="Bad_Name"))


def test_pod_cidr_stays_inside_the_pod_subnet() -> None:
    assert kubeadm.pod_cidr(255) == "10.244.255.0/24"
    for index in (0, 256):
        with pytest.raises(PlanError):
            kubeadm.pod_cidr(index)


def test_init_config_is_kubeadms_four_documents_with_the_local_settings() -> None:
    plan = kubeadm.plan(kubeadm.KubeadmRequest(name="ka", workers=1, service_subnet="10.98.0.0/16"))
    init, cluster, kubelet, proxy = yaml.safe_load_all(kubeadm.init_config(plan))
    assert init["kind"] == "InitConfiguration"
    assert init["localAPIEndpoint"] == {"advertiseAddress": plan.first.ip, "bindPort": 6443}
    assert init["nodeRegistration"]["criSocket"] == "/run/containerd/containerd.sock"
    assert init["nodeRegistration"]["name"] == "ka-controlplane-1"
    assert cluster["kind"] == "ClusterConfiguration"
    # The guide's starting point: no controlPlaneEndpoint, no extra SANs.
    assert "controlPlaneEndpoint" not in cluster
    assert "certSANs" not in (cluster.get("apiServer") or {})
    assert cluster["networking"]["serviceSubnet"] == "10.98.0.0/16"
    # kubeadm's DNS add-on runs kubeplane's cluster DNS image, under the name the registry has.
    # (tagged with the CoreDNS release kubeadm v1.20 deploys: its upgrade checks read the tag).
    assert cluster["dns"] == {
        "type": "CoreDNS",
        "imageRepository": "docker.io/kubeplane",
        "imageTag": "1.7.0",
    }
    assert kubeadm.dns_alias(plan) == "kubeplane/coredns:1.7.0"
    assert kubelet["kind"] == "KubeletConfiguration" and kubelet["cgroupDriver"] == "cgroupfs"
    assert proxy["conntrack"] == {"maxPerCore": 0}


def test_node_files_kubelet_flags_and_sshd() -> None:
    assert kubeadm.kubelet_defaults(node_ip="10.5.0.2", cgroup_root="/kubeplane-abc") == (
        'KUBELET_EXTRA_ARGS="--node-ip=10.5.0.2 --cgroup-root=/kubeplane-abc"\n'
    )
    config = kubeadm.sshd_config(listen="10.5.0.2")
    assert "ListenAddress 10.5.0.2" in config
    assert "PasswordAuthentication no" in config
    assert "PermitRootLogin prohibit-password" in config


def test_known_hosts_pins_one_line_per_host(tmp_path: Path) -> None:
    kubeadm.write_client_key(tmp_path)
    creds = kubeadm.credentials(tmp_path)
    assert creds.key.stat().st_mode & 0o777 == 0o600
    kubeadm.pin_host_key(tmp_path, "10.5.0.2", "ssh-ed25519 AAAAold node\n")
    kubeadm.pin_host_key(tmp_path, "10.5.0.3", "ssh-ed25519 AAAAother node\n")
    kubeadm.pin_host_key(tmp_path, "10.5.0.2", "ssh-ed25519 AAAAnew node\n")
    assert creds.known_hosts.read_text().splitlines() == [
        "10.5.0.3 ssh-ed25519 AAAAother",
        "10.5.0.2 ssh-ed25519 AAAAnew",
    ]


# -- the node's init --


def test_environment_files_are_read_as_systemd_reads_them(tmp_path: Path) -> None:
    flags = tmp_path / "kubeadm-flags.env"
    flags.write_text(
        '# written by kubeadm\nKUBELET_KUBEADM_ARGS="--container-runtime=remote '
        "--container-runtime-endpoint=/run/containerd/containerd.sock "
        '--pod-infra-container-image=k8s.gcr.io/pause:3.2"\n'
    )
    defaults = tmp_path / "kubelet"
    defaults.write_text("KUBELET_EXTRA_ARGS='--node-ip=10.5.0.2'\n")
    assert kubeadm_node.kubelet_argv("/usr/local/bin/kubelet", flags_file=flags, defaults=defaults) == [
        "/usr/local/bin/kubelet",
        "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
        "--kubeconfig=/etc/kubernetes/kubelet.conf",
        "--config=/var/lib/kubelet/config.yaml",
        "--container-runtime=remote",
        "--container-runtime-endpoint=/run/containerd/containerd.sock",
        "--pod-infra-container-image=k8s.gcr.io/pause:3.2",
        "--node-ip=10.5.0.2",
    ]
    # Before kubeadm ran: the unit's fixed arguments only (the kubelet exits and is restarted).
    assert len(kubeadm_node.kubelet_argv("k", flags_file=tmp_path / "none", defaults=tmp_path / "none")) == 4


def test_systemctl_requests_drive_the_units(tmp_path: Path) -> None:
    init = kubeadm_node.Init(root=tmp_path, kubelet="/bin/false", cgroups=(), socket=tmp_path / "init.sock")
    for unit in kubeadm_node.UNITS:
        init.supervisor.register(
            sup.ServiceSpec(id=unit, command=kubeadm_node.process.Command(argv=["sleep", "60"]))
        )

    async def scenario() -> None:
        async with init.supervisor:
            assert (await init.handle("is-active", ["kubelet"]))["out"] == "inactive\n"
            assert (await init.handle("start", ["kubelet.service"]))["code"] == 0
            await init.supervisor.wait_up("kubelet", timeout=10)
            assert (await init.handle("is-active", ["kubelet"])) == {"code": 0, "out": "active\n", "err": ""}
            status = await init.handle("status", ["kubelet"])
            assert status["code"] == 0 and "Loaded: loaded" in status["out"]
            # kubeadm asks `systemctl status X` and looks for "Loaded: not-found".
            assert "could not be found" in (await init.handle("status", ["docker"]))["out"]
            assert (await init.handle("restart", ["docker"]))["code"] == 5
            shown = await init.handle("show", ["kubelet"], ["MainPID", "ActiveState"])
            assert shown["out"].splitlines()[1] == "ActiveState=active"
            assert (await init.handle("is-enabled", ["kubelet"]))["code"] == 0
            assert (await init.handle("daemon-reload", []))["code"] == 0
            assert (await init.handle("stop", ["kubelet"]))["code"] == 0
            assert (await init.handle("is-active", ["kubelet"]))["code"] == 3
            assert (await init.handle("frobnicate", ["kubelet"]))["code"] == 1

    asyncio.run(scenario())


def test_unknown_extra_dirs_are_refused_before_any_mount() -> None:
    from kubeplane.provision import machine

    with pytest.raises(machine.MachineError, match="--extra-dir etc"):
        machine.boot(node_dir=Path("/nonexistent"), hostname="x", command=["true"], extra_dirs=["etc"])


def test_network_plan_of_a_kubeadm_cluster_uses_the_usual_names() -> None:
    plan = kubeadm.plan(kubeadm.KubeadmRequest(name="ka", workers=0))
    assert plan.network.bridge == netns.bridge_name("ka")
    assert plan.nodes[0].netns == netns.netns_name("ka", "ka-controlplane-1")
