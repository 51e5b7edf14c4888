"""The agent runs no command and waits for no file on its event loop.

Commands are recorded by a stand-in for :func:`subprocess.run` that notes whether it was called
on the thread running the event loop (``asyncio.to_thread`` calls come from a worker thread).
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import json
import socket
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeplane import config, resources
from kubeplane.agent import node as agent_node
from kubeplane.agent import services as agent_services
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths

pytestmark = pytest.mark.unit


class Commands:
    """Replaces subprocess.run: answers from ``outputs`` (keyed by argv tail) and records each call."""

    def __init__(self, outputs: dict[tuple[str, ...], str]) -> None:
        self.outputs = outputs
        self.calls: list[tuple[list[str], bool]] = []

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        self.calls.append((list(argv), on_loop))
        stdout = next((out for tail, out in self.outputs.items() if tuple(argv[-len(tail) :]) == tail), "")
        return subprocess.CompletedProcess(argv, 0, stdout=stdout, stderr="")

    @property
    def on_loop(self) -> list[list[str]]:
        return [argv for argv, on_loop in self.calls if on_loop]

    @property
    def argvs(self) -> list[list[str]]:
        return [argv for argv, _ in self.calls]


def control_plane_services(tmp_path: Path) -> agent_services.NodeServices:
    documents = gen.generate(
        gen.GenOptions(cluster_name="unit", endpoint="https://10.5.0.1:6443"), gen.new_secrets()
    )
    return agent_services.NodeServices(
        paths=NodePaths(tmp_path),
        document=config.load(yaml.safe_dump(copy.deepcopy(dict(documents.documents["controlplane"])))),
        name="cp1",
        node_ip="10.5.0.2",
        state=resources.State(resources.default_registry()),
    )


def test_stopping_containers_deletes_pod_network_namespaces_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = {"Spec": {"linux": {"namespaces": [{"type": "network", "path": "/var/run/netns/cni-1234"}]}}}
    commands = Commands(
        {
            ("containers", "ls", "-q"): "sandbox\n",
            ("containers", "info", "sandbox"): json.dumps(sandbox),
            ("tasks", "ls", "-q"): "sandbox\n",
        }
    )
    monkeypatch.setattr(subprocess, "run", commands)
    asyncio.run(control_plane_services(tmp_path)._kill_containers())
    assert ["ip", "netns", "delete", "cni-1234"] in commands.argvs
    assert any(argv[-3:] == ["-s", "SIGKILL", "sandbox"] for argv in commands.argvs)
    assert commands.on_loop == [], "commands ran on the event loop"


def ifreq(name: str, ip: str) -> bytes:
    sockaddr = struct.pack("@H", socket.AF_INET) + b"\0\0" + socket.inet_aton(ip)
    record = name.encode().ljust(16, b"\0") + sockaddr
    return record.ljust(agent_node.IFREQ_SIZE, b"\0")


def test_interface_addresses_are_read_from_the_ifconf_records() -> None:
    data = (
        ifreq("lo", "127.0.0.1")
        + ifreq("eth0", "10.5.0.2")
        + ifreq("eth0", "10.5.0.9")
        + ifreq("br0", "192.0.2.1")
    )
    assert agent_node.ifconf_addresses(data) == ["10.5.0.2", "10.5.0.9", "192.0.2.1"]
    # A record of another address family is skipped; a torn record at the end is ignored.
    other = b"eth1".ljust(16, b"\0") + struct.pack("@H", socket.AF_INET6)
    assert agent_node.ifconf_addresses(other.ljust(agent_node.IFREQ_SIZE, b"\0") + b"\1\2") == []


def test_local_addresses_run_no_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"local_addresses started a process: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    found = agent_node.local_addresses()
    for address in found:
        assert ipaddress.ip_address(address).version == 4
        assert not ipaddress.ip_address(address).is_loopback
