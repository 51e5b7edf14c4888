"""Pod-checkpointer decisions and sanitising: grace timers on a fake clock, activation rules."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import pytest

from kubeplane.checkpointer import CheckpointerError, logic

pytestmark = pytest.mark.unit

NODE = "cp1"
APISERVER = "kube-system/kube-apiserver-abcde"
SELF = "kube-system/pod-checkpointer-xyz"


def pod(pod_id: str, *, node: str = NODE, annotated: bool = True, phase: str | None = None) -> dict[str, Any]:
    namespace, name = pod_id.split("/")
    result: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {logic.ANNOTATION_CHECKPOINT: "true"} if annotated else {},
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "img"}]},
    }
    if phase:
        result["status"] = {"phase": phase}
    return result


def observe(
    *,
    api: list[dict[str, Any]] | None,
    kubelet: list[dict[str, Any]] | None,
    stored: set[str] = frozenset(),  # type: ignore[assignment]
    active: set[str] = frozenset(),  # type: ignore[assignment]
    now: float = 0.0,
    self_id: str | None = None,
    owner_gone: bool = False,
) -> logic.Observation:
    return logic.Observation(
        node=NODE,
        api_pods=None if api is None else tuple(api),
        kubelet_pods=None if kubelet is None else tuple(kubelet),
        stored=frozenset(stored),
        active=frozenset(active),
        now=now,
        self_id=self_id,
        owner_gone=owner_gone,
    )


def ids(pods: tuple[Mapping[str, Any], ...]) -> list[str]:
    return [logic.pod_id(p) for p in pods]


def test_running_annotated_parent_is_stored_but_not_activated() -> None:
    plan = logic.Planner(grace_period=300).plan(
        observe(api=[pod(APISERVER)], kubelet=[pod(APISERVER, phase="Running")])
    )
    assert ids(plan.store) == [APISERVER]
    assert plan.activate == () and plan.remove == ()


def test_parent_that_never_ran_here_is_not_checkpointed() -> None:
    plan = logic.Planner(grace_period=300).plan(observe(api=[pod(APISERVER)], kubelet=[]))
    assert plan.store == () and plan.activate == ()


@pytest.mark.parametrize(
    "other",
    [
        pod("kube-system/other", annotated=False),
        pod("kube-system/elsewhere", node="cp2"),
    ],
)
def test_only_annotated_pods_on_this_node_count(other: dict[str, Any]) -> None:
    running = {**other, "status": {"phase": "Running"}}
    plan = logic.Planner(grace_period=300).plan(observe(api=[other], kubelet=[running]))
    assert plan.store == ()


def test_checkpoint_is_active_exactly_while_parent_is_not_running() -> None:
    planner = logic.Planner(grace_period=300)
    stopped = planner.plan(observe(api=[pod(APISERVER)], kubelet=[], stored={APISERVER}))
    assert stopped.activate == (APISERVER,)
    running = planner.plan(
        observe(
            api=[pod(APISERVER)],
            kubelet=[pod(APISERVER, phase="Running")],
            stored={APISERVER},
            active={APISERVER},
        )
    )
    assert running.deactivate == (APISERVER,) and running.activate == ()


def test_a_running_checkpoint_is_not_mistaken_for_its_parent() -> None:
    # The kubelet reports the checkpoint itself under the parent's name (plus the node suffix on
    # the mirror); only a pod without checkpoint-of counts as the parent.
    checkpoint = pod(APISERVER, phase="Running")
    checkpoint["metadata"]["annotations"] = {logic.ANNOTATION_CHECKPOINT_OF: "kube-apiserver-abcde"}
    plan = logic.Planner(grace_period=300).plan(
        observe(api=None, kubelet=[checkpoint], stored={APISERVER}, active={APISERVER})
    )
    assert plan.deactivate == ()


def test_own_checkpoint_is_always_active() -> None:
    plan = logic.Planner(grace_period=300).plan(
        observe(api=[pod(SELF)], kubelet=[pod(SELF, phase="Running")], stored={SELF}, self_id=SELF)
    )
    assert plan.activate == (SELF,)


def test_removal_after_grace_period_of_api_answers() -> None:
    planner = logic.Planner(grace_period=300)
    first = planner.plan(observe(api=[], kubelet=[], stored={APISERVER}, active={APISERVER}, now=1000))
    assert first.remove == () and first.waiting == {APISERVER: 300}
    assert planner.plan(observe(api=[], kubelet=[], stored={APISERVER}, now=1299)).remove == ()
    assert planner.plan(observe(api=[], kubelet=[], stored={APISERVER}, now=1300)).remove == (APISERVER,)


def test_parent_coming_back_resets_the_grace_timer() -> None:
    planner = logic.Planner(grace_period=300)
    planner.plan(observe(api=[], kubelet=[], stored={APISERVER}, now=0))
    planner.plan(observe(api=[pod(APISERVER)], kubelet=[], stored={APISERVER}, now=200))
    assert planner.plan(observe(api=[], kubelet=[], stored={APISERVER}, now=400)).remove == ()
    assert planner.plan(observe(api=[], kubelet=[], stored={APISERVER}, now=700)).remove == (APISERVER,)


def test_unreachable_api_server_keeps_checkpoints_and_activates_them() -> None:
    planner = logic.Planner(grace_period=10)
    planner.plan(observe(api=[], kubelet=[], stored={APISERVER}, now=0))
    plan = planner.plan(observe(api=None, kubelet=[], stored={APISERVER}, now=10_000))
    assert plan.remove == () and plan.store == ()
    assert plan.activate == (APISERVER,)


def test_unreachable_kubelet_changes_no_activation() -> None:
    plan = logic.Planner(grace_period=300).plan(
        observe(api=[pod(APISERVER)], kubelet=None, stored={APISERVER}, active={APISERVER})
    )
    assert plan.activate == () and plan.deactivate == ()
    assert ids(plan.store) == [APISERVER]


def test_negative_grace_period_is_refused() -> None:
    with pytest.raises(CheckpointerError, match="grace period"):
        logic.Planner(grace_period=-1)


# -- sanitising ------------------------------------------------------------------------------


def secret(data: dict[str, bytes], *, kind: str = "Secret") -> dict[str, Any]:
    if kind == "Secret":
        return {"kind": kind, "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
    return {"kind": kind, "data": {k: v.decode() for k, v in data.items()}}


def daemonset_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kube-apiserver-abcde",
            "namespace": "kube-system",
            "uid": "1234",
            "resourceVersion": "99",
            "labels": {"k8s-app": "kube-apiserver"},
            "annotations": {logic.ANNOTATION_CHECKPOINT: "true", "other": "kept"},
            "ownerReferences": [{"kind": "DaemonSet", "name": "kube-apiserver"}],
        },
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": "default",
            "priority": 2000000000,
            "priorityClassName": "system-cluster-critical",
            "hostNetwork": True,
            "affinity": {"nodeAffinity": {}},
            "containers": [
                {
                    "name": "kube-apiserver",
                    "image": "k8s.gcr.io/kube-apiserver:v1.20.2",
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {
                            "name": "MODE",
                            "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}},
                        },
                    ],
                    "volumeMounts": [{"name": "secrets", "mountPath": "/secrets"}],
                }
            ],
            "volumes": [
                {"name": "secrets", "secret": {"secretName": "kube-apiserver", "defaultMode": 0o400}},
                {"name": "logs", "hostPath": {"path": "/var/log"}},
                {
                    "name": "token",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token"}},
                            {
                                "configMap": {
                                    "name": "settings",
                                    "items": [{"key": "mode", "path": "mode.txt"}],
                                }
                            },
                        ]
                    },
                },
            ],
        },
        "status": {"phase": "Running"},
    }


OBJECTS = {
    logic.Reference("Secret", "kube-apiserver"): secret({"apiserver.crt": b"CRT", "apiserver.key": b"KEY"}),
    logic.Reference("ConfigMap", "settings"): secret({"mode": b"fast"}, kind="ConfigMap"),
}


def test_references_cover_volumes_projected_sources_and_env() -> None:
    assert logic.references(daemonset_pod()) == set(OBJECTS)


def test_sanitised_checkpoint_is_a_valid_static_pod() -> None:
    checkpoint = logic.sanitise(daemonset_pod(), objects=OBJECTS, files_dir="/state/files/kube-system-x")
    meta, spec = checkpoint.pod["metadata"], checkpoint.pod["spec"]
    assert checkpoint.parent_id == "kube-system/kube-apiserver-abcde"
    assert meta == {
        "name": "kube-apiserver-abcde",
        "namespace": "kube-system",
        "labels": {"k8s-app": "kube-apiserver"},
        "annotations": {"other": "kept", logic.ANNOTATION_CHECKPOINT_OF: "kube-apiserver-abcde"},
    }
    assert "status" not in checkpoint.pod
    for dropped in ("nodeName", "serviceAccountName", "priority", "affinity"):
        assert dropped not in spec
    assert spec["automountServiceAccountToken"] is False
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["volumes"] == [
        {
            "name": "secrets",
            "hostPath": {"path": "/state/files/kube-system-x/secrets", "type": "DirectoryOrCreate"},
        },
        {"name": "logs", "hostPath": {"path": "/var/log"}},
        {
            "name": "token",
            "hostPath": {"path": "/state/files/kube-system-x/token", "type": "DirectoryOrCreate"},
        },
    ]
    assert checkpoint.files == {
        "secrets/apiserver.crt": (b"CRT", 0o400),
        "secrets/apiserver.key": (b"KEY", 0o400),
        "token/mode.txt": (b"fast", 0o644),
    }
    env = spec["containers"][0]["env"]
    assert env == [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "value": NODE},
        {"name": "MODE", "value": "fast"},
    ]


def test_sanitising_does_not_change_the_parent() -> None:
    parent = daemonset_pod()
    logic.sanitise(parent, objects=OBJECTS, files_dir="/x")
    assert parent == daemonset_pod()


def test_missing_secret_is_an_error_naming_pod_and_secret() -> None:
    objects = {**OBJECTS, logic.Reference("Secret", "kube-apiserver"): None}
    with pytest.raises(CheckpointerError, match=r"kube-system/kube-apiserver-abcde.*Secret 'kube-apiserver'"):
        logic.sanitise(daemonset_pod(), objects=objects, files_dir="/x")


def test_optional_missing_configmap_is_skipped() -> None:
    parent = daemonset_pod()
    parent["spec"]["volumes"] = [{"name": "opt", "configMap": {"name": "absent", "optional": True}}]
    parent["spec"]["containers"][0]["env"] = []
    checkpoint = logic.sanitise(
        parent, objects={logic.Reference("ConfigMap", "absent"): None}, files_dir="/x"
    )
    assert checkpoint.files == {}
    assert checkpoint.pod["spec"]["volumes"][0]["hostPath"]["path"] == "/x/opt"


def test_item_path_may_not_escape_the_volume() -> None:
    parent = daemonset_pod()
    parent["spec"]["volumes"][0]["secret"]["items"] = [{"key": "apiserver.key", "path": "../../etc/passwd"}]
    with pytest.raises(CheckpointerError, match="escapes"):
        logic.sanitise(parent, objects=OBJECTS, files_dir="/x")


@pytest.mark.parametrize("bad", ["kube-system/../etc", "kube-system/a/b", "../x/y"])
def test_checkpoint_name_refuses_path_tricks(bad: str) -> None:
    with pytest.raises(CheckpointerError):
        logic.checkpoint_name(bad)


def owned(pod_dict: dict[str, Any], uid: str) -> dict[str, Any]:
    pod_dict["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "pod-checkpointer", "uid": uid}
    ]
    return pod_dict


def test_deleting_the_checkpointer_daemonset_removes_every_checkpoint_its_own_last() -> None:
    planner = logic.Planner(grace_period=300)
    running = [pod(SELF, phase="Running"), pod(APISERVER, phase="Running")]
    api = [owned(pod(SELF), "ds-1"), pod(APISERVER)]
    # The API server pod is not running here (a crash): its checkpoint is active.
    planner.plan(
        observe(
            api=api, kubelet=running[:1], stored={SELF, APISERVER}, active={SELF, APISERVER}, self_id=SELF
        )
    )
    gone = observe(
        api=[pod(APISERVER)],
        kubelet=running[:1],
        stored={SELF, APISERVER},
        active={SELF, APISERVER},
        now=10,
        self_id=SELF,
    )
    assert planner.plan(gone).remove == ()
    final = planner.plan(
        observe(
            api=[pod(APISERVER)],
            kubelet=running[:1],
            stored={SELF, APISERVER},
            active={SELF, APISERVER},
            now=310,
            self_id=SELF,
        )
    )
    # The API server's parent still exists, but nobody would ever deactivate its checkpoint.
    assert final.disabled and final.remove == (APISERVER, SELF)
    assert final.store == () and final.activate == ()
    # Until the kubelet stops this process nothing is checkpointed again.
    later = planner.plan(
        observe(api=[pod(APISERVER)], kubelet=running, stored={APISERVER}, now=320, self_id=SELF)
    )
    assert later.remove == (APISERVER,) and later.store == ()


def test_a_replaced_checkpointer_pod_removes_only_its_own_checkpoint() -> None:
    planner = logic.Planner(grace_period=300)
    successor = "kube-system/pod-checkpointer-new"
    planner.plan(
        observe(
            api=[owned(pod(SELF), "ds-1"), pod(APISERVER)], kubelet=[], stored={SELF, APISERVER}, self_id=SELF
        )
    )
    api = [owned(pod(successor), "ds-1"), pod(APISERVER)]
    planner.plan(observe(api=api, kubelet=[], stored={SELF, APISERVER}, now=10, self_id=SELF))
    plan = planner.plan(observe(api=api, kubelet=[], stored={SELF, APISERVER}, now=310, self_id=SELF))
    assert not plan.disabled and plan.remove == (SELF,)


def test_a_deleted_checkpointer_daemonset_removes_every_checkpoint_without_the_grace_period() -> None:
    planner = logic.Planner(grace_period=300)
    running = [pod(SELF, phase="Running")]
    planner.plan(
        observe(
            api=[owned(pod(SELF), "ds-1"), pod(APISERVER)],
            kubelet=running,
            stored={SELF, APISERVER},
            active={SELF, APISERVER},
            self_id=SELF,
        )
    )
    assert planner.self_owner_names == ("pod-checkpointer",)
    # Parent gone, but its DaemonSet still there (a rolling update): the grace period runs.
    waiting = planner.plan(
        observe(api=[pod(APISERVER)], kubelet=running, stored={SELF, APISERVER}, now=5, self_id=SELF)
    )
    assert not waiting.disabled and waiting.remove == () and SELF in waiting.waiting
    # The API server says the DaemonSet is gone too: everything goes now, its own checkpoint last.
    plan = planner.plan(
        observe(
            api=[pod(APISERVER)],
            kubelet=running,
            stored={SELF, APISERVER},
            active={SELF, APISERVER},
            now=6,
            self_id=SELF,
            owner_gone=True,
        )
    )
    assert plan.disabled and plan.remove == (APISERVER, SELF)


def test_a_gone_owner_needs_the_parent_seen_and_no_sibling_on_the_node() -> None:
    # Never saw its parent (started after it went): no owner known, the grace period decides.
    planner = logic.Planner(grace_period=300)
    plan = planner.plan(
        observe(api=[pod(APISERVER)], kubelet=[], stored={SELF}, now=1, self_id=SELF, owner_gone=True)
    )
    assert not plan.disabled and plan.remove == ()
    # Another pod of the same DaemonSet (by uid) on the node: not switched off.
    planner = logic.Planner(grace_period=300)
    planner.plan(observe(api=[owned(pod(SELF), "ds-1")], kubelet=[], stored={SELF}, self_id=SELF))
    sibling = owned(pod("kube-system/pod-checkpointer-new"), "ds-1")
    plan = planner.plan(
        observe(api=[sibling], kubelet=[], stored={SELF}, now=1, self_id=SELF, owner_gone=True)
    )
    assert not plan.disabled and plan.remove == ()


def test_only_daemonsets_of_apps_count_as_owners() -> None:
    pod_dict = pod(SELF)
    pod_dict["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "b", "uid": "1"},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "a", "uid": "2"},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "3"},
        {"apiVersion": "example.com/v1", "kind": "DaemonSet", "name": "x", "uid": "4"},
    ]
    assert logic.daemonset_owners(pod_dict) == ("a", "b")
