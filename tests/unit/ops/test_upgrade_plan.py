"""upgrade-k8s: versions, paths, image repositories, config patches, preflight checks and the plan."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from ops_fakes import NODES, FakeCluster

from kubeplane.ops import upgrade, versions
from kubeplane.ops.errors import PreflightError

pytestmark = pytest.mark.unit

V = versions.Version.parse


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v1.20.2", versions.Version(1, 20, 2)),
        ("1.20.2", versions.Version(1, 20, 2)),
        ("v1.20.2-kp.1", versions.Version(1, 20, 2, "-kp.1")),
    ],
)
def test_versions_parse(text: str, expected: versions.Version) -> None:
    assert V(text) == expected
    assert V(text).tag == ("v" + text.removeprefix("v"))


@pytest.mark.parametrize("text", ["1.20", "latest", "v1.20.x", "", "v1.20.2 ; rm"])
def test_malformed_versions_are_refused(text: str) -> None:
    with pytest.raises(PreflightError, match="malformed"):
        V(text)


@pytest.mark.parametrize(
    ("source", "target"), [("v1.20.1", "v1.20.4"), ("v1.20.2", "v1.20.2-kp.1"), ("1.20.9", "1.21.0")]
)
def test_supported_paths(source: str, target: str) -> None:
    versions.check_path(V(source), V(target))


@pytest.mark.parametrize(("source", "target"), [("v1.20.2", "v1.22.0"), ("v1.20.2", "v2.20.2")])
def test_unsupported_paths(source: str, target: str) -> None:
    with pytest.raises(PreflightError, match="unsupported upgrade path"):
        versions.check_path(V(source), V(target))


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("k8s.gcr.io/kube-apiserver:v1.20.2", "k8s.gcr.io/kube-apiserver:v1.20.2-kp.1"),
        ("10.5.0.1:6000/mirror/kube-apiserver:v1.20.2", "10.5.0.1:6000/mirror/kube-apiserver:v1.20.2-kp.1"),
        ("registry.local:5000/kube-apiserver", "registry.local:5000/kube-apiserver:v1.20.2-kp.1"),
        ("k8s.gcr.io/kube-apiserver:v1.20.2@sha256:abc", "k8s.gcr.io/kube-apiserver:v1.20.2-kp.1"),
    ],
)
def test_retag_keeps_the_repository(image: str, expected: str) -> None:
    assert versions.retag(image, V("v1.20.2-kp.1")) == expected


def test_image_version_needs_a_tag() -> None:
    assert versions.image_version("r:5000/kube-apiserver:v1.20.2-kp.1") == V("v1.20.2-kp.1")
    with pytest.raises(PreflightError, match="pass --from"):
        versions.image_version("r:5000/kube-apiserver")


def test_image_patch_adds_missing_sections_and_replaces_existing_keys() -> None:
    path = upgrade.IMAGE_PATHS[upgrade.APISERVER]
    assert versions.image_patch({"cluster": {}}, path, "x") == [
        {"op": "add", "path": "/cluster/apiServer", "value": {"image": "x"}}
    ]
    assert versions.image_patch({"cluster": {"apiServer": {"certSANs": []}}}, path, "x") == [
        {"op": "add", "path": "/cluster/apiServer/image", "value": "x"}
    ]
    assert versions.image_patch({"cluster": {"apiServer": {"image": "y"}}}, path, "x") == [
        {"op": "replace", "path": "/cluster/apiServer/image", "value": "x"}
    ]


def _prepare(cluster: FakeCluster, **options: Any) -> upgrade.Observed:
    return asyncio.run(
        upgrade.prepare(
            options=upgrade.Options(**{"to": "v1.20.2-kp.1", **options}), node_api=cluster, kube=cluster
        )
    )


def test_plan_order_components_then_proxy_then_kubelets(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    plan = upgrade.build_plan(_prepare(cluster, upgrade_kubelet=True, sync_manifests=True))
    keys = [(step.kind, step.component, step.node) for step in plan.steps]
    addresses = [node.address for node in NODES]
    cp = addresses[:3]
    assert keys == [
        *(("pre-pull", "images", address) for address in addresses),
        *(("static-pod", "kube-apiserver", address) for address in cp),
        *(("static-pod", "kube-controller-manager", address) for address in cp),
        *(("static-pod", "kube-scheduler", address) for address in cp),
        ("daemonset", "kube-proxy", ""),
        *(("kubelet", "kubelet", address) for address in addresses),
        ("manifests", "bootstrap-manifests", cp[0]),
    ]
    apiserver = plan.steps[4]
    assert (apiserver.current, apiserver.target) == (
        "k8s.gcr.io/kube-apiserver:v1.20.2",
        "k8s.gcr.io/kube-apiserver:v1.20.2-kp.1",
    )
    # A worker pulls only kube-proxy; a control plane node every component and kube-proxy.
    assert plan.steps[3].target == "k8s.gcr.io/kube-proxy:v1.20.2-kp.1"
    assert len(plan.steps[0].target.split(",")) == 4
    assert "upgrade Kubernetes v1.20.2 -> v1.20.2-kp.1" in plan.render()


def test_plan_keeps_a_custom_registry(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated, repository="10.5.0.1:6000/mirror")
    plan = upgrade.build_plan(_prepare(cluster, pre_pull=False))
    assert plan.steps[0].target == "10.5.0.1:6000/mirror/kube-apiserver:v1.20.2-kp.1"
    assert all(step.target.startswith("10.5.0.1:6000/mirror/") for step in plan.steps)
    assert all(step.kind != "kubelet" for step in plan.steps)


def test_plan_marks_steps_already_at_the_target(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    cluster.kcpc[("10.5.0.2", "kube-apiserver")] = upgrade.ComponentConfig(
        3, "k8s.gcr.io/kube-apiserver:v1.20.2-kp.1"
    )
    plan = upgrade.build_plan(_prepare(cluster, pre_pull=False, source="v1.20.2"))
    assert plan.steps[0].up_to_date and not plan.steps[1].up_to_date
    assert "(already at target)" in plan.render().splitlines()[1]


def test_plan_without_kube_proxy_daemonset_says_so(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated, with_proxy=False)
    plan = upgrade.build_plan(_prepare(cluster, pre_pull=False))
    assert plan.steps[-1].component == "kube-proxy"
    assert any("kube-system/kube-proxy not found" in note for note in plan.notes)


def test_source_is_detected_from_the_first_apiserver_image(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated, version="v1.19.4")
    assert _prepare(cluster, to="v1.20.2").source == V("v1.19.4")
    with pytest.raises(PreflightError, match=r"unsupported upgrade path: v1.19.4 -> v1.21.0"):
        _prepare(cluster, to="v1.21.0")


def test_unreachable_node_fails_before_any_change(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    cluster.unreachable.add("10.5.0.4")
    with pytest.raises(PreflightError) as caught:
        _prepare(cluster)
    assert "cp-3 (10.5.0.4): connection refused" in str(caught.value)
    assert "nothing was changed" in str(caught.value)
    assert cluster.events == []


def test_malformed_target_fails_before_touching_the_cluster(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    cluster.unreachable.update(node.address for node in NODES)
    with pytest.raises(PreflightError, match="malformed target version"):
        _prepare(cluster, to="v1.20")


def test_no_control_plane_nodes_is_an_error(
    generated: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = FakeCluster(generated)

    async def workers() -> list[upgrade.ClusterNode]:
        return [NODES[3]]

    monkeypatch.setattr(cluster, "nodes", workers)
    with pytest.raises(PreflightError, match="no control plane nodes found"):
        _prepare(cluster)


def test_the_node_to_talk_through_must_be_a_kubernetes_node(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    with pytest.raises(PreflightError, match=r"10\.9\.9\.9 given with -n are not Kubernetes Nodes"):
        _prepare(cluster, via=("10.9.9.9",))


def test_one_node_given_with_n_still_plans_every_control_plane_node(generated: Mapping[str, Any]) -> None:
    # The upgrade guide's form, `upgrade-k8s -n <master node> --to ...`: -n names the node to
    # talk through. It crashed on a 3-node control plane with KeyError in the image lookup.
    cluster = FakeCluster(generated)
    observed = _prepare(cluster, via=("10.5.0.3",))
    assert [node.name for node in observed.control_plane] == ["cp-1", "cp-2", "cp-3"]
    plan = upgrade.build_plan(observed)
    static = {(step.component, step.node) for step in plan.steps if step.kind == upgrade.KIND_STATIC_POD}
    assert static == {(c, n.address) for c in upgrade.COMPONENTS for n in NODES if n.control_plane}
    pulled = {step.node for step in plan.steps if step.kind == upgrade.KIND_PULL}
    assert pulled == {n.address for n in NODES}


@pytest.mark.parametrize(("running", "target"), [("v1.20.2", "v1.20.1"), ("v1.21.0", "v1.20.9")])
def test_an_older_target_is_refused_unless_asked_for(running: str, target: str) -> None:
    with pytest.raises(PreflightError, match=r"refusing to downgrade.*--allow-downgrade"):
        versions.check_path(versions.Version.parse(running), versions.Version.parse(target))
    versions.check_path(versions.Version.parse(running), versions.Version.parse(target), allow_downgrade=True)


def test_a_second_build_of_the_same_release_is_no_downgrade() -> None:
    versions.check_path(versions.Version.parse("v1.20.2-kp.1"), versions.Version.parse("v1.20.2"))
    with pytest.raises(PreflightError, match="unsupported upgrade path"):
        versions.check_path(
            versions.Version.parse("v1.22.0"), versions.Version.parse("v1.20.0"), allow_downgrade=True
        )


def test_kubernetes_api_unreachable_fails_before_any_change(generated: Mapping[str, Any]) -> None:
    cluster = FakeCluster(generated)
    cluster.kube_errors.append(ConnectionRefusedError("connection refused: 10.5.0.1:6443"))
    with pytest.raises(PreflightError, match="cannot list Kubernetes Nodes through the Kubernetes API"):
        _prepare(cluster)
    assert cluster.events == []
