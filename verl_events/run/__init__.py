"""The run folder: a run's identity, its claim on a save_path, and the paths under it."""
