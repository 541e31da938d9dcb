"""A backlog of steps added to :class:`~stepwatch.monitors.stats.stepstats.StepStats` a field at a time
(ARCHITECTURE.md, "Attach: one optimisation").

Only the last ``recent_maxlen`` rows and the last ``window`` counted ones stay in StepStats' deques: the rows before
them add nothing but their durations (and the counts of the uncounted ones). With every duration a float in
[0, inf) and every flags value a list or a tuple, those durations are taken as slices between the uncounted rows,
and only the rows whose records survive go through :meth:`StepStats.add`: the very state one add() per row leaves.
The rows before them reach StepStats through its public :meth:`StepStats.add_unkept`, never its attributes.
"""

from __future__ import annotations

from itertools import compress
from array import array
from collections.abc import Callable, Iterable
from typing import Any, Protocol

_INF = float("inf")


class StepStats(Protocol):
    """What this reads and calls of :class:`~stepwatch.monitors.stats.stepstats.StepStats` (which imports this
    module): its public face only."""

    @property
    def recent_maxlen(self) -> int: ...
    @property
    def window_size(self) -> int: ...
    def add_unkept(self, counted_s: Iterable[Any], excluded_first: int, excluded_phase: int, seen: int,
                   last_step: int | None) -> None: ...
    def add(self, step: int | None, dt_s: float, flags: Iterable[str] = (), tokens: int | None = None,
            padded_tokens: int | None = None, t: float | None = None) -> bool: ...
_FLAG_SEQS = frozenset((list, tuple))


def add_columns(stats: StepStats, steps: list[Any], dts: Any, flags: list[Any], tokens: list[Any], padded: list[Any],
                ts: list[Any], uncounted: Callable[[tuple[str, ...]], bool], first: str) -> int | None:
    """Add the rows ``zip(steps, dts, flags, tokens, padded, ts)`` (at least one; ``dts`` a list or an array of
    floats) to ``stats`` (a StepStats, whose
    rule of the steps it does not count is ``uncounted``, ``first`` the flag counted apart); how many were counted.
    None, and nothing added, unless every duration is a float in [0, inf) and every flags value a list or a tuple."""
    if isinstance(dts, array) and dts.typecode == "d":  # a fold's: floats already, their range checked here
        import numpy as np  # noqa: PLC0415 - a backlog's cost only

        a = np.frombuffer(dts, dtype=np.float64)
        if not ((a >= 0.0) & (a < _INF)).all():
            return None
    elif set(map(type, dts)) != {float} or not all_in(dts, 0.0, _INF):
        return None
    if not set(map(type, flags)) <= _FLAG_SEQS:
        return None
    n = len(dts)
    skipped = [j for j in compress(range(n), flags) if uncounted(tuple(flags[j]))]
    skip = set(skipped)
    keep, need, i = max(0, n - (stats.recent_maxlen or n)), stats.window_size or n, n
    while i > 0 and need > 0:  # the first row whose record survives, as add_many's own way finds it
        i -= 1
        if i not in skip:
            need -= 1
    keep = min(keep, i)
    runs: list[Any] = []
    prev = counted_n = n_first = n_phase = 0
    for j in skipped:
        if j >= keep:
            break
        runs.append(dts[prev:j])
        counted_n += j - prev
        if first in flags[j]:
            n_first += 1
        else:
            n_phase += 1
        prev = j + 1
    runs.append(dts[prev:keep])
    counted_n += max(0, keep - prev)
    # (the last counted row is among the rest: added below, it sets ``last``)
    stats.add_unkept(runs, n_first, n_phase, keep, steps[keep - 1] if keep else None)
    add = stats.add
    for row in zip(steps[keep:], dts[keep:], flags[keep:], tokens[keep:], padded[keep:], ts[keep:]):
        counted_n += add(*row)
    return counted_n


def all_in(xs: Any, lo: float, hi: float) -> bool:
    """Every float of ``xs`` (non-empty) in [lo, hi): their sum is a number (no NaN, no infinity leaves it one),
    and without a NaN the least and the largest are truly so. The one check of a column of floats read from a
    file (``monitors/fold/stepcolumns.py`` uses it too)."""
    total = sum(xs)
    return total == total and min(xs) >= lo and max(xs) < hi
