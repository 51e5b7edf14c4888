"""Controllers of the node's time sync (``machine.time``)."""
