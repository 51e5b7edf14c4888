"""convert-k8s steps against a fake cluster: messages, prompts, re-runs and CA reuse."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from typing import Any

import pytest

from kubeplane import config as machine_config
from kubeplane import plan
from kubeplane.clients.errors import KubeNotFound, KubeUnavailable
from kubeplane.config import generate as gen
from kubeplane.ops import convert
from kubeplane.ops.errors import NodeUnavailable, PreflightError, WaitTimeout
from kubeplane.ops.upgrade import ClusterNode

pytestmark = pytest.mark.unit

NODES = [("10.0.0.2", "cp-1"), ("10.0.0.3", "cp-2")]


def _config(*, persist: bool = True) -> str:
    generated = gen.generate(
        gen.GenOptions(cluster_name="c", endpoint="https://10.0.0.1:6443"), gen.new_secrets()
    )
    document = generated.documents["controlplane"]
    cluster = dict(document["cluster"])
    cluster.pop("serviceAccount", None)
    cluster.pop("aggregatorCA", None)
    return gen.dump_yaml({**document, "cluster": cluster, "persist": persist})


@dataclasses.dataclass
class FakeEnv:
    """A self-hosted cluster that converts as soon as it is told to."""

    configs: dict[str, str]
    self_hosted_flag: bool = True
    daemonsets: set[str] = dataclasses.field(
        default_factory=lambda: {*convert.COMPONENTS, convert.CHECKPOINTER}
    )
    checkpoint_rounds: int = 2
    applied: list[str] = dataclasses.field(default_factory=list)
    fail_apply_after: int | None = None
    #: DaemonSet pod name → (component, node name): pods no garbage collector removes with their
    #: DaemonSet (and, once it is deleted with ``orphan``, nobody removes at all).
    daemonset_pods: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    deleted_pods: list[str] = dataclasses.field(default_factory=list)
    #: Pods deleted with their grace period (the API servers), in order.
    gracefully_deleted: list[str] = dataclasses.field(default_factory=list)
    #: DaemonSets deleted with ``orphan``.
    orphaned: list[str] = dataclasses.field(default_factory=list)
    #: Everything the rotation and the pod deletions did, in order.
    events: list[str] = dataclasses.field(default_factory=list)
    #: (node address, component) whose static container waits in crash-loop back-off until the
    #: node's kubelet restarts.
    crashing: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    #: (node address, component) whose static pod has no container yet (its agent held it back
    #: while the old pod had the port): the kubelet starts it once written, no restart needed.
    unstarted: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    #: (node address, component) → polls for which the old DaemonSet container still runs.
    old_running: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    restarted: list[str] = dataclasses.field(default_factory=list)

    async def master_nodes(self) -> list[tuple[str, str]]:
        return NODES

    async def self_hosted(self, node: str) -> bool:
        return self.self_hosted_flag

    async def secret_value(self, namespace: str, name: str, key: str) -> bytes | None:
        return b"-----BEGIN EC PRIVATE KEY-----\nabc\n-----END EC PRIVATE KEY-----\n"

    async def daemonset_image(self, name: str) -> str | None:
        return f"example.org/{name}:v1.20.2" if name in self.daemonsets else None

    async def machine_config(self, node: str) -> str:
        return self.configs[node]

    async def apply_config(self, node: str, data: str) -> None:
        if self.fail_apply_after is not None and len(self.applied) >= self.fail_apply_after:
            raise RuntimeError("simulated kill")
        self.configs[node] = data
        self.applied.append(node)

    async def resource_ids(self, node: str, type_name: str) -> list[str]:
        document = machine_config.load(self.configs[node]).model.cluster
        if document.aggregator_ca is None and self.self_hosted_flag:  # a re-run starts unpatched
            return []
        return list(convert.COMPONENTS) if type_name == "staticpods" else ["00-manifest"]

    async def delete_daemonset(self, name: str, *, orphan: bool = False) -> bool:
        if name not in self.daemonsets:
            return False
        self.daemonsets.discard(name)
        if orphan:
            self.orphaned.append(name)
        return True

    async def system_pods(self) -> list[convert.Pod]:
        pods = []
        if convert.CHECKPOINTER not in self.daemonsets and self.checkpoint_rounds > 0:
            self.checkpoint_rounds -= 1
            pods.append(
                convert.Pod(
                    name="pod-checkpointer-x-cp-1", phase="Running", annotations={convert.CHECKPOINT_OF: "x"}
                )
            )
        for name, (component, node) in self.daemonset_pods.items():
            pods.append(
                convert.Pod(
                    name=name,
                    node_name=node,
                    phase="Running",
                    ready=True,
                    labels={"k8s-app": component},
                    owner_kinds=() if component in self.orphaned else ("DaemonSet",),
                )
            )
        if not self.self_hosted_flag:
            for address, node in NODES:
                for component in convert.COMPONENTS:
                    pods.append(
                        convert.Pod(
                            name=f"{component}-{node}",
                            node_name=node,
                            phase="Running",
                            ready=(address, component) not in self.crashing,
                            labels={"k8s-app": component},
                            annotations={convert.SECRETS_VERSION: "1"},
                            owner_kinds=("Node",),
                        )
                    )
        return pods

    async def force_delete_pod(self, name: str) -> None:
        component, _ = self.daemonset_pods.pop(name, (None, None))
        assert component is not None, "running checkpoints must not be force-deleted"
        assert component != convert.APISERVER, "API servers are deleted with their grace period"
        assert component not in self.daemonsets, f"{name} deleted while its DaemonSet still exists"
        self.deleted_pods.append(name)
        self.events.append(f"force-delete {name}")

    async def delete_pod(self, name: str, *, grace_period: int) -> None:
        assert grace_period > 0
        component, _ = self.daemonset_pods.pop(name, (None, None))
        assert component == convert.APISERVER and component not in self.daemonsets
        self.deleted_pods.append(name)
        self.gracefully_deleted.append(name)
        self.events.append(f"delete {name}")

    async def remove_initialized_key(self) -> None:
        self.self_hosted_flag = False
        self.events.append("remove key")

    async def containers(self, node: str) -> list[convert.Container]:
        name = dict(NODES)[node]
        found = []
        for component in convert.COMPONENTS:
            crashing = (node, component) in self.crashing
            if (node, component) not in self.unstarted:
                found.append(
                    convert.Container(pod=f"{component}-{name}", name=component, running=not crashing)
                )
            if self.old_running.get((node, component), 0) > 0:
                self.old_running[(node, component)] -= 1
                found.append(convert.Container(pod=f"{component}-zyxwv", name=component, running=True))
        return found

    async def restart_kubelet(self, node: str) -> None:
        assert not any(n == node and rounds for (n, _), rounds in self.old_running.items())
        self.restarted.append(node)
        self.crashing = {(n, c) for n, c in self.crashing if n != node}


@dataclasses.dataclass
class FakeRotation:
    """The load balancer: every node serves unless drained; records into ``env.events``."""

    env: FakeEnv
    drained: set[str] = dataclasses.field(default_factory=set)

    async def drain(self, node: ClusterNode) -> None:
        self.drained.add(node.address)
        self.env.events.append(f"drain {node.address}")

    async def restore(self, node: ClusterNode) -> None:
        self.drained.discard(node.address)
        self.env.events.append(f"restore {node.address}")

    async def serving(self) -> set[str]:
        return {address for address, _ in NODES} - self.drained


class Lines(plan.RecordingProgress):
    """Everything the run says, in order: its own lines and its steps' messages."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    def retrying(self, message: str) -> None:
        self.lines.append(f"retrying error: {message}")


