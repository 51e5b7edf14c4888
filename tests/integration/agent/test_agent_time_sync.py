"""``machine.time.servers`` through a real ``kubeplaned``: the node runs ``chronyd -x`` (its own
files, in the node's network namespace), syncs with an NTP server on the test network, shows it in
``kubeplane get timestatus``; a server change applied with ``--immediate`` replaces the daemon live,
and ``disabled: true`` stops it.

The NTP servers are two more ``chronyd`` on the host's address on the test bridge, each serving its
own clock as a local reference (``local stratum N``, never adjusting it: ``-x``), on ports of their
own, with no command socket: the host's chrony files are never used, and no clock is changed.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_harness import Agent, Cluster, Processes, json_lines, wait_for

from kubeplane.services import timesync

pytestmark = pytest.mark.integration

#: Seconds to wait for a sync: iburst polls every 2 s and chronyd selects after a few answers.
SYNC_TIMEOUT = 60.0


def free_udp_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


def start_ntp_server(processes: Processes, directory: Path, *, address: str, allow: str, stratum: int) -> int:
    """A chronyd serving NTP on ``address`` at a free port from its own clock; returns the port."""
    directory.mkdir(parents=True)
    port = free_udp_port(address)
    config = directory / "chrony.conf"
    config.write_text(
        f"local stratum {stratum}\n"
        f"allow {allow}\n"
        f"bindaddress {address}\n"
        f"port {port}\n"
        "cmdport 0\n"
        "bindcmdaddress /\n"  # no command socket at all (not the host's /run/chrony)
        f"pidfile {directory / 'chronyd.pid'}\n"
    )
    processes.start(["chronyd", "-d", "-x", "-f", str(config)], name=f"ntp-stratum-{stratum}")
    return port


def time_status(cluster: Cluster, agent: Agent) -> dict[str, Any]:
    result = cluster.kp("-e", agent.address, "get", "timestatus", "-o", "json", check=False)
    if result.returncode != 0:
        return {}
    (document,) = json_lines(result.stdout)
    spec: dict[str, Any] = document["spec"]
    return spec


def node_daemon(agent: Agent) -> tuple[int, list[str]] | None:
    """The PID and command line of the node's chronyd, from the pid file it keeps, while it runs."""
    pidfile = timesync.files(agent.root).pidfile
    try:
        pid = int(pidfile.read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except (OSError, ValueError):
        return None
    return pid, argv


def test_time_servers_sync_change_live_and_stop(
    cluster: Cluster, processes: Processes, tmp_path: Path
) -> None:
    agent = cluster.start_agent()
    host = str(next(ipaddress.ip_network(cluster.lan.cidr).hosts()))  # the host's bridge address
    first = start_ntp_server(processes, tmp_path / "ntp1", address=host, allow=cluster.lan.cidr, stratum=8)
    second = start_ntp_server(processes, tmp_path / "ntp2", address=host, allow=cluster.lan.cidr, stratum=5)

    document = yaml.safe_load(cluster.gen.controlplane.read_text())
    document["machine"]["time"] = {"servers": [f"{host}:{first}"], "bootTimeout": "30s"}
    config = tmp_path / "controlplane-time.yaml"
    config.write_text(yaml.safe_dump(document))
    cluster.kp("-n", agent.address, "apply-config", "--insecure", "-f", str(config), config=None)
    cluster.wait_booted(agent)

    synced = wait_for(
        lambda: (status := time_status(cluster, agent)).get("synced") and status,
        timeout=SYNC_TIMEOUT,
        what="the node to sync with the first server",
        logs=cluster.logs,
    )
    assert synced["servers"] == [f"{host}:{first}"]
    assert synced["source"] == host
    assert synced["stratum"] == 9  # the server's local stratum 8, plus one
    assert synced["syncDisabled"] is False
    assert abs(synced["offset"]) < 0.5  # one clock on both sides
    running = node_daemon(agent)
    assert running is not None, "no chronyd pid file under the node's own directory"
    pid, argv = running
    assert "-x" in argv  # never sets the clock the host and all nodes share
    assert argv[argv.index("-f") + 1] == "/var/lib/kubeplane/chrony/chrony.conf"  # the node's own
    netns = Path(f"/run/netns/{agent.netns}").stat().st_ino
    assert Path(f"/proc/{pid}/ns/net").stat().st_ino == netns  # polls from the node's address

    patch = [{"op": "replace", "path": "/machine/time/servers", "value": [f"{host}:{second}"]}]
    result = cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", json.dumps(patch))
    assert "immediately" in result.stdout
    changed = wait_for(
        lambda: (status := time_status(cluster, agent)).get("stratum") == 6 and status,
        timeout=SYNC_TIMEOUT,
        what="the node to sync with the second server",
        logs=cluster.logs,
    )
    assert changed["synced"] is True
    assert changed["servers"] == [f"{host}:{second}"]
    replaced = node_daemon(agent)
    assert replaced is not None and replaced[0] != pid
    assert not Path(f"/proc/{pid}").exists() or "chronyd" not in Path(f"/proc/{pid}/cmdline").read_text()

    patch = [{"op": "add", "path": "/machine/time/disabled", "value": True}]
    cluster.kp("-e", agent.address, "patch", "mc", "--immediate", "-p", json.dumps(patch))
    stopped = wait_for(
        lambda: (status := time_status(cluster, agent)).get("syncDisabled") and status,
        timeout=30,
        what="the time sync to stop",
        logs=cluster.logs,
    )
    assert stopped["synced"] is False
    wait_for(
        lambda: node_daemon(agent) is None, timeout=10, what="the node's chronyd to exit", logs=cluster.logs
    )
    log = cluster.kp("-e", agent.address, "logs", "timed").stdout
    assert "Selected source" in log
