"""The node's etcd joins as a learner, is promoted once caught up, and never reuses a lost member.

A small fake of etcd's JSON gateway (behind :class:`httpx.MockTransport`) keeps the member list
and answers the way etcd 3.4 does: a learner serves no cluster calls or linearizable reads, and
promotion is refused while the learner is behind.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kubeplane import config
from kubeplane.agent import etcd as agent_etcd
from kubeplane.clients import errors
from kubeplane.clients import etcd as etcd_client
from kubeplane.config import generate as gen
from kubeplane.config.paths import NodePaths
from kubeplane.fileio import write_atomic
from kubeplane.pki import certs as pki_certs
from kubeplane.services import etcd as etcd_rules

pytestmark = pytest.mark.unit

DOCUMENTS = gen.generate(
    gen.GenOptions(cluster_name="unit", endpoint="https://10.5.0.1:6443"), gen.new_secrets()
).documents
LOCAL = "127.0.0.1"
PEER = etcd_rules.peer_url("10.5.0.3")
VOTER = etcd_rules.client_url("10.5.0.2")
NOT_IN_SYNC = "etcdserver: can only promote a learner member which is in sync with leader"


@dataclasses.dataclass
class FakeMember:
    id: int
    name: str
    peer: str
    learner: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"ID": str(self.id), "peerURLs": [self.peer]}
        if self.name:
            data["name"] = self.name
            data["clientURLs"] = [self.peer.replace(":2380", ":2379")]
        if self.learner:
            data["isLearner"] = True
        return data


@dataclasses.dataclass
class FakeEtcd:
    """The cluster as the gateway shows it; ``local`` is the member behind 127.0.0.1 (if any)."""

    members: list[FakeMember]
    local: int | None = None
    #: Promotions etcd refuses before the learner counts as caught up.
    behind: int = 0
    next_id: int = 0x100
    #: Members whose status requests fail (stopped).
    down: set[int] = dataclasses.field(default_factory=set)
    calls: list[tuple[str, str, dict[str, Any]]] = dataclasses.field(default_factory=list)

    def member(self, member_id: int) -> FakeMember | None:
        return next((m for m in self.members if m.id == member_id), None)

    def respond(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        body = json.loads(request.content)
        self.calls.append((host, path, body))
        local = self.member(self.local) if self.local is not None else None
        if host == LOCAL and path == "/v3/maintenance/status":
            assert local is not None, "no etcd runs on this node yet"
            return ok({"header": {"member_id": str(local.id)}, "isLearner": local.learner, "leader": "1"})
        if path == "/v3/maintenance/status" and host != LOCAL:  # a voting member; 1 leads
            answering = next((m for m in self.members if f"//{host}:" in m.peer), None)
            if answering is not None and answering.id in self.down:
                return failure(14, "connection refused")
            member_id = answering.id if answering is not None else 1
            return ok({"header": {"member_id": str(member_id)}, "isLearner": False, "leader": "1"})
        if host == LOCAL and local is not None and local.learner:
            return failure(14, "etcdserver: rpc not supported for learner")
        if path == "/v3/kv/range":
            return ok({"header": {"revision": "5"}})
        if path == "/v3/cluster/member/list":
            return ok({"members": [m.to_json() for m in self.members]})
        if path == "/v3/cluster/member/remove":
            found = self.member(int(body["ID"]))
            if found is None:
                return failure(5, "etcdserver: member not found")
            self.members.remove(found)
            return ok({})
        if path == "/v3/cluster/member/add":
            if any(body["peerURLs"][0] == m.peer for m in self.members):
                return failure(9, "etcdserver: Peer URLs already exists")
            self.next_id += 1
            added = FakeMember(self.next_id, "", body["peerURLs"][0], learner=bool(body.get("isLearner")))
            self.members.append(added)
            return ok({"member": added.to_json()})
        if path == "/v3/cluster/member/promote":
            found = self.member(int(body["ID"]))
            if found is None:
                return failure(5, "etcdserver: member not found")
            if not found.learner:
                return failure(9, "etcdserver: can only promote a learner member")
            if self.behind:
                self.behind -= 1
                return failure(9, NOT_IN_SYNC)
            found.learner = False
            return ok({})
        return failure(12, f"fake etcd does not serve {path}")

    def requests(self, path: str) -> list[dict[str, Any]]:
        return [body for _, called, body in self.calls if called == path]


def ok(data: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json={"header": {"revision": "5"}, **data})


def failure(code: int, message: str) -> httpx.Response:
    return httpx.Response(
        400 if code != 14 else 503, json={"error": message, "message": message, "code": code}
    )


def cluster(*extra: FakeMember) -> FakeEtcd:
    return FakeEtcd(members=[FakeMember(1, "cp1", etcd_rules.peer_url("10.5.0.2")), *extra])


def client(fake: FakeEtcd, endpoints: list[str]) -> etcd_client.EtcdClient:
    return etcd_client.EtcdClient(endpoints, transport=httpx.MockTransport(fake.respond))


def joined(fake: FakeEtcd) -> etcd_rules.JoinPlan:
    async def scenario() -> etcd_rules.JoinPlan:
        async with client(fake, [VOTER]) as etcd:
            return await agent_etcd.join(etcd, name="cp2", peer=PEER)

    return asyncio.run(scenario())


def refusing_adds(fake: FakeEtcd, message: str, times: int, *, code: int = 9) -> None:
    """Make etcd refuse the next ``times`` member adds with ``message`` (gRPC ``code``, by default
    FailedPrecondition)."""
    respond = fake.respond
    refusals = [message] * times

    def refusing(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v3/cluster/member/add" and refusals:
            fake.calls.append((request.url.host, request.url.path, json.loads(request.content)))
            return failure(code, refusals.pop())
        return respond(request)

    fake.respond = refusing  # type: ignore[method-assign]


def test_a_new_member_is_added_as_a_learner() -> None:
    fake = cluster()
    plan = joined(fake)
    assert fake.requests("/v3/cluster/member/add") == [{"peerURLs": [PEER], "isLearner": True}]
    assert fake.requests("/v3/cluster/member/remove") == []
    assert plan.initial_cluster == {"cp1": "https://10.5.0.2:2380", "cp2": PEER}
    assert [(m.peer, m.learner) for m in fake.members][1:] == [(PEER, True)]


def test_a_member_with_our_name_whose_data_is_lost_is_removed_then_added_anew() -> None:
    fake = cluster(FakeMember(7, "cp2", PEER))
    plan = joined(fake)
    assert fake.requests("/v3/cluster/member/remove") == [{"ID": "7"}]
    assert fake.requests("/v3/cluster/member/add") == [{"peerURLs": [PEER], "isLearner": True}]
    [ours] = [m for m in fake.members if m.peer == PEER]
    assert ours.id != 7 and ours.learner
    assert plan.initial_cluster == {"cp1": "https://10.5.0.2:2380", "cp2": PEER}
    # Retrying after a partial failure (the removal went through, the add did not) just adds.
    fake.members.remove(ours)
    joined(fake)
    assert fake.requests("/v3/cluster/member/remove") == [{"ID": "7"}]
    assert len(fake.requests("/v3/cluster/member/add")) == 2


def test_an_add_refused_as_member_not_found_while_membership_settles_is_retried() -> None:
    # etcd answered "member not found" to the add right after removing a member that had just
    # been killed (seen in the integration test); the join must be retried, not given up.
    fake = cluster(FakeMember(7, "cp2", PEER))
    refusing_adds(fake, "etcdserver: member not found", times=1, code=5)
    with pytest.raises(errors.EtcdUnavailable) as caught:
        joined(fake)
    assert caught.value.retryable and "membership is changing" in str(caught.value)
    joined(fake)
    assert [m.peer for m in fake.members if m.learner] == [PEER]


def test_a_member_of_ours_that_never_started_is_reused() -> None:
    fake = cluster(FakeMember(8, "", PEER, learner=True))
    plan = joined(fake)
    assert plan.reuse == 8
    assert fake.requests("/v3/cluster/member/add") == fake.requests("/v3/cluster/member/remove") == []


def etcd_member(tmp_path: Path, fake: FakeEtcd, monkeypatch: pytest.MonkeyPatch) -> agent_etcd.EtcdMember:
    document = copy.deepcopy(DOCUMENTS["controlplane"])
    member = agent_etcd.EtcdMember(
        paths=NodePaths(tmp_path),
        document=config.load(yaml.safe_dump(document)),
        name="cp2",
        node_ip="10.5.0.3",
    )
    for path in member.certs.all():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not read: the fake transport needs no TLS")
    discovered: list[str] = []

    async def discover() -> list[str]:
        discovered.append(VOTER)
        return [VOTER]

    monkeypatch.setattr(member, "discover", discover)
    monkeypatch.setattr(
        member, "client", lambda endpoints=None: client(fake, endpoints or [etcd_rules.client_url(LOCAL)])
    )
    return member


def flags(args: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in args)


def test_pre_start_with_an_empty_data_dir_never_restarts_the_lost_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = cluster(FakeMember(7, "cp2", PEER))
    member = etcd_member(tmp_path, fake, monkeypatch)
    asyncio.run(member._prepare())
    assert fake.requests("/v3/cluster/member/remove") == [{"ID": "7"}]
    assert member._args is not None
    args = flags(member._args)
    assert args["initial-cluster-state"] == "existing"
    assert args["initial-cluster"] == f"cp1=https://10.5.0.2:2380,cp2={PEER}"


def test_pre_start_asks_again_while_another_learner_joins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = cluster()
    refusing_adds(fake, "etcdserver: too many learner members in cluster", times=3)
    member = etcd_member(tmp_path, fake, monkeypatch)
    monkeypatch.setattr(agent_etcd, "JOIN_POLL", 0.01)
    asyncio.run(member._prepare())
    assert len(fake.requests("/v3/cluster/member/add")) == 4, "three refusals, then the add"
    assert [(m.peer, m.learner) for m in fake.members][1:] == [(PEER, True)]
    assert member._args is not None and flags(member._args)["initial-cluster-state"] == "existing"


def test_pre_start_fails_with_the_reason_when_the_cluster_does_not_settle_or_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = cluster()
    refusing_adds(fake, "etcdserver: too many learner members in cluster", times=1000)
    member = etcd_member(tmp_path, fake, monkeypatch)
    monkeypatch.setattr(agent_etcd, "JOIN_POLL", 0.01)
    monkeypatch.setattr(agent_etcd, "JOIN_POLL_WINDOW", 0.1)
    with pytest.raises(agent_etcd.EtcdNotReady, match=r"joining etcd at .*too many learner members"):
        asyncio.run(member._prepare())
    # A refusal that does not clear by itself fails at once, without asking again.
    fake = cluster(FakeMember(9, "other", PEER))  # our peer URL under another name
    member = etcd_member(tmp_path, fake, monkeypatch)
    with pytest.raises(agent_etcd.EtcdNotReady, match="joining etcd at"):
        asyncio.run(member._prepare())
    assert len(fake.requests("/v3/cluster/member/list")) == 1
    # So does an etcd that cannot answer: the next try looks the endpoints up anew.
    fake = cluster()
    refusing_adds(fake, "etcdserver: request timed out", times=1000, code=14)
    member = etcd_member(tmp_path, fake, monkeypatch)
    with pytest.raises(agent_etcd.EtcdNotReady, match=r"joining etcd at .*request timed out"):
        asyncio.run(member._prepare())
    assert len(fake.requests("/v3/cluster/member/add")) == 1


def test_health_promotes_the_learner_retrying_until_etcd_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = cluster()
    fake.behind = 2
    member = etcd_member(tmp_path, fake, monkeypatch)
    asyncio.run(member._prepare())
    [learner] = [m for m in fake.members if m.peer == PEER]
    learner.name, fake.local = "cp2", learner.id  # etcd started and published its name

    for _ in range(2):
        with pytest.raises(agent_etcd.EtcdNotReady, match=f"learner {learner.id:x} is catching up") as caught:
            asyncio.run(member._health())
        assert isinstance(caught.value.__cause__, errors.EtcdLearnerNotReady)
        assert learner.learner
    asyncio.run(member._health())
    assert not learner.learner
    # Asked of the members it joined through (a learner serves no cluster calls), never of itself.
    promotions = [(host, body) for host, path, body in fake.calls if path == "/v3/cluster/member/promote"]
    assert promotions == [("10.5.0.2", {"ID": str(learner.id)})] * 3
    # Once it votes, health is the quorum read alone.
    fake.calls.clear()
    asyncio.run(member._health())
    assert [path for _, path, _ in fake.calls] == ["/v3/maintenance/status", "/v3/kv/range"]


def test_a_learner_found_after_an_agent_restart_is_promoted_through_discovered_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = cluster(FakeMember(9, "cp2", PEER, learner=True))
    fake.local = 9
    member = etcd_member(tmp_path, fake, monkeypatch)
    (member.paths.etcd_data / "member").mkdir(parents=True)
    asyncio.run(member._prepare())  # restart from the data dir: no member call at all
    assert fake.calls == []
    asyncio.run(member._health())
    assert fake.member(9) == FakeMember(9, "cp2", PEER, learner=False)


def test_a_learner_lists_the_members_through_the_voting_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = cluster(FakeMember(9, "cp2", PEER, learner=True))
    fake.local = 9
    member = etcd_member(tmp_path, fake, monkeypatch)
    listed = asyncio.run(member.members())
    rows = [(m["name"], m["learner"], m["leader"]) for m in listed]
    assert rows == [("cp1", False, True), ("cp2", True, False)]
    asked = [host for host, path, _ in fake.calls if path == "/v3/cluster/member/list"]
    assert asked == ["127.0.0.1", "10.5.0.2"]  # refused by the learner, answered by the voter


def test_promoting_a_member_that_already_votes_is_done() -> None:
    fake = cluster()

    async def scenario() -> None:
        async with client(fake, [VOTER]) as etcd:
            await agent_etcd.promote(etcd, 1)
            with pytest.raises(errors.EtcdNotFound):
                await agent_etcd.promote(etcd, 99)

    asyncio.run(scenario())


def test_the_client_tls_context_is_built_once_and_again_after_a_rotation(tmp_path: Path) -> None:
    member = agent_etcd.EtcdMember(
        paths=NodePaths(tmp_path),
        document=config.load(yaml.safe_dump(copy.deepcopy(DOCUMENTS["controlplane"]))),
        name="cp2",
        node_ip="10.5.0.3",
    )
    member.certs.ca.parent.mkdir(parents=True, exist_ok=True)

    def write_pair() -> None:
        ca = pki_certs.new_ca("etcd")
        client = pki_certs.issue(ca=ca, common_name="cp2", usages=("client",))
        # As the secrets controller writes them: each file replaced by a rename.
        write_atomic(member.certs.ca, ca.cert)
        write_atomic(member.certs.client_crt, client.cert)
        write_atomic(member.certs.client_key, client.key)

    write_pair()
    first = member.tls()
    assert member.tls() is first, "a health check every few seconds must not rebuild the context"
    write_pair()  # rotation: new CA and key pair in place
    rotated = member.tls()
    assert rotated is not first
    assert member.tls() is rotated


def test_remove_member_removes_another_member_by_name_or_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cleanup after `reset --graceful=false` of cp3, run on cp2.
    cp3 = FakeMember(7, "cp3", etcd_rules.peer_url("10.5.0.4"))
    fake = cluster(FakeMember(9, "cp2", PEER), cp3)
    member = etcd_member(tmp_path, fake, monkeypatch)
    assert asyncio.run(member.remove_member("7")) == "removed etcd member cp3 (7)"
    assert [m.name for m in fake.members] == ["cp1", "cp2"]
    with pytest.raises(
        agent_etcd.EtcdRefused, match=r"no etcd member 'cp3'; the members are cp1 \(1\), cp2 \(9\)"
    ):
        asyncio.run(member.remove_member("cp3"))
    with pytest.raises(agent_etcd.EtcdRefused, match="cp2 is this node: use `etcd leave` on it instead"):
        asyncio.run(member.remove_member("cp2"))


def test_remove_member_refuses_to_cost_the_quorum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # cp1 is down: removing cp3 would leave cp1 and cp2 with one healthy, below the quorum of 2.
    cp3 = FakeMember(7, "cp3", etcd_rules.peer_url("10.5.0.4"))
    fake = cluster(FakeMember(9, "cp2", PEER), cp3)
    fake.down = {1}
    member = etcd_member(tmp_path, fake, monkeypatch)
    with pytest.raises(
        agent_etcd.EtcdRefused, match=r"refusing to remove member cp3: .*below the quorum of 2"
    ):
        asyncio.run(member.remove_member("cp3"))
    assert len(fake.members) == 3
