"""Controllers that derive node facts from the machine config."""
