"""Set-up: the observers config, presets, the registry of observers, and install."""
