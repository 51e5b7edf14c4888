"""The checkpointer program: flags and environment, one round of observe → plan → act, the loop.

Every flag has an environment variable, so a DaemonSet can set them either way; the downward API
gives ``NODE_NAME``, ``POD_NAME`` and ``POD_NAMESPACE`` (the latter two identify the checkpointer's
own pod, whose checkpoint always stays active). A round never raises for an unreachable source:
it logs and leaves the checkpoints as they are, and the next round tries again.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from kubeplane.checkpointer import (
    CheckpointerError,
    ConfigError,
    SourceRejected,
    SourceUnavailable,
    logic,
    sources,
)
from kubeplane.checkpointer.store import CheckpointStore

__all__ = ["DEFAULT_GRACE_PERIOD", "DEFAULT_KUBELET_URL", "Checkpointer", "main", "parse_args"]

log = logging.getLogger("kubeplane.checkpointer")

DEFAULT_GRACE_PERIOD = 300.0
DEFAULT_KUBELET_URL = "http://127.0.0.1:10255/pods"
DEFAULT_MANIFEST_DIR = "/etc/kubernetes/manifests"
DEFAULT_STATE_DIR = "/var/lib/kubeplane/checkpointer"
DEFAULT_INTERVAL = 3.0


class Checkpointer:
    """One node's checkpointer: sources, store and planner wired together."""

    def __init__(
        self,
        *,
        node: str,
        api: sources.ApiServer,
        store: CheckpointStore,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        kubelet_url: str = DEFAULT_KUBELET_URL,
        self_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.api = api
        self.store = store
        self.kubelet_url = kubelet_url
        self.self_id = self_id
        self.clock = clock
        self.planner = logic.Planner(grace_period=grace_period)
        self._waiting: set[str] = set()

    def round(self) -> logic.Plan:
        """Observe the API server, the kubelet and the disk once, and act on the plan."""
        api_pods: tuple[dict[str, object], ...] | None
        try:
            api_pods = self.api.pods_on_node(self.node)
        except (SourceUnavailable, SourceRejected, ConfigError) as exc:
            # Silence or refusal is not an answer: checkpoints stay until the API server speaks.
            log.warning("API server: %s; keeping checkpoints", exc)
            api_pods = None
        try:
            kubelet_pods: tuple[dict[str, object], ...] | None = sources.fetch_kubelet_pods(self.kubelet_url)
        except (SourceUnavailable, SourceRejected) as exc:
            log.warning("kubelet: %s; not changing which checkpoints are active", exc)
            kubelet_pods = None
        plan = self.planner.plan(
            logic.Observation(
                node=self.node,
                api_pods=api_pods,
                kubelet_pods=kubelet_pods,
                stored=self.store.stored(),
                active=self.store.active(),
                now=self.clock(),
                self_id=self.self_id,
                owner_gone=self._owner_gone(api_pods),
            )
        )
        self._act(plan)
        return plan

    def _owner_gone(self, api_pods: tuple[dict[str, object], ...] | None) -> bool:
        """Once the API server lists no parent of this checkpointer: whether it also has none of
        the DaemonSets that owned it (deleted, so no new parent comes; see :mod:`.logic`)."""
        names = self.planner.self_owner_names
        if api_pods is None or self.self_id is None or not names:
            return False
        if any(logic.pod_id(pod) == self.self_id for pod in api_pods):
            return False
        namespace = self.self_id.split("/", 1)[0]
        try:
            return not any(self.api.daemonset_exists(namespace, name) for name in names)
        except (SourceUnavailable, SourceRejected, ConfigError) as exc:
            log.warning("API server: %s; waiting for the grace period", exc)
            return False

    def _act(self, plan: logic.Plan) -> None:
        for parent in plan.store:
            parent_id = logic.pod_id(parent)
            try:
                namespace = parent_id.split("/", 1)[0]
                objects = {
                    ref: self.api.get(ref.kind, namespace, ref.name) for ref in logic.references(parent)
                }
                checkpoint = logic.sanitise(
                    parent, objects=objects, files_dir=self.store.host_files_dir(parent_id)
                )
                if self.store.write(checkpoint):
                    log.info("checkpoint of %s written", parent_id)
            except (SourceUnavailable, SourceRejected, CheckpointerError, OSError) as exc:
                log.error("cannot checkpoint %s: %s", parent_id, exc)
        for parent_id in plan.remove:
            if plan.disabled:
                log.info("removing checkpoint of %s: the checkpointer was removed from this node", parent_id)
            else:
                log.info(
                    "removing checkpoint of %s: parent gone from the API server for the grace period",
                    parent_id,
                )
            self.store.remove(parent_id)
        for parent_id, left in plan.waiting.items():
            if parent_id not in self._waiting:
                log.info(
                    "parent %s is gone from the API server; removing its checkpoint in %.0fs", parent_id, left
                )
        self._waiting = set(plan.waiting)
        stored = self.store.stored()
        for parent_id in plan.activate:
            if parent_id in stored:
                log.info("activating checkpoint of %s: parent not running on this node", parent_id)
                self.store.activate(parent_id)
        for parent_id in plan.deactivate:
            log.info("deactivating checkpoint of %s: parent running on this node", parent_id)
            self.store.deactivate(parent_id)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigError(f"environment variable {name}={raw!r} is not a number of seconds") from exc


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Flags, each defaulting to its environment variable, then to the built-in default."""
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python3 -m kubeplane.checkpointer",
        description="Keep static pod checkpoints of annotated pods on this node.",
    )
    parser.add_argument("--node", default=env("NODE_NAME"), help="this node's name (env NODE_NAME)")
    parser.add_argument(
        "--kubeconfig", default=env("KUBECONFIG"), help="kubeconfig (default: in-cluster service account)"
    )
    parser.add_argument(
        "--server", default=env("CHECKPOINTER_SERVER"), help="API server URL for in-cluster credentials"
    )
    parser.add_argument("--kubelet-url", default=env("CHECKPOINTER_KUBELET_URL", DEFAULT_KUBELET_URL))
    parser.add_argument("--manifest-dir", default=env("CHECKPOINTER_MANIFEST_DIR", DEFAULT_MANIFEST_DIR))
    parser.add_argument("--state-dir", default=env("CHECKPOINTER_STATE_DIR", DEFAULT_STATE_DIR))
    parser.add_argument(
        "--host-state-dir",
        default=env("CHECKPOINTER_HOST_STATE_DIR"),
        help="the state dir as the kubelet sees it (default: --state-dir)",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=_env_float("CHECKPOINTER_GRACE_PERIOD", DEFAULT_GRACE_PERIOD),
        help="seconds a parent must be gone before its checkpoint is removed (env CHECKPOINTER_GRACE_PERIOD)",
    )
    parser.add_argument(
        "--interval", type=float, default=_env_float("CHECKPOINTER_INTERVAL", DEFAULT_INTERVAL)
    )
    parser.add_argument("--once", action="store_true", help="run one round and exit")
    args = parser.parse_args(argv)
    if not args.node:
        parser.error("--node (or NODE_NAME) is required")
    pod_name, pod_namespace = env("POD_NAME"), env("POD_NAMESPACE")
    args.self_id = f"{pod_namespace}/{pod_name}" if pod_name and pod_namespace else None
    return args


def build(args: argparse.Namespace) -> Checkpointer:
    """A checkpointer from parsed flags."""
    if args.kubeconfig:
        api = sources.ApiServer.from_kubeconfig(Path(args.kubeconfig))
    else:
        api = sources.ApiServer.in_cluster(server=args.server)
    store = CheckpointStore(
        manifest_dir=Path(args.manifest_dir),
        state_dir=Path(args.state_dir),
        host_state_dir=Path(args.host_state_dir) if args.host_state_dir else None,
    )
    return Checkpointer(
        node=args.node,
        api=api,
        store=store,
        grace_period=args.grace_period,
        kubelet_url=args.kubelet_url,
        self_id=args.self_id,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT (or one round with ``--once``); 1 on a configuration error."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    try:
        checkpointer = build(args)
    except CheckpointerError as exc:
        log.error("%s", exc)
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "checkpointer for node %s: manifests %s, state %s, grace period %.0fs",
        args.node,
        args.manifest_dir,
        args.state_dir,
        args.grace_period,
    )
    while True:
        checkpointer.round()
        if args.once or stop.wait(args.interval):
            return 0
