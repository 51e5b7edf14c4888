"""The host side of a local cluster, for real: bridge + node namespaces, haproxy, registry, processes.

Each test owns a cluster with a random name ``kpt<hex>`` on a random ``10.217.X.0/24`` (both
private to the test) and its state under ``tmp_path``. The ``cluster`` fixture tears everything
down from the state file even when the test fails: it stops the recorded processes by PID,
destroys the network and removes the state; the tests themselves check that nothing is left.
"""

from __future__ import annotations

import dataclasses
import shutil
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import machines
import pytest

import kubeplane
from kubeplane import pki
from kubeplane.provision import dns_image, hostproc, images, netns, registry, state, workload_images
from kubeplane.provision import loadbalancer as lb

pytestmark = pytest.mark.integration

NODES = ("cp1", "cp2")

# A TLS server answering every GET with its node name (200 for /readyz), like an API server's
# /readyz behind the endpoint.
READYZ_SERVER = """
import http.server, ssl, sys
cert, key, host, port, name = sys.argv[1:]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = name.encode()
        self.send_response(200 if self.path == "/readyz" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print("serving", flush=True)
server.serve_forever()
"""


def require_binary(name: str) -> None:
    if shutil.which(name) is None:
        pytest.fail(f"{name} is missing; run scripts/setup to install the real components", pytrace=False)


def write_pem(directory: Path, name: str, pair: pki.CertKey) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    cert.write_bytes(pair.cert)
    key.touch(mode=0o600)
    key.write_bytes(pair.key or b"")
    return cert, key


@dataclasses.dataclass
class Cluster:
    state: state.ClusterState
    plan: netns.NetworkPlan

    def records(self) -> list[hostproc.ProcessRecord]:
        nodes = [rec for node in self.state.nodes for rec in node.processes.values()]
        return [*nodes, *self.state.processes.values()]


def teardown(cluster: state.ClusterState) -> None:
    """What `cluster destroy` does on the host side: processes by PID, network, state."""
    for node in cluster.nodes:
        for record in node.processes.values():
            hostproc.stop(record)
    for record in cluster.processes.values():
        hostproc.stop(record)
    netns.destroy(cluster)
    cluster.remove()


def assert_nothing_left(cluster: Cluster, records: list[hostproc.ProcessRecord]) -> None:
    for node in cluster.plan.nodes:
        assert not netns.netns_exists(node.netns), f"namespace {node.netns} is left"
        assert netns.link_info(node.host_veth) is None, f"link {node.host_veth} is left"
    assert netns.link_info(cluster.plan.bridge) is None, f"bridge {cluster.plan.bridge} is left"
    for record in records:
        assert not hostproc.is_running(record), f"{record.name} (pid {record.pid}) still runs"
    assert not cluster.state.directory.exists(), f"state {cluster.state.directory} is left"


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    for tool in ("ip", "nsenter", "haproxy", "docker-registry", "skopeo"):
        require_binary(tool)
    # A short root keeps haproxy's admin socket path under the unix socket limit.
    monkeypatch.setenv(state.STATE_ENV, str(tmp_path / "c"))
    name = f"{machines.PREFIX}{uuid.uuid4().hex[:6]}"
    plan = netns.plan(name, NODES, cidr=f"10.217.{machines.octet()}.0/24")
    cluster_state = state.ClusterState.open(name)
    try:
        yield Cluster(cluster_state, plan)
    finally:
        teardown(cluster_state)


def wait_serving(record: hostproc.ProcessRecord, timeout: float = 30.0) -> None:
    """Wait for a readyz server's "serving" line (a loaded machine can take seconds)."""
    deadline = time.monotonic() + timeout
    while "serving" not in hostproc.tail(record.log):
        if not hostproc.is_running(record) or time.monotonic() > deadline:
            pytest.fail(f"{record.name} is not serving:\n{hostproc.tail(record.log)}", pytrace=False)
        time.sleep(0.1)


def create_network(cluster: Cluster) -> float:
    started = time.monotonic()
    netns.create(cluster.plan, cluster.state, roles={"cp1": "controlplane", "cp2": "controlplane"})
    return time.monotonic() - started


