"""The init of a kubeadm node: what systemd does on a machine kubeadm manages, for its units.

A node of ``kubeplane cluster create --kubeadm`` is a machine like any local node (its own
network, mount and UTS namespaces over its own directories, :mod:`kubeplane.provision.machine`),
but no ``kubeplaned`` runs on it: kubeadm and an operator with SSH run it, as on a Debian server
with the kubeadm packages. This process is that server's init, started in the node's namespaces
(``python -m kubeplane.provision.kubeadm_node``), and supervises three units with
:class:`kubeplane.services.supervisor.Supervisor`:

- ``containerd``: ``containerd --config /etc/containerd/config.toml``, restarted always;
- ``kubelet``: the kubeadm packages' unit with its drop-in ``10-kubeadm.conf``: ``kubelet
  $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS``, the
  last two read at every start from ``/var/lib/kubelet/kubeadm-flags.env`` (written by kubeadm)
  and ``/etc/default/kubelet`` (the node's own flags), restarted always every 10 s: until
  ``kubeadm init`` or ``join`` writes ``/var/lib/kubelet/config.yaml`` it exits and comes back,
  exactly as on a fresh kubeadm machine. Its ``--cgroup-root`` and containerd's shim cgroup are
  made first (every cgroup v1 hierarchy), as a unit's ``ExecStartPre`` would;
- ``ssh``: Debian's ``sshd -D -e`` with the node's ``/etc/ssh/sshd_config``.

``systemctl`` on the node is ``kubeplane-systemctl`` (installed as ``/usr/local/sbin/systemctl``,
ahead of any other on ``PATH``): it sends each request to this process over the unix socket
:data:`CONTROL_SOCKET`, so kubeadm's ``systemctl restart kubelet`` and an operator's ``systemctl
status kubelet`` act on these units. Verbs: ``start``, ``stop``, ``restart``, ``status``,
``is-active``, ``is-enabled``, ``enable``, ``disable``, ``daemon-reload``. Logs are
``/var/log/kubeplane/<unit>.log``.

SIGTERM stops the units as a shutdown does (kubelet, then ssh and containerd), and the process
exits; the containers that outlive containerd are the provisioner's to kill, by the node's
cgroups and network namespace (:mod:`kubeplane.provision.leftovers`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubeplane.agent import owned
from kubeplane.services import cni, podnet, process
from kubeplane.services import supervisor as sup

#: Where ``systemctl`` reaches the init (inside the node: its own ``/var/lib/kubeplane``).
CONTROL_SOCKET = Path("/var/lib/kubeplane/init.sock")
CONTAINERD_CONFIG = Path("/etc/containerd/config.toml")
SSHD_CONFIG = Path("/etc/ssh/sshd_config")
KUBEADM_FLAGS = Path("/var/lib/kubelet/kubeadm-flags.env")
KUBELET_DEFAULTS = Path("/etc/default/kubelet")
#: The node's pod network (``{"podCIDR": ..., "clusterPodSubnets": [...]}``), written by the
#: provisioner: forwarding on, pod traffic leaving the pod subnets masqueraded.
POD_NETWORK = Path("/var/lib/kubeplane/pod-network.json")
#: The kubeadm drop-in's fixed arguments (``10-kubeadm.conf``).
KUBELET_KUBECONFIG_ARGS = (
    "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
    "--kubeconfig=/etc/kubernetes/kubelet.conf",
)
KUBELET_CONFIG_ARGS = ("--config=/var/lib/kubelet/config.yaml",)
#: ``RestartSec=10`` of the kubelet unit, ``StartLimitInterval=0``: forever, every 10 s.
KUBELET_RESTART = sup.Backoff(initial=10.0, maximum=10.0, factor=1.0, reset_after=10.0)
UNITS = ("containerd", "kubelet", "ssh")
DESCRIPTIONS = {
    "containerd": "containerd container runtime",
    "kubelet": "kubelet: The Kubernetes Node Agent",
    "ssh": "OpenBSD Secure Shell server",
}


def read_environment_file(path: Path) -> dict[str, str]:
    """A systemd ``EnvironmentFile``: ``KEY=VALUE`` lines, ``#`` comments, values optionally in
    double or single quotes; a missing file is empty (the ``-`` prefix the units use)."""
    values: dict[str, str] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return values
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def kubelet_argv(
    binary: str, *, flags_file: Path = KUBEADM_FLAGS, defaults: Path = KUBELET_DEFAULTS
) -> list[str]:
    """The kubelet's command line as the kubeadm unit builds it (unbraced ``$VAR`` is split on
    whitespace, as systemd does)."""
    kubeadm = read_environment_file(flags_file).get("KUBELET_KUBEADM_ARGS", "")
    extra = read_environment_file(defaults).get("KUBELET_EXTRA_ARGS", "")
    return [
        binary,
        *KUBELET_KUBECONFIG_ARGS,
        *KUBELET_CONFIG_ARGS,
        *shlex.split(kubeadm),
        *shlex.split(extra),
    ]


class Init:
    """The units of one kubeadm node and the ``systemctl`` requests that drive them."""

    def __init__(
        self, *, root: Path, kubelet: str, cgroups: Sequence[str], socket: Path = CONTROL_SOCKET
    ) -> None:
        self.root = root
        self.kubelet = kubelet
        self.cgroups = tuple(cgroups)
        self.socket = socket
        self.supervisor = sup.Supervisor(root=root)
        self.enabled = set(UNITS)
        #: When each unit's current process started (systemd's ActiveEnterTimestamp).
        self.started_at: dict[str, float] = {}
        self._pids: dict[str, int | None] = {}

    def specs(self) -> list[sup.ServiceSpec]:
        async def kubelet_command() -> process.Command:
            return process.Command(argv=kubelet_argv(self.kubelet))

        async def make_cgroups() -> None:
            for name in self.cgroups:
                await asyncio.to_thread(owned.make_cgroup, name)

        return [
            sup.ServiceSpec(
                id="containerd",
                command=process.Command(argv=["containerd", "--config", str(CONTAINERD_CONFIG)]),
                pre_start=make_cgroups,
            ),
            sup.ServiceSpec(
                id="kubelet",
                command=kubelet_command,
                depends_on=("containerd",),
                pre_start=make_cgroups,
                backoff=KUBELET_RESTART,
            ),
            sup.ServiceSpec(
                id="ssh", command=process.Command(argv=["/usr/sbin/sshd", "-D", "-e", "-f", str(SSHD_CONFIG)])
            ),
        ]

    def pod_network(self) -> None:
        """Forwarding and the masquerade chain of the node's pod network (nothing without settings)."""
        try:
            settings = json.loads(POD_NETWORK.read_text())
        except FileNotFoundError:
            return
        podnet.enable_forwarding()
        podnet.apply_masquerade(
            cni.masquerade_rules(
                pod_cidr=str(settings["podCIDR"]),
                cluster_pod_subnets=[str(subnet) for subnet in settings.get("clusterPodSubnets", [])],
            )
        )

    def _observe(self, snapshot: sup.ServiceSnapshot) -> None:
        if snapshot.state == sup.ServiceState.RUNNING and snapshot.pid != self._pids.get(snapshot.id):
            self.started_at[snapshot.id] = time.time()
        self._pids[snapshot.id] = snapshot.pid

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.to_thread(self.pod_network)
        self.supervisor.add_observer(self._observe)
        for spec in self.specs():
            self.supervisor.register(spec)
        await self.supervisor.start_all()
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = await asyncio.start_unix_server(self._serve, path=str(self.socket))
        os.chmod(self.socket, 0o600)
        try:
            await stop.wait()
        finally:
            server.close()
            self.socket.unlink(missing_ok=True)
            await self.supervisor.shutdown()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = json.loads(await reader.readline())
            reply = await self.handle(
                str(request.get("verb", "")),
                [str(u) for u in request.get("units", [])],
                [str(p) for p in request.get("properties", [])],
            )
        except (ValueError, AttributeError) as exc:
            reply = {"code": 1, "out": "", "err": f"bad request: {exc}\n"}
        writer.write((json.dumps(reply) + "\n").encode())
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    async def handle(self, verb: str, units: list[str], properties: Sequence[str] = ()) -> dict[str, Any]:
        """One ``systemctl`` request: ``{"code", "out", "err"}`` as systemctl would exit and print."""
        if verb == "daemon-reload":
            return {"code": 0, "out": "", "err": ""}
        if verb in ("list-units", "list-unit-files"):
            out = "".join(f"{unit}.service {self._active(unit)}\n" for unit in UNITS)
            return {"code": 0, "out": out, "err": ""}
        if not units:
            return {"code": 1, "out": "", "err": f"Too few arguments for {verb!r}.\n"}
        names = [unit.removesuffix(".service") for unit in units]
        unknown = [name for name in names if name not in UNITS]
        if verb == "status":
            out = "".join(self._status(name) for name in names if name in UNITS)
            out += "".join(f"Unit {name}.service could not be found.\n" for name in unknown)
            code = 4 if unknown else (0 if all(self._active(n) == "active" for n in names) else 3)
            return {"code": code, "out": out, "err": ""}
        if verb == "is-active":
            states = [self._active(name) if name in UNITS else "inactive" for name in names]
            return {
                "code": 0 if all(s == "active" for s in states) else 3,
                "out": "\n".join(states) + "\n",
                "err": "",
            }
        if unknown:
            return {"code": 5, "out": "", "err": f"Failed to {verb} {unknown[0]}.service: Unit not found.\n"}
        if verb == "show":
            out = "".join(self._show(name, list(properties)) for name in names)
            return {"code": 0, "out": out, "err": ""}
        if verb == "is-enabled":
            states = ["enabled" if name in self.enabled else "disabled" for name in names]
            return {
                "code": 0 if all(s == "enabled" for s in states) else 1,
                "out": "\n".join(states) + "\n",
                "err": "",
            }
        if verb in ("enable", "disable"):
            (self.enabled.update if verb == "enable" else self.enabled.difference_update)(names)
            return {"code": 0, "out": "", "err": ""}
        actions = {"start": self.supervisor.start, "stop": self.supervisor.stop, "restart": self._restart}
        if verb not in actions:
            return {"code": 1, "out": "", "err": f"Unknown command verb {verb}.\n"}
        for name in names:
            await actions[verb](name)
        return {"code": 0, "out": "", "err": ""}

    def _show(self, name: str, properties: list[str]) -> str:
        """``systemctl show UNIT -p NAME [--value]``'s properties (MainPID, ActiveState,
        ActiveEnterTimestamp), ``NAME=value`` lines; the caller strips names for ``--value``."""
        snapshot = self.supervisor.snapshot(name)
        started = time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_at.get(name, 0.0)))
        values = {
            "Id": f"{name}.service",
            "MainPID": str(snapshot.pid or 0),
            "ActiveState": self._active(name),
            "ActiveEnterTimestamp": started,
            "UnitFileState": "enabled" if name in self.enabled else "disabled",
        }
        wanted = properties or list(values)
        return "".join(f"{key}={values[key]}\n" for key in wanted if key in values)

    async def _restart(self, name: str) -> None:
        await self.supervisor.stop(name)
        await self.supervisor.start(name)

    def _active(self, name: str) -> str:
        snapshot = self.supervisor.snapshot(name)
        if snapshot.state == sup.ServiceState.RUNNING:
            return "active"
        if snapshot.state in (sup.ServiceState.WAITING, sup.ServiceState.PREPARING):
            return "activating"
        if snapshot.state == sup.ServiceState.FAILED:
            return "failed"
        return "inactive"

    def _status(self, name: str) -> str:
        snapshot = self.supervisor.snapshot(name)
        active = self._active(name)
        since = time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_at.get(name, time.time())))
        enabled = "enabled" if name in self.enabled else "disabled"
        last = snapshot.last_event
        lines = [
            f"* {name}.service - {DESCRIPTIONS[name]}",
            f"     Loaded: loaded (kubeplane init; {enabled})",
            f"     Active: {active} ({snapshot.state.value.lower()}) since {since}",
        ]
        if snapshot.pid:
            lines.append(f"   Main PID: {snapshot.pid}")
        if last is not None:
            lines.append(f"     Status: {last.message}")
        lines.append(f"       Logs: {self.supervisor.log_path(name)}")
        return "\n".join(lines) + "\n"


