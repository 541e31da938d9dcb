"""The snapshot's ``phase`` part: what the attempt is doing (ARCHITECTURE.md R18).

The emitter's open ``phase()`` (events.jsonl) wins where there is one; otherwise the log's
(:class:`~stepwatch.monitors.parsers.phases.LogPhases`); an attempt whose process ended is ``ended``.
"""

from __future__ import annotations

from typing import Any, cast
from collections.abc import Mapping

from stepwatch.monitors.parsers.phases import LogPhases
from stepwatch.monitors.protocol import FLAG_EVAL, FLAG_SAVE
from stepwatch.monitors.snapshot.types import Phase
from stepwatch.monitors.states import ENDED, EVALUATING, SAVING, STARTING

_EVENT_PHASES = {FLAG_SAVE: SAVING, FLAG_EVAL: EVALUATING}


def phase_part(open_phase: Any, phases: LogPhases, ended: bool, now: float) -> Phase:
    """``phase`` from events.jsonl's open phase (``open_phase``), the log's phases and whether the process ended."""
    longest = {k: round(v, 3) for k, v in phases.longest_s.items()}
    if ended:
        return cast(Phase, {"name": ENDED, "for_s": None, "source": "process", "budget_s": None, "longest_s": longest})
    if open_phase in _EVENT_PHASES:
        return cast(Phase, {"name": _EVENT_PHASES[open_phase], "for_s": None, "source": "events", "budget_s": None,
                            "longest_s": longest})
    since = phases.since_s
    return cast(Phase, {"name": phases.name, "for_s": None if since is None else round(max(0.0, now - since), 3),
                        "source": phases.source if phases.name != STARTING or since is not None else None,
                        "budget_s": phases.budget_s(), "longest_s": longest})


def learn_phase_lengths(phases: LogPhases, *longest_by_flag: Mapping[str, float]) -> None:
    """Teach the log's phases how long the evaluations and saves took from the step records flagged so
    (``EventsFold.phase_longest_s``, seconds): the budgets then hold for a view that read the log at once."""
    for longest in longest_by_flag:
        for flag, seconds in longest.items():
            if flag in _EVENT_PHASES:
                phases.learn(_EVENT_PHASES[flag], seconds)


def follow_stacks(phases: LogPhases, global_step: Any, started: float | None) -> None:
    """What the stacks of a step past its budget showed (``phases.stacks_saw``: the phase and the step they saw),
    applied to the step still in progress (``started``: its start, unix s) as if the log had said it; a phase the
    stacks said ends once the run steps past the step it held for (its length learned, as a logged phase's)."""
    saw, phases.stacks_saw = phases.stacks_saw, None
    if saw is not None and saw[1] == global_step:
        phases.saw(saw[0], started, source="stacks")
        phases.stacks_step = global_step
    elif phases.source == "stacks" and global_step != phases.stacks_step:
        phases.stepped(started, False)
