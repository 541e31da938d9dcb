"""The straggler detector: a rank whose optimizer steps end consistently later than the others'.

Input: each rank's step end times (unix s, from its own events file: the emitter's ``step_end``),
by global_step. Over the last ``STRAGGLER_WINDOW`` steps every rank has, a rank's lag at a step is
its end minus the earliest rank's end; its lag is the median of those. The slowest rank is a
straggler when its lag exceeds ``max(STRAGGLER_LAG_FLOOR_S, STRAGGLER_FACTOR x the largest lag
among the other ranks)``: the other ranks' lags are the run's own jitter (with synchronous
collectives, ranks finish a step within milliseconds of each other), so the trip point sits far
outside it; the floor keeps a few milliseconds of jitter from ever tripping it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import statistics
from typing import Any
from collections.abc import Mapping

from stepwatch.monitors.detectors.stall import STALL_FACTOR, STALL_FLOOR_S
from stepwatch.monitors.states import FLAGGED, NOT_JUDGED, OK

STRAGGLER_WINDOW = 50
STRAGGLER_MIN_COMMON = 10
STRAGGLER_LAG_FLOOR_S = 0.05
STRAGGLER_FACTOR = 3.0


def straggler_state(ends_by_rank: Mapping[int, Mapping[int, float]]) -> dict[str, Any]:
    """``{state, rank, lag_s, trip_s, steps, lags_s, reason}``; ``state`` is "ok", "flagged" or
    "not judged" (fewer than 2 ranks, or fewer than STRAGGLER_MIN_COMMON common steps)."""
    out: dict[str, Any] = {"state": NOT_JUDGED, "rank": None, "lag_s": None, "trip_s": None, "steps": 0,
                           "lags_s": {}, "reason": "", "stuck": []}
    ranks = sorted(r for r, ends in ends_by_rank.items() if ends)
    if len(ranks) < 2:
        out["reason"] = "fewer than 2 ranks record their steps (STEPWATCH_ALL_RANKS=1)"
        return out
    common = set.intersection(*(set(ends_by_rank[r]) for r in ranks))
    steps = sorted(common)[-STRAGGLER_WINDOW:]
    out["steps"] = len(steps)
    if len(steps) < STRAGGLER_MIN_COMMON:
        out["reason"] = f"{len(steps)} step(s) recorded by every rank (judged from {STRAGGLER_MIN_COMMON})"
        return out
    lags = {r: statistics.median(ends_by_rank[r][s] - min(ends_by_rank[q][s] for q in ranks) for s in steps)
            for r in ranks}
    worst = max(ranks, key=lambda r: lags[r])
    jitter = max(lags[r] for r in ranks if r != worst)
    trip = max(STRAGGLER_LAG_FLOOR_S, STRAGGLER_FACTOR * jitter)
    out.update(rank=worst, lag_s=round(lags[worst], 4), trip_s=round(trip, 4),
               lags_s={str(r): round(v, 4) for r, v in lags.items()})
    if lags[worst] > trip:
        out.update(state=FLAGGED, reason=f"rank {worst} ends its steps a median {lags[worst]:.3f} s after the "
                                         f"earliest rank over the last {len(steps)} steps (trip {trip:.3f} s)")
    else:
        out.update(state=OK, reason=f"the slowest rank ({worst}) lags {lags[worst]:.3f} s (trip {trip:.3f} s)")
    return out


def stuck_ranks(last_by_rank: Mapping[int, tuple[int | None, float | None, float | None]], now: float,
                factor: float = STALL_FACTOR, floor_s: float = STALL_FLOOR_S) -> list[dict[str, Any]]:
    """Ranks that stopped stepping while another goes on. ``last_by_rank``: rank -> (last global_step,
    its end unix s, the rank's p99 s). A rank is stuck when its last step ended more than
    ``max(factor x its p99, floor_s)`` (the stall detector's threshold) before both ``now`` and the
    newest step end of the other ranks. Returns ``[{rank, last_step, behind_s, ahead_rank,
    ahead_step, threshold_s}]``."""
    out = []
    ends = {r: v for r, v in last_by_rank.items() if v[1] is not None}
    for r, (step, end, p99) in ends.items():
        others = [(q, v) for q, v in ends.items() if q != r]
        if not others or end is None:
            continue
        q, (q_step, q_end, _) = max(others, key=lambda kv: kv[1][1] or 0)
        threshold = max(factor * (p99 or 0.0), floor_s)
        if (q_end or 0) - end > threshold and now - end > threshold:
            out.append({"rank": r, "last_step": step, "behind_s": round((q_end or 0) - end, 3), "ahead_rank": q,
                        "ahead_step": q_step, "threshold_s": round(threshold, 3)})
    return out
