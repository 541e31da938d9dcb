"""Everything that starts a run: config, preflight, identity, rotation, supervisor, stop."""
