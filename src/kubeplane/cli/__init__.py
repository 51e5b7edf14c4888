"""The ``kubeplane`` command: click commands and output formatting (outermost layer)."""
