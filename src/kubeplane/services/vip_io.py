"""The shared VIP, I/O: the address over netlink (pyroute2), the gratuitous ARP over a raw
``AF_PACKET`` socket, and the local kube-apiserver's health check.

:class:`NetlinkVip` blocks (callers run it in a thread). It acts in the agent's own network
namespace, or in the named one (``/run/netns/<name>``) for the integration tests, which play
several nodes from one process: each call enters the namespace in its own thread (network
namespaces are per thread) and leaves it before returning.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kubeplane.services import machinenet, vip

if TYPE_CHECKING:
    from pyroute2 import IPRoute  # type: ignore[import-untyped]


def _iproute() -> Any:
    """A netlink socket; pyroute2 is imported on first use, as in :mod:`.machinenet_io` (it loads
    its whole library, ~10 MB resident, which an agent without a VIP never needs)."""
    from pyroute2 import IPRoute  # noqa: PLC0415

    return IPRoute()


def _netlink_error() -> type[Exception]:
    from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]  # noqa: PLC0415

    error: type[Exception] = NetlinkError
    return error


_ESRCH = 3
_ENODEV = 19
_EADDRNOTAVAIL = 99
_CLONE_NEWNET = 0x40000000
_LIBC = ctypes.CDLL(None, use_errno=True)


class NetlinkVip:
    """Adds, renews, removes and announces a VIP in a network namespace (None: the agent's own)."""

    def __init__(self, namespace: str | None = None) -> None:
        self.namespace = namespace

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Run the block in the namespace: this thread enters it, and returns to its own after."""
        if self.namespace is None:
            yield
            return
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(f"/run/netns/{self.namespace}", os.O_RDONLY)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(own)

    def hold(self, address: vip.Vip, lifetime: int) -> None:
        """Add the address, or renew it: valid (and preferred) for ``lifetime`` more seconds."""
        interface = ipaddress.ip_interface(address.cidr)
        netlink_error = _netlink_error()
        with self.inside(), _iproute() as ip:
            index = self._index(ip, address)
            try:
                ip.addr(
                    "replace",
                    index=index,
                    address=str(interface.ip),
                    prefixlen=interface.network.prefixlen,
                    proto=machinenet.PROTO,
                    valid_lft=lifetime,
                    preferred_lft=lifetime,
                )
            except netlink_error as exc:
                raise vip.VipError(
                    f"{address.field}: cannot add {address.cidr} to {address.link}: {exc}"
                ) from exc

    def release(self, address: vip.Vip) -> bool:
        """Remove the address if this node has it; True when it did."""
        interface = ipaddress.ip_interface(address.cidr)
        netlink_error = _netlink_error()
        with self.inside(), _iproute() as ip:
            try:
                index = self._index(ip, address)
                ip.addr("del", index=index, address=str(interface.ip), prefixlen=interface.network.prefixlen)
            except vip.VipError:
                return False  # the link is gone, and the address with it
            except netlink_error as exc:
                if getattr(exc, "code", None) in (_ESRCH, _ENODEV, _EADDRNOTAVAIL):
                    return False
                raise vip.VipError(f"cannot remove {address.cidr} from {address.link}: {exc}") from exc
        return True

    def present(self, address: vip.Vip) -> bool:
        """Whether the link has the address (what the tests sample)."""
        interface = ipaddress.ip_interface(address.cidr)
        family = socket.AF_INET if address.ipv4 else socket.AF_INET6
        with self.inside(), _iproute() as ip:
            try:
                index = self._index(ip, address)
            except vip.VipError:
                return False
            return any(
                message.get("IFA_ADDRESS") == str(interface.ip)
                for message in ip.get_addr(index=index, family=family)
            )

    def announce(self, address: vip.Vip) -> None:
        """Broadcast one gratuitous ARP for the address from its link (IPv4; IPv6 is skipped)."""
        if not address.ipv4:
            return
        with self.inside():
            try:
                with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(vip.ETH_P_ARP)) as sock:
                    sock.bind((address.link, vip.ETH_P_ARP))
                    # For a packet socket the bound address ends with the link's hardware address.
                    mac = sock.getsockname()[4]
                    sock.send(vip.garp_frame(mac, address.ip))
            except OSError as exc:
                raise vip.VipError(f"cannot announce {address.ip} on {address.link}: {exc}") from exc

    @staticmethod
    def _index(ip: IPRoute, address: vip.Vip) -> int:
        found = ip.link_lookup(ifname=address.link)
        if not found:
            raise vip.VipError(f"{address.field}: interface {address.link} does not exist on this node")
        return int(found[0])


def _setns(fd: int) -> None:
    """Move this thread into the network namespace ``fd`` refers to (``setns(2)``; Python 3.11's
    ``os`` lacks it)."""
    if _LIBC.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


class ApiServerProbe:
    """Whether the node's own kube-apiserver answers ``/readyz?exclude=etcd`` on
    ``https://127.0.0.1:<port>``.

    ``/readyz`` rather than ``/livez``: a server that is shutting down says so there first, and
    that is exactly when clients should go elsewhere. Its ``etcd`` check is left out: the server
    talks to the node's own etcd member, whose health the holder's lease keep-alives already
    prove (:mod:`kubeplane.services.vip`), and while etcd elects a leader that check fails (or
    takes up to 2 s) on every node at once, so counting it would move the VIP for nothing. The
    check sends no credential (``/readyz`` is public) and trusts nothing but the status code, so
    the server's certificate is not verified.
    """

    def __init__(self, port: int) -> None:
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        self.url = f"https://127.0.0.1:{port}/readyz?exclude=etcd"
        self._http = httpx.AsyncClient(verify=False, trust_env=False)  # noqa: S501 (see the class docstring)

    async def __call__(self) -> bool:
        import httpx  # noqa: PLC0415  # on first use: see docs/architecture.md, Memory

        try:
            response = await self._http.get(self.url)
        except httpx.HTTPError:
            return False
        return response.status_code == httpx.codes.OK

    async def aclose(self) -> None:
        await self._http.aclose()
