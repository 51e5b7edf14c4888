"""Pure decisions of the pod-checkpointer: what to checkpoint, activate, deactivate and remove.

Checkpoints have two states, as in the original bootkube checkpointer:

- *stored* (inactive): the sanitised copy sits in the checkpointer's state directory. Every
  annotated pod on the node gets one once the kubelet has reported it ``Running`` (a pod that
  never ran here is not worth resurrecting, and this avoids racing its first start);
- *active*: the copy is also in the kubelet's manifest directory, so the kubelet runs it as a
  static pod. A checkpoint is active exactly while its parent is not running on the node
  according to the kubelet. The parent and its checkpoint are never meant to run together:
  control plane pods use the host network, and two kube-apiservers cannot both bind 6443. The
  checkpointer's own checkpoint is the exception and is always active, because after a reboot
  without an API server it is the only thing that can activate the others.

Removal needs the API server's word: a checkpoint is removed once the API server has answered
without its parent (or with the parent no longer annotated, or on another node) continuously
for the grace period. When that parent is the checkpointer's own and no other pod of its owner
(its DaemonSet) is on the node, checkpointing is being switched off (the DaemonSet was
deleted): every checkpoint goes with it, the checkpointer's own last. The API server saying
that the owner itself is gone (404 for the DaemonSet, by name) proves the same at once, so then
nothing waits for the grace period: no new pod of it can come (`convert-k8s` deletes it).
Left behind, an active checkpoint would have no one to deactivate or remove it, and while it
holds its component's host ports its parent cannot run, so it would stay active for good. While
the API server is unreachable nothing is removed and no grace time passes for removal: keeping
the control plane alive across reboots is the point. While the kubelet is unreachable,
activation does not change (its silence says nothing about the parent).

Sanitising turns a pod from the API server into something a kubelet accepts as a static pod and
the API server's NodeRestriction admission accepts as its mirror pod: no ownerReferences,
nodeName, status, service account name or priority value; Secret and ConfigMap volumes (and the
Secret/ConfigMap sources of projected volumes) become host path directories the store fills
with the objects' data, and env references to them or to the pod's own fields become literal
values. Service account token *Secrets* are copied like any Secret: the checkpointer's own
checkpoint needs API credentials to see its parent go and clean up; bound (projected) tokens
are dropped, a static pod cannot get one.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any

from kubeplane.checkpointer import CheckpointerError

__all__ = [
    "ANNOTATION_CHECKPOINT",
    "ANNOTATION_CHECKPOINT_OF",
    "Checkpoint",
    "Observation",
    "Plan",
    "Planner",
    "Reference",
    "checkpoint_name",
    "is_checkpoint",
    "is_running",
    "pod_id",
    "references",
    "sanitise",
    "wants_checkpoint",
]

ANNOTATION_CHECKPOINT = "checkpointer.alpha.coreos.com/checkpoint"
ANNOTATION_CHECKPOINT_OF = "checkpointer.alpha.coreos.com/checkpoint-of"

Pod = dict[str, Any]

_SECRET_MODE = 0o600
_CONFIGMAP_MODE = 0o644
_SAFE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def pod_id(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def checkpoint_name(parent_id: str) -> str:
    """File stem of a parent's checkpoint: ``<namespace>-<name>``."""
    namespace, _, name = parent_id.partition("/")
    for part in (namespace, name):
        # Names come from the API server (DNS labels/subdomains); refuse anything that could
        # leave the directory rather than trusting that.
        if not _SAFE_NAME.match(part):
            raise CheckpointerError(f"pod {parent_id!r} has a name that is not a DNS subdomain")
    return f"{namespace}-{name}"


def is_checkpoint(pod: Mapping[str, Any]) -> bool:
    """True for a checkpoint (or its mirror pod): it carries the checkpoint-of annotation."""
    return ANNOTATION_CHECKPOINT_OF in ((pod.get("metadata") or {}).get("annotations") or {})


def wants_checkpoint(pod: Mapping[str, Any], node: str) -> bool:
    """True for a pod on `node` annotated for checkpointing that is not itself a checkpoint."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return (
        annotations.get(ANNOTATION_CHECKPOINT) == "true"
        and (pod.get("spec") or {}).get("nodeName") == node
        and not is_checkpoint(pod)
    )


def _self_last(known: frozenset[str], self_id: str | None) -> tuple[str, ...]:
    """Every checkpoint, the checkpointer's own last (removing it stops this process)."""
    others = sorted(parent_id for parent_id in known if parent_id != self_id)
    return (*others, *([self_id] if self_id in known else []))


def _owner_uids(pod: Mapping[str, Any]) -> set[str]:
    return {str(ref.get("uid")) for ref in (pod.get("metadata") or {}).get("ownerReferences") or ()}


