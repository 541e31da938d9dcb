"""Nearest-rank percentiles over step durations, standard library only (ARCHITECTURE.md R1, R2).

The percentile is the one nearest-rank of :mod:`stepwatch.monitors.stats.nearest_rank` (exact
rational arithmetic: ``p=90, n=10`` gives rank 9, never 10 through a rounding error).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stepwatch.monitors.stats.nearest_rank import nearest_rank as _nearest_rank

#: Percentiles reported in ``run_end.step_seconds``, with their key names.
SUMMARY_PERCENTILES = (("p50", 50), ("p90", 90), ("p99", 99))


def nearest_rank(sorted_values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (``0 <= p <= 100``) of already sorted values, by
    :func:`stepwatch.monitors.stats.nearest_rank.nearest_rank`; None for an empty sequence.
    Raises ValueError when ``p`` is outside [0, 100]."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {p!r}")
    return _nearest_rank(sorted_values, p) if len(sorted_values) else None


def step_summary(dts_s: Iterable[float]) -> dict[str, float | int | None]:
    """``{"n", "min", "p50", "p90", "p99", "max"}`` over step durations in seconds.

    The caller decides what is counted (the emitter leaves out the first step of each process).
    With no values: ``n`` is 0 and every other key is None (present-and-null, never absent).
    """
    values = sorted(dts_s)
    out: dict[str, float | int | None] = {"n": len(values), "min": values[0] if values else None}
    for key, p in SUMMARY_PERCENTILES:
        out[key] = nearest_rank(values, p)
    out["max"] = values[-1] if values else None
    return out
