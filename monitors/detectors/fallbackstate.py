"""The fallback detector's state by name, and its trip point: what the detector, its array path and the saved fold share.

:class:`FallbackState` is everything a :class:`~stepwatch.monitors.detectors.fallback.FallbackDetector` holds that
decides its next verdict: ``FallbackDetector.from_state(d.to_state())`` judges every further step as ``d`` does. It is
the one way in or out of the detector's state: the array path of a backlog (``monitors/detectors/steadyspan.py``)
reads one and returns the next, and the supervisor's saved fold (``monitors/fold/savedstate.py``) writes and reads
one, so neither knows how the detector keeps it (sorted views, deques). :func:`trip_point` is the trip formula (the
module docstring of ``fallback.py`` says where its numbers come from), called by the detector step by step and by
the array path for each step of a span. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepwatch.monitors.detectors.baseline import BaselineState
from stepwatch.monitors.stats.nearest_rank import nearest_rank_index

#: Counted steps remembered (step, dt, width, tag) to find where a warm-up ended.
HISTORY_KEPT = 4096
#: How many slow / excused step numbers are kept for display.
KEEP_STEPS = 1000


@dataclass(frozen=True, slots=True)
class SlowStep:
    """A judged step above the trip: its global_step, seconds, expected seconds and score (x expected). ``silent``: busy
    but silent past the step budget, which counts towards a mode but is never suspected alone."""

    step: int | None
    dt_s: float
    expected_s: float
    score: float
    silent: bool = False


#: A counted step in the history: (global_step, dt, width, tag) with tag "w" warming, "a" accepted, "s" slow.
HistoryEntry = tuple[int | None, float, float | None, str]
#: A judged step of the flag window: (its slow record or None, its judged index, whether it scored in the valley).
WindowEntry = tuple[SlowStep | None, int, bool]


@dataclass(frozen=True, slots=True)
class FallbackState:
    """A fallback detector's state, field by field (the constructor's settings first). The :class:`SlowStep` records
    are shared: ``onset`` and ``flag_cluster`` hold the very records of ``window`` and ``slow`` (the detector tells a
    new cluster by identity)."""

    trip_ratio_min: float
    spread_mult: float
    baseline_window: int
    steady_run: int
    steady_band: float
    drop_factor: float
    flag_window: int
    flag_min_slow: int
    valley_div: float
    #: "ok", "suspected" or "flagged"; whether the warm-up is over; the warm-up's last step; the last ``first`` step
    state: str
    steady: bool
    until_step: int | None
    last_first_step: int | None
    #: the warm-up: its window (the last steady_run counted steps), the current run of in-band steps, its counts
    warm: BaselineState
    run: int
    warm_count: int
    warm_breaks: int
    #: the last HISTORY_KEPT counted, non-excused steps
    history: tuple[HistoryEntry, ...]
    #: the steady baseline; the scores of its accepted steps (arrival order); the short window of (dt, width)
    base: BaselineState
    scores: tuple[float, ...]
    short: tuple[tuple[float, float | None], ...]
    #: the last flag_window judged steps, and the judged steps in the valley when the state last moved
    window: tuple[WindowEntry, ...]
    valley: int
    #: results: the slow steps (the last KEEP_STEPS), how many in all and before the onset, the excused steps
    slow: tuple[SlowStep, ...]
    n_slow: int
    n_slow_before_onset: int
    excused: tuple[tuple[int | None, str, float | None], ...]
    onset: SlowStep | None
    onset_judged: int | None
    flag_cluster: tuple[SlowStep, ...]
    flagged_at_step: int | None
    flagged_after_judged: int | None
    flagged_slow_after_onset: int | None
    judged: int
    seen: int
    max_ok_score: float | None
    max_ok_step: int | None


def trip_point(p75: float, p25: float, trip_ratio_min: float, spread_mult: float) -> float:
    """The trip, x the expected time, of scores whose nearest-rank p75 and p25 are given:
    ``max(trip_ratio_min, 1 + spread_mult * (p75 - p25) / 1.349)`` (IQR / 1.349: a robust sigma). Never
    decreases as p75 - p25 grows, so bounds of the two give a bound of the trip."""
    trip = 1.0 + spread_mult * ((p75 - p25) / 1.349)
    return trip if trip > trip_ratio_min else trip_ratio_min


def trip_of_scores(scores: list[float], trip_ratio_min: float, spread_mult: float) -> float:
    """:func:`trip_point` of a window of accepted scores (any order); ``trip_ratio_min`` under 4 of them."""
    n = len(scores)
    if n < 4:
        return trip_ratio_min
    sc = sorted(scores)
    return trip_point(sc[nearest_rank_index(75, n)], sc[nearest_rank_index(25, n)], trip_ratio_min, spread_mult)
