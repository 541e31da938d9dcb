"""The restart policy: after an attempt ends, RESTART (from the newest complete checkpoint) or STOP, with the reason
and its evidence. Pure: the supervisor gathers the facts (:mod:`stepwatch.monitors.parsers.endcauses`,
:mod:`.checkpoints`) and records the decision in ``restart.json``.

Configured in the run config's ``[restart]`` table::

    [restart]
    mode = "observe"        # off | observe (record and page what it would do) | enforce (do it)
    max_restarts = 3        # restarts of one run at most
    backoff_s = 30          # the wait before a new attempt
    storm_attempts = 3      # this many ends within storm_window_s: STOP (a crash loop)
    storm_window_s = 600
    checkpoints = "out/ckpt_*"       # when the trainer's layout is not recognised (a glob from the run's cwd)
    complete_marker = "DONE"         # ... and the file a complete one holds
    resume = "hf"           # "hf" (--resume_from_checkpoint PATH), "lightning" (--ckpt_path PATH), or an argv
                            # template holding {checkpoint} and/or {step}
    unsafe_checkpoint = "stop"   # a checkpoint whose path others can change (launcher/checkpointpath.py): "stop"
                                 # (no new attempt) or "scratch" (the next attempt starts from scratch)

The rules, in order: a cause a restart cannot help (completed, the operator's stop, a configuration or code error)
STOPs; so does a spent budget (``max_restarts``), a storm (``storm_attempts`` ends in ``storm_window_s``), and the
same cause as the previous attempt with neither a newer step nor a newer complete checkpoint ("same cause, no
progress"). Anything else RESTARTs, from the newest complete checkpoint (or from scratch when there is none).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from stepwatch.monitors.parsers.endcauses import NEVER_RESTART
from stepwatch.monitors.restartsettings import MODES as MODES, UNSAFE_CHECKPOINT as UNSAFE_CHECKPOINT
from stepwatch.monitors.restartsettings import RestartSettings as RestartSettings, restart_settings as restart_settings
from stepwatch.monitors.states import RESTART as RESTART, STOP as STOP  # re-exported: the policy speaks them

# the [restart] settings and their parser live in monitors/restartsettings.py (re-exported here: callers keep working);
# a run's settings are read once through monitors/runsettings.py
_NEVER_WORDS = {"completed": "the run completed", "operator_stop": "stopped by the operator",
                "config_error": "configuration or code error"}


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """One attempt's end as the policy sees it (a row of restart.json's ``attempts``)."""

    attempt: int
    cause: str
    evidence: str
    step: int | None
    checkpoint: str | None  # the newest complete checkpoint after it ended
    checkpoint_step: int | None
    ended_at_unix: float


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: str  # RESTART | STOP
    reason: str
    evidence: str
    checkpoint: str | None  # where a new attempt resumes (None: from scratch)
    checkpoint_step: int | None
    attempt: int  # the attempt that ended
    lost_steps: int | None  # steps done after the checkpoint, done again by the resumed attempt

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def decide(previous: list[AttemptEnd], this: AttemptEnd, s: RestartSettings, restarts: int | None = None) -> Decision:
    """RESTART or STOP after ``this`` attempt's end, given the ``previous`` ends of the same run (oldest first) and
    ``restarts``, how many restarts the policy made in a row up to this attempt (the supervisor's own record,
    run.json ``resumed_from``: a restart.json removed or replaced never resets the budget); the ends recorded
    when it is None."""
    lost = max(0, this.step - (this.checkpoint_step or 0)) if this.step is not None else None
    made = len(previous) if restarts is None else restarts

    def verdict(v: str, reason: str) -> Decision:
        return Decision(v, reason, this.evidence, this.checkpoint if v == RESTART else None,
                        this.checkpoint_step if v == RESTART else None, this.attempt, lost if v == RESTART else None)

    if this.cause in NEVER_RESTART:
        return verdict(STOP, _NEVER_WORDS[this.cause])
    if made >= s.max_restarts:
        return verdict(STOP, f"the restart budget is spent: {made} restart(s) of max_restarts {s.max_restarts}")
    recent = [p for p in previous if this.ended_at_unix - p.ended_at_unix <= s.storm_window_s]
    if len(recent) + 1 >= s.storm_attempts:
        return verdict(STOP, f"a crash loop: {len(recent) + 1} ends within {s.storm_window_s:g} s "
                             f"(storm_attempts {s.storm_attempts})")
    if previous and (p := previous[-1]).attempt == this.attempt - 1 and p.cause == this.cause and (
            this.step or -1) <= (p.step or -1) and (this.checkpoint_step or -1) <= (p.checkpoint_step or -1):
        return verdict(STOP, f"same cause, no progress: {this.cause} again at step {this.step} "
                             f"(attempt {p.attempt} reached step {p.step})")
    where = f"from {this.checkpoint}" if this.checkpoint else "from scratch (no complete checkpoint)"
    return verdict(RESTART, f"{this.cause}: restart {made + 1} of {s.max_restarts}, {where}")


def resume_argv(argv: list[str], resume: str | tuple[str, ...] | None, checkpoint: str | None,
                step: int | None) -> list[str]:
    """The command of a resumed attempt: ``argv`` with the resume argument set (an earlier one replaced); ``argv``
    unchanged when there is no checkpoint or no ``resume`` rule."""
    if checkpoint is None or resume is None:
        return list(argv)
    if isinstance(resume, tuple):
        return list(argv) + [a.replace("{checkpoint}", checkpoint).replace("{step}", str(step)) for a in resume]
    flag = {"hf": "--resume_from_checkpoint", "lightning": "--ckpt_path"}[resume]
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out + [flag, checkpoint]