def daemonset_owners(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the DaemonSets (apps/v1) that own `pod`, sorted."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or ()
    return tuple(
        sorted(
            str(ref["name"])
            for ref in refs
            if ref.get("kind") == "DaemonSet"
            and str(ref.get("apiVersion", "")).startswith("apps/")
            and ref.get("name")
        )
    )


def is_running(pod: Mapping[str, Any]) -> bool:
    """Whether a pod from the kubelet's ``/pods`` is running (phase Running, not terminating)."""
    return (pod.get("status") or {}).get("phase") == "Running"


# -- sanitising ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, order=True)
class Reference:
    """A Secret or ConfigMap a pod uses, in the pod's namespace."""

    kind: str  # "Secret" or "ConfigMap"
    name: str


def _env_sources(pod: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        yield from container.get("envFrom") or []
        for env in container.get("env") or []:
            yield env.get("valueFrom") or {}


def references(pod: Mapping[str, Any]) -> set[Reference]:
    """Every Secret and ConfigMap the pod's volumes and env refer to."""
    found: set[Reference] = set()
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if "secret" in volume:
            found.add(Reference("Secret", volume["secret"]["secretName"]))
        if "configMap" in volume:
            found.add(Reference("ConfigMap", volume["configMap"]["name"]))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "secret" in source:
                found.add(Reference("Secret", source["secret"]["name"]))
            if "configMap" in source:
                found.add(Reference("ConfigMap", source["configMap"]["name"]))
    for source in _env_sources(pod):
        for key, kind in (
            ("secretRef", "Secret"),
            ("secretKeyRef", "Secret"),
            ("configMapRef", "ConfigMap"),
            ("configMapKeyRef", "ConfigMap"),
        ):
            if key in source:
                found.add(Reference(kind, source[key]["name"]))
    return found


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A sanitised checkpoint: the static pod and the files its host path volumes need.

    `files` maps a path relative to the checkpoint's files directory to (content, mode).
    """

    parent_id: str
    pod: Pod
    files: Mapping[str, tuple[bytes, int]]


def _object_data(obj: Mapping[str, Any] | None) -> dict[str, bytes]:
    """Key → bytes of a Secret (base64 ``data``) or ConfigMap (``data`` + base64 ``binaryData``)."""
    if obj is None:
        return {}
    if obj.get("kind") == "Secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


class _Sanitiser:
    def __init__(self, parent: Pod, objects: Mapping[Reference, Mapping[str, Any] | None], files_dir: str):
        self.parent = parent
        self.objects = objects
        self.files_dir = PurePosixPath(files_dir)
        self.files: dict[str, tuple[bytes, int]] = {}
        self.where = f"pod {pod_id(parent)}"

    def lookup(self, ref: Reference, *, optional: bool) -> dict[str, bytes] | None:
        obj = self.objects.get(ref)
        if obj is None and not optional:
            raise CheckpointerError(
                f"{self.where} uses {ref.kind} {ref.name!r}, which the API server did not return; "
                "the checkpoint needs it (check that it exists and that the checkpointer may read it)"
            )
        return None if obj is None else _object_data(obj)

    def project(self, volume: str, source: Mapping[str, Any], ref: Reference, default_mode: int) -> None:
        """Write the keys of one Secret/ConfigMap source into the volume's directory."""
        data = self.lookup(ref, optional=bool(source.get("optional")))
        if data is None:
            return
        items = source.get("items")
        selected = (
            [(item["key"], item["path"], item.get("mode")) for item in items]
            if items
            else [(key, key, None) for key in sorted(data)]
        )
        mode = source.get("defaultMode", default_mode)
        for key, path, item_mode in selected:
            if key not in data:
                if source.get("optional"):
                    continue
                raise CheckpointerError(f"{self.where}: {ref.kind} {ref.name!r} has no key {key!r}")
            rel = PurePosixPath(volume) / path
            if ".." in rel.parts or rel.is_absolute():
                raise CheckpointerError(f"{self.where}: volume {volume!r} item path {path!r} escapes")
            self.files[str(rel)] = (data[key], item_mode if item_mode is not None else mode)

    def volume(self, volume: Mapping[str, Any]) -> dict[str, Any]:
        name = volume["name"]
        sources: list[tuple[Mapping[str, Any], Reference, int]] = []
        if "secret" in volume:
            spec = dict(volume["secret"])
            sources.append((spec, Reference("Secret", spec["secretName"]), _SECRET_MODE))
        elif "configMap" in volume:
            spec = dict(volume["configMap"])
            sources.append((spec, Reference("ConfigMap", spec["name"]), _CONFIGMAP_MODE))
        elif "projected" in volume:
            projected = volume["projected"]
            for source in projected.get("sources") or []:
                # Bound service account tokens and downward API files cannot be had without the
                # API server; a static pod does without them.
                for key, kind, mode in (
                    ("secret", "Secret", _SECRET_MODE),
                    ("configMap", "ConfigMap", _CONFIGMAP_MODE),
                ):
                    if key in source:
                        merged = {"defaultMode": projected.get("defaultMode", mode), **source[key]}
                        sources.append((merged, Reference(kind, merged["name"]), mode))
        else:
            return dict(volume)
        for source_spec, ref, mode in sources:
            self.project(name, source_spec, ref, mode)
        return {"name": name, "hostPath": {"path": str(self.files_dir / name), "type": "DirectoryOrCreate"}}

    def field(self, path: str) -> str | None:
        meta = self.parent.get("metadata") or {}
        spec = self.parent.get("spec") or {}
        values = {
            "metadata.name": meta.get("name"),
            "metadata.namespace": meta.get("namespace"),
            "metadata.uid": meta.get("uid"),
            "spec.nodeName": spec.get("nodeName"),
            "spec.serviceAccountName": spec.get("serviceAccountName"),
        }
        value = values.get(path)
        return None if value is None else str(value)

    def env(self, container: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The container's env with every reference resolved; envFrom folded in first."""
        result: dict[str, dict[str, Any]] = {}
        for source in container.get("envFrom") or []:
            for key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
                if key in source:
                    ref = Reference(kind, source[key]["name"])
                    data = self.lookup(ref, optional=bool(source[key].get("optional"))) or {}
                    for name, value in sorted(data.items()):
                        full = source.get("prefix", "") + name
                        result[full] = {"name": full, "value": value.decode()}
        for env in container.get("env") or []:
            result.pop(env["name"], None)
            result[env["name"]] = self.env_var(env)
        return list(result.values()) or None

    def env_var(self, env: Mapping[str, Any]) -> dict[str, Any]:
        source = env.get("valueFrom")
        if not source:
            return dict(env)
        for key, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
            if key in source:
                ref_spec = source[key]
                data = self.lookup(Reference(kind, ref_spec["name"]), optional=bool(ref_spec.get("optional")))
                value = (data or {}).get(ref_spec["key"])
                if value is None and not ref_spec.get("optional"):
                    raise CheckpointerError(
                        f"{self.where}: env {env['name']} needs key {ref_spec['key']!r} "
                        f"of {kind} {ref_spec['name']!r}, which does not have it"
                    )
                return {"name": env["name"], "value": "" if value is None else value.decode()}
        if "fieldRef" in source:
            resolved = self.field(source["fieldRef"]["fieldPath"])
            if resolved is not None:
                return {"name": env["name"], "value": resolved}
        # status.* and resourceFieldRef are served by the kubelet for static pods too.
        return dict(env)

    def container(self, container: Mapping[str, Any]) -> dict[str, Any]:
        result = copy.deepcopy(dict(container))
        result.pop("envFrom", None)
        env = self.env(container)
        if env is None:
            result.pop("env", None)
        else:
            result["env"] = env
        return result

    def run(self) -> Checkpoint:
        meta = self.parent.get("metadata") or {}
        spec = copy.deepcopy(self.parent.get("spec") or {})
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != ANNOTATION_CHECKPOINT}
        annotations[ANNOTATION_CHECKPOINT_OF] = meta.get("name", "")
        for key in (
            "nodeName",
            "serviceAccountName",
            "serviceAccount",
            "priority",
            "schedulerName",
            "affinity",
        ):
            spec.pop(key, None)
        spec["automountServiceAccountToken"] = False
        spec["volumes"] = [self.volume(v) for v in spec.get("volumes") or []]
        if not spec["volumes"]:
            del spec["volumes"]
        for key in ("initContainers", "containers"):
            if key in spec:
                spec[key] = [self.container(c) for c in spec[key]]
        metadata: dict[str, Any] = {
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace") or "default",
        }
        if meta.get("labels"):
            metadata["labels"] = dict(meta["labels"])
        metadata["annotations"] = annotations
        pod: Pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
        return Checkpoint(parent_id=pod_id(self.parent), pod=pod, files=dict(sorted(self.files.items())))


def sanitise(
    parent: Mapping[str, Any],
    *,
    objects: Mapping[Reference, Mapping[str, Any] | None],
    files_dir: str,
) -> Checkpoint:
    """The checkpoint of `parent`; `objects` holds the Secrets/ConfigMaps of `references(parent)`
    as the API server returned them (None: does not exist), `files_dir` is the node path where
    the checkpoint's files will be (host path volumes point there).

    Raises :class:`CheckpointerError` when a non-optional Secret/ConfigMap or key is missing.
    """
    return _Sanitiser(dict(parent), objects, files_dir).run()


# -- planning ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Observation:
    """What one round saw. ``None`` for a source that did not answer.

    `api_pods`: every pod the API server lists on this node (any namespace);
    `kubelet_pods`: every pod the kubelet reports; `stored`/`active`: parent ids of the stored
    and active checkpoints on disk; `now`: the clock (seconds, monotonic is fine).
    """

    node: str
    api_pods: tuple[Mapping[str, Any], ...] | None
    kubelet_pods: tuple[Mapping[str, Any], ...] | None
    stored: frozenset[str]
    active: frozenset[str]
    now: float
    self_id: str | None = None
    owner_gone: bool = False
    """The API server answered 404 for every DaemonSet that owned the checkpointer's own parent
    (:attr:`Planner.self_owner_names`): it was deleted, not replaced."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to do this round, each list sorted; `store` holds the parent pods to (re)checkpoint."""

    store: tuple[Mapping[str, Any], ...] = ()
    activate: tuple[str, ...] = ()
    deactivate: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    waiting: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Parent id → seconds left before removal, for parents the API server no longer has."""
    disabled: bool = False
    """Checkpointing is switched off: ``remove`` is every checkpoint, the checkpointer's own last."""


class Planner:
    """Turns observations into plans; remembers since when each parent has been missing."""

    def __init__(self, *, grace_period: float) -> None:
        if grace_period < 0:
            raise CheckpointerError(f"grace period must not be negative, got {grace_period}")
        self.grace_period = grace_period
        self._missing_since: dict[str, float] = {}
        #: uids of the owners (the DaemonSet) of the checkpointer's own parent, last seen.
        self._self_owners: set[str] = set()
        #: Names of the DaemonSets that owned the checkpointer's own parent, last seen: what to
        #: ask the API server about once that parent is gone (:attr:`Observation.owner_gone`).
        self.self_owner_names: tuple[str, ...] = ()
        #: Set once checkpointing was switched off: from then on every checkpoint is removed.
        self.disabled = False

    def plan(self, obs: Observation) -> Plan:
        """Decide this round's actions (see the module docstring for the rules)."""
        known = obs.stored | obs.active
        if self.disabled:
            # Until the kubelet stops this (checkpoint) process: nothing comes back.
            return Plan(remove=_self_last(known, obs.self_id), disabled=True)
        running = (
            None
            if obs.kubelet_pods is None
            else {pod_id(p) for p in obs.kubelet_pods if is_running(p) and not is_checkpoint(p)}
        )
        store: list[Mapping[str, Any]] = []
        remove: list[str] = []
        waiting: dict[str, float] = {}
        if obs.api_pods is not None:
            parents = {pod_id(p): p for p in obs.api_pods if wants_checkpoint(p, obs.node)}
            for parent_id, parent in sorted(parents.items()):
                self._missing_since.pop(parent_id, None)
                if parent_id in obs.stored or (running is not None and parent_id in running):
                    store.append(parent)
            for parent_id in sorted(known - parents.keys()):
                since = self._missing_since.setdefault(parent_id, obs.now)
                left = self.grace_period - (obs.now - since)
                if left <= 0:
                    remove.append(parent_id)
                    del self._missing_since[parent_id]
                else:
                    waiting[parent_id] = left
            for parent_id in list(self._missing_since):
                if parent_id not in known:
                    del self._missing_since[parent_id]
            if obs.self_id in parents:
                self._self_owners = _owner_uids(parents[obs.self_id])
                self.self_owner_names = daemonset_owners(parents[obs.self_id])
            elif (
                obs.self_id in remove
                or (obs.self_id in known and obs.owner_gone and bool(self.self_owner_names))
            ) and not any(
                _owner_uids(p) & self._self_owners for p in obs.api_pods if pod_id(p) != obs.self_id
            ):
                self.disabled = True
                return Plan(remove=_self_last(known, obs.self_id), disabled=True)
        keep = (obs.stored | {pod_id(p) for p in store}) - set(remove)
        activate: list[str] = []
        deactivate: list[str] = []
        if running is not None:
            for parent_id in sorted(keep):
                should_run = parent_id == obs.self_id or parent_id not in running
                if should_run and parent_id not in obs.active:
                    activate.append(parent_id)
                elif not should_run and parent_id in obs.active:
                    deactivate.append(parent_id)
        return Plan(
            store=tuple(store),
            activate=tuple(activate),
            deactivate=tuple(deactivate),
            remove=tuple(remove),
            waiting=waiting,
        )
