"""The stall detector: alive by ``kill -0``, stuck in fact (ARCHITECTURE.md R11).

:func:`stall_state`: the step in progress has run longer than
``max(STALL_FACTOR * p99, STALL_FLOOR_S)`` = ``max(10 * p99, 3 s)`` with at least
``STALL_MIN_STEPS`` (5) counted steps and no save/eval phase open. 10x p99: the real run's slowest
step, the compile, is 1.5x its p99 (45.79 / 30.52), so 10x is far outside the jitter. The 3 s floor
keeps a run of 0.05 s steps from reading stalled on a GC pause, yet a run that emitted 20 fast steps
and hangs reads ``stalled`` 3 s later. A first eager step of a fallback (~20x p50, ~13x p99) reads
stalled while it runs; once it ends the fallback detector takes over.

The step's elapsed time is ``now`` minus its start, both wall clock, but the start was written by
the run (another host's clock, perhaps) and ``now`` is the judge's: a view whose clock runs a day
ahead would read every step a day long. A judge that watched the step begin passes what its own
monotonic clock observed (``observed``: at least, at most seconds), and the wall-clock difference is
clamped into it: a clock skew or a clock step never makes a stall, and a step that truly runs past
the threshold on the monotonic clock still does.

Pure: no I/O, no clock reads (time is passed in).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar
from collections.abc import Mapping

from stepwatch.monitors.parsers.phases import PHASE_FLOOR_S
from stepwatch.monitors.states import NOT_JUDGED, OK, STALLED, StallFloorSource

#: A stall: the step in progress ran longer than max(STALL_FACTOR x p99, STALL_FLOOR_S) seconds ...
STALL_FACTOR = 10.0
STALL_FLOOR_S = 3.0
#: ... with at least this many counted steps behind it.
STALL_MIN_STEPS = 5
#: A busy but silent step is judged stuck only after this long (seconds), or 3x the longest save or
#: evaluation seen so far when that is longer (ARCHITECTURE.md R18).
BUSY_FLOOR_S = 60.0


@dataclass(frozen=True, slots=True)
class StallSettings:
    """What ``[stall]`` sets for one run: the floors of the step budget (max(10 x p99, floor)), the busy budget
    (max(floor, 3 x the longest save or evaluation)) and an evaluation's or a save's budget (the same rule)."""

    #: the ``[stall]`` keys the run config accepts, each a number of seconds (launcher/config.py refuses any other)
    KEYS: ClassVar[tuple[str, ...]] = ("step_floor_s", "busy_floor_s", "phase_floor_s")

    step_floor_s: float = STALL_FLOOR_S
    busy_floor_s: float = BUSY_FLOOR_S
    phase_floor_s: float = PHASE_FLOOR_S
    #: the keys the run config set (the others are the defaults)
    configured: frozenset[str] = frozenset()

    def step_floor_source(self) -> StallFloorSource:
        """Where ``step_floor_s`` came from: the snapshot's ``stall.floor_source``."""
        return "run config" if "step_floor_s" in self.configured else "default"


def stall_settings(table: Mapping[str, Any]) -> StallSettings:
    """The ``[stall]`` table's settings; ValueError naming a bad one (seconds, 1 to 7 days)."""
    got: dict[str, float] = {}
    for key in StallSettings.KEYS:
        v = table.get(key)
        if v is None:
            continue
        if type(v) not in (int, float) or not 1.0 <= v <= 7 * 86400:
            raise ValueError(f"{key} must be a number of seconds from 1 to 604800; got {v!r}")
        got[key] = float(v)
    return StallSettings(**got, configured=frozenset(got))


def stall_settings_of(run: Mapping[str, Any]) -> StallSettings:
    """``[stall]`` of a run record (run.json's ``config``); the defaults where absent or invalid (a hostile
    file's value is never a reason to judge differently than the defaults would)."""
    config = run.get("config")
    table = config.get("stall") if isinstance(config, dict) else None
    try:
        return stall_settings(table) if isinstance(table, dict) else StallSettings()
    except ValueError:
        return StallSettings()



@dataclass(frozen=True, slots=True)
class StallVerdict:
    """``state`` "ok" | "stalled"; ``current_step_elapsed_s`` seconds the step in progress has run
    (None when unknown); ``threshold_s`` the elapsed time that reads stalled (None when too few
    steps); ``reason`` in words."""

    state: str
    current_step_elapsed_s: float | None
    threshold_s: float | None
    reason: str = field(default="")

    def as_dict(self) -> dict[str, Any]:
        """The status JSON's ``stall`` object's verdict: ``{state, current_step_elapsed_s, threshold_s}``."""
        return {"state": self.state, "current_step_elapsed_s": self.current_step_elapsed_s,
                "threshold_s": self.threshold_s}


def _get(stats: Any, key: str) -> Any:
    if isinstance(stats, Mapping):
        return stats.get(key)
    return getattr(stats, key, None)


