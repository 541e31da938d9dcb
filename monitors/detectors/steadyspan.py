"""The fallback detector's steady spans, judged as arrays: the cold path of a long backlog (ARCHITECTURE.md,
"Attach: one optimisation").

A backlog of 10^6 steps is mostly one thing: a steady run of one batch shape, no slow step, nothing that moves the
state. :func:`consume` recognises such a span of the rows :meth:`FallbackDetector.add_columns` is given and applies it
in one go, leaving the detector in the very state one :meth:`FallbackDetector.add` per row leaves; everything else
(warm-up, a slow step, a possible baseline restart, a second width, a step without a width) is the per-step path's,
which resumes at the first row the span cannot vouch for. Why each shortcut gives the per-step path's numbers:

* **Expected time.** With every step of the baseline window of one width ``w`` (and at least ``NEIGHBORS`` of them)
  the per-step path takes the median of the window's ``NEIGHBORS`` oldest steps (``_Baseline.expected``'s fast
  branch); a span adds its judged steps to the window in order, so step ``a`` of the span is expected to take the
  median of ``A[s:s + 9]``, ``s = max(0, P + a - window)``, over the window's steps ``A`` then the span's.
* **No slow step.** A step is slow only above the trip, and the trip is never under ``trip_ratio_min``: a span whose
  judged steps all score at or below it has none, whatever the trip's exact value.
* **No baseline restart.** The drop test restarts when every step of the short window runs under the level (the
  per-token median of the window) / ``drop_factor``. The median of ``n <= window`` values is at most the largest of
  any ``(n - 1) // 2 + 1`` of them, hence at most the largest of the steps from the start of the aligned block of
  ``(window - 1) // 2 + 1`` (100) before k's up to k, which hold the newest that many (and nothing after k). The
  largest of the aligned block of ``steady_run // 2`` inside the short window is at most the short window's
  largest. When that lower bound is at or above the upper one / ``drop_factor``, no restart can happen.
* **The end state** (windows, scores, the last ``flag_window`` valley flags with their exact trip, the history,
  the slowest steady step, the excused steps) is rebuilt from the span's tail.

numpy is imported here only (a backlog's cost; a live step never comes this way). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from itertools import compress
from collections.abc import Callable, Iterable
from typing import Any

from stepwatch.monitors.detectors.baseline import NEIGHBORS, _Baseline, _width
from stepwatch.monitors.states import FLAGGED, OK
from stepwatch.monitors.stats.nearest_rank import nearest_rank_index

#: The fallback detector (monitors/detectors/fallback.py, which imports this module): its state is read and set here.
FallbackDetector = Any

#: Rows judged as arrays at most at once, and the first try's size (doubled after a span that held throughout,
#: back to the first after one that did not: a run that leaves the steady state often costs little here).
BLOCK_MAX = 1 << 16
BLOCK_MIN = 1 << 10


def applies(det: FallbackDetector) -> bool:
    """The detector is where a span can start: steady, ``ok`` or ``flagged`` (a span moves neither), and its baseline
    window of one width with at least NEIGHBORS steps."""
    base = det._base
    return (det._steady and det._state in (OK, FLAGGED) and len(base._groups) == 1
            and base._n_width == len(base._q) >= NEIGHBORS and base.maxlen == det.baseline_window
            and (det._short_in_base or det._state == FLAGGED))


def consume(det: FallbackDetector, cols: tuple[Any, ...], start: int, size: int,
            excuse_of: Callable[[Iterable[str]], str | None]) -> int:
    """Apply the steady span of the rows ``start`` to ``start + size`` of ``cols`` (steps, dts, flags, tokens,
    padded: a field each) from its first row to ``det``; the rows applied (0: none; the per-step path goes on from
    ``start`` plus that). ``excuse_of``: the detector's rule of the flags that excuse a step. Call only when
    :func:`applies`."""
    import numpy as np  # noqa: PLC0415 - a backlog's cost only

    end = start + size
    dts_in = cols[1][start:end]
    typed = isinstance(dts_in, array) and dts_in.typecode == "d"  # a fold's column: floats already
    if not len(dts_in) or not typed and set(map(type, dts_in)) != {float}:
        return 0  # ints, text...: the per-step path converts or refuses them one by one
    base = det._base
    (w0,) = base._groups
    pads = cols[4][start:end]
    if not (set(map(type, pads)) == {int} and set(pads) == {w0}):
        ws = list(map(_width, cols[3][start:end], pads))
        stop = next((j for j, w in enumerate(ws) if w != w0), len(ws))
        if stop == 0:
            return 0
        dts_in = dts_in[:stop]
    flags_in = cols[2][start:start + len(dts_in)]
    n = len(dts_in)
    dt = np.frombuffer(dts_in, dtype=np.float64) if typed else np.array(dts_in, dtype=np.float64)
    ok_dt = (dt >= 0.0) & (dt < math.inf)  # a NaN fails both
    excuse: dict[int, str] = {}
    for j in compress(range(n), flags_in):
        e = excuse_of(flags_in[j])
        if e is not None:
            excuse[j] = e
    judged = np.ones(n, dtype=bool)
    if excuse:
        judged[list(excuse)] = False
    # the judged steps before each row: where its baseline window starts
    before = np.cumsum(judged) - judged
    old = [d for d, _, _ in base._q]
    P, maxlen = len(old), base.maxlen
    A = np.concatenate((np.array(old, dtype=np.float64), dt[judged]))
    med9 = np.partition(np.lib.stride_tricks.sliding_window_view(A, NEIGHBORS), NEIGHBORS >> 1, axis=1)[:, NEIGHBORS >> 1]
    exp = med9[np.maximum(0, P + before - maxlen)]
    with np.errstate(divide="ignore", invalid="ignore"):
        score = dt / exp
    bad = ~ok_dt | ~(exp > 0.0) | (judged & ~(score <= det.trip_ratio_min))
    if det._state != FLAGGED:
        # after judged step a (A's index k = P + a) is added: is a baseline restart ruled out? The level's bound:
        # the largest of any `of` of the window's steps is at least its median (fewer lie under it), and so is the
        # largest from the aligned block of `of` before k's to k, which holds the newest `of` (and nothing after
        # k). The short window's largest is at least that of the aligned block of steady_run // 2 within it.
        of, h = (maxlen - 1) // 2 + 1, max(1, det.steady_run // 2)
        pt = A / w0
        k = P + np.arange(int(judged.sum()))
        full = len(det._short) + np.arange(1, len(k) + 1) >= det.steady_run
        bound = _max_since_last_block(pt, of)[k]
        short_max = _block_max(pt, h)[(k + 1) // h]  # block (k + 1) // h - 1: within [k - steady_run + 1, k]
        maybe = full & ~(short_max >= bound / det.drop_factor)
        bad[np.flatnonzero(judged)[maybe]] = True
    stop = int(np.argmax(bad)) if bad.any() else n
    if stop:
        _apply(det, cols[0], start, dt[:stop], score[:stop], judged[:stop], excuse, w0)
    return stop


def _block_max(x: Any, size: int) -> Any:
    """The largest of each aligned block of ``size`` values of ``x`` (the last one short), after one block of
    -inf: entry b + 1 is block b's."""
    import numpy as np  # noqa: PLC0415

    n = len(x)
    padded = np.full((-(-n // size) + 1) * size, -math.inf)
    padded[size:size + n] = x
    return padded.reshape(-1, size).max(axis=1)


def _max_since_last_block(x: Any, size: int) -> Any:
    """Entry k: the largest of ``x`` from the start of the aligned block of ``size`` before k's to k."""
    import numpy as np  # noqa: PLC0415

    n = len(x)
    blocks = np.full((-(-n // size), size), -math.inf)
    blocks.ravel()[:n] = x
    so_far = np.maximum.accumulate(blocks, axis=1).ravel()[:n]  # within k's own block, up to k
    before = np.concatenate(([-math.inf], blocks.max(axis=1)[:-1]))  # the whole block before it
    return np.maximum(so_far, before[np.arange(n) // size])


def _apply(det: FallbackDetector, steps: list[Any], start: int, dt: Any, score: Any, judged: Any,
           excuse: dict[int, str], w: float) -> None:
    """The detector's state after the span's rows (``dt``, ``score``, ``judged``: their arrays; row j's step is
    ``steps[start + j]``), as one add() per row leaves it (see the module docstring)."""
    import numpy as np  # noqa: PLC0415

    n = len(dt)
    det._seen += n
    for j, e in sorted(excuse.items()):
        if j < n:
            if e == "first":
                det._last_first_step = steps[start + j]
            det._excused.append((steps[start + j], e, float(score[j])))
    acc = np.flatnonzero(judged)
    if not len(acc):
        return
    tail = acc[-max(det._history.maxlen or 0, det.baseline_window + det.flag_window):]
    t_rows, t_dts, t_scores = tail.tolist(), dt[tail].tolist(), score[tail].tolist()
    det._history.extend((steps[start + j], d, w, "a") for j, d in zip(t_rows, t_dts))
    old = list(det._base._q)
    base = det._base = _Baseline(det.baseline_window)
    for d, ww, _pt in old[-det.baseline_window:]:
        base.add(d, ww)
    for d in t_dts[-det.baseline_window:]:
        base.add(d, w)
    # the scores window, and the valley flags of the last flag_window judged steps with the trip each one met
    new_scores = t_scores[-(det.baseline_window + det.flag_window):]
    allsc = list(det._scores_q) + new_scores
    first_new = len(allsc) - len(new_scores)
    judged0 = det._judged + len(acc) - len(new_scores)
    for i in range(max(first_new, len(allsc) - det.flag_window), len(allsc)):
        trip = _trip_of(det, allsc[max(0, i - det.baseline_window):i])
        det._window.append((None, judged0 + i - first_new + 1, allsc[i] > trip / det.valley_div))
    q = det._scores_q = deque(allsc[-det.baseline_window:])
    det._scores = sorted(q)
    det._scores_sync, det._scores_idle, det._scores_added, det._scores_evicted = True, 0, 0, 0
    det._short.extend((d, w) for d in t_dts[-det.steady_run:])
    det._judged += len(acc)
    best = int(acc[int(np.argmax(score[acc]))])  # the first of the largest, as a strict > per step keeps
    if det._max_ok_score is None or float(score[best]) > det._max_ok_score:
        det._max_ok_score, det._max_ok_step = float(score[best]), steps[start + best]


def _trip_of(det: FallbackDetector, window: list[float]) -> float:
    """:meth:`FallbackDetector._trip` for a scores window (oldest first), from scratch."""
    n = len(window)
    if n < 4:
        return det.trip_ratio_min
    sc = sorted(window)
    trip = 1.0 + det.spread_mult * ((sc[nearest_rank_index(75, n)] - sc[nearest_rank_index(25, n)]) / 1.349)
    return trip if trip > det.trip_ratio_min else det.trip_ratio_min
