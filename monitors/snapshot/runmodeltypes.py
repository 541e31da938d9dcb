"""The status snapshot's types for what the run is doing (ARCHITECTURE.md R18): its phase and the liveness
signals and verdicts that need no log shape. Part of :mod:`.types` (which re-exports them).

No ``from __future__ import annotations`` (see :mod:`.types`).
"""

from typing import TypedDict

from stepwatch.monitors.detectors.frozen import Frozen
from stepwatch.monitors.states import PhaseName, RestartOutcome, RestartVerdict, WatchState


class Phase(TypedDict):
    """``phase``: what the attempt is doing (ARCHITECTURE.md R18), from events.jsonl's open phase or the log."""

    name: PhaseName
    for_s: float | None  #: how long it has been doing it (seconds; null when unknown)
    source: str | None  #: "events" (the emitter's phase()), "log" (its lines, bars), "stacks" (the processes' stacks
    #: showed a save or an evaluation in a step past its budget), "process" (it ended), null
    budget_s: float | None  #: how long an evaluation or a save may run before it is judged stuck
    longest_s: dict[str, float]  #: the longest evaluation and save seen so far, seconds


class LivenessSignals(TypedDict):
    """``liveness.signals_s``: seconds since each signal last moved, as this view saw it (None: unknown) —
    the run's processes' CPU time (the whole recorded tree), train.log's bytes, the training step."""

    cpu: float | None
    output: float | None
    step: float | None


#: ``liveness.signals_s``'s keys, in order (the exporter's ``stepwatch_liveness_seconds{signal=...}``)
LIVENESS_SIGNALS = ("cpu", "output", "step")


class Liveness(TypedDict):
    """``liveness``: judgements of the run's processes that need no log shape (:mod:`..detectors.frozen`), and
    the independent signals the stall and frozen verdicts stand on (ARCHITECTURE.md R18)."""

    frozen: Frozen
    signals_s: LivenessSignals


class Watch(TypedDict):
    """``watch``: who watches the running run (its supervisor, the warden and keeper that take over when it is gone:
    monitors/watch/warden.py), probed by identity from run.json; ``unwatched`` when the run's process lives and
    none of them does (nothing reads its output, records or pages its end)."""

    state: WatchState
    reason: str
    supervisor_pid: int | None  #: the supervisor run.json names (null: none)
    wardens_alive: int | None  #: of the wardens run.json names (warden, keeper), how many live; null: it names none


class RestartView(TypedDict):
    """``restart``: the restart policy's last decision (restart.json, written by the supervisor of the attempt that
    ended; ``[restart]`` in the run config), or null when the policy is off or has not decided yet."""

    verdict: RestartVerdict
    mode: str  #: "observe" (recorded and paged only) | "enforce"
    cause: str  #: why the attempt ended (monitors/parsers/endcauses.py CAUSES)
    reason: str  #: why this verdict (the rule that decided)
    evidence: str  #: what decided the cause
    checkpoint: str | None  #: where the next attempt resumes (null: from scratch, or STOP)
    checkpoint_step: int | None
    attempt: int | None  #: the attempt that ended
    lost_steps: int | None  #: steps after the checkpoint, done again by a resumed attempt
    words: str  #: the decision in one line, as the page said it
    #: an enforced RESTART: when its back-off ends and the next attempt is due (decided + back-off, unix s); null otherwise
    starts_at_unix: float | None
    #: what an enforced RESTART became (monitors/states.py RESTART_OUTCOMES); null: not yet (the back-off), or none due
    outcome: RestartOutcome | None
    outcome_words: str  #: why it did not start, Slurm's requeue, why the started attempt went from scratch; "" if none
    started_attempt: int | None  #: the attempt the restart started


class AttemptLedger(TypedDict):
    """``ledger.attempts[]``: one attempt's wall time in accounts (:mod:`.ledger`; ledger.json once it ended)."""

    attempt: int | None
    launched_at_unix: float | None
    ended_at_unix: float | None  #: null while it runs
    wall_s: float | None  #: launch to end (or now), seconds
    #: seconds per account (monitors/states.py LEDGER_PHASES, every key): they add up to wall_s; null: no launch time
    phases_s: dict[str, float] | None
    last_step: int | None
    step_p50_s: float | None
    resumed_from_step: int | None  #: the checkpoint's step this attempt resumed from (run.json ``resumed_from``)
    after_attempt: int | None  #: the attempt it resumed after
    #: who started it (run.json ``resumed_from.by``): "restart policy", "slurm requeue", "operator" (a launch or relaunch
    #: by hand: the gap before it is ``operator_idle``); null: an older record that does not say
    started_by: str | None
    lost_steps: int | None  #: the steps a later attempt did again (after its checkpoint); null: none resumed after it
    source: str  #: "live" (running), "ended" (this snapshot's, ended), "record" (an earlier attempt's ledger.json)


class Ledger(TypedDict):
    """``ledger``: where the run's hours went, per attempt and in all (ARCHITECTURE.md, "The ledger")."""

    attempts: list[AttemptLedger]
    phases_s: dict[str, float] | None  #: the run's accounts (restart gaps, unaccounted attempts included)
    wall_s: float | None  #: the first launch to the last end (or now)
    goodput: float | None  #: training over wall time (0..1)
    reason: str | None  #: why there is no ledger
