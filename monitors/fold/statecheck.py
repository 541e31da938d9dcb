"""What a restored saved state must hold before it is used (:mod:`.savedstate` calls these on each
object it makes): the invariants the code indexing those objects relies on, so a crafted or damaged
``events.state.json`` is refused (StateError) rather than slowing or crashing a view."""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.detectors.baseline import BaselineState
from stepwatch.monitors.detectors.fallbackstate import HISTORY_KEPT, KEEP_STEPS, FallbackState
from stepwatch.monitors.detectors.losshealth import LEVEL_N, Episode, LossHealth
from stepwatch.monitors.states import CATASTROPHIC, PERSISTENT, SPIKE
from stepwatch.monitors.detectors.scaling import ScalingFit
from stepwatch.monitors.stats.stepstate import StepStatsState


class StateError(ValueError):
    """A saved state that cannot be read back: malformed, an unknown class, attributes that are
    not the class's own, a value of the wrong type, a container held twice."""


def _check_baseline(b: BaselineState) -> None:
    """A detector window of at most its capacity, each step (seconds, a positive width or None): what its width
    index is built from (a width without a logarithm would fail at each step). Raises StateError."""
    if not 1 <= b.maxlen <= 1 << 24 or len(b.steps) > b.maxlen:
        raise StateError(f"a saved detector window holds {len(b.steps)} steps, more than its {b.maxlen}")
    for e in b.steps:
        if (type(e) is not tuple or len(e) != 2 or type(e[0]) is not float
                or not (e[1] is None or (type(e[1]) is float and 0.0 < e[1] < math.inf))):
            raise StateError(f"a saved detector window holds {str(e)[:40]}, not (seconds, width)")


def _check_lengths(name: str, lengths: dict[str, tuple[int, int]]) -> None:
    """Each window of a saved ``name`` (field -> (its length, the most it keeps)) within its bound. Raises StateError."""
    for k, (n, most) in lengths.items():
        if n > most:
            raise StateError(f"a saved {name}.{k} keeps {n} items, more than {most}")


def _check_fallback(d: FallbackState) -> None:
    """A detector's windows of their lengths, its baselines of its settings' sizes. Raises StateError."""
    _check_lengths("FallbackDetector", {
        "history": (len(d.history), HISTORY_KEPT), "window": (len(d.window), d.flag_window),
        "short": (len(d.short), d.steady_run), "scores": (len(d.scores), d.baseline_window),
        "slow": (len(d.slow), KEEP_STEPS), "excused": (len(d.excused), KEEP_STEPS)})
    if d.warm.maxlen != d.steady_run or d.base.maxlen != d.baseline_window:
        raise StateError("a saved FallbackDetector's windows are not of its settings' sizes")


def _check_stats(s: StepStatsState) -> None:
    """Step statistics of floats, their windows of their lengths. Raises StateError."""
    _check_lengths("StepStats", {"recent": (len(s.recent), s.recent_maxlen),
                                 "counted_recent": (len(s.counted_recent), s.window)})
    if not all(type(x) is float for x in s.sorted_s) or not all(type(x) is float for x in s.pending_s):
        raise StateError("a saved StepStats' step times hold something else than floats")


def _check_scaling(f: ScalingFit) -> None:
    """A fit's sums have the shapes its code indexes (3x3, 3, four numbers per width). Raises StateError."""
    num = (int, float)
    ok = (len(f.xtx) == 3 and all(type(r) is list and len(r) == 3 and all(type(x) in num for x in r) for r in f.xtx)
          and len(f.xty) == 3 and all(type(x) in num for x in f.xty)
          and all(type(k) is int and type(v) is list and len(v) == 4 and all(type(x) in num for x in v)
                  for k, v in f.widths.items())
          and all(type(k) is int and type(v) is int for k, v in f.fit_widths.items()))
    if not ok:
        raise StateError("a saved ScalingFit has sums of the wrong shape")


def _check_loss_health(h: LossHealth) -> None:
    """Windows of finite floats (their median is taken at the next value), an episode's level and scale finite, the
    last episode an Episode's keys. Raises StateError."""
    for name in ("window", "gwindow", "recent"):
        if not all(type(x) is float and math.isfinite(x) for x in getattr(h, name)):
            raise StateError(f"a saved LossHealth.{name} holds something else than finite floats")
    if not all(x is None or type(x) is int for x in h.wsteps) or h.wsteps.maxlen != LEVEL_N:
        raise StateError("a saved LossHealth.wsteps holds something else than steps")
    if not all(type(x) is float and math.isfinite(x) for x in (h.level, h.scale, h.first_max)):
        raise StateError("a saved LossHealth's level, scale or first maximum is not a finite number")
    if h.kind not in ("", SPIKE, PERSISTENT, CATASTROPHIC) or any(
            type(e) is not dict or set(e) != set(Episode.__annotations__) for e in h.ended):
        raise StateError("a saved LossHealth's episode is not one it makes")


#: class name -> the check run on each restored instance
RESTORED_CHECKS: dict[str, Callable[[Any], None]] = {
    "BaselineState": _check_baseline, "FallbackDetector": _check_fallback, "StepStats": _check_stats,
    "ScalingFit": _check_scaling, "LossHealth": _check_loss_health}
