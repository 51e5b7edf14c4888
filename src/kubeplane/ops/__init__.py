"""kubeplane.ops: cluster-wide operations (see docs/architecture.md for what this layer owns).

Modules:

- :mod:`~kubeplane.ops.upgrade`: ``upgrade-k8s``, a rolling upgrade of the control plane (checks
  and plan), run by :mod:`~kubeplane.ops.upgrader`; :mod:`~kubeplane.ops.versions` parses versions
  and retags images;
- :mod:`~kubeplane.ops.convert`: ``convert-k8s``, self-hosted control plane -> static pods;
- :mod:`~kubeplane.ops.health`: cluster health checks.

Every operation is a :class:`kubeplane.plan.Plan` (pure data that ``--dry-run`` prints) run by the
one executor :func:`kubeplane.plan.execute`, re-runnable from any point. Operations reach the
cluster only through interfaces they declare (node API, Kubernetes API, load balancer rotation),
which the CLI implements; this layer never imports ``provision``.

Exceptions (from :mod:`kubeplane.ops.errors`)::

    OpsError                base class: an operation could not start or finish
    ├── PreflightError      a check before any change failed; nothing was changed
    ├── WaitTimeout         the cluster did not reach the expected state in time
    └── NodeUnavailable     a node API call could not be served now (retryable)

A failed step stops the executor with :class:`kubeplane.plan.StepFailed` (.step, .cause, .resume:
the command that continues), which wraps one of these.
"""
