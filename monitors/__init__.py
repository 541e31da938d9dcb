"""Everything that observes a run, without UI. Keep this module empty: stepwatch.telemetry runs
inside the training process and must import only the standard library."""