def test_network_connects_nodes_and_host_and_destroys_cleanly(cluster: Cluster) -> None:
    created = create_network(cluster)
    # Running create again finds everything in place and changes nothing.
    netns.create(cluster.plan, cluster.state)
    cp1, cp2 = cluster.plan.nodes
    netns.wait_reachable(cp2.ip, netns=cp1.netns)
    netns.wait_reachable(cp1.ip, netns=cp2.netns)
    netns.wait_reachable(cluster.plan.host_ip, netns=cp1.netns)
    netns.wait_reachable(cp2.ip)
    assert not netns.ping(str(cluster.plan.cidr[200]), netns=cp1.netns), "an unused address answered"

    loaded = state.ClusterState.load(cluster.plan.cluster)
    assert loaded.network is not None
    assert loaded.network.netns == [cp1.netns, cp2.netns]
    assert [(n.name, n.ip) for n in loaded.nodes] == [("cp1", cp1.ip), ("cp2", cp2.ip)]
    assert (
        subprocess.run(
            ["ip", "-n", cp1.netns, "-br", "addr", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[2]
        == f"{cp1.ip}/24"
    )

    # Another cluster on an overlapping CIDR is refused before it touches anything.
    other = netns.plan("kptother", ["n1"], cidr=str(cluster.plan.cidr.supernet(new_prefix=16)))
    with pytest.raises(
        netns.AddressConflict, match=f"address {cluster.plan.host_ip}/24 on {cluster.plan.bridge}"
    ):
        netns.check_host(other, None)

    started = time.monotonic()
    teardown(cluster.state)
    destroyed = time.monotonic() - started
    teardown(cluster.state)  # safe twice
    assert_nothing_left(cluster, [])
    print(f"\nnetwork with 2 nodes: create {created:.2f}s, destroy {destroyed:.2f}s")


def test_a_node_added_to_a_running_network_and_removed_again(cluster: Cluster) -> None:
    """What `cluster add` / `cluster remove` do to the network: one more namespace on the same
    bridge (the creation's code, with a plan of just that node), then only that one removed."""
    create_network(cluster)
    cp1, cp2 = cluster.plan.nodes
    extra = netns.NodeAddress(
        name="cp3",
        index=3,
        ip=str(cluster.plan.cidr[4]),
        netns=netns.netns_name(cluster.plan.cluster, "cp3"),
        host_veth=netns.veth_name(cluster.plan.cluster, 3),
    )
    netns.create(dataclasses.replace(cluster.plan, nodes=(extra,), routes=()), cluster.state)
    netns.wait_reachable(extra.ip, netns=cp1.netns)
    netns.wait_reachable(cp2.ip, netns=extra.netns)
    assert cluster.state.network is not None
    assert cluster.state.network.netns == [cp1.netns, cp2.netns, extra.netns]

    node = cluster.state.node("cp3")
    netns.remove_node(cluster.state, node)
    netns.remove_node(cluster.state, node)  # safe twice
    assert not netns.netns_exists(extra.netns)
    assert netns.link_info(extra.host_veth) is None
    loaded = state.ClusterState.load(cluster.plan.cluster)
    assert loaded.network is not None
    assert loaded.network.netns == [cp1.netns, cp2.netns]
    assert loaded.network.links == [cp1.host_veth, cp2.host_veth]
    netns.wait_reachable(cp2.ip, netns=cp1.netns)


def test_haproxy_balances_checks_and_drains_control_plane_nodes(cluster: Cluster, tmp_path: Path) -> None:
    create_network(cluster)
    ca = pki.new_ca("kpt-ca")
    ca_path, _ = write_pem(tmp_path / "pki", "ca", ca.cert_only())
    backends = []
    for node in cluster.plan.nodes:
        pair = pki.issue(
            ca=ca, common_name=node.name, ip_addresses=[node.ip, cluster.plan.host_ip], usages=("server",)
        )
        cert, key = write_pem(tmp_path / "pki", node.name, pair)
        node_state = cluster.state.node(node.name)
        node_state.processes["readyz"] = hostproc.start(
            [sys.executable, "-c", READYZ_SERVER, cert, key, node.ip, str(lb.API_PORT), node.name],
            name=f"readyz-{node.name}",
            log=tmp_path / "logs" / f"{node.name}.log",
            netns=node.netns,
        )
        cluster.state.save()
        backends.append(lb.Backend(node.name, node.ip))
    for node in cluster.plan.nodes:
        wait_serving(cluster.state.node(node.name).processes["readyz"])

    proxy = lb.HAProxy(cluster.state.directory / "haproxy")
    cluster.state.dirs["haproxy"] = str(proxy.directory)
    proxy.write_config(bind_address=cluster.plan.host_ip, backends=backends)
    cluster.state.processes["haproxy"] = proxy.start()
    cluster.state.save()
    for node in cluster.plan.nodes:
        status = proxy.wait_status(node.name, until="healthy", timeout=30)
        assert status.check == "L7OK", f"{node.name}: {status}"

    verify = ssl.create_default_context(cafile=str(ca_path))
    endpoint = f"https://{cluster.plan.host_ip}:{lb.API_PORT}/readyz"

    def served_by(count: int) -> set[str]:
        seen = set()
        for _ in range(count):
            # A new connection per request: haproxy balances connections, not requests.
            response = httpx.get(endpoint, verify=verify, timeout=5)
            assert response.status_code == httpx.codes.OK
            seen.add(response.text)
        return seen

    assert served_by(6) == {"cp1", "cp2"}

    proxy.set_server_state("cp1", "maint")
    assert proxy.server_states()["cp1"].status == "MAINT"
    assert served_by(6) == {"cp2"}

    # A reload (new backend set) keeps the administrative state and the master's PID.
    record = proxy.record
    spare = lb.Backend("spare", str(cluster.plan.cidr[250]))
    proxy.update(bind_address=cluster.plan.host_ip, backends=[*backends, spare])
    assert proxy.record == record and proxy.running()
    assert set(proxy.server_states()) == {"cp1", "cp2", "spare"}
    assert proxy.server_states()["cp1"].status == "MAINT"
    proxy.wait_status("spare", until="out")
    assert served_by(4) == {"cp2"}

    proxy.set_server_state("cp1", "drain")
    assert proxy.server_states()["cp1"].status.startswith("DRAIN")
    proxy.set_server_state("cp1", "ready")
    proxy.wait_status("cp1", until="healthy")
    assert served_by(6) == {"cp1", "cp2"}

    # The health check takes a node whose server stopped out of rotation by itself.
    hostproc.stop(cluster.state.node("cp2").processes["readyz"])
    status = proxy.wait_status("cp2", until="out", timeout=10)
    assert status.status == "DOWN"
    assert served_by(4) == {"cp1"}

    records = cluster.records()
    teardown(cluster.state)
    assert_nothing_left(cluster, records)


def test_registry_serves_pushed_images_to_nodes_and_logs_their_pulls(
    cluster: Cluster, tmp_path: Path
) -> None:
    create_network(cluster)
    payload = tmp_path / "hello.txt"
    payload.write_text("hello from kubeplane\n")
    ref = "k8s.gcr.io/kpt-hello:v1"
    archive = tmp_path / "hello.tar"
    image_id = images.write_docker_archive(
        images.ImageSpec(ref, (images.LayerEntry("/hello.txt", "file", 0o644, payload),)), archive
    )

    reg = registry.Registry(cluster.state.directory / "registry", address=cluster.plan.host_ip)
    cluster.state.dirs["registry"] = str(reg.directory)
    cluster.state.processes["registry"] = reg.start()
    cluster.state.save()

    assert reg.push(archive, ref) is True
    assert reg.push(archive, ref) is False, "a second push of the same image copied it again"
    assert reg.catalog() == ["kpt-hello"]
    assert reg.tags("kpt-hello") == ["v1"]
    assert reg.config_digest("kpt-hello", "v1") == f"sha256:{image_id}"

    # Fetch the manifest from a node the way containerd's mirror for "*" does.
    node = cluster.plan.nodes[1]
    fetch = (
        "import sys, urllib.request\n"
        "request = urllib.request.Request(sys.argv[1], headers={'User-Agent': 'containerd/1.6.20',"
        " 'Accept': 'application/vnd.docker.distribution.manifest.v2+json'})\n"
        "print(urllib.request.urlopen(request, timeout=5).status)\n"
    )
    url = f"{reg.url}/v2/kpt-hello/manifests/v1?ns=k8s.gcr.io"
    result = subprocess.run(
        [*hostproc.nsenter_argv(node.netns), sys.executable, "-c", fetch, url],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.stdout.strip() == "200", result.stderr
    assert registry.pulled_repositories(reg.log) == {"kpt-hello"}
    assert {p.client for p in registry.pulls(reg.log) if p.method == "GET"} == {node.ip}

    records = cluster.records()
    teardown(cluster.state)
    assert_nothing_left(cluster, records)


def test_busybox_workload_image_is_served_under_both_tags(cluster: Cluster) -> None:
    """What cluster create pushes for `kubectl run --image=busybox`: one image, two tags."""
    create_network(cluster)
    image = workload_images.Builder().ensure_busybox()
    reg = registry.Registry(cluster.state.directory / "registry", address=cluster.plan.host_ip)
    cluster.state.dirs["registry"] = str(reg.directory)
    cluster.state.processes["registry"] = reg.start()
    cluster.state.save()

    assert [reg.push(image.archive, ref) for ref in image.refs] == [True, True]
    assert registry.mirror_path("busybox") == ("library/busybox", "latest")
    assert reg.catalog() == ["library/busybox"]
    version = image.refs[0].rpartition(":")[2]
    assert sorted(reg.tags("library/busybox")) == sorted([version, "latest"])
    digests = {reg.config_digest("library/busybox", tag) for tag in (version, "latest")}
    assert digests == {registry.archive_config_digest(image.archive)}

    records = cluster.records()
    teardown(cluster.state)
    assert_nothing_left(cluster, records)


def test_agnhost_under_both_tags_and_the_dns_image_are_served(cluster: Cluster) -> None:
    """The rest of what cluster create pushes to every local cluster: agnhost (its VERSION tag and
    the one the e2e framework names) and the cluster DNS add-on's image."""
    create_network(cluster)
    agnhost = workload_images.Builder().ensure_agnhost()
    dns = dns_image.Builder().ensure()
    reg = registry.Registry(cluster.state.directory / "registry", address=cluster.plan.host_ip)
    cluster.state.dirs["registry"] = str(reg.directory)
    cluster.state.processes["registry"] = reg.start()
    cluster.state.save()

    assert [reg.push(agnhost.archive, ref) for ref in agnhost.refs] == [True, True]
    assert reg.push(dns.archive, dns.ref) is True
    assert sorted(reg.catalog()) == ["e2e-test-images/agnhost", "kubeplane/cluster-dns"]
    assert sorted(reg.tags("e2e-test-images/agnhost")) == ["2.21", "2.25"]
    digests = {reg.config_digest("e2e-test-images/agnhost", tag) for tag in ("2.21", "2.25")}
    assert digests == {registry.archive_config_digest(agnhost.archive)}
    assert reg.tags("kubeplane/cluster-dns") == [kubeplane.__version__]
    assert reg.config_digest("kubeplane/cluster-dns", kubeplane.__version__) == (
        registry.archive_config_digest(dns.archive)
    )

    records = cluster.records()
    teardown(cluster.state)
    assert_nothing_left(cluster, records)


# -- host processes -----------------------------------------------------------------------------


def test_stop_kills_the_whole_group_and_only_what_we_started(tmp_path: Path) -> None:
    require_binary("sleep")
    leader = hostproc.start(
        ["sh", "-c", "sleep 300 & sleep 300"],
        name="group",
        log=tmp_path / "g.log",
        pidfile=tmp_path / "g.pid",
    )
    bystander = hostproc.start(["sleep", "300"], name="bystander", log=tmp_path / "b.log")
    try:
        assert (tmp_path / "g.pid").read_text().strip() == str(leader.pid)
        deadline = time.monotonic() + 5
        while len(hostproc.group_members(leader.pid, since=leader.start_time)) < 3:
            assert time.monotonic() < deadline, "the shell did not start its two sleeps"
            time.sleep(0.05)

        # A record whose start time does not match (a recycled PID) is never signalled.
        impostor = dataclasses.replace(bystander, start_time=bystander.start_time + 1)
        assert hostproc.stop(impostor) is False
        assert hostproc.is_running(bystander)

        assert hostproc.stop(leader, timeout=5) is True
        assert not hostproc.is_running(leader)
        assert hostproc.group_members(leader.pid, since=leader.start_time) == []
        assert not (tmp_path / "g.pid").exists()
        assert hostproc.stop(leader) is False  # safe twice
        assert hostproc.is_running(bystander)
    finally:
        hostproc.stop(leader)
        hostproc.stop(bystander)
    assert not hostproc.is_running(bystander)


def test_a_process_that_dies_at_once_is_reported_with_its_log(tmp_path: Path) -> None:
    record = hostproc.start(
        ["sh", "-c", "echo broken config >&2; exit 3"], name="broken", log=tmp_path / "x.log"
    )
    deadline = time.monotonic() + 5
    while hostproc.is_running(record):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "broken config" in hostproc.tail(record.log)
    assert hostproc.stop(record) is False
