"""kubeplane.clients: thin clients for etcd and Kubernetes, the innermost layer.

- :mod:`kubeplane.clients.etcd`: an asyncio etcd v3 client over etcd's JSON gateway with mutual
  TLS and endpoint failover (KV, leases, locks, watches, members, status,
  snapshots);
- :mod:`kubeplane.clients.kube`: the one asyncio Kubernetes API client (from kubeconfig text;
  get, list, watch, create, replace, patch, server-side apply, delete, discovery), answering failures
  with the typed errors below and never retrying by itself.

This layer imports nothing else from kubeplane but :mod:`kubeplane.retry`, so every other layer
may use it.

Exceptions (all from :mod:`kubeplane.clients.errors`; ``retryable`` says whether sending the same
request again later may succeed)::

    ClientError                   base class
    ├── EtcdError                 etcd refused or failed a request (.code: gRPC code, .endpoint)
    │   ├── EtcdUnavailable       retryable: no endpoint answered, no leader, overloaded, timeout
    │   ├── EtcdNotFound          lease or member does not exist
    │   ├── EtcdConflict          the cluster's state forbids the change (duplicate peer URL)
    │   │   ├── EtcdLearnerNotReady   retryable: the learner has not caught up, promote it later
    │   │   └── EtcdMemberNotLearner  promoting a member that already votes
    │   ├── EtcdCompacted         the revision asked for was compacted away
    │   ├── EtcdLeaseLost         retryable: a kept lease (a held lock) was lost; its block was stopped
    │   ├── EtcdInvalidRequest    malformed request (a bug in the caller)
    │   └── EtcdPermissionDenied  the client certificate may not do this
    └── KubeError                 the Kubernetes API refused or failed a request (.status, .verb, .path)
        ├── KubeUnavailable       retryable: could not serve now (5xx, 429, timeout, no answer)
        ├── KubeNotFound          404
        ├── KubeGone              410: a watch's resourceVersion is too old; list again
        ├── KubeConflict          409: exists already, or resourceVersion changed
        ├── KubeForbidden         401/403, or TLS failed (untrusted server, refused client certificate)
        ├── KubeInvalid           400/422: malformed request or object
        └── KubeconfigError       the kubeconfig text cannot make a client (also a ValueError)

A few ``EtcdConflict`` answers that clear up once the cluster settles (a new member not started
yet, a second learner waiting for the first) are marked ``retryable`` individually.
"""
