"""The shared VIP (``machine.network.interfaces[].vip.ip``), pure: which VIPs the config asks for,
the etcd key each is elected under, when a holder must give its VIP up, and the gratuitous ARP
frame that announces a new owner.

How the election runs (:mod:`kubeplane.services.vip_election`): every control plane node whose
local kube-apiserver answers tries to create :func:`key` (``kubeplane:v1:vip:<ip>``) in etcd, in
a transaction that succeeds only while the key is absent, attached to a lease of
:attr:`Timing.ttl` seconds and holding its node name. The node that created it holds the VIP: it
adds the address (``/32``; ``/128`` for IPv6) to the configured link, marked with
:data:`kubeplane.services.machinenet.PROTO` and a valid lifetime of :attr:`Timing.lifetime`
seconds that it renews on every tick, and announces it with gratuitous ARP. The others watch
the key and try again as soon as it is gone.

There are never two owners because a holder's address is gone *before* anyone else can take the
key: :class:`Tenure` keeps the instant until which the lease is certainly alive in etcd (the send
time of the last keep-alive that got through, plus the TTL etcd returned, minus
:attr:`Timing.margin`), and the holder renews the address only while its new lifetime ends before
that instant (:meth:`Tenure.may_renew`). The kernel deletes an address that is not renewed when
its lifetime runs out, so the same bound holds for an agent that is SIGKILLed or hangs.

A keep-alive that is late does not end the tenure, only the renewals: the address lapses, the key
stays this node's, and the next keep-alive that gets through proves the lease alive and puts the
address back (announced again). That is what an etcd leader election looks like from a holder
(every write waits for the new leader, which extends every lease by its TTL), and moving the VIP
then would cost clients a failover for nothing. A holder cut off from etcd's quorum loses its
lease on the other side instead, and the next node takes the key once it expired there, after
the address has lapsed here. The holder lets go (removes the address, revokes the lease) when
etcd says its lease is gone, when its local kube-apiserver failed :attr:`Timing.unhealthy_after`
health checks in a row or left one unanswered for :attr:`Timing.unresponsive_after` seconds (a
late answer is not a failed check), and when the agent stops (so the next node takes over within
one round trip).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import struct

from kubeplane.config import models

#: Under the agent's etcd prefix (``kubeplane:v1:``, as the bootstrap keys).
KEY_PREFIX = b"kubeplane:v1:vip:"
BROADCAST = b"\xff" * 6
ETH_P_ARP = 0x0806
_ARP_REQUEST = 1


class VipError(Exception):
    """Taking, renewing, removing or announcing the VIP failed; the message says which."""


@dataclasses.dataclass(frozen=True)
class Vip:
    """A shared address ``ip`` on ``link``, from config field ``field``."""

    link: str
    ip: str
    field: str

    @property
    def cidr(self) -> str:
        """The address as the holder adds it: the whole address, so no on-link route is added."""
        return str(ipaddress.ip_interface(self.ip))

    @property
    def ipv4(self) -> bool:
        return ipaddress.ip_address(self.ip).version == 4


@dataclasses.dataclass(frozen=True)
class Timing:
    """How fast the election moves (seconds); the defaults fail over in about ``ttl``.

    etcd's shortest lease is 2 s with its default election timeout (it raises a shorter TTL to
    that), so 2 s is as fast as an owner that vanished can be replaced.
    """

    #: The lease TTL asked for (etcd may grant more; the granted TTL is what counts).
    ttl: int = 2
    #: How often the holder renews its lease and the address and checks its kube-apiserver.
    tick: float = 0.5
    #: The address's valid lifetime (whole seconds, the kernel's unit), renewed every tick.
    lifetime: int = 1
    #: Time kept between the address's end and the earliest moment etcd may expire the lease.
    margin: float = 0.5
    #: Failed kube-apiserver health checks in a row that make the holder give the VIP up.
    unhealthy_after: int = 2
    #: How long a tick waits for the health check's answer (one that comes later counts at a
    #: later tick) and at least for a keep-alive's; with ``tick`` less than ``lifetime``, so a
    #: healthy holder renews the address before it runs out.
    check_timeout: float = 0.25
    #: How long one health check may go unanswered before the holder gives the VIP up. A slow
    #: answer is not a failed one: on a loaded machine the kube-apiserver answers late, and moving
    #: the VIP to another node of that machine would only cost clients a failover.
    unresponsive_after: float = 2.0
    #: Gratuitous ARP announcements after taking the VIP, one per tick.
    announcements: int = 3
    #: How often the holder makes sure its etcd member does not lead (it hands leadership over).
    leadership_check: float = 10.0

    @property
    def keepalive_timeout(self) -> float:
        """How long a lease keep-alive's answer is waited for: as long as it can still allow a
        renewal (the renewed address must run out ``margin`` before a lease renewed when the
        keep-alive was *sent* could expire), and at least ``check_timeout``. An answer slowed by a
        loaded machine is still used; safety rests on the send time, not on the wait."""
        return max(self.check_timeout, self.ttl - self.margin - self.lifetime)


class Tenure:
    """What a holder knows about its right to the VIP, and when it must let go (:meth:`verdict`).

    ``safe_until`` is the instant (monotonic seconds) until which the lease is certainly alive in
    etcd, less the margin; it only moves forward with keep-alives that got through.
    """

    def __init__(self, timing: Timing, *, granted_at: float, ttl: int) -> None:
        self.timing = timing
        self.safe_until = granted_at + ttl - timing.margin
        self.failed_checks = 0
        #: How long the health check in flight has gone unanswered (0: none is late).
        self.unanswered_for = 0.0
        self.lease_gone = False

    def keepalive(self, *, sent: float, ttl: int) -> None:
        """A keep-alive sent at ``sent`` got through; etcd renewed the lease for ``ttl`` seconds."""
        self.safe_until = max(self.safe_until, sent + ttl - self.timing.margin)

    def lost(self) -> None:
        """etcd says the lease expired or was revoked: the key may be someone else's already."""
        self.lease_gone = True

    def health(self, ok: bool) -> None:
        """The outcome of one check of the local kube-apiserver."""
        self.failed_checks = 0 if ok else self.failed_checks + 1
        self.unanswered_for = 0.0

    def unanswered(self, seconds: float) -> None:
        """The check of the local kube-apiserver in flight has gone ``seconds`` without an answer."""
        self.unanswered_for = seconds

    def may_renew(self, now: float) -> bool:
        """Whether the address may be renewed at ``now``: its new lifetime ends while the lease is
        certainly alive (a late keep-alive lets it lapse until the next one gets through)."""
        return now + self.timing.lifetime <= self.safe_until

    def verdict(self) -> str | None:
        """Why the holder must give the VIP up, or None while it may keep the key."""
        if self.lease_gone:
            return "etcd says the lease is gone"
        if self.failed_checks >= self.timing.unhealthy_after:
            return f"the local kube-apiserver failed {self.failed_checks} health checks in a row"
        if self.unanswered_for >= self.timing.unresponsive_after:
            return f"the local kube-apiserver left a health check unanswered for {self.unanswered_for:.1f}s"
        return None


