"""kubeplane.services: supervised node processes (containerd, kubelet, etcd).

- :mod:`kubeplane.services.supervisor`: :class:`~kubeplane.services.supervisor.Supervisor` runs
  :class:`~kubeplane.services.supervisor.ServiceSpec` s in dependency order with health checks,
  restart backoff and a per-service event history;
- :mod:`kubeplane.services.process`: spawning a command in its own process group, waiting on its
  pidfd, stopping the whole group;
- :mod:`kubeplane.services.logs`: per-stream rotating log files, ``tail`` and ``follow``;
- :mod:`kubeplane.services.containerd`: ``render_config`` (containerd v2 TOML);
- :mod:`kubeplane.services.kubelet`: ``render_args`` (kubelet v1.20 flags).

Renderers take every input as keyword arguments and do no I/O.

Exceptions (from :mod:`kubeplane.services.supervisor`)::

    ServiceError                  base class
    ├── UnknownServiceError       no service with that id (also a KeyError); names the known ids
    ├── ServiceRegistrationError  duplicate id or a dependency cycle
    └── ServiceTimeoutError       a wait timed out; names the last event and the log path
"""
