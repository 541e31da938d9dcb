"""The one nearest-rank percentile (ARCHITECTURE.md R1), standard library only: the emitter inside the
training process and the readers' statistics both use it.

Nearest-rank: the ``p``-th percentile of ``n`` sorted values is the value at 1-based rank
``ceil(p/100 * n)`` (clamped to ``[1, n]``). No interpolation, so every reported number is a value
that was actually observed.
"""

from __future__ import annotations

import math
from fractions import Fraction
from collections.abc import Sequence


def nearest_rank_index(p: float, n: int) -> int:
    """0-based index of the nearest-rank ``p``-th percentile in a sorted list of ``n`` values.

    Rank = ceil(p/100 * n), 1-based, clamped to [1, n]; computed with exact rational arithmetic so
    ``p=99, n=100`` is rank 99, not 100 through a float rounding. ``p`` in [0, 100]; p=0 gives the
    minimum. Raises ValueError for n < 1 or p outside [0, 100].
    """
    if n < 1:
        raise ValueError("nearest rank of an empty set")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p!r} outside [0, 100]")
    if isinstance(p, int) or float(p).is_integer():
        rank = -(-int(p) * n // 100)  # integer ceil: the common case, fast
    else:
        rank = math.ceil(Fraction(str(p)) * n / 100)
    return min(max(rank, 1), n) - 1


def nearest_rank(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (see :func:`nearest_rank_index`)."""
    return sorted_values[nearest_rank_index(p, len(sorted_values))]
