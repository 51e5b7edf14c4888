"""Controllers of the node's networking (the host-gw pod network)."""
