"""kubeplane.dns: the cluster DNS add-on (Kubernetes DNS specification, schema 1.1.0).

kubeplane's replacement for the original's CoreDNS Deployment: it reads the same Corefile, answers
the records the Kubernetes DNS specification requires (``docs/dns.md`` has the table) from a watch
of Services and EndpointSlices, and hands every other name to an upstream resolver.

The pure core (no I/O):

- :mod:`~kubeplane.dns.corefile`: the Corefile subset kubeplane renders -> :class:`Config`;
- :mod:`~kubeplane.dns.records`: an immutable :class:`Table` of records built from Service and
  EndpointSlice objects, updated one Service at a time;
- :mod:`~kubeplane.dns.answer`: a query (message or wire bytes) -> an authoritative reply, or the
  verdict that it must be forwarded upstream;
- :mod:`~kubeplane.dns.wirecache`: finished replies by question, the server's hot path.

The I/O around it (``python3 -m kubeplane.dns -conf PATH``):

- :mod:`~kubeplane.dns.watch`: reflectors keeping the table current from the API server;
- :mod:`~kubeplane.dns.forward`: names outside the zones sent upstream, ``cache N``, loop guard;
- :mod:`~kubeplane.dns.server`: the UDP, TCP and HTTP (``/health``, ``/ready``) listeners;
- :mod:`~kubeplane.dns.main`: the command line and the in-cluster kubeconfig.

The add-on runs in its own image with Debian's ``python3-dnspython``, ``python3-httpx`` and
``python3-yaml``, so the package imports nothing third-party beyond those (a unit test checks it)
and nothing from kubeplane but itself, ``kubeplane.clients`` and ``kubeplane.retry``
(import-linter checks that, and that the rest of kubeplane never imports it).

Exceptions::

    DNSError            base class
    └── CorefileError   a Corefile this server cannot run; names the line and what is wrong
"""

from __future__ import annotations

__all__ = ["SCHEMA_VERSION", "CorefileError", "DNSError"]

#: The version of the Kubernetes DNS specification answered at ``dns-version.<zone>`` (TXT).
SCHEMA_VERSION = "1.1.0"


class DNSError(Exception):
    """Base class of the DNS add-on's errors."""


class CorefileError(DNSError):
    """The Corefile is malformed or asks for something this server cannot do."""
