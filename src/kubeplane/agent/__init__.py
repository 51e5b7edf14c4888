"""kubeplane.agent (see docs/architecture.md for what this layer owns)."""
