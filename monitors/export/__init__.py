"""Exporting a run to the monitoring stacks people already run (Prometheus)."""
