"""Step-time statistics: the one nearest-rank percentile and the per-attempt summary."""
