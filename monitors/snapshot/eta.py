"""The ETA an operator can plan by: from the recent rate, not the run's whole history.

``eta``: ``{eta_s, remaining_steps, end_at_unix, seconds_per_step, state, basis}``:

- ``seconds_per_step``: the nearest-rank median of the last ETA_RECENT_STEPS counted steps (a
  save spike does not move it), or, once the last CHANGE_STEPS steps in a row all ran CHANGE_FACTOR
  times slower (or faster) than the median before them, the median of those (a run slowed 20x reads
  so after 3 slow steps; ``basis`` says the change);
- ``eta_s`` = what is left of the step in progress (the median less the time it has already
  taken, never below 0) + the steps after it at the median; ``end_at_unix`` = now + eta_s;
- ``state``: ``ok``, ``stalled`` (the stall detector says the step in progress is stuck: the figure
  is what the run would need if it went on now, and the views say STALLED, not a time), or
  ``not judged`` (no max_steps, no counted step, or the run is not running) with ``basis`` saying why.
"""

from __future__ import annotations

import math

from stepwatch.monitors.snapshot.types import Eta, Stall
from stepwatch.monitors.states import NOT_JUDGED, OK, STALLED
from stepwatch.monitors.stats.nearest_rank import nearest_rank

#: Counted steps the rate is the median of.
ETA_RECENT_STEPS = 16


def eta_part(recent_dt_s: list[float], max_steps: int | None, global_step: int | None, stall: Stall,
             running: bool, now: float) -> Eta:
    """``recent_dt_s``: the counted steps' times, oldest first (the last ETA_RECENT_STEPS are used);
    ``stall``: the snapshot's stall part (its ``state`` and ``current_step_elapsed_s``)."""
    current_step_elapsed_s, stall_state = stall.get("current_step_elapsed_s"), stall.get("state")
    out: Eta = {"eta_s": None, "remaining_steps": None, "end_at_unix": None, "seconds_per_step": None,
                "state": NOT_JUDGED, "basis": None}
    if not running:
        out["basis"] = "the run is not running"
        return out
    if max_steps is None or global_step is None:
        out["basis"] = "the planned number of steps is unknown (no max_steps in the log or the emitter)"
        return out
    dts = recent_dt_s[-ETA_RECENT_STEPS:]
    if not dts:
        out["basis"] = "no counted step yet"
        return out
    rate = nearest_rank(sorted(dts), 50)
    basis = f"median of the last {len(dts)} step(s)"
    change = rate_change(dts)
    if change is not None:
        rate = nearest_rank(sorted(dts[-CHANGE_STEPS:]), 50)
        basis = f"the rate changed {change:.3g}x over the last {CHANGE_STEPS} steps: their median"
    if not math.isfinite(rate) or not 0 <= rate <= 1e6:
        out["basis"] = "the recent step times are not usable numbers"
        return out
    remaining = max(0, int(max_steps) - int(global_step))
    in_progress = max(rate - (current_step_elapsed_s or 0.0), 0.0) if remaining else 0.0
    eta = in_progress + max(remaining - 1, 0) * rate
    out.update(eta_s=eta, remaining_steps=remaining, end_at_unix=now + eta, seconds_per_step=rate,
               state=STALLED if stall_state == STALLED else OK,
               basis=basis)
    return out


#: A change of rate is seen when this many steps in a row each differ from the median of the
#: recent steps before them by CHANGE_FACTOR or more (a single save or eval spike never is one).
CHANGE_STEPS = 3
CHANGE_FACTOR = 2.0
#: ... judged only with at least this many recent steps before them.
CHANGE_BEFORE_MIN = 4


def rate_change(dts: list[float]) -> float | None:
    """The factor (new median / old median) when the last CHANGE_STEPS step times all differ from
    the median of the ones before them by CHANGE_FACTOR or more, the same way; None otherwise."""
    before, last = dts[:-CHANGE_STEPS], dts[-CHANGE_STEPS:]
    if len(before) < CHANGE_BEFORE_MIN or len(last) < CHANGE_STEPS:
        return None
    old = nearest_rank(sorted(before), 50)
    if not old > 0 or not all(math.isfinite(x) and x >= 0 for x in last):
        return None
    if all(x >= CHANGE_FACTOR * old for x in last) or all(x * CHANGE_FACTOR <= old for x in last):
        return nearest_rank(sorted(last), 50) / old
    return None
