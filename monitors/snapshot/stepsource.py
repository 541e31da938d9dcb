"""Which steps speak for a run, and when the stall verdict is not to be believed.

The rule, in plain words:

1. **The headline steps.** The emitter's step records in events.jsonl speak whenever there is one
   (``timing: exact``). Without them, the supervisor's records of train.log's steps
   (logsteps.jsonl) speak while the supervisor lives and for a run it saw to the end (``timing``:
   ``reported`` when the log prints its own step times, ``shared`` when one log line times several
   steps, else ``per_update``). A supervisor gone mid-run left its records frozen, so this view's
   own parse of train.log takes over (``approximate``: the fallback detector does not judge it).
   With no step anywhere, nothing speaks (``timing`` null).
2. **The step number.** ``step.global_step`` is the last step record's number in events.jsonl, else
   the step the log shows (a progress bar, a ``step N`` line); ``step.source`` says which.
3. **The stall guards.** The stall detector (:func:`~stepwatch.monitors.detectors.stall.stall_state`)
   times the step in progress from the last recorded step's end (from the last counter advance the
   view saw, for its own parse) and judges only a running run. Its verdict is set aside:

   - ``not judged`` while too few steps give no threshold;
   - for steps seen through the log only (no emitter, so no save/eval phase events):
     ``not judged`` once the training bar is complete, ``ok`` while the log was written more recently
     than the threshold (:func:`~stepwatch.monitors.detectors.stall.log_only_guard`);
   - ``not judged`` on a full disk: the silence of files that cannot be written proves nothing
     (:func:`guard_stall`, applied once the disk is read).

   A stall's time (``stall_at``, the alert's ``at``) is the step's start plus the threshold, from
   the files, and only for a stall that stands.

   The step's start is a time the run wrote, on its own clock; the judge's "now" is its own. A judge
   that saw the step begin (the start moved forward between two of its refreshes) also times it on
   its monotonic clock (:class:`ObservedStart`), and the stall detector clamps the wall-clock
   difference into that: a view whose clock runs a day ahead of the run's never reads a day-long
   step, and the supervisor's verdicts survive a step of its wall clock. A start that was already
   there at the first refresh (a one-shot ``status``) has only the wall clock to go by.

Pure: the observer passes the folds and the clock in; nothing here reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from stepwatch.monitors.detectors.stall import BUSY_FLOOR_S, STALL_FLOOR_S, log_only_guard, stall_state
from stepwatch.monitors.fold.events import EventsFold
from stepwatch.monitors.fold.stepcolumns import step_no, unix_time
from stepwatch.monitors.parsers.logtracker import LogTracker
from stepwatch.monitors.snapshot.disk import full_words
from stepwatch.monitors.snapshot.types import Snapshot, Stall
from stepwatch.monitors.states import NOT_JUDGED, STALLED, SUSPECTED, StallFloorSource, StallState
from stepwatch.monitors.stats.stepstats import StepStats

Timing = Literal["exact", "reported", "shared", "per_update", "approximate"]


@dataclass(frozen=True)
class StepSource:
    """The steps that speak (rule 1): ``fold`` the events fold whose detectors judge (events.jsonl's,
    or the supervisor's log steps), None for this view's own parse or no steps; ``stats`` their
    step times; ``timing`` the snapshot's ``step.timing``; ``use_events`` the emitter speaks."""

    fold: EventsFold | None
    stats: StepStats
    timing: Timing | None
    use_events: bool


def choose(ev: EventsFold, log_ev: EventsFold, log_stats: StepStats, supervisor_alive: bool | None,
           ended: Any) -> StepSource:
    """Rule 1: ``ev`` events.jsonl's fold, ``log_ev`` the supervisor's logsteps.jsonl fold,
    ``log_stats`` this view's own parse of train.log; ``supervisor_alive`` / ``ended`` the snapshot's."""
    use_events = ev.stats.seen > 0
    # the supervisor's records speak while it lives, and for a run it saw to the end; a supervisor
    # gone mid-run left them frozen: this view's own reading takes over (labelled approximate)
    use_logsteps = not use_events and log_ev.stats.seen > 0 and bool(supervisor_alive or ended is not None)
    fold = ev if use_events else (log_ev if use_logsteps else None)
    timing: Timing | None
    if fold is not None:
        stats = fold.stats
        timing = "exact" if use_events else ("reported" if log_ev.reported_steps else
                                             "shared" if log_ev.shared_steps else "per_update")
    elif log_stats.seen > 0:
        stats, timing = log_stats, "approximate"
    else:
        stats, timing = ev.stats, None
    return StepSource(fold, stats, timing, use_events)


def global_step(ev: EventsFold, progress: LogTracker) -> int | None:
    """Rule 2: the last step record's number in events.jsonl, else the step the log shows."""
    step = step_no(ev.last_step.get("step")) if ev.last_step is not None else None
    return step if step is not None else progress.global_step


def step_source(use_events: bool, global_step: int | None) -> Literal["events", "log"] | None:
    """``step.source``: ``events`` when the emitter speaks, else ``log`` once the log showed a step."""
    return "events" if use_events else ("log" if global_step is not None else None)


def step_started(src: StepSource, last_advance_at: float | None) -> float | None:
    """Rule 3: unix s the step in progress began: the last recorded step's end, or for this view's
    own parse of train.log the last counter advance it saw (``last_advance_at``); None when unknown."""
    if src.fold is not None:
        return unix_time(src.fold.last_step.get("step_end")) if src.fold.last_step else None
    return last_advance_at


#: How late a step's record may reach its file after the step ended, seconds: the emitter writes
#: every 50 ms (telemetry/writer.py FLUSH_EVERY_S), the supervisor's log timer within ~16 ms of the
#: bytes (watch/logsteps.py); with room for a slow disk. A refresh that did not see a step's record
#: proves the step ended no earlier than this before it.
RECORD_LATENCY_S = 1.0


class ObservedStart:
    """When a judge saw the step in progress begin, on its own monotonic clock: the start it last
    saw, the refresh that first saw it and the one before it. Pure: the monotonic time is passed in."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.last_look: float | None = None  # the previous refresh, monotonic s
        self.seen_at: float | None = None  # the refresh that first saw this start, monotonic s
        self.before: float | None = None  # the refresh before it, which did not see it

    def observe(self, started: float | None, mono: float) -> tuple[float, float] | None:
        """``(at_least, at_most)`` seconds the step starting at ``started`` (unix s, the run's clock)
        has run, on the monotonic clock (``mono``: this refresh's look); None when this judge did not
        see it begin (the start was there at its first look, or moved back: a change of which steps
        speak)."""
        moved_on = (started is not None and self.last_look is not None
                    and (self.started is None or started > self.started))  # None: no step before
        if moved_on:
            self.seen_at, self.before = mono, self.last_look
        elif started != self.started:
            self.seen_at = self.before = None
        self.started, self.last_look = started, mono
        if self.seen_at is None or self.before is None:
            return None
        return max(0.0, mono - self.seen_at - RECORD_LATENCY_S), mono - self.before + RECORD_LATENCY_S


def stall_part(src: StepSource, started: float | None, now: float, open_phase: Any, bar_complete: bool,
               last_log_byte_age_s: float | None,
               observed: tuple[float, float] | None = None,
               log_phase: tuple[str, float | None] | None = None,
               busy: tuple[float, float] | None = None, floor_s: float = STALL_FLOOR_S,
               finish_line: bool = False, floor_source: StallFloorSource = "default") -> tuple[Stall, float | None]:
    """Rule 3 for a running run: ``(stall, stall_at)``. ``started``: unix s the step in progress began;
    ``open_phase``: events.jsonl's open save/eval phase; ``bar_complete`` / ``last_log_byte_age_s``:
    train.log's bar reached its total / how long ago the log was last written; ``observed``: what
    :meth:`ObservedStart.observe` said of ``started``; ``log_phase``: the evaluation or save the log says is
    under way and its budget (used where events.jsonl has no phase open); ``busy``: the run's processes' CPU
    cores over the last look and the busy budget, where known (:func:`busy_but_silent`); ``floor_s`` / ``floor_source``:
    the step budget's floor and where it came from (``[stall] step_floor_s`` or the default), said in the part."""
    budget = None
    if not open_phase and log_phase is not None:
        open_phase, budget = log_phase
    sv = stall_state(started, now, src.stats, open_phase, observed=observed, phase_budget_s=budget, floor_s=floor_s)
    stall = cast(Stall, {**sv.as_dict(), "reason": sv.reason, "floor_s": floor_s, "floor_source": floor_source})
    if sv.threshold_s is None:
        stall["state"] = NOT_JUDGED
    elif budget is None and not src.use_events and (guard := log_only_guard(sv, bar_complete, last_log_byte_age_s,
                                                                                      finish_line)):
        stall.update(state=cast(StallState, guard[0]), reason=guard[1])
        if stall["state"] == NOT_JUDGED:
            stall["threshold_s"] = None
        return stall, None
    if sv.state == STALLED and budget is None and busy is not None and sv.current_step_elapsed_s is not None:
        judged = busy_but_silent(sv.current_step_elapsed_s, *busy)
        stall.update(cast(Stall, judged))
        if judged and stall["state"] == STALLED and started:  # busy past the busy budget: stuck from there on
            return stall, started + busy[1]
    # when it became a stall, from the files: the step's start plus the threshold
    stall_at = (started + sv.threshold_s if stall["state"] == STALLED and started and sv.threshold_s else None)
    return stall, stall_at


#: The processes' CPU (cores, over the last look) above which a silent step is busy, not stuck.
BUSY_CORES = 0.1
def busy_budget_s(longest_phase_s: float, floor_s: float = BUSY_FLOOR_S) -> float:
    """How long a busy but silent step may run: the longer of the floor (BUSY_FLOOR_S, or ``[stall]
    busy_floor_s``) and 3x the longest save or eval."""
    return max(floor_s, 3.0 * longest_phase_s)


def busy_but_silent(elapsed_s: float, cpu_cores: float, budget_s: float) -> dict[str, Any]:
    """A step past its stall budget: ``suspected`` (shown, not paged) while the processes' CPU moves
    (``cpu_cores`` >= BUSY_CORES) and it has run less than ``budget_s``; stalled after that; an idle tree
    stays stalled (no CPU and no step: stuck)."""
    if cpu_cores < BUSY_CORES:
        return {}
    if elapsed_s <= budget_s:
        return {"state": SUSPECTED, "threshold_s": budget_s, "reason": (f"busy but silent: no step for {elapsed_s:.1f} s while the processes use "
                                               f"{cpu_cores:.2f} CPU cores (a save or an evaluation the log does not "
                                               f"name?); judged stuck after {budget_s:.0f} s")}
    return {"state": STALLED, "threshold_s": budget_s,
            "reason": (f"busy but silent for {elapsed_s:.1f} s > {budget_s:.0f} s (the busy budget: the longer of "
                       f"its floor and 3 x the longest save or evaluation): no step, no output, the CPU "
                       f"at {cpu_cores:.2f} cores")}


def guard_stall(snap: Snapshot) -> None:
    """Rule 3's last guard: no stall verdict on a full disk (the silence of files that cannot be
    written proves nothing)."""
    disk = snap.get("disk") or {}
    if disk.get("full") and snap["stall"].get("state") != NOT_JUDGED:
        snap["stall"].update(state=NOT_JUDGED, threshold_s=None, reason=f"{full_words(disk)}: missing log lines and events "
                                                       "prove nothing (ENOSPC)")