def _run(
    env: FakeEnv,
    *,
    answers: list[bool] | None = None,
    force: bool = True,
    rotation: FakeRotation | None = None,
) -> list[str]:
    said = Lines()
    lines = said.lines
    asked: list[str] = []

    def confirm(prompt: str) -> bool:
        asked.append(prompt)
        return (answers or []).pop(0)

    options = convert.Options(force=force, interval=0, checkpoint_interval=0)
    converter = convert.Converter(
        env, options=options, echo=lines.append, confirm=confirm, progress=said, rotation=rotation
    )
    try:
        asyncio.run(converter.run())
    finally:
        lines.extend(asked)
    return lines


def test_force_runs_every_step_with_the_guides_messages() -> None:
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES})
    lines = _run(env)
    text = "\n".join(lines)
    assert lines[0] == 'discovered master nodes ["10.0.0.2" "10.0.0.3"]'
    for expected in (
        "current self-hosted status: true",
        "gathering control plane configuration",
        "aggregator CA key can't be recovered",
        'patching master node "10.0.0.3" configuration',
        "waiting for static pod definitions to be generated",
        "waiting for manifests to be generated",
        'deleting daemonset "pod-checkpointer"',
        "retrying error: found 1 active pod checkpoints: ['pod-checkpointer-x-cp-1']",
        "removing self-hosted initialized key",
        'deleting daemonset "kube-scheduler"',
    ):
        assert expected in text
    assert lines[-1] == "conversion process completed successfully"
    assert env.daemonsets == set()
    configs = [machine_config.load(c).model.cluster for c in env.configs.values()]
    assert all(c.api_server_image == "example.org/kube-apiserver:v1.20.2" for c in configs)
    # Every node gets the same aggregator CA (one minted for the whole run).
    assert len({c.aggregator_ca.crt for c in configs if c.aggregator_ca}) == 1