def key(ip: str) -> bytes:
    """The etcd key the VIP ``ip`` is elected under."""
    return KEY_PREFIX + str(ipaddress.ip_address(ip)).encode()


def desired(network: models.MachineNetwork | None) -> tuple[Vip, ...]:
    """The VIPs ``network`` (``machine.network``) asks for, one per address (the first wins)."""
    vips: dict[str, Vip] = {}
    for index, interface in enumerate((network.interfaces or ()) if network else ()):
        if interface.vip is None or interface.ignore:
            continue
        ip = str(ipaddress.ip_address(interface.vip.ip))
        vips.setdefault(
            ip, Vip(link=interface.interface, ip=ip, field=f"machine.network.interfaces[{index}].vip")
        )
    return tuple(vips.values())


def garp_frame(mac: bytes, ip: str) -> bytes:
    """An Ethernet frame with a gratuitous ARP request: "``ip`` is at ``mac``", to everyone.

    A gratuitous ARP is an ARP request for the sender's own address (sender and target IP both
    ``ip``), broadcast. Hosts that already have a neighbour entry for ``ip`` update it to ``mac``
    (Linux does so by default, ``arp_accept`` only governs creating new entries), so traffic to
    the VIP moves to its new owner without waiting for the old entry to go stale. IPv4 only:
    IPv6 would need an unsolicited neighbour advertisement instead.
    """
    if len(mac) != 6:
        raise ValueError(f"a MAC address has 6 bytes, not {len(mac)}")
    address = socket.inet_aton(str(ipaddress.IPv4Address(ip)))
    ethernet = BROADCAST + mac + struct.pack("!H", ETH_P_ARP)
    # hardware type Ethernet (1), protocol IPv4, address lengths 6 and 4, operation request.
    arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, _ARP_REQUEST)
    arp += mac + address + b"\x00" * 6 + address
    return ethernet + arp