def stall_state(
    current_step_started_at: float | None,
    now: float,
    stats: Any,
    in_phase: Any = None,
    *,
    phase_budget_s: float | None = None,
    factor: float = STALL_FACTOR,
    floor_s: float = STALL_FLOOR_S,
    min_steps: int = STALL_MIN_STEPS,
    observed: tuple[float, float] | None = None,
) -> StallVerdict:
    """Is the step in progress stuck?

    ``current_step_started_at``: unix seconds the step in progress began — the previous step's end
    (``step_end`` of the last step record, since ``dt`` runs end to end), or the process start
    before the first step; None when unknown. ``now``: unix seconds (passed in; this function reads
    no clock). ``stats``: a :class:`stepwatch.monitors.stats.stepstats.StepStats` or its ``summary()`` dict — ``n``
    and ``p99`` (seconds) are read. ``in_phase``: truthy ("save", "eval", True) while the emitter says
    a save or evaluation is running (:mod:`stepwatch.monitors.protocol`'s ``phase`` events, or the log's:
    :mod:`stepwatch.monitors.parsers.phases`); never stalled then, unless ``phase_budget_s`` is given and the
    step in progress has run past it (ARCHITECTURE.md R18).

    Stalled when ``n >= min_steps`` and elapsed > ``max(factor * p99, floor_s)`` (module docstring
    for the numbers). Elapsed is clamped at 0 when ``now`` is before the start (clock skew), and into
    ``observed`` = ``(at_least, at_most)`` seconds when given: how long the step has run as the
    caller's monotonic clock saw it (it saw the step begin between two of its looks).
    """
    if current_step_started_at is None:
        return StallVerdict(OK, None, None, "no step start known")
    wall = max(0.0, float(now) - float(current_step_started_at))
    elapsed = wall if observed is None else min(max(wall, observed[0]), observed[1])
    v = _judge(elapsed, stats, in_phase, factor, floor_s, min_steps, phase_budget_s)
    if abs(wall - elapsed) > floor_s:  # say it: the run's clock is not the judge's
        how = "behind" if wall > elapsed else "ahead of"
        v = StallVerdict(v.state, v.current_step_elapsed_s, v.threshold_s,
                         f"{v.reason} (timed on the judge's own clock: the run's step times are about "
                         f"{abs(wall - elapsed):.0f} s {how} it)")
    return v


def _judge(elapsed: float, stats: Any, in_phase: Any, factor: float, floor_s: float, min_steps: int,
           phase_budget_s: float | None = None) -> StallVerdict:
    """The verdict for a step that has run ``elapsed`` seconds (:func:`stall_state`)."""
    n = _get(stats, "n") or 0
    p99 = _get(stats, "p99")
    if n < min_steps or p99 is None:
        return StallVerdict(
            OK, elapsed, None, f"{n} counted step{'s' if n != 1 else ''}; a stall needs at least {min_steps}"
        )
    threshold = max(factor * float(p99), floor_s)
    if in_phase:
        name = in_phase if isinstance(in_phase, str) else "save/eval"
        if phase_budget_s is None:
            return StallVerdict(OK, elapsed, threshold, f"in a {name} phase for {elapsed:.1f} s; not a stall")
        if elapsed > phase_budget_s:
            return StallVerdict(STALLED, elapsed, phase_budget_s,
                                f"{name} for {elapsed:.1f} s > its budget {phase_budget_s:.0f} s (3 x the longest "
                                "so far, at least the floor): stuck in it")
        return StallVerdict(OK, elapsed, phase_budget_s, f"{name} for {elapsed:.1f} s; within its budget "
                                                         f"{phase_budget_s:.0f} s, not a stall")
    if elapsed > threshold:
        return StallVerdict(
            STALLED,
            elapsed,
            threshold,
            f"step in progress for {elapsed:.1f} s > {threshold:.1f} s "
            f"(= max({factor:g} x p99 {float(p99):.2f} s, {floor_s:g} s)); no save/eval phase open",
        )
    return StallVerdict(
        OK, elapsed, threshold, f"step in progress for {elapsed:.1f} s; stalled after {threshold:.1f} s"
    )


def log_only_guard(verdict: StallVerdict, bar_complete: bool,
                   last_log_byte_age_s: float | None, finish_line: bool = False) -> tuple[str, str] | None:
    """For steps seen through the log only (no emitter, so no save/eval phase events): when the
    verdict must not stand, ``(state, reason)`` to show instead, else None.

    - the training bar reached its total, or (``finish_line``) the log said training is over: what follows
      (a final save, the summary, teardown) is no step: ``not judged``;
    - a stalled verdict while the log was written less than the threshold ago: a save or an
      evaluation shows no phase, but a process still writing its log is not frozen: ``ok``.
    """
    if bar_complete:
        return NOT_JUDGED, "the training bar is complete"
    if finish_line:  # ``training complete``, the Trainer's summary: teardown, a final save, no step to come
        return NOT_JUDGED, "the log says training is over (finishing)"
    if (verdict.state == STALLED and verdict.threshold_s is not None and last_log_byte_age_s is not None
            and last_log_byte_age_s < verdict.threshold_s):
        return OK, (f"the step runs long but the log was written {last_log_byte_age_s:.0f} s ago "
                    "(a save or an evaluation?): not a stall")
    return None
