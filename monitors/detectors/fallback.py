"""The eager-fallback detector: flags the moment step times go bimodal (a silent fallback to eager).

ARCHITECTURE.md R3, R10, R11. No I/O, no clock reads, no UI imports: the status
snapshot, the TUI and a future headless alerting process run them unchanged. Time is always
passed in.

Fallback detector — the numbers and where they come from
========================================================

A compiled run sits at p50 ~20 s per optimizer step; one that silently fell back to eager sits at
~400 s (ARCHITECTURE.md, "Reference runs": "roughly 20x"). The real compiled run's own jitter, first step
included, is max/p50 = 45.79/19.75 = 2.32 (the same reference run, 1,445 steps). The trip point sits far
outside the jitter and far below the fallback (ARCHITECTURE.md R11):

* A step's **score** is ``dt / expected``. ``expected`` is the run's OWN baseline:

  - without token counts: the median of the last ``BASELINE_WINDOW`` (200) accepted steady steps;
  - with ``padded_tokens`` (or ``tokens`` when padded is null) — "width" ``w``: the median, over the
    ``NEIGHBORS`` (9) accepted steps nearest in log-width, of ``dt_i * max(1, w / w_i) ** 2``.
    That is an *upper bound* of t(w) from each neighbour for any t(w) = C + A*w + B*w^2 with
    non-negative terms (the scaling curve of ARCHITECTURE.md, "Reference runs"): t never falls with width
    and grows at most quadratically.
    A tightly bucketed run spanning 10x in width and 20x in s/step therefore scores ~1, never above
    its jitter, while a 20x fallback still scores ~20 (its neighbours are close in width).

* **Trip point** (``trip_ratio``), in units of the expected time:
  ``max(TRIP_RATIO_MIN, 1 + SPREAD_MULT * sigma)``, where sigma = IQR/1.349 of the scores of the last
  200 accepted steps (a robust sigma: insensitive to the tail, so the trip cannot ratchet itself up
  on slow steps). ``TRIP_RATIO_MIN = 6``: 2.6x above the real jitter's 2.32 and 3.3x below the
  fallback's ~20 (about their geometric mean, 6.8, rounded down). Measured on the seeded controls
  (bench/detector_controls.py): the slowest accepted step of every negative scores <= 2.61 (margin
  >= 2.3x to the trip); every eager step of the positives scores >= ~12 (2x above it).
  ``SPREAD_MULT = 10`` only matters for a run far noisier than the real one (sigma > 0.5; the real
  run's sigma is ~0.17): there the trip widens instead of flagging the run's own tail.

* **Warm-up**: with torch.compile the first tens to hundreds of steps can run far slower. A step is
  in band when it ran <= ``STEADY_BAND`` (3x) the median (or width-aware expectation) of the 20
  steps before it. The run is ``warming`` until a run of consecutive in-band steps is at least
  ``STEADY_RUN`` (20) long AND at least half as long as the warm-up so far (20 lucky narrow batches
  in a run that is inherently 20x wide are not a steady state; such a run, seen without token
  counts, may stay ``warming`` — unjudged — and the reason says why). No step is judged while
  warming. At steady state the baseline starts from that run, less its leading steps above 3x.
  Because a slow warm-up plateau can pass for steady, when all of the last 20 accepted steps ran
  under half the baseline level (per padded token when widths are known), the warm-up is re-opened
  after the fact: the baseline restarts from those 20 steps and ``until_step`` moves. ``until_step``
  is the last warm-up step that ran > 3x the steady level, else the last ``first`` step seen, else
  None.

* **States**: ``ok`` -> ``suspected`` at the first unexplained slow step -> ``flagged`` once slow
  steps form a second mode: at least ``FLAG_MIN_SLOW`` (3) of the last ``FLAG_WINDOW`` (40) judged
  steps are slow, AND fewer judged steps in that window fall in the valley between the bulk and the
  trip (scores in (trip/``VALLEY_DIV``, trip], VALLEY_DIV = 2) than are slow — a mode is separated
  from the bulk by a valley, a heavy tail is not. A full fallback (every step slow) flags on its 3rd
  slow step (2 after the onset); a partial fallback of 10 / 15 / 20 % slow steps collects 3 within
  40 steps of its onset with probability 0.91 / 0.986 / 0.998 (binomial; the bench measures it over
  seeds). ``suspected`` returns to ``ok`` when the 40-step window holds no slow step. ``flagged``
  stays for the attempt (feed a new detector per attempt). Windows count judged steps, not
  global_step differences: step numbers may start anywhere (a resume) and jump.

* Steps flagged ``first`` / ``save`` / ``eval`` / ``recompile`` are scored for display
  (``details()["excused_steps"]``) but never count, never enter the baseline and never move the
  state. Slow steps never enter the baseline either, so a fallback cannot become the new normal.

Known blind spots (the dynamo log and counters cover them: :mod:`stepwatch.monitors.snapshot.dynamo`): a run that
is eager from its first steady step has an eager baseline; on a CPU the fallback does not show in
step times at all (fixtures/real/dynamo_step_times.csv); steps seen only through the log tailer carry
no ``recompile`` / ``save`` flags, so there a recompile storm or frequent saves after warm-up can look
like a partial fallback; a variable-width run without token counts may never leave ``warming``.

Feed one rank's steps (rank 0 speaks for the run: ARCHITECTURE.md, "A step from the log to the screen").

"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any
from collections.abc import Iterable, Mapping

from stepwatch.monitors.detectors import steadyspan
from stepwatch.monitors.detectors.baseline import NEIGHBORS, VIEW_IDLE, Baseline, ratio, width_of
from stepwatch.monitors.detectors.fallbackstate import HISTORY_KEPT, FallbackState, SlowStep, trip_point
# re-exported (`x as x`): the number of slow / excused step numbers kept for display
from stepwatch.monitors.detectors.fallbackstate import KEEP_STEPS as KEEP_STEPS
from stepwatch.monitors.protocol import FLAG_EVAL, FLAG_FIRST, FLAG_RECOMPILE, FLAG_SAVE, FLAG_SILENT, FLAG_IDLE, FLAG_STOPPED
from stepwatch.monitors.states import FLAGGED, OK, STEADY, SUSPECTED, WARMING
from stepwatch.monitors.stats.stepstats import check_step_seconds, nearest_rank

# --------------------------------------------------------------------------- fallback constants
#: Minimum trip point, x the expected time. Real jitter max/p50 = 2.32; a fallback ~20 (ARCHITECTURE.md,
#: "Reference runs").
TRIP_RATIO_MIN = 6.0
#: Trip widening for noisy runs: trip >= 1 + SPREAD_MULT * sigma (sigma = IQR/1.349 of scores).
SPREAD_MULT = 10.0
#: Accepted steady steps the baseline and the score spread are taken over.
BASELINE_WINDOW = 200
#: Consecutive in-band steps that end the warm-up (and at least half as many as the warm-up so far).
STEADY_RUN = 20
#: A warm-up step is one that ran more than this x the (eventual) steady level.
STEADY_BAND = 3.0
#: A sustained level this many times lower than at steady state re-opens the warm-up.
DROP_FACTOR = 2.0
#: Judged steps the second-mode test looks at, and the slow steps it needs among them.
FLAG_WINDOW = 40
FLAG_MIN_SLOW = 3
#: The valley below the trip: judged steps scoring in (trip / VALLEY_DIV, trip]. A second mode
#: needs fewer valley steps than slow steps in the flag window (a mode is separated by a valley).
VALLEY_DIV = 2.0
#: Flags whose steps are shown but never count (the protocol's flags), in the order they are named.
EXEMPT_FLAGS = (FLAG_FIRST, FLAG_RECOMPILE, FLAG_SAVE, FLAG_EVAL, FLAG_STOPPED, FLAG_IDLE)
#: Rows fed step by step where a backlog's steady span stopped, before the next span is tried.
_EACH_AFTER_SPAN = 256




@dataclass(frozen=True, slots=True)
class StepVerdict:
    """How one step was judged.

    ``score`` = dt / expected (None while there is nothing to compare with); ``trip_ratio`` the trip
    in x-expected units when the step was judged; ``slow`` True only for a judged (counted, steady)
    step above the trip; ``excused`` the flag that excused it ("first", "recompile", "save", "eval"),
    "warming" during warm-up, or None; ``state`` the detector state after this step.
    """

    step: int | None
    dt_s: float
    expected_s: float | None
    score: float | None
    trip_ratio: float | None
    slow: bool
    excused: str | None
    state: str


def _excuse(flags: Iterable[str]) -> str | None:
    """The first of EXEMPT_FLAGS among ``flags``, or None."""
    fl = set(flags)
    for f in EXEMPT_FLAGS:
        if f in fl:
            return f
    return None


class FallbackDetector:
    """Eager-fallback detector over one attempt's steps, fed in order (see the module docstring).

    Feed one rank's steps in order (rank 0 speaks for the run), one detector per attempt, with
    :meth:`update` (an ``events.jsonl`` step record) or :meth:`add`. Each returns a
    :class:`StepVerdict` the screen can use to mark the step. Read
    :meth:`snapshot` (the status JSON's ``fallback`` object), :meth:`warmup` (its ``warmup``
    object) and :meth:`details` (numbers for the screen and the bench). Constructor arguments
    override the module constants (tests and the bench use them; callers should not need to).
    """

    def __init__(
        self,
        *,
        trip_ratio_min: float = TRIP_RATIO_MIN,
        spread_mult: float = SPREAD_MULT,
        baseline_window: int = BASELINE_WINDOW,
        steady_run: int = STEADY_RUN,
        steady_band: float = STEADY_BAND,
        drop_factor: float = DROP_FACTOR,
        flag_window: int = FLAG_WINDOW,
        flag_min_slow: int = FLAG_MIN_SLOW,
        valley_div: float = VALLEY_DIV,
    ) -> None:
        if trip_ratio_min <= 1 or steady_band <= 1 or drop_factor <= 1:
            raise ValueError("trip_ratio_min, steady_band and drop_factor must be > 1")
        if min(baseline_window, steady_run, flag_window, flag_min_slow) < 1:
            raise ValueError("windows and counts must be >= 1")
        self.trip_ratio_min = float(trip_ratio_min)
        self.spread_mult = float(spread_mult)
        self.baseline_window = int(baseline_window)
        self.steady_run = int(steady_run)
        self.steady_band = float(steady_band)
        self.drop_factor = float(drop_factor)
        self.flag_window = int(flag_window)
        self.flag_min_slow = int(flag_min_slow)
        self.valley_div = float(valley_div)
        self._valley = 0

        self._state = OK
        self._steady = False
        self._until_step: int | None = None
        self._last_first_step: int | None = None
        # warm-up: the last steady_run counted steps, and the current run of in-band steps
        self._warm = Baseline(self.steady_run)
        self._run = 0
        self._warm_count = 0
        self._warm_breaks = 0
        # counted, non-excused steps: (step, dt, w, tag) with tag "w" warming, "a" accepted, "s" slow
        self._history: deque[tuple[int | None, float, float | None, str]] = deque(maxlen=HISTORY_KEPT)
        # steady state
        self._base = Baseline(self.baseline_window)
        # scores of the last baseline_window accepted steps (arrival order), and a sorted view of them
        # kept like Baseline's (in step while read exactly, else stale; see _trip)
        self._scores_q: deque[float] = deque()
        self._scores: list[float] = []
        self._scores_sync = True
        self._scores_idle = 0
        self._scores_added = 0  # scores pushed / evicted since the view went stale
        self._scores_evicted = 0
        self._short: deque[tuple[float, float | None]] = deque(maxlen=self.steady_run)
        # With steady_run <= baseline_window (the defaults) the short window is the newest steps of
        # the baseline: a baseline of steps that all have a width says the short window's do too.
        # With a shorter baseline the drop check never runs: the baseline is then the newest steps of
        # the full short window, so its median step is one of them, never under half of itself.
        self._short_in_base = self.steady_run <= self.baseline_window
        # the last flag_window judged steps: (the slow record or None, judged index, in the valley)
        self._window: deque[tuple[SlowStep | None, int, bool]] = deque(maxlen=self.flag_window)
        # results
        self._slow: deque[SlowStep] = deque(maxlen=KEEP_STEPS)
        self._n_slow = 0
        self._n_slow_before_onset = 0
        self._excused: deque[tuple[int | None, str, float | None]] = deque(maxlen=KEEP_STEPS)
        self._onset: SlowStep | None = None
        self._onset_judged: int | None = None
        self._flag_cluster: list[SlowStep] = []
        self._flagged_at_step: int | None = None
        self._flagged_after_judged: int | None = None
        self._flagged_slow_after_onset: int | None = None
        self._judged = 0
        self._seen = 0
        self._max_ok_score: float | None = None
        self._max_ok_step: int | None = None

    # ------------------------------------------------------------------ explicit state
    def to_state(self) -> FallbackState:
        """Everything that decides the next verdicts, by name (:class:`FallbackState`): ``from_state`` of it goes on
        exactly as this detector does. A copy: feeding this detector does not change it."""
        return FallbackState(
            trip_ratio_min=self.trip_ratio_min, spread_mult=self.spread_mult, baseline_window=self.baseline_window,
            steady_run=self.steady_run, steady_band=self.steady_band, drop_factor=self.drop_factor,
            flag_window=self.flag_window, flag_min_slow=self.flag_min_slow, valley_div=self.valley_div,
            state=self._state, steady=self._steady, until_step=self._until_step, last_first_step=self._last_first_step,
            warm=self._warm.to_state(), run=self._run, warm_count=self._warm_count, warm_breaks=self._warm_breaks,
            history=tuple(self._history), base=self._base.to_state(), scores=tuple(self._scores_q),
            short=tuple(self._short), window=tuple(self._window), valley=self._valley, slow=tuple(self._slow),
            n_slow=self._n_slow, n_slow_before_onset=self._n_slow_before_onset, excused=tuple(self._excused),
            onset=self._onset, onset_judged=self._onset_judged, flag_cluster=tuple(self._flag_cluster),
            flagged_at_step=self._flagged_at_step, flagged_after_judged=self._flagged_after_judged,
            flagged_slow_after_onset=self._flagged_slow_after_onset, judged=self._judged, seen=self._seen,
            max_ok_score=self._max_ok_score, max_ok_step=self._max_ok_step,
        )

    @classmethod
    def from_state(cls, st: FallbackState) -> FallbackDetector:
        """A detector in state ``st`` (its settings checked as the constructor checks them: ValueError)."""
        d = cls(trip_ratio_min=st.trip_ratio_min, spread_mult=st.spread_mult, baseline_window=st.baseline_window,
                steady_run=st.steady_run, steady_band=st.steady_band, drop_factor=st.drop_factor,
                flag_window=st.flag_window, flag_min_slow=st.flag_min_slow, valley_div=st.valley_div)
        d._set_state(st)
        return d

    def _set_state(self, st: FallbackState) -> None:
        """Take ``st``'s state (its settings are this detector's); the sorted views start exact."""
        self._state, self._steady, self._until_step = st.state, st.steady, st.until_step
        self._last_first_step = st.last_first_step
        self._warm = Baseline.from_state(st.warm)
        self._run, self._warm_count, self._warm_breaks = st.run, st.warm_count, st.warm_breaks
        self._history = deque(st.history, maxlen=HISTORY_KEPT)
        self._base = Baseline.from_state(st.base)
        self._scores_q = deque(st.scores)
        self._scores = sorted(st.scores)
        self._scores_sync, self._scores_idle, self._scores_added, self._scores_evicted = True, 0, 0, 0
        self._short = deque(st.short, maxlen=self.steady_run)
        self._window = deque(st.window, maxlen=self.flag_window)
        self._valley = st.valley
        self._slow = deque(st.slow, maxlen=KEEP_STEPS)
        self._n_slow, self._n_slow_before_onset = st.n_slow, st.n_slow_before_onset
        self._excused = deque(st.excused, maxlen=KEEP_STEPS)
        self._onset, self._onset_judged, self._flag_cluster = st.onset, st.onset_judged, list(st.flag_cluster)
        self._flagged_at_step, self._flagged_after_judged = st.flagged_at_step, st.flagged_after_judged
        self._flagged_slow_after_onset = st.flagged_slow_after_onset
        self._judged, self._seen = st.judged, st.seen
        self._max_ok_score, self._max_ok_step = st.max_ok_score, st.max_ok_step

    # ------------------------------------------------------------------ feeding
    def update(self, rec: Mapping[str, Any]) -> StepVerdict | None:
        """Feed one ``events.jsonl`` record. Non-step records and steps without ``dt`` are ignored
        (None). Raises ValueError for a negative or non-finite ``dt``."""
        if rec.get("kind", "step") != "step" or rec.get("dt") is None:
            return None
        return self.add(
            rec.get("step"),
            rec["dt"],
            rec.get("flags") or (),
            rec.get("tokens"),
            rec.get("padded_tokens"),
        )

    def add(
        self,
        step: int | None,
        dt_s: float,
        flags: Iterable[str] = (),
        tokens: int | None = None,
        padded_tokens: int | None = None,
    ) -> StepVerdict:
        """Feed one step: global_step (only reported), seconds, flags, real / padded token counts.

        Raises ValueError for a ``dt_s`` that is not a finite number >= 0 (nothing is changed)."""
        return self._feed(((step, dt_s, flags, tokens, padded_tokens, None),), True)[0][1]

    def add_many(
        self, rows: Iterable[tuple[Any, Any, Any, Any, Any, Any]]
    ) -> list[tuple[int, StepVerdict]]:
        """Feed many steps, each ``(step, dt_s, flags, tokens, padded_tokens, t)`` as :meth:`add`
        takes them (``t`` is not read: the rows :meth:`StepStats.add_many` takes), in order: the detector ends in the
        very state one :meth:`add` per row leaves, and each verdict is the same. Returns ``(row index, verdict)`` of
        the slow steps only (a backlog of 10^5 steps needs no verdict object per step). A bad ``dt_s`` raises
        ValueError as :meth:`add` does; the rows before it are fed."""
        if isinstance(rows, list) and len(rows) >= steadyspan.BLOCK_MIN:
            return self._feed_columns(tuple(list(map(itemgetter(i), rows)) for i in range(5)))
        out: list[tuple[int, StepVerdict]] = []
        self._feed_each(enumerate(rows), False, out)
        return out

    def add_columns(self, steps: list[Any], dts: Any, flags: list[Any], tokens: list[Any],
                    padded: list[Any]) -> list[tuple[int, StepVerdict]]:
        """:meth:`add_many` of the rows ``zip(steps, dts, flags, tokens, padded)``, given a field at a time (a fold's
        backlog; ``dts`` a list or an array of floats)."""
        if len(dts) >= steadyspan.BLOCK_MIN:
            return self._feed_columns((steps, dts, flags, tokens, padded))
        out: list[tuple[int, StepVerdict]] = []
        self._feed_each(enumerate(zip(steps, dts, flags, tokens, padded, repeat(None))), False, out)
        return out

    def _feed(self, rows: Iterable[tuple[Any, Any, Any, Any, Any, Any]], every: bool) -> list[tuple[int, StepVerdict]]:
        out: list[tuple[int, StepVerdict]] = []
        self._feed_each(enumerate(rows), every, out)
        return out

    def _feed_columns(self, cols: tuple[Any, ...]) -> list[tuple[int, StepVerdict]]:
        """A backlog, a field a list: its steady spans as arrays (monitors/detectors/steadyspan.py), the rest step by
        step; ``(index, verdict)`` of the slow rows."""
        out: list[tuple[int, StepVerdict]] = []
        i, n, size = 0, len(cols[1]), steadyspan.BLOCK_MIN
        while i < n:
            got = 0
            if steadyspan.applies(self._steady, self._state, self._base.to_state(), self.baseline_window,
                                  self.steady_run):
                got, after = steadyspan.consume(self.to_state(), cols, i, size, _excuse)
                if got:
                    self._set_state(after)
            i += got
            if got == size:
                size = min(2 * size, steadyspan.BLOCK_MAX)
                continue
            size = steadyspan.BLOCK_MIN
            if i < n:  # where the span stopped: a stretch step by step
                j = min(n, i + _EACH_AFTER_SPAN)
                self._feed_each(zip(range(i, j), zip(*(c[i:j] for c in cols), repeat(None))), False, out)
                i = j
        return out

    def _feed_each(self, rows: Iterable[tuple[int, tuple[Any, Any, Any, Any, Any, Any]]], every: bool,
                   out: list[tuple[int, StepVerdict]]) -> None:
        """:meth:`_feed` one (index, row) at a time."""
        history = self._history
        for i, (step, dt_s, flags, tokens, padded_tokens, _t) in rows:
            dt = check_step_seconds(dt_s)
            excuse = _excuse(flags) if flags else None
            w = width_of(tokens, padded_tokens)
            self._seen += 1
            if excuse is not None:
                v = self._excused_step(step, dt, w, excuse)
            elif not self._steady:
                history.append((step, dt, w, "w"))
                v = self._warming_step(step, dt, w)
            else:
                v = self._judged_step(step, dt, w, every, bool(flags) and FLAG_SILENT in flags)
                if v is None:
                    continue
                if v.slow:
                    out.append((i, v))
                    continue
            if every:
                out.append((i, v))

    def _judged_step(self, step: int | None, dt: float, w: float | None, every: bool,
                     silent: bool = False) -> StepVerdict | None:
        """A steady, counted step: judged against the baseline; a verdict when slow or ``every``."""
        base = self._base
        exp = base.expected(w)[0]
        trip = self._trip()
        score = ratio(dt, exp)  # type: ignore[arg-type]  # a steady baseline is never empty
        self._judged += 1
        window = self._window
        if score > trip:
            rec = SlowStep(step, dt, exp, score, silent)  # type: ignore[arg-type]
            self._history.append((step, dt, w, "s"))
            window.append((rec, self._judged, False))
            self._on_slow(rec)
            return StepVerdict(step, dt, exp, score, trip, True, None, self._state)
        self._history.append((step, dt, w, "a"))
        window.append((None, self._judged, score > trip / self.valley_div))
        base.add(dt, w)
        self._push_score(score)
        short = self._short
        short.append((dt, w))
        if self._max_ok_score is None or score > self._max_ok_score:
            self._max_ok_score, self._max_ok_step = score, step
        if self._state == SUSPECTED and not any(x for x, _, _ in window):
            self._state = OK
            self._onset = None
            self._onset_judged = None
        if self._state != FLAGGED and len(short) >= self.steady_run and self._short_in_base:
            self._check_drop()
        return StepVerdict(step, dt, exp, score, trip, False, None, self._state) if every else None

    def _excused_step(self, step: int | None, dt: float, w: float | None, excuse: str) -> StepVerdict:
        """A step flagged first / recompile / save / eval: scored for display, never counted."""
        if excuse == "first":
            self._last_first_step = step
        exp = score = trip = None
        if self._steady:
            exp, _ = self._base.expected(w)
            trip = self._trip()
            score = dt / exp if exp else None
        self._excused.append((step, excuse, score))
        return StepVerdict(step, dt, exp, score, trip, False, excuse, self._state)

    # ------------------------------------------------------------------ warm-up
    def _warming_step(self, step: int | None, dt: float, w: float | None) -> StepVerdict:
        exp = self._warm.expected(w)[0] if len(self._warm) else None
        score = None if exp is None else ratio(dt, exp)
        if score is not None and score > self.steady_band:
            self._run = 0
            self._warm_breaks += 1
        else:
            self._run += 1
        self._warm.add(dt, w)
        self._warm_count += 1
        # A run of in-band steps must be at least half as long as the warm-up so far: 20 lucky
        # narrow steps in a run that is inherently 20x wide (no token counts) are not a steady state.
        # (the warm baseline is then full: _run <= _warm_count, and it keeps the last steady_run steps)
        need = max(self.steady_run, math.ceil(self._warm_count / 2))
        if self._run >= need:
            self._declare_steady()
        return StepVerdict(step, dt, exp, score, None, False, WARMING, self._state)

    def _declare_steady(self) -> None:
        """End of warm-up: the baseline starts from the run of in-band steps, less its leading
        warm-up steps (a run can start on slow compile steps and pass into the fast level)."""
        self._steady = True
        run = [(dt, w) for _, dt, w, _ in list(self._history)[-min(self._run, self.baseline_window):]]
        self._restart_baseline(run)
        keep = [(dt, w) for dt, w in run if ratio(dt, self._base.expected(w)[0]) <= self.steady_band]
        if len(keep) < len(run) and 2 * len(keep) >= len(run):
            self._restart_baseline(keep)
        until = self._last_warmup_step(list(self._history))
        self._until_step = until if until is not None else self._last_first_step

    def _restart_baseline(self, recent: list[tuple[float, float | None]]) -> None:
        """Baseline, score window and short window restart from ``recent`` steps, (dt, width)."""
        self._base = Baseline(self.baseline_window)
        for dt, w in recent:
            self._base.add(dt, w)
        self._scores_q = deque()
        self._scores = []
        self._scores_sync = True
        self._scores_idle = 0
        self._short.clear()
        for dt, w in recent:
            self._push_score(ratio(dt, self._base.expected(w)[0]))

    def _last_warmup_step(self, hist: list[tuple[int | None, float, float | None, str]]) -> int | None:
        """Last non-slow step of ``hist`` that ran > steady_band x the current baseline, or None."""
        for step, dt, w, tag in reversed(hist):
            if tag != "s" and ratio(dt, self._base.expected(w)[0]) > self.steady_band:
                return step
        return None

    def _check_drop(self) -> None:
        """Each of the last steady_run accepted steps ran under 1/drop_factor of the baseline level
        (per padded token when every step has a width, else seconds): what came before was still
        warm-up (a slow plateau can pass for steady). Restart the baseline from those steps and move
        until_step to the last earlier step that ran > steady_band x the new level."""
        short = self._short  # full (steady_run steps), within the baseline, not flagged: _feed, the caller, says so
        base = self._base
        per_token = base.all_have_width()  # and so every step of the short window (see _short_in_base)
        if per_token:
            # Most steps: a bound of the level without sorting. level <= bound, so a step at or
            # above bound / drop_factor is at or above the limit, and the exact test would stop too.
            bound = base.level_bound()
            if bound is not None:
                limit = bound / self.drop_factor
                for dt, w in short:
                    if dt / w >= limit:  # type: ignore[operator]
                        return
        level = base.level() if per_token else base.median_s()
        if not level:
            return
        limit = level / self.drop_factor
        # any step at or above the limit keeps the baseline (in a steady run the first one is)
        if per_token:
            for dt, w in short:
                if dt / w >= limit:  # type: ignore[operator]
                    return
        else:
            for dt, _ in short:
                if dt >= limit:
                    return
        self._restart_baseline(list(short))
        until = self._last_warmup_step(list(self._history))
        if until is not None:
            self._until_step = until

    # ------------------------------------------------------------------ steady state
    def _push_score(self, s: float) -> None:
        q = self._scores_q
        q.append(s)
        if not self._scores_sync:
            self._scores_added += 1
        elif self._scores_idle >= VIEW_IDLE:
            self._scores_sync = False
            self._scores_added = 1
            self._scores_evicted = 0
        else:
            self._scores_idle += 1
            insort(self._scores, s)
        if len(q) > self.baseline_window:
            old = q.popleft()
            if self._scores_sync:
                sc = self._scores
                del sc[bisect_left(sc, old)]
            else:
                self._scores_evicted += 1

    def _sorted_scores(self) -> list[float]:
        if not self._scores_sync:
            self._scores = sorted(self._scores_q)
            self._scores_sync = True
        self._scores_idle = 0
        return self._scores

    def spread(self) -> float | None:
        """Robust sigma of recent accepted scores: IQR / 1.349 (x expected units); None before steady."""
        n = len(self._scores_q)
        if n < 4:
            return None
        sc = self._sorted_scores()
        return (nearest_rank(sc, 75) - nearest_rank(sc, 25)) / 1.349

    def _trip(self) -> float:
        """max(trip_ratio_min, 1 + spread_mult * spread()): :func:`trip_point` of the scores window.

        At most steps the sorted scores are not needed. While they are stale (S, with a scores
        pushed and r evicted since), the nearest-rank p75 and p25 of the current window lie within
        S[i75 + r] and S[i25 - a] (removing r values moves an order statistic at most r ranks up,
        adding a values at most a ranks down). The trip formula never decreases as p75 - p25 grows
        (IEEE rounding is monotone; with spread_mult <= 0 it stays at the minimum), so when those
        bounds give a trip at or below trip_ratio_min, the exact trip is trip_ratio_min.
        """
        tmin, mult = self.trip_ratio_min, self.spread_mult
        n = len(self._scores_q)
        if n < 4:
            return tmin
        i75 = -(-75 * n // 100) - 1  # nearest_rank_index(75, n), n >= 4
        i25 = -(-25 * n // 100) - 1
        if not self._scores_sync:
            sc = self._scores
            hi, lo = i75 + self._scores_evicted, i25 - self._scores_added
            # lo >= 0 puts hi inside the view: the a scores added (r <= a evicted) leave n = len(S) + a - r
            # with ceil(n / 4) - 1 >= a, so i75 + r = ceil(3n / 4) - 1 + r <= len(S) - 1
            if lo >= 0 and not trip_point(sc[hi], sc[lo], tmin, mult) > tmin:
                return tmin
            # a fresh snapshot; it stays a stale view (no add kept in step) unless the trip is needed
            self._scores = sc = sorted(self._scores_q)
            self._scores_added = self._scores_evicted = 0
        else:
            sc = self._scores
        trip = trip_point(sc[i75], sc[i25], tmin, mult)
        if not trip > tmin:  # max(tmin, trip)
            return tmin
        # above the minimum: the exact value is read at every step, keep the view in step
        self._scores_sync = True
        self._scores_idle = 0
        return trip

    def _on_slow(self, s: SlowStep) -> None:
        self._slow.append(s)
        self._n_slow += 1
        if self._state == FLAGGED:
            return
        cluster = [(x, j) for x, j, _ in self._window if x is not None]
        if len(cluster) < self.flag_min_slow and all(x.silent for x, _ in cluster):
            return  # busy but silent (a save the log does not name): alone, no suspicion of a second mode
        valley = sum(1 for _, _, v in self._window if v)
        if self._onset is not cluster[0][0]:
            # slow steps before this cluster's onset (the cluster's own are the last len(cluster))
            self._n_slow_before_onset = self._n_slow - len(cluster)
        self._onset, self._onset_judged = cluster[0]
        self._state = SUSPECTED
        self._valley = valley
        if len(cluster) >= self.flag_min_slow and valley < len(cluster):
            self._state = FLAGGED
            self._flagged_at_step = s.step
            self._flagged_after_judged = self._judged - self._onset_judged
            self._flagged_slow_after_onset = len(cluster) - 1
            self._flag_cluster = [x for x, _ in cluster]

    # ------------------------------------------------------------------ reading
    @property
    def state(self) -> str:
        """"ok", "suspected" or "flagged"."""
        return self._state

    @property
    def onset_step(self) -> int | None:
        """global_step of the first slow step of the current (or flagged) cluster, or None."""
        return self._onset.step if self._onset is not None and self._state != OK else None

    @property
    def slow_steps(self) -> list[int | None]:
        """global_steps of every judged slow step so far (the last KEEP_STEPS), oldest first."""
        return [s.step for s in self._slow]

    @property
    def trip_ratio(self) -> float:
        """Current trip point in x-expected units (TRIP_RATIO_MIN until steady)."""
        return self._trip() if self._steady else self.trip_ratio_min

    def reason(self) -> str:
        """The state in words, with the numbers: baseline, trip point, slow step times."""
        if not self._steady:
            n = self._warm_count
            need = max(self.steady_run, math.ceil(n / 2))
            text = (
                f"warming up: {n} counted step{'s' if n != 1 else ''}, no steady state yet "
                f"({need} consecutive steps within {self.steady_band:g}x of the preceding ones needed; "
                f"the longest current run is {self._run}); warm-up alone never flags"
            )
            if n >= 100 and self._warm_breaks * 20 >= n:
                text += (
                    f". {self._warm_breaks} of {n} steps ran > {self.steady_band:g}x the steps before them: "
                    "a run this wide cannot be judged per step without token counts "
                    "(tokens / padded_tokens in the step events)"
                )
            return text
        base = self._base.median_s()
        trip = self._trip()
        sigma = self.spread() or 0.0
        how = (
            f"baseline p50 {base:.2f} s/step over the last {len(self._base)} steady steps"
            + (
                ", judged per padded token against steps of similar width (t(w)=A*w+B*w^2)"
                if self._base.n_width >= NEIGHBORS
                else ""
            )
            + f"; trip {trip:.1f}x expected (= max({self.trip_ratio_min:g}x, 1 + {self.spread_mult:g} x "
            f"jitter sigma {sigma:.3f}); at the baseline {trip * base:.1f} s)"
        )
        if self._state == OK:
            tail = ""
            if self._slow:
                last = self._slow[-1]
                tail = (
                    f"; {self._n_slow} isolated slow step{'s' if self._n_slow != 1 else ''} earlier "
                    f"(last: step {last.step}, {last.dt_s:.2f} s = {last.score:.1f}x"
                    + (", busy but silent: a save or an evaluation the log does not name?" if last.silent else "")
                    + ") — not a second mode"
                )
            mx = self._max_ok_score
            return (
                f"ok: {how}; slowest steady step {mx:.2f}x expected" if mx is not None else f"ok: {how}"
            ) + tail
        if self._state == FLAGGED:
            cluster = self._flag_cluster
        else:
            cluster = [x for x, _, _ in self._window if x is not None]  # never empty: the step evicting the last is ok
        times = ", ".join(f"{x.step}: {x.dt_s:.2f} s ({x.score:.1f}x)" for x in cluster[:8])
        more = f" and {len(cluster) - 8} more" if len(cluster) > 8 else ""
        if self._state == SUSPECTED:
            text = (
                f"suspected: unexplained slow step{'s' if len(cluster) != 1 else ''} {times}{more}; {how}; "
                f"flags at {self.flag_min_slow} slow steps within {self.flag_window} judged steps"
            )
            if len(cluster) >= self.flag_min_slow:
                text += (
                    f" with fewer steps between {trip / self.valley_div:.1f}x and {trip:.1f}x (now {self._valley}): "
                    "these slow steps continue the run's own tail, not a separate mode yet"
                )
            return text
        since = self._judged - (self._onset_judged or self._judged) + 1
        n_after = self._n_slow - self._n_slow_before_onset
        return (
            f"flagged: {len(cluster)} slow steps within {(self._flagged_after_judged or 0) + 1} judged steps "
            f"from step {self.onset_step} ({times}{more}) — a second mode; since the onset {n_after} of "
            f"{since} judged steps were slow ({100.0 * n_after / since:.0f}%); {how}. A compiled graph that "
            f"falls back to eager runs about 20x slower: look for dynamo's recompile-limit warning in the log "
            f"and the recompile counts"
        )

    def snapshot(self) -> dict[str, Any]:
        """The status JSON's ``fallback`` object: ``{state, slow_steps, onset_step, reason}``."""
        return {
            "state": self._state,
            "slow_steps": self.slow_steps,
            "onset_step": self.onset_step,
            "reason": self.reason(),
        }

    def warmup(self) -> dict[str, Any]:
        """The status JSON's ``warmup`` object: ``{state: "warming"|"steady"|None, until_step}``.

        state None before any counted step. until_step: see the module docstring (it can move later
        when a warm-up plateau is recognised).
        """
        if not self._history and not self._steady:
            return {"state": None, "until_step": None}
        return {"state": STEADY if self._steady else WARMING, "until_step": self._until_step}

    def details(self) -> dict[str, Any]:
        """Numbers behind the state, for the screen and bench/detector_controls.py.

        ``baseline_s`` median of the baseline window (s/step); ``trip_ratio`` trip in x-expected;
        ``spread_sigma`` IQR/1.349 of accepted scores; ``max_ok_score`` / ``max_ok_step`` the slowest
        accepted steady step (its margin to the trip is ``trip_ratio / max_ok_score``);
        ``flagged_at_step``; ``judged_to_flag`` judged steps from the onset to the flag (0 = onset);
        ``slow_after_onset_to_flag`` slow steps after the onset when it flagged; ``excused_steps``
        ``[(step, flag, score)]``; ``n_slow`` slow steps in total; ``judged`` steps judged.
        """
        return {
            "baseline_s": self._base.median_s() if self._steady else None,
            "trip_ratio": self.trip_ratio,
            "spread_sigma": self.spread(),
            "max_ok_score": self._max_ok_score,
            "max_ok_step": self._max_ok_step,
            "flagged_at_step": self._flagged_at_step,
            "judged_to_flag": self._flagged_after_judged,
            "slow_after_onset_to_flag": self._flagged_slow_after_onset,
            "excused_steps": list(self._excused),
            "n_slow": self._n_slow,
            "valley": self._valley,
            "judged": self._judged,
            "seen": self._seen,
        }