def test_no_at_first_prompt_changes_nothing_after_the_patch() -> None:
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES})
    with pytest.raises(convert.Aborted):
        _run(env, answers=[False], force=False)
    assert convert.CHECKPOINTER in env.daemonsets and env.self_hosted_flag


def test_no_at_second_prompt_keeps_self_hosted() -> None:
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES})
    with pytest.raises(convert.Aborted):
        _run(env, answers=[True, False], force=False)
    assert env.self_hosted_flag and set(convert.COMPONENTS) <= env.daemonsets


def test_rerun_after_partial_patch_reuses_the_aggregator_ca() -> None:
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES}, fail_apply_after=1)
    with pytest.raises(plan.StepFailed) as caught:
        _run(env)
    assert isinstance(caught.value.cause, RuntimeError)
    assert "step 2/8 failed: patch machine config on node 10.0.0.3: simulated kill" in str(caught.value)
    first = machine_config.load(env.configs["10.0.0.2"]).model.cluster.aggregator_ca
    assert first is not None
    env.fail_apply_after = None
    lines = _run(env)
    assert "reusing the aggregator CA already patched into a control plane machine config" in lines
    # The node the first run patched is found done; only the other one is patched again.
    assert 'master node "10.0.0.2" configuration is already patched' in lines
    assert 'patching master node "10.0.0.2" configuration' not in lines
    for text in env.configs.values():
        ca = machine_config.load(text).model.cluster.aggregator_ca
        assert ca is not None and ca.crt == first.crt


def test_rerun_after_key_removal_skips_to_daemonset_replacement() -> None:
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES}, self_hosted_flag=False)
    env.daemonsets.discard("kube-apiserver")
    lines = _run(env)
    assert "current self-hosted status: false" in lines
    assert "gathering control plane configuration" not in lines
    assert lines[-1] == "conversion process completed successfully"


def test_a_rerun_says_which_daemonsets_an_earlier_run_deleted() -> None:
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES}, self_hosted_flag=False)
    env.daemonsets.discard("kube-apiserver")
    env.daemonsets.discard("kube-controller-manager")
    lines = _run(env)
    assert 'daemonset "kube-controller-manager" was already deleted' in lines
    assert 'deleting daemonset "kube-scheduler"' in lines
    assert 'daemonset "kube-scheduler" was already deleted' not in lines
    assert lines[-1] == "conversion process completed successfully"


def test_refuses_persist_false() -> None:
    env = FakeEnv(configs={ip: _config(persist=False) for ip, _ in NODES})
    with pytest.raises(PreflightError, match="persist: false"):
        _run(env)
    assert env.applied == []


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConnectionRefusedError("refused"), True),
        (KubeUnavailable("(503) Service Unavailable"), True),
        (NodeUnavailable("node 10.0.0.2: no answer (UNAVAILABLE)"), True),
        (EOFError(), True),
        (KubeNotFound("GET /api/v1/nodes/x: 404 Not Found", status=404), False),
        (ValueError("bad"), False),
    ],
)
def test_retryable(error: BaseException, expected: bool) -> None:
    assert convert.retryable(error) is expected


def test_decoded_service_account_key_is_patched() -> None:
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES})
    _run(env)
    sa: Any = machine_config.load(env.configs["10.0.0.2"]).model.cluster.service_account
    assert base64.b64decode(sa.key).startswith(b"-----BEGIN EC PRIVATE KEY-----")


