"""``kubeplane-crictl``: the part of ``crictl`` that kubeadm and its operators use, over the CRI.

kubeadm drives a CRI runtime through the ``crictl`` command (``crictl -r SOCKET info`` in its
preflight checks, ``pull`` and ``inspecti`` for images, ``pods -q``, ``stopp`` and ``rmp`` in
``kubeadm reset``), and the HA guide restarts static pods with ``crictl pods``, ``crictl stopp``
and ``crictl rmp``. Debian 12 ships no ``crictl`` (cri-tools is not packaged), so kubeadm nodes
made by ``kubeplane cluster create --kubeadm`` get this program as ``/usr/local/sbin/crictl``.

It is a client of the real runtime: every command is one or two CRI calls (API v1alpha2, what
containerd 1.6 and kubelet v1.20 speak) to the socket given with ``-r``/``--runtime-endpoint``
(default: ``runtime-endpoint`` of ``/etc/crictl.yaml``, else containerd's
``unix:///run/containerd/containerd.sock``). Commands: ``version``, ``info``, ``pods``, ``ps``,
``stopp``, ``rmp``, ``stop``, ``rm``, ``images``, ``inspecti``, ``pull``. Output follows
crictl's: tables whose first column is the 13-character ID (so ``crictl pods | grep NAME | cut
-d' ' -f1`` works as in the guide), ``-q`` for full IDs, JSON for ``info`` and ``inspecti``. IDs
may be abbreviated, as the runtime resolves unique prefixes. Exit status 1 on any failure, with
the runtime's message.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

from kubeplane.api.proto.kubeplane.cri.v1alpha2 import cri_pb2

DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"
CONFIG_FILE = Path("/etc/crictl.yaml")
#: Width of the abbreviated IDs in tables, as crictl prints them.
SHORT_ID = 13
_RUNTIME = "/runtime.v1alpha2.RuntimeService/"
_IMAGES = "/runtime.v1alpha2.ImageService/"

R = TypeVar("R", bound=Message)


class CrictlError(Exception):
    """A command that cannot be done; the message is printed as crictl would."""


class RuntimeClient:
    """Synchronous CRI calls to one runtime socket (``unix://PATH`` or a plain path)."""

    def __init__(self, endpoint: str, *, timeout: float) -> None:
        target = endpoint if endpoint.startswith("unix:") else f"unix://{endpoint}"
        self.endpoint = endpoint
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target)

    def close(self) -> None:
        self._channel.close()

    def call(self, method: str, request: Message, reply: type[R], *, deadline: bool = True) -> R:
        """One CRI call; ``deadline=False`` (an image pull) lets it take as long as it takes once
        the runtime answered, as crictl's ``--timeout`` bounds the connection, not a pull."""
        stub: Callable[..., R] = self._channel.unary_unary(
            method, request_serializer=type(request).SerializeToString, response_deserializer=reply.FromString
        )
        if not deadline:
            try:
                grpc.channel_ready_future(self._channel).result(timeout=self.timeout)
            except grpc.FutureTimeoutError as exc:
                raise CrictlError(
                    f"connect to the runtime at {self.endpoint!r}: no answer within {self.timeout:g}s "
                    "(is containerd running?)"
                ) from exc
        try:
            return stub(request, timeout=self.timeout if deadline else None)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = method.rsplit("/", 1)[-1]
            if code == grpc.StatusCode.UNAVAILABLE:
                raise CrictlError(
                    f"connect to the runtime at {self.endpoint!r}: {details} (is containerd running?)"
                ) from exc
            raise CrictlError(f"{name}: {details}") from exc

    def version(self) -> cri_pb2.VersionResponse:
        return self.call(
            _RUNTIME + "Version", cri_pb2.VersionRequest(version="v1alpha2"), cri_pb2.VersionResponse
        )

    def status(self) -> cri_pb2.StatusResponse:
        return self.call(_RUNTIME + "Status", cri_pb2.StatusRequest(verbose=True), cri_pb2.StatusResponse)

    def sandboxes(self) -> list[cri_pb2.PodSandbox]:
        reply = self.call(
            _RUNTIME + "ListPodSandbox", cri_pb2.ListPodSandboxRequest(), cri_pb2.ListPodSandboxResponse
        )
        return list(reply.items)

    def containers(self) -> list[cri_pb2.Container]:
        reply = self.call(
            _RUNTIME + "ListContainers", cri_pb2.ListContainersRequest(), cri_pb2.ListContainersResponse
        )
        return list(reply.containers)

    def stop_sandbox(self, sandbox_id: str) -> None:
        request = cri_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id)
        self.call(_RUNTIME + "StopPodSandbox", request, cri_pb2.StopPodSandboxResponse)

    def remove_sandbox(self, sandbox_id: str) -> None:
        request = cri_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id)
        self.call(_RUNTIME + "RemovePodSandbox", request, cri_pb2.RemovePodSandboxResponse)

    def stop_container(self, container_id: str, *, timeout: int) -> None:
        request = cri_pb2.StopContainerRequest(container_id=container_id, timeout=timeout)
        self.call(_RUNTIME + "StopContainer", request, cri_pb2.StopContainerResponse)

    def remove_container(self, container_id: str) -> None:
        request = cri_pb2.RemoveContainerRequest(container_id=container_id)
        self.call(_RUNTIME + "RemoveContainer", request, cri_pb2.RemoveContainerResponse)

    def images(self) -> list[cri_pb2.Image]:
        reply = self.call(_IMAGES + "ListImages", cri_pb2.ListImagesRequest(), cri_pb2.ListImagesResponse)
        return list(reply.images)

    def image_status(self, image: str) -> cri_pb2.ImageStatusResponse:
        request = cri_pb2.ImageStatusRequest(image=cri_pb2.ImageSpec(image=image), verbose=True)
        return self.call(_IMAGES + "ImageStatus", request, cri_pb2.ImageStatusResponse)

    def pull(self, image: str) -> str:
        request = cri_pb2.PullImageRequest(image=cri_pb2.ImageSpec(image=image))
        return self.call(_IMAGES + "PullImage", request, cri_pb2.PullImageResponse, deadline=False).image_ref


