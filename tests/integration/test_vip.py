"""The shared VIP's election for real: three node processes, each in its own network namespace on
a bridge of the test's own, elect an owner in a real etcd. The VIP is held by exactly one node;
it moves when the owner stops gracefully (well under a second), when it is SIGKILLed (within
about the lease TTL: the kernel drops the dead owner's address when its lifetime runs out), when
its kube-apiserver stops answering, and it is given up by everyone while etcd is frozen. The
host's neighbour entry for the VIP follows each new owner through its gratuitous ARP. Sampled
from the namespaces throughout: never two holders at once."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import vip_nodes
from machines import Lan

from kubeplane.services import vip

if TYPE_CHECKING:
    from conftest import EtcdServer

pytestmark = pytest.mark.integration

NODES = ("n1", "n2", "n3")


@pytest.fixture
def nodes(tmp_path: Path, etcd_server: EtcdServer) -> Iterator[vip_nodes.VipNodes]:
    lan = Lan(tmp_path / "lan")
    started: vip_nodes.VipNodes | None = None
    try:
        hosts = [lan.add(name) for name in NODES]
        pki = tmp_path / "vip-pki"
        pki.mkdir()
        ca, cert, key = pki / "ca.crt", pki / "client.crt", pki / "client.key"
        ca.write_bytes(etcd_server.ca.cert)
        cert.write_bytes(etcd_server.client.cert)
        key.touch(mode=0o600)
        key.write_bytes(etcd_server.client.key or b"")
        access = vip_nodes.EtcdAccess(endpoint=etcd_server.endpoint, ca=ca, cert=cert, key=key)
        ip = lan.cidr.rsplit(".", 1)[0] + ".250"
        started = vip_nodes.VipNodes(
            etcd=access,
            hosts=[vip_nodes.Host(name=host.name, netns=host.netns) for host in hosts],
            ip=ip,
            directory=tmp_path / "vip",
        )
        yield started
    finally:
        if started is not None:
            started.close()
        leaks = lan.destroy()
    assert not leaks, leaks


def test_one_holder_that_fails_over_on_every_loss(nodes: vip_nodes.VipNodes, etcd_server: EtcdServer) -> None:
    timing = vip.Timing()
    sampler = vip_nodes.Sampler(nodes)
    try:
        for name in NODES:
            nodes.start(name)
        # The first owner: how soon is bound by three Python processes starting beside the rest
        # of the suite (10.4 s once, on a loaded machine), not by the election; the failovers
        # below are timed against the election's own timing (and bench/bench_vip.py).
        sampler.wait_for(lambda held: len(held) == 1, after=time.monotonic(), timeout=30)
        owner = vip_nodes.holder_of(sampler.samples[-1][1]) or vip_nodes.holder_of(nodes.holders())
        assert owner is not None, nodes.logs()
        # The others follow once they have seen the owner (a status line each); the first owner can
        # be elected while they are still starting, and a failover needs a follower to take over.
        _wait(lambda: all(nodes.reasons(name) for name in NODES), "every node to follow", timeout=30)

        # The host resolves the VIP to the owner's MAC.
        vip_nodes.provoke_arp(nodes.address.ip)
        _wait(lambda: vip_nodes.host_neighbour(nodes.address.ip) == nodes.mac(owner), "ARP to the owner")

        # Graceful: SIGTERM the owner; another node has the VIP well within a second.
        stopped = time.monotonic()
        nodes.stop(owner)
        moved = sampler.wait_for(lambda held: bool(held) and owner not in held, after=stopped, timeout=5)
        assert moved - stopped < 1.0, nodes.logs()
        new_owner = vip_nodes.holder_of(nodes.holders())
        assert new_owner is not None and new_owner != owner
        # Its gratuitous ARP moved the host's entry without the host asking.
        _wait(lambda: vip_nodes.host_neighbour(nodes.address.ip) == nodes.mac(new_owner), "gratuitous ARP")
        nodes.start(owner)  # back as a follower
        time.sleep(1)
        assert nodes.holders() == {new_owner}

        # Ungraceful: SIGKILL the owner. Its address expires with its lifetime, the lease with
        # its TTL, and the next node takes over.
        owner = new_owner
        killed = time.monotonic()
        nodes.stop(owner, kill=True)
        gone = sampler.wait_for(lambda held: owner not in held, after=killed, timeout=5)
        moved = sampler.wait_for(lambda held: bool(held) and owner not in held, after=killed, timeout=10)
        # The kernel drops an address whose lifetime ran out at its next lifetime check: those run
        # at least 1 s apart with 0.25 s of fuzz, from a workqueue a loaded machine delays (a full
        # run saw 1.56 s). The design keeps `margin` between the address's end and the lease's
        # earliest expiry for that; a longer lifetime (2 s) would still fail here.
        assert gone - killed <= timing.lifetime + timing.margin, "the kernel keeps a dead owner's address"
        assert moved - killed < timing.ttl + 1.5, nodes.logs()
        nodes.start(owner)

        # The owner's kube-apiserver stops answering: it lets go after exactly `unhealthy_after`
        # failed checks (its own account, so a loaded machine's slow ticks do not matter; how soon
        # in seconds is bench/bench_vip.py's figure), and another takes over.
        owner = vip_nodes.holder_of(nodes.holders()) or ""
        assert owner, nodes.logs()
        sick = time.monotonic()
        nodes.set_healthy(owner, False)
        sampler.wait_for(lambda held: bool(held) and owner not in held, after=sick, timeout=10)
        gave_up = [reason for reason in nodes.reasons(owner) if reason.startswith("gave it up")]
        expected = f"the local kube-apiserver failed {timing.unhealthy_after} health checks in a row"
        assert gave_up and gave_up[-1] == f"gave it up: {expected}", nodes.logs()
        nodes.set_healthy(owner, True)

        # etcd freezes: the owner can no longer renew its lease and gives the VIP up before the
        # lease could expire; nobody takes it while etcd is gone; one node does once it is back.
        owner = vip_nodes.holder_of(nodes.holders()) or ""
        assert owner, nodes.logs()
        frozen = time.monotonic()
        os.kill(etcd_server.started.process.pid, signal.SIGSTOP)
        try:
            released = sampler.wait_for(lambda held: not held, after=frozen, timeout=5)
            assert released - frozen < timing.ttl - timing.margin + 0.3
            time.sleep(timing.ttl + 1)
            assert nodes.holders() == set()
        finally:
            os.kill(etcd_server.started.process.pid, signal.SIGCONT)
        sampler.wait_for(lambda held: len(held) == 1, after=time.monotonic(), timeout=15)
    finally:
        sampler.stop()
    overlaps = sampler.overlaps()
    assert overlaps == [], f"two nodes held the VIP at once: {overlaps}\n{nodes.logs()}"
    assert sampler.most_at_once() == 1


def _wait(predicate: object, what: str, timeout: float = 3.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_sampler_tells_a_handover_from_two_holders() -> None:
    """The sampler asks the nodes one after the other: a handover between two answers of one
    sample shows both nodes in it, which is no overlap; two runs of answers that cross are."""
    # n2 is asked at 10.00 (has it), gives it up; n3 takes it, is asked at 10.02 (has it).
    handover = [
        ("n2", 9.90, 9.91, True),
        ("n3", 9.91, 9.92, False),
        ("n2", 10.00, 10.01, True),
        ("n3", 10.01, 10.02, True),
        ("n2", 10.10, 10.11, False),
        ("n3", 10.11, 10.12, True),
    ]
    assert vip_nodes.overlaps(handover) == []
    assert vip_nodes.tenures(handover) == {"n2": [(9.91, 10.00)], "n3": [(10.02, 10.11)]}
    # Both keep it over two samples: they held it at once from 10.02 to 10.10.
    both = [*handover[:4], ("n2", 10.10, 10.11, True), ("n3", 10.11, 10.12, True)]
    assert vip_nodes.overlaps(both) == [("n2", "n3", 10.02, 10.10)]
