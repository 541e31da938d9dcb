"""Per-attempt statistics over optimizer-step durations (ARCHITECTURE.md R1-R3).

One :class:`StepStats` per attempt. It is fed one optimizer step at a time, from ``events.jsonl``
``step`` records (``dt`` in seconds, ``flags``, ``tokens``, ``padded_tokens``; :mod:`stepwatch.monitors.protocol`)
or from the log tailer (step and dt only; the tailer may say which step was the first of a process).

Rules (ARCHITECTURE.md R1-R3):

* The first step of each process (flag ``"first"``) carries compilation and is **excluded** from the
  counted set; so is a step whose interval held an evaluation or a save (flags ``"eval"``, ``"save"``:
  ARCHITECTURE.md R18). Not the slowest step: on a variable-width run an ordinary long batch can beat it.
  ``n`` counts only counted steps.
* Percentiles are **nearest-rank**: the value at 1-based rank ``ceil(p/100 * n)`` of the sorted
  counted values, so every reported number is a step that really happened.
* A mean is never reported: it hides the bimodality a partial fallback produces.

Cost: ``add`` is O(1) (deque and list appends); the counted durations reach the sorted list at the
next read of an order statistic, O(k log n) for k new steps (one sort when k is large, as when a
long finished run is read in one go). Memory: the sorted list
holds one float per counted step (about 32 bytes each, ~32 MB at 10^6 steps); everything else is
bounded (``recent_maxlen`` records for the screen, ``window`` steps for throughput).

No I/O, no clock reads, no UI imports: the status snapshot, the TUI and a headless alerting
process can all use it unchanged.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from operator import itemgetter
from typing import Any
from collections.abc import Iterable

from sortedcontainers import SortedList

from stepwatch.monitors.protocol import FLAG_EVAL, FLAG_FIRST, FLAG_SAVE, FLAG_STOPPED
from stepwatch.monitors.stats import stepbacklog
# re-exported (`x as x`): a step's record and the check of its duration live with the statistics' state
from stepwatch.monitors.stats.stepstate import StepRecord as StepRecord
from stepwatch.monitors.stats.stepstate import StepStatsState
from stepwatch.monitors.stats.stepstate import check_step_seconds as check_step_seconds
from stepwatch.monitors.stats.stepstate import opt_count
# re-exported (`x as x`): callers import the nearest-rank helpers from here too
from stepwatch.monitors.stats.nearest_rank import nearest_rank as nearest_rank
from stepwatch.monitors.stats.nearest_rank import nearest_rank_index as nearest_rank_index

#: The flag the emitter puts on the first step of each process (:mod:`stepwatch.monitors.protocol`).
FIRST = FLAG_FIRST
#: Flags of a step whose interval held an evaluation, a save or a stopped process: no training step time
#: (ARCHITECTURE.md R18).
PHASE_FLAGS = frozenset((FLAG_EVAL, FLAG_SAVE, FLAG_STOPPED))


#: Pending durations sorted as an array from this many (a backlog's first read)
_SORT_AS_ARRAY_FROM = 1 << 16
#: add_many by column from this many rows (a backlog)
_COLUMNS_FROM = 1024


def _uncounted(fl: tuple[str, ...]) -> bool:
    """A ``first`` step, or one whose interval held an evaluation, a save or a stopped process."""
    return bool(fl) and (FIRST in fl or not PHASE_FLAGS.isdisjoint(fl))

#: Unit suffix of the canonical line (ARCHITECTURE.md, "Reference runs").
UNIT = "seconds_per_optimizer_step"

#: Summary keys, in the order the status JSON prints them.
SUMMARY_KEYS = ("n", "min", "p50", "p90", "p99", "max", "last")


# StepRecord's generated __init__ sets its 7 fields with object.__setattr__ (it is frozen): ~1.5 us,
# a third of an add. add() builds the same object (class StepRecord, the same slot values) as a
# _RecordBuilder, a plain class with the very same slots whose __init__ stores them directly, then
# gives it its class: CPython allows __class__ assignment between classes of the same layout. About
# a third of the cost; tests/test_stepstats.py compares the two.
class _RecordBuilder:
    __slots__ = StepRecord.__slots__

    def __init__(self, step: int | None, dt_s: float, flags: tuple[str, ...], tokens: int | None,
                 padded_tokens: int | None, t: float | None, counted: bool) -> None:
        self.step = step
        self.dt_s = dt_s
        self.flags = flags
        self.tokens = tokens
        self.padded_tokens = padded_tokens
        self.t = t
        self.counted = counted


_INF = math.inf


class StepStats:
    """Incremental statistics over one attempt's optimizer-step durations, in seconds.

    ``recent_maxlen``: how many recent steps (counted or not) are kept for the screen.
    ``window``: how many recent *counted* steps throughput and the ETA look at (default 200: a
    few minutes to an hour of a 1-20 s/step run; long enough to smooth jitter, short enough to follow
    a real change of speed).
    """

    def __init__(self, recent_maxlen: int = 4096, window: int = 200) -> None:
        if recent_maxlen < 1 or window < 1:
            raise ValueError("recent_maxlen and window must be >= 1")
        self._sorted_list: SortedList = SortedList()
        # counted durations not yet in _sorted_list, in arrival order (see the _sorted property)
        self._pending = array("d")  # floats, not float objects: 8 bytes a step, freed from the heap they were read into
        self._recent: deque[StepRecord] = deque(maxlen=recent_maxlen)
        self._window: deque[StepRecord] = deque(maxlen=window)
        self._last: float | None = None
        self._last_step: int | None = None
        self._excluded_first = 0
        self._excluded_phase = 0
        self._seen = 0

    # ------------------------------------------------------------------ explicit state
    def to_state(self) -> StepStatsState:
        """Everything that decides what this reports next, by name (:class:`StepStatsState`); a copy."""
        return StepStatsState(
            recent_maxlen=self.recent_maxlen, window=self.window_size, sorted_s=tuple(self._sorted_list),
            pending_s=tuple(self._pending), recent=tuple(self._recent), counted_recent=tuple(self._window),
            last=self._last, last_step=self._last_step, excluded_first=self._excluded_first,
            excluded_phase=self._excluded_phase, seen=self._seen)

    @classmethod
    def from_state(cls, st: StepStatsState) -> StepStats:
        """Statistics in state ``st`` (ValueError for sizes the constructor refuses, TypeError for a non-number)."""
        s = cls(st.recent_maxlen, st.window)
        s._sorted_list = SortedList(st.sorted_s)
        s._pending = array("d", st.pending_s)
        s._recent.extend(st.recent)
        s._window.extend(st.counted_recent)
        s._last, s._last_step, s._seen = st.last, st.last_step, st.seen
        s._excluded_first, s._excluded_phase = st.excluded_first, st.excluded_phase
        return s

    @property
    def recent_maxlen(self) -> int:
        """How many recent steps (counted or not) are kept."""
        return self._recent.maxlen or 0

    @property
    def window_size(self) -> int:
        """How many recent counted steps throughput and the ETA look at."""
        return self._window.maxlen or 0

    def add_unkept(self, counted_s: Iterable[Any], excluded_first: int, excluded_phase: int, seen: int,
                   last_step: int | None) -> None:
        """Rows none of whose records would survive in the recent windows, summed up: their counted durations
        (runs of floats in [0, inf), arrival order), how many were left out and why, how many in all, the last one's
        step. The state one :meth:`add` per row leaves, but for ``last``: the caller adds the rows after them one by
        one, the last counted among them. A backlog's way (``monitors/stats/stepbacklog.py``)."""
        extend = self._pending.extend
        for run in counted_s:
            extend(run)
        self._excluded_first += excluded_first
        self._excluded_phase += excluded_phase
        if seen:
            self._seen += seen
            self._last_step = last_step

    # ------------------------------------------------------------------ feeding
    def add(
        self,
        step: int | None,
        dt_s: float,
        flags: Iterable[str] = (),
        tokens: int | None = None,
        padded_tokens: int | None = None,
        t: float | None = None,
    ) -> bool:
        """Add one optimizer step. Returns True when it was counted (False for a ``first``, ``eval`` or ``save`` step).

        ``step``: the trainer's global_step (may start anywhere and jump; only stored).
        ``dt_s``: end-to-end seconds of the step (the step event's ``dt``, as :mod:`stepwatch.telemetry.core` measures it). Raises ValueError when
        it is not a finite number >= 0 (a NaN or a negative time is a caller bug, not a step).
        ``tokens`` / ``padded_tokens``: real and padded token counts of the step, or None.
        ``t``: unix seconds of the step's end, or None.
        """
        # the common cases first, each the same value (or the same error) as the general helper
        dt = dt_s if type(dt_s) is float and 0.0 <= dt_s < _INF else check_step_seconds(dt_s)
        fl = tuple(flags or ())
        counted = not _uncounted(fl)
        rec: StepRecord = _RecordBuilder(  # type: ignore[assignment] - StepRecord(...), see _RecordBuilder
            step,
            dt,
            fl,
            tokens if tokens is None or (type(tokens) is int and tokens >= 0) else opt_count(tokens),
            padded_tokens
            if padded_tokens is None or (type(padded_tokens) is int and padded_tokens >= 0)
            else opt_count(padded_tokens),
            t,
            counted,
        )
        rec.__class__ = StepRecord  # type: ignore[assignment]
        self._recent.append(rec)
        self._seen += 1
        self._last_step = step
        if counted:
            self._pending.append(dt)
            self._window.append(rec)
            self._last = dt
        elif FIRST in fl:
            self._excluded_first += 1
        else:
            self._excluded_phase += 1
        return counted

    def add_many(self, rows: Iterable[tuple[Any, Any, Any, Any, Any, Any]]) -> int:
        """:meth:`add` for each row ``(step, dt_s, flags, tokens, padded_tokens, t)``, in order, and
        the very same state after; returns how many rows were counted.

        Attaching to a long run feeds 10^5 steps at once, and only the last ``recent_maxlen`` of
        them (and the last ``window`` counted) stay in the deques: records are built for those rows
        only, the others just add their duration. Every row's duration and flags are checked before
        any row is added: a row :meth:`add` would refuse raises what add() raises, with exactly the
        rows before it added.
        """
        if isinstance(rows, list) and len(rows) >= _COLUMNS_FROM:
            steps, dts, flags, tokens, padded, ts = (list(map(itemgetter(i), rows)) for i in range(6))
            got = stepbacklog.add_columns(self, steps, dts, flags, tokens, padded, ts, _uncounted, FIRST)
            if got is not None:
                return got
        return self._add_rows(rows)

    def add_columns(self, steps: list[Any], dts: Any, flags: list[Any], tokens: list[Any], padded: list[Any],
                    ts: list[Any]) -> int:
        """:meth:`add_many` of the rows ``zip(steps, dts, flags, tokens, padded, ts)``, given a field at a time (a
        fold's backlog: monitors/stats/stepbacklog.py)."""
        got = (stepbacklog.add_columns(self, steps, dts, flags, tokens, padded, ts, _uncounted, FIRST)
               if len(dts) >= _COLUMNS_FROM else None)
        return got if got is not None else self._add_rows(list(zip(steps, dts, flags, tokens, padded, ts)))

    def _add_rows(self, rows: Iterable[tuple[Any, Any, Any, Any, Any, Any]]) -> int:
        norm: list[tuple[Any, float, tuple[Any, ...], Any, Any, Any]] = []
        for step, dt_s, flags, tokens, padded, t in rows:
            try:
                dt = dt_s if type(dt_s) is float and 0.0 <= dt_s < _INF else check_step_seconds(dt_s)
                fl = tuple(flags or ())  # once: flags may be an iterator
            except Exception as e:
                self.add_many(norm)  # the rows before it, in full
                self.add(step, dt_s, flags, tokens, padded, t)  # raises what add() raises
                raise e
            norm.append((step, dt, fl, tokens, padded, t))
        n = len(norm)
        if n == 0:
            return 0
        # the first row whose record survives: within the last recent_maxlen rows, or among the
        # last `window` counted ones
        keep = max(0, n - (self._recent.maxlen or n))
        need = self._window.maxlen or n
        i = n
        while i > 0 and need > 0:
            i -= 1
            if not _uncounted(norm[i][2]):
                need -= 1
        keep = min(keep, i)
        pending = self._pending
        counted_n = 0
        for step, dt, fl, _tokens, _padded, _t in norm[:keep]:
            if FIRST in fl:
                self._excluded_first += 1
            elif _uncounted(fl):
                self._excluded_phase += 1
            else:
                pending.append(dt)
                counted_n += 1
                self._last = dt
            self._seen += 1
            self._last_step = step
        add = self.add
        for row in norm[keep:]:
            counted_n += add(*row)
        return counted_n

    def add_record(self, rec: dict[str, Any]) -> bool:
        """Add an ``events.jsonl`` ``step`` record (a dict with step, dt, flags, tokens, ...).

        A record whose ``dt`` is null (unknown) is skipped and returns False; a negative or
        non-finite ``dt`` raises ValueError as in :meth:`add`.
        """
        dt = rec.get("dt")
        if dt is None:
            return False
        return self.add(
            rec.get("step"),
            dt,
            rec.get("flags") or (),
            rec.get("tokens"),
            rec.get("padded_tokens"),
            rec.get("t"),
        )

    # ------------------------------------------------------------------ order statistics
    @property
    def _sorted(self) -> SortedList:
        """Every counted duration, sorted. ``add`` only appends to ``_pending``; the first read
        after adds merges them in one ``SortedList.update`` (one sort when the batch is large, as when
        attaching to a long run; else one ``add`` each, in sorted order). Equal values keep their
        arrival order either way, as with one ``add`` per step, so every read returns the same value."""
        pending = self._pending
        if pending:
            if len(pending) <= 16:  # a live refresh: one add each (update() would sort them first, for nothing)
                add = self._sorted_list.add
                for v in pending:  # arrival order: each lands right of its equals, as update() places them
                    add(v)
            elif len(pending) < _SORT_AS_ARRAY_FROM:
                self._sorted_list.update(pending)
            else:  # a backlog: sorted as an array, equals in arrival order; update() then finds one run
                import numpy as np  # noqa: PLC0415 - a backlog's cost only

                a = np.frombuffer(pending, dtype=np.float64)  # in [0, inf): only 0.0 and -0.0 are equals that differ
                self._sorted_list.update(np.sort(a, kind="stable" if np.signbit(a).any() else None).tolist())
            self._pending = array("d")
        return self._sorted_list

    @property
    def n(self) -> int:
        """Number of counted steps (first steps of processes excluded)."""
        return len(self._sorted)

    @property
    def seen(self) -> int:
        """Every step added, counted or not."""
        return self._seen

    @property
    def excluded_first(self) -> int:
        """How many ``first`` steps were left out of the counted set."""
        return self._excluded_first

    @property
    def excluded_phase(self) -> int:
        """How many steps whose interval held an evaluation or a save were left out of the counted set."""
        return self._excluded_phase

    def percentile(self, p: float) -> float | None:
        """Nearest-rank ``p``-th percentile of the counted steps, seconds; None when n == 0."""
        if not self._sorted:
            return None
        return self._sorted[nearest_rank_index(p, len(self._sorted))]

    @property
    def min(self) -> float | None:
        return self._sorted[0] if self._sorted else None

    @property
    def max(self) -> float | None:
        return self._sorted[-1] if self._sorted else None

    @property
    def p50(self) -> float | None:
        return self.percentile(50)

    @property
    def p90(self) -> float | None:
        return self.percentile(90)

    @property
    def p99(self) -> float | None:
        return self.percentile(99)

    @property
    def last(self) -> float | None:
        """Seconds of the most recent *counted* step (None when n == 0)."""
        return self._last

    @property
    def last_step(self) -> int | None:
        """global_step of the most recent step added, counted or not."""
        return self._last_step

    def summary(self) -> dict[str, Any]:
        """``{n, min, p50, p90, p99, max, last}`` in seconds; every value None when n == 0 (n is 0)."""
        if not self._sorted:
            return {k: (0 if k == "n" else None) for k in SUMMARY_KEYS}
        return {
            "n": self.n,
            "min": self.min,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "max": self.max,
            "last": self._last,
        }

    def canonical_line(self) -> str:
        """``n=1312 min=11.84 p50=19.48 p99=28.96 max=45.79 seconds_per_optimizer_step``.

        Two decimals, the format of ARCHITECTURE.md's "Reference runs". With no counted step:
        ``n=0 seconds_per_optimizer_step``.
        """
        if not self._sorted:
            return f"n=0 {UNIT}"
        return (
            f"n={self.n} min={self.min:.2f} p50={self.p50:.2f} p99={self.p99:.2f} "
            f"max={self.max:.2f} {UNIT}"
        )

    # ------------------------------------------------------------------ recent steps
    def recent(self, count: int | None = None) -> list[StepRecord]:
        """The most recent ``count`` steps (all if None), oldest first, including ``first`` steps."""
        items = list(self._recent)
        return items if count is None else items[-count:] if count > 0 else []

    def recent_p50(self) -> float | None:
        """Nearest-rank median of the last ``window`` counted steps, seconds (None when none)."""
        if not self._window:
            return None
        return nearest_rank(sorted(r.dt_s for r in self._window), 50)

    def throughput(self) -> dict[str, float | None]:
        """Throughput over the last ``window`` counted steps that carry token counts.

        Returns ``{tokens_per_s, real_tokens_per_s, padding_share}``:

        * ``tokens_per_s``: padded tokens / s = sum(padded_tokens) / sum(dt) over steps with
          ``padded_tokens``; None when no recent step has it.
        * ``real_tokens_per_s``: sum(tokens) / sum(dt) over steps with ``tokens``.
        * ``padding_share``: 1 - sum(tokens) / sum(padded_tokens) over steps with both (real
          tokens reported apart from padded ones: ARCHITECTURE.md, "Reference runs").

        Sums, not a mean of per-step rates, so a slow step weighs by its time. A value that cannot be
        computed is None, never 0.
        """
        pad_tok = pad_dt = real_tok = real_dt = both_real = both_pad = 0.0
        have_pad = have_real = have_both = False
        for r in self._window:
            if r.padded_tokens is not None:
                pad_tok += r.padded_tokens
                pad_dt += r.dt_s
                have_pad = True
            if r.tokens is not None:
                real_tok += r.tokens
                real_dt += r.dt_s
                have_real = True
            if r.tokens is not None and r.padded_tokens is not None:
                both_real += r.tokens
                both_pad += r.padded_tokens
                have_both = True
        return {
            "tokens_per_s": pad_tok / pad_dt if have_pad and pad_dt > 0 else None,
            "real_tokens_per_s": real_tok / real_dt if have_real and real_dt > 0 else None,
            "padding_share": 1.0 - both_real / both_pad if have_both and both_pad > 0 else None,
        }

    # ------------------------------------------------------------------ histogram
    def histogram(
        self,
        bins: int = 20,
        scale: str = "log",
        lo_s: float | None = None,
        hi_s: float | None = None,
    ) -> list[tuple[float, float, int]]:
        """Counts of counted steps per duration bin: ``[(lo_s, hi_s, count), ...]`` low to high.

        A max-per-bucket sparkline hides a second mode; counts per duration bin show it (a partial
        fallback is a second hump ~20x to the right). ``scale`` "log" (default: a 20 s and a 400 s
        mode both get resolution) or "linear". Bounds default to the counted min and max; bin i
        holds ``lo <= dt < hi`` except the last, which includes its upper edge. Values outside given
        bounds are clamped into the first / last bin so every counted step is in exactly one bin.
        O(bins * log n). Returns [] when n == 0. Raises ValueError for bins < 1, an unknown scale, or
        a log scale with a non-positive bound (a 0 s step falls into the first bin).
        """
        if bins < 1:
            raise ValueError("bins must be >= 1")
        if scale not in ("log", "linear"):
            raise ValueError(f"unknown scale {scale!r} (log or linear)")
        if not self._sorted:
            return []
        lo = self._sorted[0] if lo_s is None else float(lo_s)
        hi = self._sorted[-1] if hi_s is None else float(hi_s)
        if scale == "log":
            if (lo_s is not None and lo <= 0) or (hi_s is not None and hi <= 0):
                raise ValueError("log-scale histogram bounds must be > 0")
            if lo <= 0:  # auto bound and a 0 s step: start at the smallest positive step
                i = self._sorted.bisect_right(0.0)
                lo = self._sorted[i] if i < len(self._sorted) else hi
            if hi <= 0:  # every counted step took 0 s
                return [(0.0, 0.0, len(self._sorted))]
        if hi < lo:
            raise ValueError("hi_s must be >= lo_s")
        if hi == lo:
            return [(lo, hi, len(self._sorted))]
        if scale == "log":
            a, b = math.log(lo), math.log(hi)
            edges = [math.exp(a + (b - a) * i / bins) for i in range(bins + 1)]
        else:
            edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
        edges[0], edges[-1] = lo, hi
        out: list[tuple[float, float, int]] = []
        prev = 0
        for i in range(bins):
            cut = len(self._sorted) if i == bins - 1 else self._sorted.bisect_left(edges[i + 1])
            out.append((edges[i], edges[i + 1], cut - prev))
            prev = cut
        return out
