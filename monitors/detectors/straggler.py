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
from typing import Any, Mapping

from stepwatch.monitors.detectors.stall import NOT_JUDGED

STRAGGLER_WINDOW = 50
STRAGGLER_MIN_COMMON = 10
STRAGGLER_LAG_FLOOR_S = 0.05
STRAGGLER_FACTOR = 3.0
OK, FLAGGED = "ok", "flagged"


def straggler_state(ends_by_rank: Mapping[int, Mapping[int, float]]) -> dict[str, Any]:
    """``{state, rank, lag_s, trip_s, steps, lags_s, reason}``; ``state`` is "ok", "flagged" or
    "not judged" (fewer than 2 ranks, or fewer than STRAGGLER_MIN_COMMON common steps)."""
    out: dict[str, Any] = {"state": NOT_JUDGED, "rank": None, "lag_s": None, "trip_s": None, "steps": 0,
                           "lags_s": {}, "reason": ""}
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
