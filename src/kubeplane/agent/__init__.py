"""kubeplane.agent (see DESIGN.md for what this layer owns)."""
