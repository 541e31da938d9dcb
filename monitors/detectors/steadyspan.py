"""The fallback detector's steady spans, judged as arrays: the cold path of a long backlog (ARCHITECTURE.md,
"Attach: one optimisation").

A backlog of 10^6 steps is mostly one thing: a steady run of one batch shape, no slow step, nothing that moves the
state. :func:`consume` recognises such a span of the rows :meth:`FallbackDetector.add_columns` is given and applies it
in one go to the detector's :class:`~stepwatch.monitors.detectors.fallbackstate.FallbackState`, returning the very
state one :meth:`FallbackDetector.add` per row leaves; everything else
(warm-up, a slow step, a possible baseline restart, a second width, a step without a width) is the per-step path's,
which resumes at the first row the span cannot vouch for. Why each shortcut gives the per-step path's numbers:

* **Expected time.** With every step of the baseline window of one width ``w`` (and at least ``NEIGHBORS`` of them)
  the per-step path takes the median of the window's ``NEIGHBORS`` oldest steps (``Baseline.expected``'s fast
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
* **The end state** (windows, scores, the last ``flag_window`` valley flags with their exact trip, from the one
  :func:`~stepwatch.monitors.detectors.fallbackstate.trip_point` the detector calls, the history, the slowest steady
  step, the excused steps) is rebuilt from the span's tail.

numpy is imported here only (a backlog's cost; a live step never comes this way). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import replace
from itertools import compress
from collections.abc import Callable, Iterable
from typing import Any

from stepwatch.monitors.detectors.baseline import NEIGHBORS, BaselineState, width_of
from stepwatch.monitors.detectors.fallbackstate import HISTORY_KEPT, KEEP_STEPS, FallbackState, trip_of_scores
from stepwatch.monitors.states import FLAGGED, OK

#: Rows judged as arrays at most at once, and the first try's size (doubled after a span that held throughout,
#: back to the first after one that did not: a run that leaves the steady state often costs little here).
BLOCK_MAX = 1 << 16
BLOCK_MIN = 1 << 10


def applies(steady: bool, state: str, base: BaselineState, baseline_window: int, steady_run: int) -> bool:
    """A detector (its :class:`FallbackState`'s fields of these names) is where a span can start: steady, ``ok`` or
    ``flagged`` (a span moves neither), and its baseline window of one width with at least NEIGHBORS steps (and the
    short window within it, unless flagged: the drop test's bound needs it). Asked before the whole state is taken:
    most stretches of a run of several widths are not such a place."""
    if not (steady and state in (OK, FLAGGED) and len(base.steps) >= NEIGHBORS and base.maxlen == baseline_window
            and (steady_run <= baseline_window or state == FLAGGED)):
        return False
    widths = base.widths
    return len(widths) == 1 and None not in widths


def consume(st: FallbackState, cols: tuple[Any, ...], start: int, size: int,
            excuse_of: Callable[[Iterable[str]], str | None]) -> tuple[int, FallbackState]:
    """Apply the steady span of the rows ``start`` to ``start + size`` of ``cols`` (steps, dts, flags, tokens,
    padded: a field each) from its first row to a detector in state ``st``: the rows applied and the state after them
    (0 and ``st``: none; the per-step path goes on from ``start`` plus that). ``excuse_of``: the detector's rule of
    the flags that excuse a step. Call only when :func:`applies`."""
    import numpy as np  # noqa: PLC0415 - a backlog's cost only

    end = start + size
    dts_in = cols[1][start:end]
    typed = isinstance(dts_in, array) and dts_in.typecode == "d"  # a fold's column: floats already
    if not len(dts_in) or not typed and set(map(type, dts_in)) != {float}:
        return 0, st  # ints, text...: the per-step path converts or refuses them one by one
    base = st.base
    (w0,) = base.widths
    assert w0 is not None  # applies() says so
    pads = cols[4][start:end]
    if not (set(map(type, pads)) == {int} and set(pads) == {w0}):
        ws = list(map(width_of, cols[3][start:end], pads))
        stop = next((j for j, w in enumerate(ws) if w != w0), len(ws))
        if stop == 0:
            return 0, st
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
    old = [d for d, _ in base.steps]
    P, maxlen = len(old), base.maxlen
    A = np.concatenate((np.array(old, dtype=np.float64), dt[judged]))
    med9 = np.partition(np.lib.stride_tricks.sliding_window_view(A, NEIGHBORS), NEIGHBORS >> 1, axis=1)[:, NEIGHBORS >> 1]
    exp = med9[np.maximum(0, P + before - maxlen)]
    with np.errstate(divide="ignore", invalid="ignore"):
        score = dt / exp
    bad = ~ok_dt | ~(exp > 0.0) | (judged & ~(score <= st.trip_ratio_min))
    if st.state != FLAGGED:
        # after judged step a (A's index k = P + a) is added: is a baseline restart ruled out? The level's bound:
        # the largest of any `of` of the window's steps is at least its median (fewer lie under it), and so is the
        # largest from the aligned block of `of` before k's to k, which holds the newest `of` (and nothing after
        # k). The short window's largest is at least that of the aligned block of steady_run // 2 within it.
        of, h = (maxlen - 1) // 2 + 1, max(1, st.steady_run // 2)
        pt = A / w0
        k = P + np.arange(int(judged.sum()))
        full = len(st.short) + np.arange(1, len(k) + 1) >= st.steady_run
        bound = _max_since_last_block(pt, of)[k]
        short_max = _block_max(pt, h)[(k + 1) // h]  # block (k + 1) // h - 1: within [k - steady_run + 1, k]
        maybe = full & ~(short_max >= bound / st.drop_factor)
        bad[np.flatnonzero(judged)[maybe]] = True
    stop = int(np.argmax(bad)) if bad.any() else n
    if not stop:
        return 0, st
    return stop, _apply(st, cols[0], start, dt[:stop], score[:stop], judged[:stop], excuse, w0)


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


def _apply(st: FallbackState, steps: list[Any], start: int, dt: Any, score: Any, judged: Any,
           excuse: dict[int, str], w: float) -> FallbackState:
    """The detector's state after the span's rows (``dt``, ``score``, ``judged``: their arrays; row j's step is
    ``steps[start + j]``), as one add() per row leaves it (see the module docstring)."""
    import numpy as np  # noqa: PLC0415

    n = len(dt)
    last_first_step = st.last_first_step
    excused = list(st.excused)
    for j, e in sorted(excuse.items()):
        if j < n:
            if e == "first":
                last_first_step = steps[start + j]
            excused.append((steps[start + j], e, float(score[j])))
    st = replace(st, seen=st.seen + n, last_first_step=last_first_step, excused=tuple(excused[-KEEP_STEPS:]))
    acc = np.flatnonzero(judged)
    if not len(acc):
        return st
    bw, fw = st.baseline_window, st.flag_window
    tail = acc[-max(HISTORY_KEPT, bw + fw):]
    t_rows, t_dts, t_scores = tail.tolist(), dt[tail].tolist(), score[tail].tolist()
    history = st.history + tuple((steps[start + j], d, w, "a") for j, d in zip(t_rows, t_dts))
    base = st.base.steps + tuple((d, w) for d in t_dts[-bw:])
    # the scores window, and the valley flags of the last flag_window judged steps with the trip each one met
    new_scores = t_scores[-(bw + fw):]
    allsc = list(st.scores) + new_scores
    first_new = len(allsc) - len(new_scores)
    judged0 = st.judged + len(acc) - len(new_scores)
    window = list(st.window)
    for i in range(max(first_new, len(allsc) - fw), len(allsc)):
        trip = trip_of_scores(allsc[max(0, i - bw):i], st.trip_ratio_min, st.spread_mult)
        window.append((None, judged0 + i - first_new + 1, allsc[i] > trip / st.valley_div))
    best = int(acc[int(np.argmax(score[acc]))])  # the first of the largest, as a strict > per step keeps
    max_ok_score, max_ok_step = st.max_ok_score, st.max_ok_step
    if max_ok_score is None or float(score[best]) > max_ok_score:
        max_ok_score, max_ok_step = float(score[best]), steps[start + best]
    return replace(
        st, history=history[-HISTORY_KEPT:], base=BaselineState(st.base.maxlen, base[-st.base.maxlen:]),
        scores=tuple(allsc[-bw:]), window=tuple(window[-fw:]),
        short=(st.short + tuple((d, w) for d in t_dts[-st.steady_run:]))[-st.steady_run:],
        judged=st.judged + len(acc), max_ok_score=max_ok_score, max_ok_step=max_ok_step,
    )
