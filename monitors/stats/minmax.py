"""A whole run's metric series in bounded memory, spikes kept: bins of (first step, last step, min,
max, last value) that merge pairwise when there are too many (each merge doubles the steps a bin
covers), so a loss spike at step 12,000 of a 100,000-step run is still its bin's max, never averaged
away. Standard library only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Bins a whole run's series keeps at most (the log's metrics and the emitter's log events alike).
SERIES_BINS = 512


@dataclass(slots=True)
class Bin:
    """Points from ``first_step`` to ``last_step``: their ``lo`` and ``hi`` (finite values only;
    None when every one was NaN/inf), the ``last`` value, and how many were not finite."""

    first_step: int | None
    last_step: int | None
    lo: float | None
    hi: float | None
    last: float
    n: int = 1
    nonfinite: int = 0


class MinMaxSeries:
    """Append ``(step, value)``; at most ``max_bins`` bins, each holding ``per_bin`` points until
    the bins are merged in pairs (then ``per_bin`` doubles)."""

    def __init__(self, max_bins: int = SERIES_BINS):
        self.max_bins = max(2, max_bins)
        self.bins: list[Bin] = []
        self.per_bin = 1
        #: the whole run's NaN/inf points: how many, the step of the first (bins merge, these never do)
        self.nonfinite = 0
        self.first_nonfinite_step: int | None = None
        #: whether the newest point is the run's first NaN/inf (restep_last then moves its step too)
        self.first_nonfinite_is_last = False

    def add(self, step: int | None, value: float) -> None:
        finite = math.isfinite(value)
        self.first_nonfinite_is_last = not finite and self.nonfinite == 0
        if not finite:
            self.nonfinite += 1
            if self.first_nonfinite_is_last:
                self.first_nonfinite_step = step
        b = self.bins[-1] if self.bins else None
        if b is not None and b.n < self.per_bin:
            b.last_step, b.last, b.n = step, value, b.n + 1
            if finite:
                b.lo = value if b.lo is None else min(b.lo, value)
                b.hi = value if b.hi is None else max(b.hi, value)
            else:
                b.nonfinite += 1
            return
        self.bins.append(Bin(step, step, value if finite else None, value if finite else None, value, 1,
                             0 if finite else 1))
        if len(self.bins) > self.max_bins:
            self._merge()

    def add_many(self, steps: Sequence[int | None], values: Sequence[float]) -> None:
        """:meth:`add` of each ``(step, value)``, in order, the very same bins after: the points that fill the newest
        bin go in at once (its lo and hi the least and largest of theirs, the first of equals kept, as one at a
        time keeps them)."""
        i, n = 0, len(values)
        while i < n:
            b = self.bins[-1] if self.bins else None
            if b is None or b.n >= self.per_bin:
                self.add(steps[i], values[i])
                i += 1
                continue
            room = self.per_bin - b.n
            chunk = values[i:i + room]
            finite = [v for v in chunk if math.isfinite(v)]
            if len(finite) < len(chunk):  # NaN/inf points: counted one at a time
                for j in range(i, i + len(chunk)):
                    self.add(steps[j], values[j])
                i += len(chunk)
                continue
            b.last_step, b.last, b.n = steps[i + len(chunk) - 1], chunk[-1], b.n + len(chunk)
            lo, hi = min(chunk), max(chunk)
            b.lo = lo if b.lo is None else min(b.lo, lo)
            b.hi = hi if b.hi is None else max(b.hi, hi)
            self.first_nonfinite_is_last = False
            i += len(chunk)

    def restep_last(self, step: int | None) -> None:
        """The newest point was printed at ``step``, not where it was added (the HF Trainer prints its
        log dict before the bar's redraw shows the step it belongs to)."""
        if self.bins:
            b = self.bins[-1]
            if b.n == 1:
                b.first_step = step
            b.last_step = step
        if self.first_nonfinite_is_last:
            self.first_nonfinite_step = step

    def _merge(self) -> None:
        merged = []
        for i in range(0, len(self.bins), 2):
            a = self.bins[i]
            if i + 1 == len(self.bins):
                merged.append(a)
                continue
            b = self.bins[i + 1]
            los = [x for x in (a.lo, b.lo) if x is not None]
            his = [x for x in (a.hi, b.hi) if x is not None]
            merged.append(Bin(a.first_step, b.last_step, min(los) if los else None, max(his) if his else None,
                              b.last, a.n + b.n, a.nonfinite + b.nonfinite))
        self.bins = merged
        self.per_bin *= 2

    def as_json(self) -> list[list[float | int | None]]:
        """``[[first_step, last_step, lo, hi], ...]`` oldest first (JSON: no NaN)."""
        return [[b.first_step, b.last_step, b.lo, b.hi] for b in self.bins]
