"""Planning a local cluster: names, addresses, per-node configs, patches, and failing before side effects."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kubeplane import pki
from kubeplane.cli import cluster as cluster_cli
from kubeplane.cli import output
from kubeplane.cli import upgrade as cli_upgrade
from kubeplane.config import generate as gen
from kubeplane.ops import health
from kubeplane.provision import checkpointer_image, cluster, dns_image, leftovers, netns, planning, state
from kubeplane.provision import create as create_mod

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def secrets() -> gen.SecretsBundle:
    return gen.new_secrets()


def _plan(secrets: gen.SecretsBundle, **kwargs: object) -> planning.ClusterPlan:
    return planning.plan(planning.ClusterRequest(**kwargs), secrets=secrets)  # type: ignore[arg-type]


def _doc(node: planning.NodePlan) -> dict:  # type: ignore[type-arg]
    return yaml.safe_load(node.config)  # type: ignore[no-any-return]


def test_nodes_control_plane_first_with_addresses_after_the_host(secrets: gen.SecretsBundle) -> None:
    plan = _plan(secrets, name="demo", controlplanes=3, workers=2)
    assert [(n.name, n.role, n.ip) for n in plan.nodes] == [
        ("demo-controlplane-1", "controlplane", "10.5.0.2"),
        ("demo-controlplane-2", "controlplane", "10.5.0.3"),
        ("demo-controlplane-3", "controlplane", "10.5.0.4"),
        ("demo-worker-1", "worker", "10.5.0.5"),
        ("demo-worker-2", "worker", "10.5.0.6"),
    ]
    assert plan.network.bridge == "kp-demo"
    assert plan.network.host_ip == "10.5.0.1"
    assert plan.endpoint == "https://10.5.0.1:6443"
    assert plan.registry_url == "http://10.5.0.1:6000"


def test_other_cidr_moves_every_address(secrets: gen.SecretsBundle) -> None:
    plan = _plan(secrets, name="demo", cidr="10.9.3.0/24", workers=0)
    assert [n.ip for n in plan.nodes] == ["10.9.3.2"]
    assert _doc(plan.nodes[0])["cluster"]["controlPlane"]["endpoint"] == "https://10.9.3.1:6443"


def test_configs_use_the_local_registry_and_name_each_node(secrets: gen.SecretsBundle) -> None:
    plan = _plan(secrets, name="demo", registry_mirrors={"docker.io": ("http://mirror.example:5000",)})
    cp, worker = (_doc(n) for n in plan.nodes)
    for doc, node in ((cp, plan.nodes[0]), (worker, plan.nodes[1])):
        mirrors = doc["machine"]["registries"]["mirrors"]
        assert mirrors["*"] == {"endpoints": ["http://10.5.0.1:6000"]}
        assert mirrors["docker.io"] == {"endpoints": ["http://mirror.example:5000"]}
        assert doc["machine"]["network"]["hostname"] == node.name
        assert "10.5.0.1" in doc["machine"]["certSANs"]
    assert cp["machine"]["type"] == "controlplane"
    assert "10.5.0.1" in cp["cluster"]["apiServer"]["certSANs"]
    assert worker["machine"]["type"] == "worker"
    assert "key" not in worker["machine"]["ca"]  # workers never hold the OS CA key


def test_client_context_targets_control_plane_endpoints_and_all_nodes(secrets: gen.SecretsBundle) -> None:
    plan = _plan(secrets, name="demo", controlplanes=2, workers=1)
    assert plan.client_config.context == "demo"
    context = plan.client_config.contexts["demo"]
    assert context.endpoints == ("10.5.0.2", "10.5.0.3")
    assert context.nodes == ("10.5.0.2", "10.5.0.3", "10.5.0.4")


def test_role_patches_apply_to_their_role_only(secrets: gen.SecretsBundle) -> None:
    plan = _plan(
        secrets,
        name="demo",
        config_patches=({"machine": {"kubelet": {"extraArgs": {"v": "2"}}}},),
        controlplane_patches=({"cluster": {"allowSchedulingOnMasters": True}},),
        worker_patches=({"machine": {"kubelet": {"extraArgs": {"max-pods": "50"}}}},),
    )
    cp, worker = (_doc(n) for n in plan.nodes)
    assert cp["machine"]["kubelet"]["extraArgs"] == {"v": "2"}
    assert cp["cluster"]["allowSchedulingOnMasters"] is True
    assert worker["machine"]["kubelet"]["extraArgs"] == {"v": "2", "max-pods": "50"}
    assert "allowSchedulingOnMasters" not in worker["cluster"]


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        (
            {"config_patches": ([{"op": "replace", "path": "/machine/nope", "value": 1}],)},
            "/machine has no key",
        ),
        ({"worker_patches": ([{"op": "remove", "path": "/cluster/nope"}],)}, "--config-patch-worker"),
        ({"name": "Bad_Name"}, "cluster name 'Bad_Name' is invalid"),
        ({"name": "much-too-long-name"}, "at most 12"),
        ({"cidr": "10.5.0.0/30", "workers": 2}, "usable addresses"),
        ({"cidr": "10.5.0.1/24"}, "cluster CIDR"),
        ({"kubernetes_version": "1.20"}, "1.20"),
        (
            {"worker_patches": ({"machine": {"ports": {"nodeAPI": 51000}}},)},
            "kubeplane-worker-1 sets machine.ports to nodeAPI 51000, trustd 50001, but the cluster's "
            "ports are 50000, 50001 (--node-api-port, --trustd-port)",
        ),
    ],
)
def test_mistakes_are_plan_errors(
    secrets: gen.SecretsBundle, request_kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(cluster.PlanError) as caught:
        _plan(secrets, **request_kwargs)
    assert message in str(caught.value)


def test_port_flags_move_every_nodes_ports_and_the_client_endpoints(secrets: gen.SecretsBundle) -> None:
    plan = _plan(secrets, name="demo", controlplanes=2, workers=1, node_api_port=51000, trustd_port=51001)
    assert (plan.node_api_port, plan.trustd_port) == (51000, 51001)
    for node in plan.nodes:
        assert _doc(node)["machine"]["ports"] == {"nodeAPI": 51000, "trustd": 51001}, node.name
    context = plan.client_config.contexts["demo"]
    assert context.endpoints == ("10.5.0.2:51000", "10.5.0.3:51000")
    assert context.nodes == ("10.5.0.2", "10.5.0.3", "10.5.0.4")  # forwarded to the nodes' own port
    default = _plan(secrets, name="demo")
    assert (default.node_api_port, default.trustd_port) == (50000, 50001)
    assert all("ports" not in _doc(node)["machine"] for node in default.nodes)
    assert default.client_config.contexts["demo"].endpoints == ("10.5.0.2",)


def test_a_patch_may_repeat_the_port_flags_but_not_contradict_them(secrets: gen.SecretsBundle) -> None:
    same = {"machine": {"ports": {"nodeAPI": 51000, "trustd": 51001}}}
    plan = _plan(secrets, name="demo", node_api_port=51000, trustd_port=51001, config_patches=(same,))
    assert all(_doc(node)["machine"]["ports"] == same["machine"]["ports"] for node in plan.nodes)
    other = {"machine": {"ports": {"trustd": 52001}}}
    with pytest.raises(cluster.PlanError) as caught:
        _plan(secrets, name="demo", node_api_port=51000, trustd_port=51001, controlplane_patches=(other,))
    assert str(caught.value).startswith(
        "the machine config of node demo-controlplane-1 sets machine.ports to nodeAPI 51000, trustd 52001, "
        "but the cluster's ports are 51000, 51001 (--node-api-port, --trustd-port)"
    )


@pytest.mark.parametrize(
    ("ports", "message"),
    [
        ((51000, 51000), "machine.ports.trustd: 51000 is also the node API's port (machine.ports.nodeAPI)"),
        ((None, 10250), "machine.ports.trustd: 10250 is already the port of kubelet API"),
        ((6443, None), "machine.ports.nodeAPI: 6443 is already the port of"),
    ],
)
def test_port_flags_are_validated_as_gen_config_does(
    secrets: gen.SecretsBundle, ports: tuple[int | None, int | None], message: str
) -> None:
    with pytest.raises(cluster.PlanError) as caught:
        _plan(secrets, name="demo", node_api_port=ports[0], trustd_port=ports[1])
    assert "cannot generate the machine configs" in str(caught.value) and message in str(caught.value)


def test_the_creation_records_the_ports_and_reaches_booted_nodes_on_them(tmp_path: Path) -> None:
    plan = planning.plan(planning.ClusterRequest(name="demo", node_api_port=51000, trustd_port=51001))
    creation = create_mod.Creation(
        plan,
        toolchain_paths=None,  # type: ignore[arg-type]  # the state step needs none
        client_config_path=tmp_path / "config",
        state_root=tmp_path,
    )
    configs = next(step for step in creation.plan().steps if step.component == "configs")
    assert "booted, the node API moves to port 51000, trustd to 51001" in configs.target
    creation._state()
    recorded = state.ClusterState.load("demo", root=tmp_path)
    assert (recorded.node_api_port, recorded.trustd_port) == (51000, 51001)
    assert recorded.node_api_endpoint("10.5.0.2") == "10.5.0.2:51000"
    created = creation.created()
    assert created.controlplanes == ("10.5.0.2",)  # node addresses, as health's topology has them
    assert created.endpoints == ("10.5.0.2:51000",)


def _forbid(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *names: str) -> None:
    """State, client config and the host-wide routes lock under ``tmp_path`` (so a ``cluster
    create`` running on the host meanwhile neither blocks nor is blocked by the test); ``names``
    of the create module and the network creation fail the test when called."""
    monkeypatch.setenv("KUBEPLANE_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("KUBEPLANECONFIG", str(tmp_path / "config"))
    lock = functools.partial(netns.host_routes_lock, path=tmp_path / "routes.lock")
    monkeypatch.setattr(cluster_cli.netns, "host_routes_lock", lock)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing on the host may change here")

    for name in names:
        monkeypatch.setattr(create_mod, name, forbidden)
    monkeypatch.setattr(create_mod.netns, "create", forbidden)


def test_cli_bad_patch_fails_before_any_side_effect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid(monkeypatch, tmp_path, "Creation")
    result = CliRunner().invoke(
        cluster_cli.cluster,
        [
            "create",
            "--name",
            "demo",
            "--config-patch",
            '[{"op": "add", "path": "/machine/bogus/x", "value": 1}]',
        ],
    )
    assert result.exit_code == 1, result.output
    assert "config patch #1" in result.output and "nothing was created" in result.output
    assert "network" not in result.output and "[1/" not in result.output
    assert not (tmp_path / "state").exists() and not (tmp_path / "config").exists()


def test_cli_dry_run_prints_every_creation_step_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forbid(monkeypatch, tmp_path, "preflight")
    result = CliRunner().invoke(
        cluster_cli.cluster,
        ["create", "--name", "demo", "--controlplanes", "3", "--workers", "1", "--dry-run"],
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    steps = [m[1] for line in lines if (m := re.match(r"^ +\d+\. ([^:]+):", line))]
    assert steps == [
        "write cluster state cluster-wide",
        "create network cluster-wide",
        "start load balancer cluster-wide",
        "start registry cluster-wide",
        "start master nodes cluster-wide",
        "start worker nodes cluster-wide",
        "apply configs cluster-wide",
        "bootstrap etcd on node 10.5.0.2",
        "write client config and kubeconfig cluster-wide",
        "wait cluster health cluster-wide",
    ]
    assert any("demo-controlplane-3 (10.5.0.4)" in line for line in lines)
    assert any("haproxy on 10.5.0.1:6443 to 3 control plane nodes" in line for line in lines)
    assert lines[-1] == "dry run: nothing was changed"
    assert not (tmp_path / "state").exists() and not (tmp_path / "config").exists()


def test_cli_port_flags_reach_the_plan_and_are_checked_like_gen_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forbid(monkeypatch, tmp_path, "preflight")
    ports = ["--node-api-port", "51000", "--trustd-port", "51001"]
    result = CliRunner().invoke(cluster_cli.cluster, ["create", "--name", "demo", *ports, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "booted, the node API moves to port 51000, trustd to 51001" in result.stdout
    for flag, value in (("--node-api-port", "0"), ("--trustd-port", "65536")):
        refused = CliRunner().invoke(
            cluster_cli.cluster, ["create", "--name", "demo", flag, value, "--dry-run"]
        )
        assert refused.exit_code == 2 and f"Invalid value for '{flag}'" in refused.output, refused.output
    patched = CliRunner().invoke(
        cluster_cli.cluster,
        ["create", "--name", "demo", *ports, "--config-patch", '{"machine": {"ports": {"nodeAPI": 52000}}}'],
    )
    assert patched.exit_code == 1 and "(--node-api-port, --trustd-port)" in patched.output, patched.output
    assert "nothing was created" in patched.output
    kubeadm = CliRunner().invoke(cluster_cli.cluster, ["create", "--kubeadm", *ports, "--dry-run"])
    assert (
        kubeadm.exit_code == 2 and "--kubeadm takes none of --node-api-port, --trustd-port" in kubeadm.output
    )
    assert not (tmp_path / "state").exists() and not (tmp_path / "config").exists()


def test_parse_duration() -> None:
    assert output.parse_duration("10m") == 600
    assert output.parse_duration("1h30m") == 5400
    assert output.parse_duration("45s") == 45
    assert output.parse_duration("90") == 90
    with pytest.raises(Exception, match="not a duration"):
        output.parse_duration("soon")


def test_images_lists_what_nodes_pull() -> None:
    result = CliRunner().invoke(cluster_cli.images, ["--kubernetes-version", "v1.20.2"])
    assert result.exit_code == 0, result.output
    assert result.output.split() == [
        "k8s.gcr.io/kube-apiserver:v1.20.2",
        "k8s.gcr.io/kube-controller-manager:v1.20.2",
        "k8s.gcr.io/kube-scheduler:v1.20.2",
        "k8s.gcr.io/kube-proxy:v1.20.2",
        "k8s.gcr.io/coredns:1.7.0",
        "k8s.gcr.io/pause:3.2",
    ]


def test_images_of_a_local_cluster_name_its_dns_image_with_the_registry_host() -> None:
    result = CliRunner().invoke(cluster_cli.images, ["--local"])
    assert result.exit_code == 0, result.output
    assert f"docker.io/{dns_image.image_ref()}" in result.output.split()
    assert "k8s.gcr.io/coredns:1.7.0" not in result.output


def test_images_of_a_self_hosted_control_plane_add_the_checkpointer() -> None:
    result = CliRunner().invoke(cluster_cli.images, ["--local", "--self-hosted"])
    assert result.exit_code == 0, result.output
    assert f"docker.io/{checkpointer_image.image_ref()}" in result.output.split()
    plain = CliRunner().invoke(cluster_cli.images, ["--local"])
    assert "pod-checkpointer" not in plain.output


def test_images_of_a_config_follow_its_images(tmp_path: Path, secrets: gen.SecretsBundle) -> None:
    plan = _plan(secrets, name="imgs")
    config = tmp_path / "controlplane.yaml"
    config.write_text(plan.controlplanes[0].config)
    result = CliRunner().invoke(cluster_cli.images, ["-f", str(config)])
    assert result.exit_code == 0, result.output
    assert result.output.split()[-2:] == [f"docker.io/{dns_image.image_ref()}", "k8s.gcr.io/pause:3.2"]
    document = yaml.safe_load(plan.controlplanes[0].config)
    document["cluster"]["coreDNS"] = {"disabled": True}
    config.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(cluster_cli.images, ["-f", str(config)])
    assert result.exit_code == 0, result.output
    assert not [line for line in result.output.split() if "dns" in line]


def test_health_runs_every_check_and_names_failing_nodes() -> None:
    attempts = {"flaky": 0}

    def flaky() -> list[str]:
        attempts["flaky"] += 1
        return [] if attempts["flaky"] >= 2 else ["node 10.5.0.2: not yet"]

    checks = [
        health.Check("flaky", flaky),
        health.Check("broken", lambda: ["node 10.5.0.3 (demo-controlplane-2): not Ready (x)"]),
        health.Check("crashing", lambda: 1 / 0),  # type: ignore[arg-type,return-value]
        health.Check("fine", lambda: []),
    ]
    reported: list[health.Result] = []
    results = health.run(checks, timeout=1.0, interval=0.01, report=reported.append)
    assert reported == results
    assert [r.ok for r in results] == [True, False, False, True]
    assert results[1].text().splitlines()[0] == "waiting for broken: FAILED"
    assert "ZeroDivisionError" in results[2].problems[0]
    assert results[3].text() == "waiting for fine: OK"
    assert health.failing_nodes(results) == {"10.5.0.3"}


def test_pod_netns_names_are_read_from_mountinfo_and_only_unmounted_names_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text(
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "90 25 0:4 net:[4026532] /run/netns/cni-aaaa rw shared:5 - nsfs nsfs rw\n"
        "91 25 0:4 net:[4026533] /var/run/netns/cni-bbbb rw - nsfs nsfs rw\n"
        "92 25 0:4 net:[4026534] /run/netns/kp-e2e1-n1 rw - nsfs nsfs rw\n"
    )
    real_path = Path

    def fake_path(*parts: str) -> Path:
        joined = str(real_path(*parts))
        return real_path(str(tmp_path) + joined) if joined.startswith("/proc/") else real_path(joined)

    monkeypatch.setattr(leftovers, "Path", fake_path)
    assert leftovers.pod_netns_of(4242) == {"cni-aaaa", "cni-bbbb"}
    assert leftovers.pod_netns_of(4243) == set()

    netns_dir = tmp_path / "netns"
    netns_dir.mkdir()
    for name in ("cni-aaaa", "cni-other"):
        (netns_dir / name).touch()
    monkeypatch.setattr(leftovers.netns, "NETNS_DIR", netns_dir)
    mounted = {str(netns_dir / "cni-bbbb")}
    (netns_dir / "cni-bbbb").touch()
    monkeypatch.setattr(leftovers.os.path, "ismount", lambda path: str(path) in mounted)
    leftovers.remove_pod_netns_names({"cni-aaaa", "cni-bbbb", "cni-gone"})
    # The orphaned name goes; a still-mounted one and names not asked about stay.
    assert sorted(p.name for p in netns_dir.iterdir()) == ["cni-bbbb", "cni-other"]


def test_local_clusters_get_host_gw_the_dns_add_on_and_a_routed_service_subnet(
    secrets: gen.SecretsBundle,
) -> None:
    plan = _plan(secrets, name="demo", service_subnet="10.98.0.0/16", dns_upstreams=("10.5.0.1",))
    for node in plan.nodes:
        doc = _doc(node)
        assert doc["cluster"]["network"]["cni"] == {"name": "host-gw"}
        assert doc["cluster"]["network"]["serviceSubnets"] == ["10.98.0.0/16"]
        assert doc["cluster"]["coreDNS"]["image"].startswith("kubeplane/cluster-dns:")
        assert doc["machine"]["network"]["nameservers"] == ["10.5.0.1"]
    # The host reaches Services through the first control plane node.
    assert plan.network.routes == (("10.98.0.0/16", "10.5.0.2"),)
    # No upstream asked for: none (the host's resolver is not reachable from pods).
    assert _doc(_plan(secrets, name="demo").nodes[0])["machine"]["network"]["nameservers"] == []


def test_a_service_subnet_from_the_patches_wins(secrets: gen.SecretsBundle) -> None:
    patch = {"cluster": {"network": {"serviceSubnets": ["10.200.0.0/16"]}}}
    plan = _plan(secrets, name="demo", service_subnet="10.98.0.0/16", config_patches=(patch,))
    assert _doc(plan.nodes[0])["cluster"]["network"]["serviceSubnets"] == ["10.200.0.0/16"]
    assert plan.network.routes == (("10.200.0.0/16", "10.5.0.2"),)


def test_service_subnets_are_picked_free_of_host_routes_and_kept_on_re_runs() -> None:
    import ipaddress

    taken = [ipaddress.IPv4Network("10.96.0.0/16"), ipaddress.IPv4Network("10.97.5.0/24")]
    assert planning.service_subnet_for(taken) == "10.98.0.0/16"
    assert planning.service_subnet_for(taken, recorded="10.96.0.0/16") == "10.96.0.0/16"
    with pytest.raises(cluster.PlanError, match="every local Service subnet"):
        planning.service_subnet_for([ipaddress.IPv4Network("10.96.0.0/12")])


def test_wireguard_cidr_gives_every_node_wg0_as_the_quick_start_describes(secrets: gen.SecretsBundle) -> None:
    plan = _plan(
        secrets,
        name="demo",
        controlplanes=2,
        workers=1,
        wireguard_cidr="10.1.0.0/24",
        config_patches=({"machine": {"network": {"interfaces": [{"interface": "eth0", "mtu": 1400}]}}},),
    )
    docs = {node.name: _doc(node) for node in plan.nodes}
    wg0 = {name: doc["machine"]["network"]["interfaces"][-1] for name, doc in docs.items()}
    # The patches' interfaces stay; wg0 comes after them.
    assert all(doc["machine"]["network"]["interfaces"][0]["interface"] == "eth0" for doc in docs.values())
    assert {name: (i["interface"], i["cidr"]) for name, i in wg0.items()} == {
        "demo-controlplane-1": ("wg0", "10.1.0.2/24"),
        "demo-controlplane-2": ("wg0", "10.1.0.3/24"),
        "demo-worker-1": ("wg0", "10.1.0.4/24"),
    }
    public = {name: pki.wireguard_public_key(i["wireguard"]["privateKey"]) for name, i in wg0.items()}
    assert len(set(public.values())) == 3
    cp1, cp2, worker = (
        wg0[f"demo-{n}"]["wireguard"] for n in ("controlplane-1", "controlplane-2", "worker-1")
    )
    assert cp1["listenPort"] == cp2["listenPort"] == 51111 and "listenPort" not in worker

    def peer(key: str, tunnel: str, endpoint: str | None) -> dict[str, object]:
        found: dict[str, object] = {
            "publicKey": key,
            "allowedIPs": [f"{tunnel}/32"],
            "persistentKeepaliveInterval": "5s",
        }
        return {**found, "endpoint": endpoint} if endpoint else found

    # Every node peers with every control plane node; control plane nodes with the workers too
    # (no endpoint: a worker has no fixed port, it keeps the tunnel alive itself).
    assert worker["peers"] == [
        peer(public["demo-controlplane-1"], "10.1.0.2", "10.5.0.2:51111"),
        peer(public["demo-controlplane-2"], "10.1.0.3", "10.5.0.3:51111"),
    ]
    assert cp1["peers"] == [
        peer(public["demo-controlplane-2"], "10.1.0.3", "10.5.0.3:51111"),
        peer(public["demo-worker-1"], "10.1.0.4", None),
    ]


@pytest.mark.parametrize(
    ("cidr", "message"),
    [
        ("10.1.0.1/24", "--wireguard-cidr 10.1.0.1/24: 10.1.0.1/24 has host bits set"),
        ("10.1.0.0/31", "--wireguard-cidr 10.1.0.0/31 is too small for 2 nodes"),
        ("10.5.0.0/16", "--wireguard-cidr 10.5.0.0/16 overlaps the cluster network 10.5.0.0/24"),
    ],
)
def test_wireguard_cidr_mistakes_are_plan_errors(secrets: gen.SecretsBundle, cidr: str, message: str) -> None:
    with pytest.raises(cluster.PlanError) as caught:
        _plan(secrets, name="demo", wireguard_cidr=cidr)
    assert message in str(caught.value)


def test_a_vip_is_the_endpoint_and_every_control_plane_carries_it(secrets: gen.SecretsBundle) -> None:
    plan = _plan(secrets, name="demo", controlplanes=3, workers=1, vip="10.5.0.250")
    assert plan.endpoint == "https://10.5.0.250:6443"
    assert plan.network.vip == "10.5.0.250"
    assert "10.5.0.250" not in [n.ip for n in plan.nodes]
    for node in plan.controlplanes:
        doc = _doc(node)
        assert doc["machine"]["network"]["interfaces"] == [{"interface": "eth0", "vip": {"ip": "10.5.0.250"}}]
        assert doc["cluster"]["controlPlane"]["endpoint"] == "https://10.5.0.250:6443"
        assert "10.5.0.250" in doc["cluster"]["apiServer"]["certSANs"]
    worker = _doc(plan.workers[0])
    assert "interfaces" not in worker["machine"]["network"]  # a VIP is only for control planes
    assert worker["cluster"]["controlPlane"]["endpoint"] == "https://10.5.0.250:6443"
    # The node API still goes to the nodes themselves, never through the moving VIP.
    assert plan.client_config.contexts["demo"].endpoints == ("10.5.0.2", "10.5.0.3", "10.5.0.4")


def test_a_vip_keeps_the_wireguard_interface_beside_it(secrets: gen.SecretsBundle) -> None:
    plan = _plan(secrets, name="demo", workers=0, vip="10.5.0.250", wireguard_cidr="10.1.0.0/24")
    interfaces = _doc(plan.nodes[0])["machine"]["network"]["interfaces"]
    assert [(i["interface"], "vip" in i, "wireguard" in i) for i in interfaces] == [
        ("eth0", True, False),
        ("wg0", False, True),
    ]


@pytest.mark.parametrize(
    ("vip", "message"),
    [
        ("ten", "--vip 'ten' is not an IP address (e.g. 10.5.0.254)"),
        ("10.6.0.9", "--vip 10.6.0.9 is outside the cluster network 10.5.0.0/24"),
        ("fd00::9", "--vip fd00::9 is outside the cluster network 10.5.0.0/24"),
        ("10.5.0.0", "--vip 10.5.0.0 is the network or broadcast address of 10.5.0.0/24"),
        ("10.5.0.255", "--vip 10.5.0.255 is the network or broadcast address of 10.5.0.0/24"),
        ("10.5.0.1", "--vip 10.5.0.1 is the host's address on the cluster bridge (the nodes' gateway)"),
        ("10.5.0.3", "--vip 10.5.0.3 is the address of node demo-worker-1"),
    ],
)
def test_vip_mistakes_are_plan_errors_naming_the_flag(
    secrets: gen.SecretsBundle, vip: str, message: str
) -> None:
    with pytest.raises(cluster.PlanError) as caught:
        _plan(secrets, name="demo", vip=vip)
    assert message in str(caught.value)


def test_cli_dry_run_with_a_vip_starts_no_load_balancer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forbid(monkeypatch, tmp_path, "preflight")
    result = CliRunner().invoke(
        cluster_cli.cluster,
        ["create", "--name", "demo", "--controlplanes", "3", "--vip", "10.5.0.200", "--dry-run"],
    )
    assert result.exit_code == 0, result.output
    assert "load balancer" not in result.stdout and "haproxy" not in result.stdout
    assert "the control plane nodes elect the owner of the endpoint's VIP 10.5.0.200" in result.stdout
    refused = CliRunner().invoke(
        cluster_cli.cluster, ["create", "--name", "demo", "--vip", "10.5.0.2", "--dry-run"]
    )
    assert refused.exit_code == 1
    assert "--vip 10.5.0.2 is the address of node demo-controlplane-1" in refused.output
    assert "nothing was created" in refused.output
    assert not (tmp_path / "state").exists()


def test_a_vip_cluster_needs_no_haproxy_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = planning.plan(planning.ClusterRequest(name="demo", vip="10.5.0.200"))
    monkeypatch.setattr(create_mod.os, "geteuid", lambda: 0)
    found = {tool for tool in create_mod.HOST_TOOLS if tool != "haproxy"}
    monkeypatch.setattr(
        create_mod.shutil, "which", lambda tool: f"/usr/bin/{tool}" if tool in found else None
    )

    class Stop(Exception):
        pass

    def stop(*_: object, **__: object) -> None:
        raise Stop

    monkeypatch.setattr(create_mod, "agent_command", stop)
    with pytest.raises(Stop):  # past the host tools check: haproxy was not asked for
        create_mod.preflight(plan, toolchain=None)  # type: ignore[arg-type]
    with pytest.raises(cluster.PreflightError, match="haproxy"):
        create_mod.preflight(planning.plan(planning.ClusterRequest(name="demo")), toolchain=None)  # type: ignore[arg-type]


def test_upgrades_of_a_vip_cluster_run_without_a_load_balancer_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`upgrade-k8s` and `certs renew` drain haproxy servers in a local cluster that has one; a
    VIP cluster's state has no haproxy directory, and they go on without a rotation."""
    monkeypatch.setenv(state.STATE_ENV, str(tmp_path))
    plan = planning.plan(planning.ClusterRequest(name="demo", controlplanes=3, workers=0, vip="10.5.0.200"))
    recorded = state.ClusterState.open("demo")
    recorded.network = state.NetworkState(
        cidr="10.5.0.0/24", host_ip="10.5.0.1", bridge="kp-demo", vip="10.5.0.200"
    )
    recorded.nodes = [
        state.NodeState(name=n.name, role=n.role, index=i, ip=n.ip, netns=n.netns, host_veth="")
        for i, n in enumerate(plan.nodes, start=1)
    ]
    recorded.save()
    assert cli_upgrade.local_rotation([n.ip for n in plan.nodes]) is None
