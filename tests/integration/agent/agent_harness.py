"""Harness for the node agent acceptance tests: real ``kubeplaned`` processes on machine nodes,
driven only through the ``kubeplane`` CLI.

Every agent is a machine node (:mod:`machines`): its own network namespace on the test's bridge,
listening on ``<its address>:50000``, and its own mount and UTS namespaces, so it runs with the
default ``--root /`` over its node directory under the test's ``tmp_path``. It runs in its own
process group, stopped by the parent conftest's ``processes`` fixture (SIGTERM, then SIGKILL)
even when the test fails; the test network goes after it.

API-only nodes: these tests exercise the agent's API, config store and lifecycle, not the
services (containerd, kubelet, etcd; ``test_cluster_formation`` runs those), so the agents run
with ``kubeplaned --no-services``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import machines
import pytest
import yaml

from kubeplane.config.paths import NodePaths

#: The parent conftest's ``Processes`` and ``Started`` (conftest modules cannot be imported by name).
Processes = Any
Started = Any

API_PORT = 50000
CLI_TIMEOUT = 60.0
BOOT_TIMEOUT = 30.0


def venv_binary(name: str) -> Path:
    """A console script installed next to the running interpreter, or fail naming the fix."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        pytest.fail(f"{path} is missing; install the package (pip install -e .)", pytrace=False)
    return path


def port_open(address: str, port: int = API_PORT) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
        return True
    return False


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str, logs: Callable[[], str]) -> Any:
    """Poll ``predicate`` until truthy; fail with ``what`` and the agent logs."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})\n{logs()}", pytrace=False)


@dataclasses.dataclass
class Agent:
    """One ``kubeplaned`` on a machine node; ``root`` is the node's directory on the host."""

    name: str
    address: str
    netns: str
    root: Path
    processes: Processes
    env: dict[str, str]
    started: Started | None = None

    @property
    def paths(self) -> NodePaths:
        return NodePaths(self.root)

    def config_bytes(self) -> bytes | None:
        """The applied config file on disk (None when there is none)."""
        path = self.paths.config
        return path.read_bytes() if path.exists() else None

    def staged_bytes(self) -> bytes | None:
        path = self.paths.staged_config
        return path.read_bytes() if path.exists() else None

    def start(self) -> None:
        """Start (or restart) the agent and wait until its API port accepts connections."""
        agent = [
            venv_binary("kubeplaned"),
            *("--listen", f"{self.address}:{API_PORT}"),
            *("--log-level", "debug", "--no-services"),
        ]
        self.started = self.processes.start(
            machines.argv(node_dir=self.root, hostname=self.name, command=agent),
            name=f"kubeplaned-{self.name}",
            netns=self.netns,
            env=self.env,
        )
        started = self.started

        def listening() -> bool:
            if started.process.poll() is not None:
                pytest.fail(
                    f"kubeplaned exited with {started.process.returncode}\n{self.logs()}", pytrace=False
                )
            return port_open(self.address)

        wait_for(listening, timeout=BOOT_TIMEOUT, what=f"kubeplaned on {self.address}", logs=self.logs)

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to the agent's process group and wait until the agent is gone."""
        assert self.started is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.started.process.pid, signum)
        self.started.process.wait(timeout=15)
        self.processes.forget(self.started)  # reaps whatever is left of the group
        wait_for(
            lambda: not port_open(self.address),
            timeout=10,
            what=f"port {self.address}:{API_PORT} to close",
            logs=self.logs,
        )

    def logs(self) -> str:
        return self.started.tail(60) if self.started is not None else "(agent not started)"


@dataclasses.dataclass(frozen=True)
class Generated:
    """Output of ``kubeplane gen config``: machine configs and the admin client config."""

    directory: Path
    controlplane: Path
    worker: Path
    admin_config: Path

    def os_ca(self) -> tuple[bytes, bytes]:
        """The OS CA (``machine.ca``) certificate and key PEMs of the control plane config."""
        ca = yaml.safe_load(self.controlplane.read_text())["machine"]["ca"]
        return base64.b64decode(ca["crt"]), base64.b64decode(ca["key"])