# -- output --


def ago(created_ns: int, *, now: float | None = None) -> str:
    """``created_at`` (nanoseconds since the epoch) as crictl prints it: "3 minutes ago"."""
    seconds = max(0.0, (time.time() if now is None else now) - created_ns / 1e9)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    count = int(seconds)
    return "Less than a second ago" if count < 1 else f"{count} second{'s' if count != 1 else ''} ago"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to the widest cell plus three spaces, as crictl's tabwriter pads them."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["   ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]  # fmt: skip
    return "\n".join(lines) + "\n"


def short(identifier: str) -> str:
    return identifier[:SHORT_ID]


def _image_name(ref: str) -> tuple[str, str]:
    """``repo:tag`` split as crictl's IMAGE and TAG columns (a digest-only ref has tag <none>)."""
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        return ref, "<none>"
    return name, tag


def _labels(pairs: Sequence[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CrictlError(f"--label {pair!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def _matches(pattern: str | None, value: str) -> bool:
    return pattern is None or re.search(pattern, value) is not None


# -- commands --


def cmd_version(client: RuntimeClient, _args: argparse.Namespace) -> str:
    reply = client.version()
    return (
        f"Version:  0.1.0\nRuntimeName:  {reply.runtime_name}\nRuntimeVersion:  {reply.runtime_version}\n"
        f"RuntimeApiVersion:  {reply.runtime_api_version}\n"
    )


def cmd_info(client: RuntimeClient, _args: argparse.Namespace) -> str:
    reply = client.status()
    document: dict[str, Any] = {"status": json_format.MessageToDict(reply.status)}
    for key, value in reply.info.items():
        try:
            document[key] = json.loads(value)
        except ValueError:
            document[key] = value
    return json.dumps(document, indent=2) + "\n"


def _selected_pods(client: RuntimeClient, args: argparse.Namespace) -> list[cri_pb2.PodSandbox]:
    labels = _labels(args.label)
    state = {"ready": cri_pb2.SANDBOX_READY, "notready": cri_pb2.SANDBOX_NOTREADY}.get(
        (args.state or "").lower()
    )
    if args.state and state is None:
        raise CrictlError(f"--state {args.state!r}: expected ready or notready")
    pods = [
        pod
        for pod in client.sandboxes()
        if _matches(args.name, pod.metadata.name)
        and _matches(args.namespace, pod.metadata.namespace)
        and (args.id is None or pod.id.startswith(args.id))
        and (state is None or pod.state == state)
        and all(pod.labels.get(key) == value for key, value in labels.items())
    ]
    return sorted(pods, key=lambda pod: pod.created_at, reverse=True)


def cmd_pods(client: RuntimeClient, args: argparse.Namespace) -> str:
    pods = _selected_pods(client, args)
    if args.output == "json":
        items = [json_format.MessageToDict(pod) for pod in pods]
        return json.dumps({"items": items}, indent=2) + "\n"
    if args.quiet:
        return "".join(f"{pod.id}\n" for pod in pods)
    rows = [
        (
            pod.id if args.no_trunc else short(pod.id),
            ago(pod.created_at),
            "Ready" if pod.state == cri_pb2.SANDBOX_READY else "NotReady",
            pod.metadata.name,
            pod.metadata.namespace,
            str(pod.metadata.attempt),
            pod.runtime_handler or "(default)",
        )
        for pod in pods
    ]
    return table(("POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME"), rows)


_CONTAINER_STATES = {
    cri_pb2.CONTAINER_CREATED: "Created",
    cri_pb2.CONTAINER_RUNNING: "Running",
    cri_pb2.CONTAINER_EXITED: "Exited",
    cri_pb2.CONTAINER_UNKNOWN: "Unknown",
}


def cmd_ps(client: RuntimeClient, args: argparse.Namespace) -> str:
    containers = [
        container
        for container in client.containers()
        if (args.all or container.state == cri_pb2.CONTAINER_RUNNING)
        and _matches(args.name, container.metadata.name)
        and (args.pod is None or container.pod_sandbox_id.startswith(args.pod))
        and (args.id is None or container.id.startswith(args.id))
    ]
    containers.sort(key=lambda container: container.created_at, reverse=True)
    if args.output == "json":
        items = [json_format.MessageToDict(container) for container in containers]
        return json.dumps({"containers": items}, indent=2) + "\n"
    if args.quiet:
        return "".join(f"{container.id}\n" for container in containers)
    rows = [
        (
            container.id if args.no_trunc else short(container.id),
            container.image.image if args.no_trunc else short(container.image.image.removeprefix("sha256:")),
            ago(container.created_at),
            _CONTAINER_STATES.get(container.state, "Unknown"),
            container.metadata.name,
            str(container.metadata.attempt),
            container.pod_sandbox_id if args.no_trunc else short(container.pod_sandbox_id),
        )
        for container in containers
    ]
    return table(("CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID"), rows)


def _each(ids: Sequence[str], action: Callable[[str], None], done: str) -> str:
    out = []
    for identifier in ids:
        action(identifier)
        out.append(f"{done} {identifier}\n")
    return "".join(out)


def cmd_stopp(client: RuntimeClient, args: argparse.Namespace) -> str:
    return _each(args.ids, client.stop_sandbox, "Stopped sandbox")


def cmd_rmp(client: RuntimeClient, args: argparse.Namespace) -> str:
    out = []
    for identifier in args.ids:
        if args.force:
            client.stop_sandbox(identifier)
        client.remove_sandbox(identifier)
        out.append(f"Removed sandbox {identifier}\n")
    return "".join(out)


def cmd_stop(client: RuntimeClient, args: argparse.Namespace) -> str:
    out = []
    for identifier in args.ids:
        client.stop_container(identifier, timeout=args.timeout)
        out.append(f"{identifier}\n")
    return "".join(out)


def cmd_rm(client: RuntimeClient, args: argparse.Namespace) -> str:
    out = []
    for identifier in args.ids:
        client.remove_container(identifier)
        out.append(f"{identifier}\n")
    return "".join(out)


def cmd_images(client: RuntimeClient, args: argparse.Namespace) -> str:
    images = client.images()
    if args.quiet:
        return "".join(f"{image.id}\n" for image in images)
    rows = []
    for image in images:
        refs = list(image.repo_tags) or [f"{digest.split('@')[0]}:<none>" for digest in image.repo_digests]
        for ref in refs:
            name, tag = _image_name(ref)
            if args.image is not None and args.image not in (name, ref):
                continue
            image_id = image.id.removeprefix("sha256:")
            rows.append((name, tag, image_id if args.no_trunc else image_id[:SHORT_ID], _size(image.size)))
    return table(("IMAGE", "TAG", "IMAGE ID", "SIZE"), sorted(rows))


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.3g}{unit}"
        value /= 1000
    return f"{size}B"


def cmd_inspecti(client: RuntimeClient, args: argparse.Namespace) -> str:
    documents = []
    for image in args.images:
        reply = client.image_status(image)
        if not reply.HasField("image") or not reply.image.id:
            raise CrictlError(f"no such image {image!r} present")
        documents.append({"status": json_format.MessageToDict(reply.image)})
    return "".join(json.dumps(document, indent=2) + "\n" for document in documents)


def cmd_pull(client: RuntimeClient, args: argparse.Namespace) -> str:
    return f"Image is up to date for {client.pull(args.image)}\n"


COMMANDS: dict[str, Callable[[RuntimeClient, argparse.Namespace], str]] = {
    "version": cmd_version,
    "info": cmd_info,
    "pods": cmd_pods,
    "ps": cmd_ps,
    "stopp": cmd_stopp,
    "rmp": cmd_rmp,
    "stop": cmd_stop,
    "rm": cmd_rm,
    "images": cmd_images,
    "img": cmd_images,
    "inspecti": cmd_inspecti,
    "pull": cmd_pull,
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="crictl",
        description="A client of a CRI container runtime (kubeplane's implementation of the crictl "
        "commands kubeadm uses).",
    )
    top.add_argument(
        "-r", "--runtime-endpoint", help=f"runtime socket (default: {CONFIG_FILE} or {DEFAULT_ENDPOINT})"
    )
    top.add_argument("-i", "--image-endpoint", help="image service socket (default: the runtime endpoint)")
    top.add_argument("-t", "--timeout", type=float, default=10.0, help="seconds per call (default 10)")
    top.add_argument("-D", "--debug", action="store_true", help="accepted for compatibility")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("version", help="the runtime's name and versions")
    commands.add_parser("info", help="the runtime's status and configuration (JSON)")
    pods = commands.add_parser("pods", help="list pod sandboxes")
    ps = commands.add_parser("ps", help="list containers")
    for listing in (pods, ps):
        listing.add_argument("-q", "--quiet", action="store_true", help="only full IDs")
        listing.add_argument("--name", help="names matching this regular expression")
        listing.add_argument("--id", help="IDs starting with this")
        listing.add_argument("--no-trunc", action="store_true", help="full IDs")
    pods.add_argument("--namespace", help="namespaces matching this regular expression")
    for listing in (pods, ps):
        listing.add_argument(
            "-o", "--output", choices=("table", "json"), default="table", help="table or json"
        )
    pods.add_argument("-s", "--state", help="ready or notready")
    pods.add_argument("--label", action="append", default=[], help="KEY=VALUE (repeatable)")
    ps.add_argument("-a", "--all", action="store_true", help="also containers that are not running")
    ps.add_argument("-p", "--pod", help="containers of the pod sandbox with this ID")
    for name, text in (("stopp", "stop pod sandboxes"), ("rmp", "remove pod sandboxes")):
        command = commands.add_parser(name, help=text)
        command.add_argument("ids", nargs="+", metavar="POD-ID")
        if name == "rmp":
            command.add_argument("-f", "--force", action="store_true", help="stop them first")
    stop = commands.add_parser("stop", help="stop containers")
    stop.add_argument("ids", nargs="+", metavar="CONTAINER-ID")
    stop.add_argument("--timeout", type=int, default=10, help="seconds before SIGKILL (default 10)")
    rm = commands.add_parser("rm", help="remove containers")
    rm.add_argument("ids", nargs="+", metavar="CONTAINER-ID")
    for name in ("images", "img"):
        images = commands.add_parser(name, help="list images")
        images.add_argument("image", nargs="?", help="only this image")
        images.add_argument("-q", "--quiet", action="store_true", help="only image IDs")
        images.add_argument("--no-trunc", action="store_true", help="full image IDs")
    inspecti = commands.add_parser("inspecti", help="an image's status (JSON); exit 1 when it is absent")
    inspecti.add_argument("images", nargs="+", metavar="IMAGE")
    pull = commands.add_parser("pull", help="pull an image")
    pull.add_argument("image", metavar="IMAGE")
    return top


def configured_endpoint(path: Path = CONFIG_FILE) -> str:
    """``runtime-endpoint`` of crictl's config file, else containerd's default socket."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return DEFAULT_ENDPOINT
    value = document.get("runtime-endpoint") if isinstance(document, dict) else None
    return value if isinstance(value, str) and value else DEFAULT_ENDPOINT


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    endpoint = args.runtime_endpoint or configured_endpoint()
    if args.command in ("images", "img", "inspecti", "pull") and args.image_endpoint:
        endpoint = args.image_endpoint
    client = RuntimeClient(endpoint, timeout=args.timeout)
    try:
        sys.stdout.write(COMMANDS[args.command](client, args))
    except CrictlError as exc:
        print(f"crictl {args.command}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
