"""Pure etcd rules: flags, join plans, leave and bootstrap refusals; the node's CNI config."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplane.clients.etcd import Member
from kubeplane.services import etcd as rules

pytestmark = pytest.mark.unit

CERTS = rules.EtcdCerts.under(Path("/n/system/secrets/etcd"))


def member(id_: int, name: str, ip: str, *, learner: bool = False) -> Member:
    return Member(
        id=id_,
        name=name,
        peer_urls=[rules.peer_url(ip)],
        client_urls=[rules.client_url(ip)] if name else [],
        is_learner=learner,
    )


def test_bootstrap_args_start_a_single_member_cluster_with_tls_everywhere() -> None:
    args = rules.render_args(
        name="cp1",
        node_ip="10.5.0.2",
        data_dir=Path("/n/var/lib/etcd"),
        certs=CERTS,
        initial_cluster={"cp1": rules.peer_url("10.5.0.2")},
        extra_args={"election-timeout": "5000", "advertise-client-urls": "https://cp1:2379"},
    )
    flags = dict(arg[2:].split("=", 1) for arg in args)
    assert flags["listen-client-urls"] == "https://10.5.0.2:2379,https://127.0.0.1:2379"
    assert flags["listen-peer-urls"] == "https://10.5.0.2:2380"
    assert flags["initial-cluster"] == "cp1=https://10.5.0.2:2380"
    assert flags["initial-cluster-state"] == "new"
    assert flags["client-cert-auth"] == flags["peer-client-cert-auth"] == "true"
    assert flags["pre-vote"] == "true", "a member that was cut off does not depose the leader"
    assert flags["trusted-ca-file"] == flags["peer-trusted-ca-file"] == "/n/system/secrets/etcd/ca.crt"
    # extra args replace rendered flags and add new ones
    assert flags["advertise-client-urls"] == "https://cp1:2379"
    assert flags["election-timeout"] == "5000"
    assert len(args) == len(flags)


def test_restart_args_carry_no_initial_cluster() -> None:
    args = rules.render_args(name="cp1", node_ip="10.5.0.2", data_dir=Path("/d"), certs=CERTS)
    assert not any(arg.startswith(("--initial-cluster=", "--initial-cluster-state")) for arg in args)


def test_join_adds_a_member_and_lists_started_members_only() -> None:
    members = [member(1, "cp1", "10.5.0.2"), member(2, "", "10.5.0.9")]
    plan = rules.plan_join(members, name="cp2", peer=rules.peer_url("10.5.0.3"))
    assert plan.add
    assert plan.initial_cluster == {"cp1": "https://10.5.0.2:2380", "cp2": "https://10.5.0.3:2380"}


def test_join_replaces_a_member_with_our_name_and_reuses_our_unstarted_peer_url() -> None:
    peer = rules.peer_url("10.5.0.3")
    # Our name is in the list but we are joining (empty data dir): that member's log is lost.
    by_name = rules.plan_join(
        [member(1, "cp1", "10.5.0.2"), member(7, "cp2", "10.5.0.3")], name="cp2", peer=peer
    )
    assert (by_name.remove, by_name.reuse, by_name.add) == (7, None, True)
    assert by_name.initial_cluster == {"cp1": "https://10.5.0.2:2380", "cp2": peer}
    by_url = rules.plan_join([member(1, "cp1", "10.5.0.2"), member(8, "", "10.5.0.3")], name="cp2", peer=peer)
    assert by_url.reuse == 8
    assert by_url.initial_cluster == {"cp1": "https://10.5.0.2:2380", "cp2": peer}


@pytest.mark.parametrize(
    ("names", "healthy", "refused"),
    [
        (["a"], {1}, "only etcd member"),
        (["a", "b"], {1, 2}, None),
        (["a", "b", "c"], {1, 2, 3}, None),
        (["a", "b", "c"], {1, 2}, "below the quorum"),  # c is down: a and c left, 1 healthy of 2
        (["a", "b", "c", "d", "e"], {1, 2, 3, 4}, None),
        (["a", "b", "c", "d", "e"], {1, 2, 3}, "below the quorum"),
    ],
)
def test_leave_keeps_a_healthy_quorum(names: list[str], healthy: set[int], refused: str | None) -> None:
    members = [member(i + 1, name, f"10.5.0.{i + 2}") for i, name in enumerate(names)]
    reason = rules.leave_refusal(members, leaving=2 if len(names) > 1 else 1, healthy=healthy)
    assert (reason is None) if refused is None else (reason is not None and refused in reason)


def test_learners_do_not_count_towards_quorum() -> None:
    members = [
        member(1, "a", "10.5.0.2"),
        member(2, "b", "10.5.0.3"),
        member(3, "c", "10.5.0.4", learner=True),
    ]
    assert "only etcd member" not in (rules.leave_refusal(members, leaving=2, healthy={1, 3}) or "")
    assert rules.leave_refusal(members, leaving=1, healthy={2, 3}) is None


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"control_plane": False}, "worker"),
        ({"bootstrapped": True}, "already bootstrapped"),
        ({"has_data": True}, "data directory is not empty"),
        ({"other_cluster": "the control plane endpoint https://x:6443 answers"}, "another node"),
        ({}, None),
    ],
)
def test_bootstrap_refusals(kwargs: dict[str, object], reason: str | None) -> None:
    facts: dict[str, object] = {
        "control_plane": True,
        "bootstrapped": False,
        "has_data": False,
        "other_cluster": None,
    }
    result = rules.bootstrap_refusal(**{**facts, **kwargs})  # type: ignore[arg-type]
    assert (result is None) if reason is None else (result is not None and reason in result)


@pytest.mark.parametrize(
    ("names", "healthy", "refused"),
    [
        (["a"], {1}, "below the quorum of 1"),  # a single member: its cluster stops
        (["a", "b"], {1, 2}, "below the quorum of 2"),  # two voters need both
        (["a", "b", "c"], {1, 2, 3}, None),
        (["a", "b", "c"], {1, 2}, "below the quorum of 2"),  # c is down already
        (["a", "b", "c", "d", "e"], {1, 2, 3, 4}, None),
    ],
)
def test_an_upgrade_keeping_data_may_stop_a_member_only_with_a_healthy_quorum(
    names: list[str], healthy: set[int], refused: str | None
) -> None:
    """The member stays in the cluster while it is down: the quorum counts every voter."""
    members = [member(i + 1, name, f"10.5.0.{i + 2}") for i, name in enumerate(names)]
    reason = rules.outage_refusal(members, stopping=2 if len(names) > 1 else 1, healthy=healthy)
    assert (reason is None) if refused is None else (reason is not None and refused in reason)


def test_learners_do_not_keep_a_quorum_while_a_member_is_down() -> None:
    members = [
        member(1, "a", "10.5.0.2"),
        member(2, "b", "10.5.0.3"),
        member(3, "c", "10.5.0.4", learner=True),
    ]
    assert "below the quorum of 2" in (rules.outage_refusal(members, stopping=2, healthy={1, 2, 3}) or "")
