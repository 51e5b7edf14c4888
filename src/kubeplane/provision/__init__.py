"""kubeplane.provision (see docs/architecture.md for what this layer owns)."""