class Cluster:
    """Agents of one test plus a ``kubeplane`` runner bound to the test's client configs."""

    def __init__(self, *, tmp_path: Path, processes: Processes) -> None:
        self.tmp_path = tmp_path
        self.processes = processes
        self.agents: list[Agent] = []
        self.agent_env = dict(os.environ)
        self.lan = machines.Lan(tmp_path / "lan")
        processes.defer(self.lan.destroy)
        self.gen = self._generate()
        self.admin = self.gen.admin_config

    def _generate(self) -> Generated:
        out = self.tmp_path / "gen"
        self.kp("gen", "config", "test-cluster", "https://127.0.0.1:6443", "-o", str(out), config=None)
        return Generated(
            directory=out,
            controlplane=out / "controlplane.yaml",
            worker=out / "worker.yaml",
            admin_config=out / "kubeplaneconfig",
        )

    # -- CLI -------------------------------------------------------------------------------

    def kp(
        self,
        *args: str,
        config: Path | str | None = "admin",
        check: bool = True,
        env: dict[str, str] | None = None,
        timeout: float = CLI_TIMEOUT,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubeplane [--kubeplaneconfig CONFIG] ARGS``; with ``check``, fail on exit != 0."""
        argv = [str(venv_binary("kubeplane"))]
        if config == "admin":
            argv += ["--kubeplaneconfig", str(self.gen.admin_config)]
        elif config is not None:
            argv += ["--kubeplaneconfig", str(config)]
        argv += list(args)
        # No client config from the environment or $HOME may leak into a test.
        clean = {k: v for k, v in os.environ.items() if k != "KUBEPLANECONFIG"}
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env={**clean, "HOME": str(self.tmp_path), **(env or {})},
            check=False,
        )
        if check and result.returncode != 0:
            pytest.fail(
                f"`kubeplane {' '.join(args)}` exited {result.returncode}\n"
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\n{self.logs()}",
                pytrace=False,
            )
        return result

    def kp_argv(self, *args: str, config: Path | None = None) -> list[str]:
        """The argv of a ``kubeplane`` command for :meth:`Processes.start` (long-running ones)."""
        return [
            str(venv_binary("kubeplane")),
            "--kubeplaneconfig",
            str(config or self.gen.admin_config),
            *args,
        ]

    # -- agents ----------------------------------------------------------------------------

    def start_agent(self) -> Agent:
        """A fresh agent in maintenance mode (no config yet)."""
        host = self.lan.add()
        agent = Agent(
            name=host.name,
            address=host.address,
            netns=host.netns,
            root=self.tmp_path / f"node-{host.name}",
            processes=self.processes,
            env=self.agent_env,
        )
        agent.start()
        self.agents.append(agent)
        return agent

    def wait_booted(self, agent: Agent, *, config: Path | str = "admin") -> dict[str, Any]:
        """Wait until ``agent`` answers ``version`` over mutual TLS out of maintenance mode."""

        def booted() -> dict[str, Any] | None:
            result = self.kp("-e", agent.address, "version", "-o", "json", config=config, check=False)
            if result.returncode != 0:
                return None
            document: dict[str, Any] = yaml.safe_load(result.stdout)
            servers = document.get("servers") or [{}]
            return document if servers[0].get("maintenance") is False else None

        result: dict[str, Any] = wait_for(
            booted, timeout=BOOT_TIMEOUT, what=f"{agent.address} to boot", logs=self.logs
        )
        return result

    def boot_agent(self, config: Path | None = None) -> Agent:
        """A fresh agent configured with ``config``, by default the generated control plane config
        (insecure first apply)."""
        agent = self.start_agent()
        self.kp(
            "-n", agent.address, "apply-config", "--insecure", "-f", str(config or self.gen.controlplane),
            config=None,
        )  # fmt: skip
        self.wait_booted(agent)
        return agent

    def restart(self, agent: Agent) -> None:
        agent.start()

    def logs(self) -> str:
        return "\n".join(agent.logs() for agent in self.agents)

    # -- client configs --------------------------------------------------------------------

    def client_config(self, *, name: str, roles: str, ca: tuple[Path, Path] | None = None) -> Path:
        """A client config whose certificate carries ``roles``, made with ``kubeplane gen`` and
        ``kubeplane config add`` as a user would; signed by the OS CA unless ``ca`` is given."""
        directory = self.tmp_path / f"client-{name}"
        directory.mkdir()
        if ca is None:
            crt, key = self.gen.os_ca()
            ca = (directory / "os.crt", directory / "os.key")
            ca[0].write_bytes(crt)
            ca[1].write_bytes(key)
        trusted = directory / "trusted-os.crt"
        trusted.write_bytes(self.gen.os_ca()[0])
        key_path = directory / f"{name}.key"
        self.kp("gen", "key", "--name", str(directory / name), config=None)
        self.kp("gen", "csr", "--key", str(key_path), "--ip", "127.0.0.1", "--roles", roles, config=None)
        ca_base = str(ca[0].with_suffix(""))
        self.kp(
            "gen", "crt", "--ca", ca_base, "--csr", str(directory / f"{name}.csr"),
            "--name", str(directory / name), config=None,
        )  # fmt: skip
        config = directory / "kubeplaneconfig"
        self.kp(
            "config", "add", name, "--ca", str(trusted), "--crt", str(directory / f"{name}.crt"),
            "--key", str(key_path), config=config,
        )  # fmt: skip
        return config


def rows(table: str) -> list[list[str]]:
    """The cells of a ``kubeplane get`` table, header first (columns are space-padded)."""
    return [line.split() for line in table.splitlines() if line.strip()]


def documents(text: str) -> list[dict[str, Any]]:
    """Every YAML (or JSON Lines) document of a command's output."""
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def json_lines(text: str) -> list[dict[str, Any]]:
    return [yaml.safe_load(line) for line in text.splitlines() if line.strip()]


def by_node(found: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["node"]: doc for doc in found}
