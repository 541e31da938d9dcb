"""What :class:`~stepwatch.monitors.stats.stepstats.StepStats` holds, by name, and the record of one step it keeps.

:class:`StepStatsState` is everything that decides what StepStats reports next: ``StepStats.from_state(s.to_state())``
goes on exactly as ``s`` does. The supervisor's saved fold (``monitors/fold/savedstate.py``) writes and reads one, so
it never knows how StepStats keeps its durations (a SortedList and an array waiting to be merged into it). Pure: no
I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_INF = math.inf


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step as StepStats saw it. ``counted`` is False for the first step of a process."""

    step: int | None
    dt_s: float
    flags: tuple[str, ...]
    tokens: int | None
    padded_tokens: int | None
    t: float | None
    counted: bool


def check_step_seconds(dt_s: Any) -> float:
    """``dt_s`` as float seconds of one optimizer step. Raises ValueError, naming the value, when it
    is not a number, not finite or negative (a NaN or a negative time is a caller bug, not a step).
    Shared by :class:`StepStats` and the fallback detector."""
    if type(dt_s) is float and 0.0 <= dt_s < _INF:  # nearly every step: already what it must be
        return dt_s
    try:
        dt = float(dt_s)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond a float's range
        raise ValueError(f"step duration must be a number of seconds, got {dt_s!r}") from None
    if not math.isfinite(dt) or dt < 0:
        raise ValueError(f"step duration must be finite and >= 0 seconds, got {dt_s!r}")
    return dt


def opt_count(v: Any) -> int | None:
    """A token count as read: a non-negative int, else None (text, a negative number, an infinity...)."""
    if v is None:
        return None
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        return None
    return i if i >= 0 else None


@dataclass(frozen=True, slots=True)
class StepStatsState:
    """A StepStats' state, field by field. ``recent`` and ``counted_recent`` hold the very same records (the latter
    the last ``window`` counted ones)."""

    recent_maxlen: int
    window: int
    #: every counted duration merged so far, sorted; and those not merged yet, in arrival order (seconds)
    sorted_s: tuple[float, ...]
    pending_s: tuple[float, ...]
    #: the last recent_maxlen steps (counted or not), and the last window counted ones
    recent: tuple[StepRecord, ...]
    counted_recent: tuple[StepRecord, ...]
    #: the last counted step's seconds; the last step's global_step; the steps left out, by why; every step added
    last: float | None
    last_step: int | None
    excluded_first: int
    excluded_phase: int
    seen: int
