"""kubeplane.ops (see DESIGN.md for what this layer owns)."""