def test_pods_of_deleted_daemonsets_are_deleted_not_left_to_the_garbage_collector() -> None:
    # On a real cluster they survived: the collector runs in the controller manager being replaced,
    # and a surviving pod holds its host ports, so the static pod replacing it crash-loops.
    pods = {f"{component}-abcde": (component, "cp-1") for component in convert.COMPONENTS}
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES}, daemonset_pods=dict(pods))
    lines = _run(env)
    assert sorted(env.deleted_pods) == sorted(pods)
    # The API server's pod goes with its grace period, after its DaemonSet went leaving it running.
    assert env.gracefully_deleted == ["kube-apiserver-abcde"]
    assert env.orphaned == ["kube-apiserver"]
    # The other two go before the static pods are released: theirs start on free ports.
    assert env.events == [
        "force-delete kube-controller-manager-abcde",
        "force-delete kube-scheduler-abcde",
        "remove key",
        "delete kube-apiserver-abcde",
    ]
    assert 'waiting for pods of daemonset "kube-controller-manager" to terminate' in lines
    assert lines[-1] == "conversion process completed successfully"


def test_a_static_pod_in_crash_loop_back_off_gets_its_kubelet_restarted() -> None:
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES}, crashing={("10.0.0.3", "kube-scheduler")})
    lines = _run(env)
    assert env.restarted == ["10.0.0.3"]
    assert (
        'restarting kubelet on node "10.0.0.3" to start its kube-scheduler static pod without waiting '
        "out the crash-loop back-off"
    ) in lines
    assert lines[-1] == "conversion process completed successfully"


def test_the_kubelet_restart_waits_for_the_old_container_to_free_the_ports() -> None:
    env = FakeEnv(
        configs={ip: _config() for ip, _ in NODES},
        crashing={("10.0.0.2", "kube-apiserver")},
        old_running={("10.0.0.2", "kube-apiserver"): 3},
    )
    lines = _run(env)
    assert env.restarted == ["10.0.0.2"]  # restart_kubelet asserts the old container had stopped
    assert any("10.0.0.2: kube-apiserver still runs in ['kube-apiserver-zyxwv']" in line for line in lines)


def test_an_old_container_that_never_stops_fails_naming_the_node() -> None:
    env = FakeEnv(
        configs={ip: _config() for ip, _ in NODES},
        crashing={("10.0.0.3", "kube-apiserver")},
        old_running={("10.0.0.3", "kube-apiserver"): 10**6},
    )
    converter = convert.Converter(
        env,
        options=convert.Options(force=True, interval=0, checkpoint_interval=0, graceful_stop_timeout=0.05),
        echo=lambda _: None,
        confirm=lambda _: True,
    )
    with pytest.raises(plan.StepFailed, match=r'old kube-apiserver containers on node "10.0.0.3"') as caught:
        asyncio.run(converter.run(resume="kubeplane convert-k8s --force"))
    assert isinstance(caught.value.cause, WaitTimeout)
    assert "re-run `kubeplane convert-k8s --force` to continue" in str(caught.value)
    assert env.restarted == []


def test_the_plan_lists_every_step_from_read_calls_only() -> None:
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES})
    before = (dict(env.configs), set(env.daemonsets), env.self_hosted_flag)
    options = convert.Options(force=False, interval=0, checkpoint_interval=0)
    converter = convert.Converter(env, options=options, echo=print, confirm=lambda _: False)
    plan = asyncio.run(converter.plan())
    kinds = [(step.kind, step.component, step.node) for step in plan.steps]
    assert kinds == [
        *(("patch", "machine config", ip) for ip, _ in NODES),
        ("disable", convert.CHECKPOINTER, ""),
        ("remove", "etcd key 'initialized'", ""),
        *(("hand over", "kube-apiserver", ip) for ip, _ in NODES),
        ("replace", "kube-controller-manager", ""),
        ("replace", "kube-scheduler", ""),
    ]
    last = plan.steps[-1]
    assert (last.current, last.target) == ("DaemonSet", f"static pods on {len(NODES)} nodes")
    assert any("asks before disabling pod-checkpointer" in note for note in plan.notes)
    assert (dict(env.configs), set(env.daemonsets), env.self_hosted_flag) == before
    assert env.applied == env.deleted_pods == env.restarted == []
    # Once the key is gone only the hand-over is left, and the plan says so.
    env.self_hosted_flag = False
    env.daemonsets.discard("kube-scheduler")
    rest = asyncio.run(converter.plan())
    assert [(s.kind, s.component, s.current) for s in rest.steps] == [
        *(("hand over", "kube-apiserver", "DaemonSet pod") for _ in NODES),
        ("replace", "kube-controller-manager", "DaemonSet"),
        ("replace", "kube-scheduler", "no DaemonSet"),
    ]


