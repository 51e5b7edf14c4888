"""What kubeplane gives kubeadm besides its configuration: the patches of its static pods.

kubeadm v1.20's stacked etcd pod requests 100Mi of ephemeral storage. A kubelet that has just
started (a joining control plane node's, restarted by ``kubeadm join`` for its TLS bootstrap)
does not know its node's ephemeral storage yet for a few seconds, and a static pod that fails
admission then is never admitted again until the kubelet restarts: the new etcd member never
starts, and the cluster, which already counts it, has lost its quorum (kubernetes/kubernetes#99305;
kubeadm dropped the request in v1.22). kubeplane removes the request with kubeadm's own patch
mechanism (``--experimental-patches DIR``, a JSON patch of the ``etcd`` target) wherever it runs
``kubeadm init`` or ``kubeadm join --control-plane``.
"""

from __future__ import annotations

import json

#: Where kubeplane keeps what it hands kubeadm on a node (its configuration files, the patches):
#: beside kubeadm's own files, on a local node a directory of the node's own.
CONFIG_DIR = "/etc/kubernetes/kubeplane"
#: Where the patches are on a node, and the flag that hands them to kubeadm.
PATCHES_DIR = f"{CONFIG_DIR}/patches"
PATCHES_FLAG = f"--experimental-patches={PATCHES_DIR}"
#: File name → content of each patch (``<target>+<patch type>.json``).
PATCHES = {
    "etcd+json.json": json.dumps(
        [{"op": "remove", "path": "/spec/containers/0/resources/requests/ephemeral-storage"}]
    )
    + "\n",
}
