"""The fallback detector's baseline: the run's own recent step times, median and width-aware.

What a step is expected to take, from the accepted steady steps before it (see
:mod:`stepwatch.monitors.detectors.fallback` for the numbers and their sources): the median of the
last ``BASELINE_WINDOW`` steps, or with token counts the median over the ``NEIGHBORS`` nearest in
log-width of ``dt_i * max(1, w / w_i) ** 2``. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import Any
from collections.abc import Iterable

from stepwatch.monitors.stats.stepstats import nearest_rank

#: Neighbours (nearest in log padded width) the width-aware expected time is the median of.
NEIGHBORS = 9
#: A sorted view of Baseline stops following the window after this many adds without a read.
VIEW_IDLE = 8
_EXACT_INT = 2**53  # ints below convert to float exactly
_DT_OF = itemgetter(0)
_PT_OF = itemgetter(2)


def width_of(tokens: Any, padded_tokens: Any) -> float | None:
    """A step's width: its padded token count, else its real one, as a positive finite float; None
    when neither is one (a bool, text that is no number, 0, inf... are not counts)."""
    if type(padded_tokens) is int and 0 < padded_tokens < _EXACT_INT:  # nearly every step: exact
        return float(padded_tokens)
    for v in (padded_tokens, tokens):
        if v is None or isinstance(v, bool):
            continue
        try:
            f = float(v)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond a float's range
            continue
        if math.isfinite(f) and f > 0:
            return f
    return None


def ratio(dt: float, expected: float) -> float:
    """dt / expected; a 0 s expectation makes any positive dt infinitely slow and 0 s a 1. (Every
    caller passes a non-empty baseline's expectation: never None.)"""
    if expected > 0:
        return dt / expected
    return math.inf if dt > 0 else 1.0


def _median(values: Iterable[float]) -> float:
    return nearest_rank(sorted(values), 50)


# Windows here hold at most a few hundred values: a plain sorted list kept with bisect (C code, a
# memmove of a few hundred pointers) is several times cheaper per add/remove than a SortedList, and
# gives the same order. SortedList.add inserts to the right of equal values and remove() deletes the
# leftmost equal value; insort_right / del at bisect_left do the same, so even 0.0 and -0.0 end up
# in the same places and every nearest-rank read returns the same value, sign of zero included.
# (nearest_rank_index(50, n) is (n - 1) >> 1 for n >= 1: rank ceil(n / 2).)


def _remove(sorted_list: list, value: Any) -> None:
    del sorted_list[bisect_left(sorted_list, value)]


@dataclass(frozen=True, slots=True)
class BaselineState:
    """What a :class:`Baseline` holds, by name: its capacity and its steps, oldest first, each
    ``(dt seconds, width or None)``. Everything else (width groups, sorted views) is derived from
    these, so this is the whole of it: ``Baseline.from_state(b.to_state())`` expects what ``b`` does."""

    maxlen: int
    steps: tuple[tuple[float, float | None], ...]

    @property
    def widths(self) -> frozenset[float | None]:
        """The distinct widths of the steps (None for a step without one)."""
        return frozenset(w for _, w in self.steps)


class Baseline:
    """Recent accepted steps: the median step time, and width-aware expected times.

    Holds at most ``maxlen`` steps, (dt seconds, width tokens or None), first in first out.
    O(1) add/evict plus a memmove while a sorted view is kept up to date; expected() is
    O(NEIGHBORS log NEIGHBORS) in a run of repeated widths, O(log n + NEIGHBORS) otherwise.

    Widths: one deque per distinct width (``_groups``, arrival order) and the distinct log widths
    in a sorted list (``_lws``). A new step is the newest of its group and the evicted one the
    oldest of the window, hence of its group, so both ends are O(1). Read in ``_lws`` order (the
    groups of one log width merged by arrival), they are exactly the sorted list
    ``[(log w, seq, dt, w), ...]`` that expected() picks neighbours from (:meth:`_around`).

    Sorted views (the step times for ``median_s``, the times per token for ``level``): read at every
    step only in some runs (the step times when steps have no width). Each is kept in step with the
    window while it is read, left as it was (stale) after ``VIEW_IDLE`` adds without a read, and
    rebuilt by one sort at the next read. Both give the same list: the window is first in, first
    out, so a stable sort in arrival order places equal values (0.0 and -0.0) exactly where
    insort-right / delete-leftmost put them. A stale view still bounds the current median from
    above (:meth:`level_bound`).
    """

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._q: deque[tuple[float, float | None, float | None]] = deque()  # (dt, w, dt / w)
        self._n_width = 0
        self._groups: dict[float, deque[float]] = {}  # width -> step times, arrival order
        self._lws: list[float] = []  # sorted distinct log widths
        self._lw_ws: dict[float, list[float]] = {}  # log width -> the widths with that log
        self._shared: set[float] = set()  # log widths shared by more than one width (float ties)
        # sorted views: the list, whether it is exact (kept in step), adds since its last read
        self._dts: list[float] = []
        self._dts_sync = True
        self._dts_idle = 0
        self._pt: list[float] = []
        self._pt_sync = True
        self._pt_idle = 0
        self._pt_evicted = 0  # width steps evicted since _pt went stale

    def __len__(self) -> int:
        return len(self._q)

    def to_state(self) -> BaselineState:
        """The steps of the window, by name (see :class:`BaselineState`)."""
        return BaselineState(self.maxlen, tuple((dt, w) for dt, w, _ in self._q))

    @classmethod
    def from_state(cls, st: BaselineState) -> Baseline:
        """A window holding ``st``'s steps, as one :meth:`add` per step leaves it (its sorted views are
        rebuilt at their next read: they give the same values either way)."""
        b = cls(st.maxlen)
        add = b.add
        for dt, w in st.steps:
            add(dt, w)
        return b

    @property
    def n_width(self) -> int:
        return self._n_width

    def all_have_width(self) -> bool:
        """Every step of the window has a width (none: True). One call: read at every judged step."""
        return self._n_width == len(self._q)

    def add(self, dt: float, w: float | None) -> None:
        q = self._q
        if w is None:
            q.append((dt, None, None))
        else:
            pt = dt / w
            q.append((dt, w, pt))
            g = self._groups.get(w)
            if g is None:
                self._new_group(w, dt)
            else:
                g.append(dt)
            self._n_width += 1
            if self._pt_sync:
                if self._pt_idle >= VIEW_IDLE:
                    self._pt_sync = False
                    self._pt_evicted = 0
                else:
                    self._pt_idle += 1
                    insort(self._pt, pt)
        if self._dts_sync:
            if self._dts_idle >= VIEW_IDLE:
                self._dts_sync = False
            else:
                self._dts_idle += 1
                insort(self._dts, dt)
        if len(q) > self.maxlen:
            odt, ow, opt = q.popleft()
            if self._dts_sync:
                d = self._dts
                del d[bisect_left(d, odt)]
            if ow is not None:
                g = self._groups[ow]
                g.popleft()  # the oldest step of the window is the oldest of its group
                if not g:
                    self._drop_group(ow)
                self._n_width -= 1
                if self._pt_sync:
                    v = self._pt
                    del v[bisect_left(v, opt)]
                else:
                    self._pt_evicted += 1

    def _new_group(self, w: float, dt: float) -> None:
        self._groups[w] = deque((dt,))
        lw = math.log(w)
        ws = self._lw_ws.get(lw)
        if ws is None:
            self._lw_ws[lw] = [w]
            insort(self._lws, lw)
        else:
            ws.append(w)
            self._shared.add(lw)

    def _drop_group(self, w: float) -> None:
        del self._groups[w]
        lw = math.log(w)
        ws = self._lw_ws[lw]
        ws.remove(w)
        if not ws:
            del self._lw_ws[lw]
            _remove(self._lws, lw)
        if len(ws) < 2:
            self._shared.discard(lw)

    # ------------------------------------------------------------------ sorted views
    def _sorted_dts(self) -> list[float]:
        if not self._dts_sync:
            self._dts = sorted(map(_DT_OF, self._q))
            self._dts_sync = True
        self._dts_idle = 0
        return self._dts

    def _sorted_pt(self) -> list[float]:
        # read only while every step has a width (level()): every entry has its time per token
        if not self._pt_sync:
            self._pt = sorted(map(_PT_OF, self._q))
            self._pt_sync = True
        self._pt_idle = 0
        return self._pt

    def median_s(self) -> float | None:
        if not self._q:
            return None
        d = self._sorted_dts()
        return d[(len(d) - 1) >> 1]

    def level(self) -> float | None:
        """Median per padded token when every step has a width, else median seconds per step."""
        if not self._q:
            return None
        d = self._sorted_pt() if self._n_width == len(self._q) else self._sorted_dts()
        return d[(len(d) - 1) >> 1]

    def level_bound(self) -> float | None:
        """An upper bound of the per-token median (``level()`` when every step has a width), or
        None; does not count as a read of the view. While the view is kept in step the bound is the
        median itself.

        The current multiset T is the view's S less at most r = ``_pt_evicted`` of its values, plus
        new ones. Removing r values moves an order statistic at most r ranks up in S, adding values
        only lowers it: T[m] <= S[m + r].
        """
        n = self._n_width
        if not n:
            return None
        i = ((n - 1) >> 1) + (0 if self._pt_sync else self._pt_evicted)
        pt = self._pt
        return pt[i] if i < len(pt) else None

    # ------------------------------------------------------------------ expected
    def _by_log_width(self, lw: float) -> list[tuple[float, int, float, float]]:
        """The steps of log width ``lw`` as ``(log w, seq, dt, w)``, in arrival order."""
        # The seq in the tuples is not read by expected(): only their order (arrival) matters.
        ws = self._lw_ws[lw]
        if len(ws) == 1:
            w = ws[0]
            return [(lw, 0, dt, w) for dt in self._groups[w]]
        return [(lw, 0, dt, w) for dt, w, _ in self._q if w in ws]  # widths of one log (rare)

    def _around(self, lw: float, k: int) -> list[tuple[float, int, float, float]]:
        """``by_width[max(0, i - k) : i + k]`` of the sorted list ``[(log w, seq, dt, w)]`` of
        the steps with a width, where ``i`` is the first position with log w >= ``lw``."""
        lws = self._lws
        j = bisect_left(lws, lw)
        left: list[tuple[float, int, float, float]] = []
        jj = j - 1
        while jj >= 0 and len(left) < k:
            left[:0] = self._by_log_width(lws[jj])[-(k - len(left)) :]
            jj -= 1
        right: list[tuple[float, int, float, float]] = []
        jj = j
        while jj < len(lws) and len(right) < k:
            right.extend(self._by_log_width(lws[jj])[: k - len(right)])
            jj += 1
        return left + right

    def expected(self, w: float | None) -> tuple[float | None, str]:
        """Expected seconds for a step of width ``w`` and the mode used ("width" or "median")."""
        nw = self._n_width
        # nw >= min(NEIGHBORS, max(3, len(self._q))), without the two calls
        if w is not None and (nw >= NEIGHBORS or (nw >= 3 and nw >= len(self._q))):
            k = NEIGHBORS
            g = self._groups.get(w)
            if g is not None and len(g) >= k and not (self._shared and math.log(w) in self._shared):
                # Fast path, the same numbers: at least k steps have width w and no other width
                # has its log. In the sorted list they are the first k from position i, at
                # distance 0.0; every other candidate is to the left (log w_i < log w: a non-zero
                # distance), so the stable sort keeps these k first, in order, and each is scaled
                # by max(1, w / w_i) ** 2 == 1.0 exactly.
                picked = sorted(islice(g, k))
                return picked[(k - 1) >> 1], "width"
            lw = math.log(w)
            around = self._around(lw, k)
            around.sort(key=lambda e: abs(e[0] - lw))
            picked = [dt_i * max(1.0, w / w_i) ** 2 for _, _, dt_i, w_i in around[:k]]
            return _median(picked), "width"
        return self.median_s(), "median"