def test_api_servers_are_handed_over_one_node_at_a_time_out_of_the_rotation() -> None:
    pods = {
        f"kube-apiserver-{suffix}": ("kube-apiserver", node)
        for suffix, (_, node) in zip("ab", NODES, strict=True)
    }
    env = FakeEnv(
        configs={ip: _config() for ip, _ in NODES},
        daemonset_pods=dict(pods),
        crashing={(address, "kube-apiserver") for address, _ in NODES},
    )
    lines = _run(env, rotation=FakeRotation(env))
    # Each node leaves the rotation, loses its old pod (graceful), gets its static pod (kubelet
    # restarted out of the back-off) and comes back before the next node's turn.
    assert env.events == [
        "remove key",
        "drain 10.0.0.2",
        "delete kube-apiserver-a",
        "restore 10.0.0.2",
        "drain 10.0.0.3",
        "delete kube-apiserver-b",
        "restore 10.0.0.3",
    ]
    assert env.restarted == ["10.0.0.2", "10.0.0.3"]
    assert env.orphaned == ["kube-apiserver"]
    assert "taking node cp-1 out of the load balancer rotation" in lines
    assert lines[-1] == "conversion process completed successfully"


def test_a_rerun_skips_nodes_handed_over_and_puts_them_back_in_the_rotation() -> None:
    # A run killed between a node's static pod becoming Ready and its return to the rotation.
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES}, self_hosted_flag=False)
    rotation = FakeRotation(env, drained={"10.0.0.2"})
    lines = _run(env, rotation=rotation)
    assert env.events == ["restore 10.0.0.2", "restore 10.0.0.3"]
    assert rotation.drained == set()
    assert 'node "10.0.0.2" already serves the API from its static pod' in lines
    assert env.gracefully_deleted == [] and env.restarted == []


def test_the_last_api_server_serving_is_not_taken_out_of_the_rotation() -> None:
    env = FakeEnv(
        configs={ip: _config() for ip, _ in NODES},
        daemonset_pods={"kube-apiserver-a": ("kube-apiserver", "cp-1")},
    )
    rotation = FakeRotation(env, drained={"10.0.0.3"})
    lines = _run(env, rotation=rotation)
    assert "drain 10.0.0.2" not in env.events
    assert "keeping node cp-1 in the load balancer rotation: no other API server is serving" in lines


def test_a_rerun_after_the_two_daemonsets_went_removes_the_key_without_asking_again() -> None:
    # The run that was told yes deleted kube-controller-manager's and kube-scheduler's DaemonSets
    # and was killed before the key went: asking again could leave the cluster without both.
    env = FakeEnv(configs={ip: _config() for ip, _ in NODES})
    env.daemonsets -= {"kube-controller-manager", "kube-scheduler", convert.CHECKPOINTER}
    env.checkpoint_rounds = 0
    lines = _run(env, answers=[True], force=False)
    assert "confirm applying static pod definitions and manifests [yes/no]: " not in lines
    assert any(
        "DaemonSets are already gone: applying the static pods was confirmed" in line for line in lines
    )
    assert not env.self_hosted_flag
    # Only the first question was asked (the prompts asked come last in the lines).
    assert lines[-2:] == [
        "conversion process completed successfully",
        "confirm disabling pod-checkpointer to proceed with control plane update [yes/no]: ",
    ]


def test_a_static_pod_not_started_yet_is_waited_for_without_a_kubelet_restart() -> None:
    # The node's agent held its static kube-apiserver back while the old pod had the port: no
    # container yet is not a crash-loop, the kubelet starts it as soon as its file is written.
    env = FakeEnv(
        configs={ip: _config() for ip, _ in NODES},
        daemonset_pods={"kube-apiserver-a": ("kube-apiserver", "cp-1")},
        unstarted={("10.0.0.2", "kube-apiserver")},
    )
    lines = _run(env, rotation=FakeRotation(env))
    assert env.restarted == []
    assert env.gracefully_deleted == ["kube-apiserver-a"]
    assert lines[-1] == "conversion process completed successfully"
