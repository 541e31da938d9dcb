"""Pure detectors, each owning its constants and their sources: fallback, stall, storm."""
