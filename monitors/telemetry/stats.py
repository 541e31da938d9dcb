"""Nearest-rank percentiles over step durations, standard library only (playbook 4.3).

Nearest-rank: the ``p``-th percentile of ``n`` sorted values is the value at 1-based rank
``ceil(p/100 * n)`` (clamped to ``[1, n]``). No interpolation, so every reported number is a value
that was actually observed. The rank is computed with exact rational arithmetic (``Fraction``), so
``p=90, n=10`` gives rank 9, never 10 through a rounding error.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable, Sequence

#: Percentiles reported in ``run_end.step_seconds``, with their key names.
SUMMARY_PERCENTILES = (("p50", 50), ("p90", 90), ("p99", 99))


def nearest_rank(sorted_values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (``0 <= p <= 100``) of already sorted values.

    Returns None for an empty sequence. Raises ValueError when ``p`` is outside [0, 100].
    """
    n = len(sorted_values)
    if n == 0:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {p!r}")
    frac = Fraction(p) if isinstance(p, int) else Fraction(str(p))
    rank = math.ceil(frac * n / 100)
    rank = min(max(rank, 1), n)
    return sorted_values[rank - 1]


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
