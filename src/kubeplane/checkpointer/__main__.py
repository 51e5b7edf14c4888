"""``python3 -m kubeplane.checkpointer``: run the pod-checkpointer (:mod:`kubeplane.checkpointer.main`)."""

from __future__ import annotations

import sys

from kubeplane.checkpointer import main

if __name__ == "__main__":
    sys.exit(main.main())
