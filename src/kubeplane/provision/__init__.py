"""kubeplane.provision (see DESIGN.md for what this layer owns)."""
