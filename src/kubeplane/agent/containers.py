"""The node's Kubernetes containers as containerd's CRI plugin sees them, and their log files.

- :func:`list_containers`: every container of containerd's ``k8s.io`` namespace with the pod it
  belongs to, read from the labels the CRI plugin sets (``io.kubernetes.pod.namespace``,
  ``io.kubernetes.pod.name``, ``io.kubernetes.container.name``) and the task state.
- :func:`log_file`: where kubelet v1.20 keeps a container's log —
  ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log``, a fixed path shared by
  every kubelet on the machine (pod names of static pods carry the node name, so nodes do not
  collide); the newest restart wins.
- :func:`cri_message`: a CRI log line (``<time> <stream> <P|F> <message>``) without its prefix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kubeplane.agent.services import ctr

POD_LOGS = Path("/var/log/pods")
_POD_NAMESPACE = "io.kubernetes.pod.namespace"
_POD_NAME = "io.kubernetes.pod.name"
_CONTAINER_NAME = "io.kubernetes.container.name"


class ContainerNotFound(Exception):
    """No log of that container on this node."""


async def list_containers(socket: Path) -> list[dict[str, Any]]:
    """``{"namespace", "pod", "name", "id", "image", "state", "pid"}`` per CRI container."""
    tasks: dict[str, tuple[str, int]] = {}
    for line in (await ctr(socket, "tasks", "ls")).splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3:
            tasks[fields[0]] = (fields[2], int(fields[1]) if fields[1].isdigit() else 0)
    found = []
    for container_id in (await ctr(socket, "containers", "ls", "-q")).split():
        info = json.loads(await ctr(socket, "containers", "info", container_id))
        labels = info.get("Labels") or {}
        state, pid = tasks.get(container_id, ("STOPPED", 0))
        found.append(
            {
                "namespace": labels.get(_POD_NAMESPACE, ""),
                "pod": labels.get(_POD_NAME, ""),
                # The sandbox (pause) container has no container name label.
                "name": labels.get(_CONTAINER_NAME, "") or "(sandbox)",
                "id": container_id,
                "image": info.get("Image", ""),
                "state": state,
                "pid": pid,
            }
        )
    return sorted(found, key=lambda c: (c["namespace"], c["pod"], c["name"]))


_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_CHARS = "lower-case letters, digits and '-'"
#: Kubernetes name rules of each part (namespace and container: DNS-1123 label; pod: subdomain):
#: pattern, length limit and how to say it. They leave no '/', '..', '_' or glob character in a
#: part, so a reference cannot leave the pod log directory nor match another pod's logs.
_NAME_RULES = (
    ("namespace", re.compile(_DNS_LABEL), 63, _LABEL_CHARS),
    ("pod", re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"), 253, f"{_LABEL_CHARS}, and '.' between them"),
    ("container", re.compile(_DNS_LABEL), 63, _LABEL_CHARS),
)


def parse_id(container: str) -> tuple[str, str, str]:
    """``NAMESPACE/POD:CONTAINER`` → its three parts; ValueError naming the expected form.

    Each part must be a valid Kubernetes name (see :data:`_NAME_RULES`), so a reference can only
    name a log under the pod log directory.
    """
    namespace, slash, rest = container.partition("/")
    pod, colon, name = rest.partition(":")
    if not (slash and colon and namespace and pod and name):
        raise ValueError(
            f"container {container!r} must look like NAMESPACE/POD:CONTAINER, e.g. kube-system/x:y"
        )
    for (part, rule, limit, chars), value in zip(_NAME_RULES, (namespace, pod, name), strict=True):
        if len(value) > limit or not rule.fullmatch(value):
            raise ValueError(
                f"container {container!r}: {part} {value!r} is not a Kubernetes name "
                f"({chars}; at most {limit} characters)"
            )
    return namespace, pod, name


def log_file(container: str, *, pod_logs: Path = POD_LOGS, written: bool = False) -> Path:
    """The newest log file of ``NAMESPACE/POD:CONTAINER`` written by the kubelet; with ``written``
    the newest one with something in it (a container that keeps crashing has a new, still empty
    log each time it is created again, while its predecessor's says why it exited)."""
    namespace, pod, name = parse_id(container)
    candidates = [
        log
        for directory in pod_logs.glob(f"{namespace}_{pod}_*")
        for log in (directory / name).glob("*.log")
        if log.stem.isdigit()
    ]
    if not candidates:
        raise ContainerNotFound(
            f"no log for container {container} under {pod_logs} (see `kubeplane containers -k`)"
        )
    if written and any(log.stat().st_size for log in candidates):
        candidates = [log for log in candidates if log.stat().st_size]
    return max(candidates, key=lambda log: (log.stat().st_mtime, int(log.stem)))


def cri_message(line: str) -> str:
    """The message of a CRI log line; lines in another format pass through."""
    parts = line.split(" ", 3)
    if len(parts) == 4 and parts[1] in ("stdout", "stderr") and parts[2] in ("P", "F"):
        return parts[3]
    return line