def systemctl_main(argv: Sequence[str] | None = None) -> int:
    """``systemctl [-q] [-p NAME]... [--value] VERB [UNIT...]`` on a kubeadm node (see the module
    docstring)."""
    parser = argparse.ArgumentParser(prog="systemctl", add_help=True)
    parser.add_argument("-q", "--quiet", action="store_true")
    parser.add_argument("-p", "--property", action="append", default=[], dest="properties")
    parser.add_argument("--value", action="store_true")
    parser.add_argument("--no-pager", action="store_true")
    parser.add_argument("--now", action="store_true")
    parser.add_argument("words", nargs="*")
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not options.words:
        print(
            "systemctl: this node's init understands start, stop, restart, status, show, is-active, "
            "is-enabled, enable, disable, daemon-reload",
            file=sys.stderr,
        )
        return 1
    properties = [name for value in options.properties for name in value.split(",") if name]
    request = {"verb": options.words[0], "units": options.words[1:], "properties": properties}
    socket_path = Path(os.environ.get("KUBEPLANE_INIT_SOCKET", str(CONTROL_SOCKET)))
    reply = asyncio.run(_ask(socket_path, request))
    out = str(reply.get("out", ""))
    if options.value:
        out = "".join(line.partition("=")[2] + "\n" for line in out.splitlines())
    if not options.quiet:
        sys.stdout.write(out)
    sys.stderr.write(str(reply.get("err", "")))
    return int(reply.get("code", 1))


async def _ask(socket_path: Path, request: dict[str, Any]) -> dict[str, Any]:
    try:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
    except OSError as exc:
        return {
            "code": 1,
            "out": "",
            "err": f"System has not been booted with kubeplane's init ({socket_path}: {exc})\n",
        }
    writer.write((json.dumps(request) + "\n").encode())
    await writer.drain()
    answer = await reader.readline()
    writer.close()
    try:
        reply = json.loads(answer)
    except ValueError:
        return {"code": 1, "out": "", "err": "the node's init closed the connection without an answer\n"}
    return reply if isinstance(reply, dict) else {"code": 1, "out": "", "err": "bad answer\n"}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kubeplane.provision.kubeadm_node", description=__doc__)
    parser.add_argument("--kubelet", required=True, help="the kubelet binary")
    parser.add_argument("--cgroup", action="append", default=[], help="a cgroup to make first (repeatable)")
    options = parser.parse_args(argv)
    init = Init(root=Path("/"), kubelet=options.kubelet, cgroups=options.cgroup)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await init.run(stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
