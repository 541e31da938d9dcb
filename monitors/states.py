"""The state words: every state a detector, the watchdog or the status snapshot says, in one place.

The words are the contract: ``status --json`` carries them, the screen colours them, ``watch``
narrates them, the exporter maps them to numbers, alerts fire on them. Define a state here, import it
everywhere else; never spell one as a literal string in a second module.

Standard library only (``typing``), no stepwatch import: safe to import from the training process,
like :mod:`stepwatch.monitors.protocol` beside it. Each family has its constants and a ``Literal``
alias the snapshot's types (:mod:`stepwatch.monitors.snapshot.types`) use.
"""

from __future__ import annotations

from typing import Any, Final, Literal

# --- verdicts of the detectors ------------------------------------------------------------------
#: Judged, and nothing wrong.
OK: Final = "ok"
#: The fallback detector saw slow steps that may be a second mode (not yet enough to flag).
SUSPECTED: Final = "suspected"
#: A detector's alarm: the fallback detector's second mode, the straggler detector's slow rank.
FLAGGED: Final = "flagged"
#: The step in progress has run far longer than the run's steps take (the stall detector; the ETA).
STALLED: Final = "stalled"
#: What a detector that has not judged says (no steps, warming up, too few steps, a guard), never "ok".
NOT_JUDGED: Final = "not judged"

#: ``fallback.state``.
FallbackState = Literal["ok", "suspected", "flagged", "not judged"]
#: ``stall.state``: ``suspected`` while the step runs past its budget but the processes' CPU moves (busy but
#: silent: shown, never paged, until the busy budget).
StallState = Literal["ok", "suspected", "stalled", "not judged"]
#: ``stall.floor_source``: where the step budget's floor came from (``[stall] step_floor_s``, or the default).
StallFloorSource = Literal["default", "run config"]
#: ``straggler.state``.
StragglerState = Literal["ok", "flagged", "not judged"]
#: ``eta.state``: ``stalled`` when the stall detector says so (the views then show STALLED, not a time).
EtaState = Literal["ok", "stalled", "not judged"]
#: ``liveness.frozen.state``: ``flagged`` when a process of the run is held stopped.
FrozenState = Literal["ok", "flagged", "not judged"]

#: ``loss_health.state`` (monitors/detectors/losshealth.py): an episode of the training loss, by how bad it is; ``ok``
#: between episodes.
SPIKE: Final = "spike"
PERSISTENT: Final = "persistent"
CATASTROPHIC: Final = "catastrophic"
LossState = Literal["ok", "spike", "persistent", "catastrophic", "not judged"]
EpisodeKind = Literal["spike", "persistent", "catastrophic"]

# --- the run's phase (what the attempt is doing: monitors/parsers/phases.py) ----------------------
#: Before the first training step: imports, preprocessing, compilation.
STARTING: Final = "starting"
TRAINING: Final = "training"
EVALUATING: Final = "evaluating"
SAVING: Final = "saving"
#: After the last training step: the final save, the summary, teardown.
FINISHING: Final = "finishing"
#: The attempt's process ended.
ENDED: Final = "ended"
#: ``phase.name``; every phase word in order (the exporter's ``stepwatch_phase{phase=...}``).
PhaseName = Literal["starting", "training", "evaluating", "saving", "finishing", "ended"]
PHASES: Final = (STARTING, TRAINING, EVALUATING, SAVING, FINISHING, ENDED)

# --- the ledger of where the hours went (monitors/snapshot/ledger.py) ----------------------------
#: Waiting in the scheduler's queue (Slurm: submission to the job's start).
QUEUED: Final = "queued"
#: Between one attempt's end and the launch of the next one the system started (the restart policy's back-off and
#: launch, a Slurm requeue).
RESTART_GAP: Final = "restart_gap"
#: Between one attempt's end and the next one's launch by hand (``stepwatch relaunch``, the run screen's ``r``): the
#: operator's own time, booked apart from the policy's gap and left out of goodput.
OPERATOR_IDLE: Final = "operator_idle"
#: Training time a later attempt did again: the steps after the checkpoint it resumed from, and a failed
#: attempt's step in flight when it died.
LOST: Final = "lost"
#: An attempt no record accounts for (its supervisor died before it wrote ledger.json).
UNACCOUNTED: Final = "unaccounted"
#: Every account of the ledger, in order (``ledger.*.phases_s``; ``stepwatch_time_seconds_total{phase=...}``);
#: the sum of a run's accounts is its wall time.
LEDGER_PHASES: Final = (QUEUED, STARTING, TRAINING, EVALUATING, SAVING, STALLED, FINISHING, RESTART_GAP, OPERATOR_IDLE,
                         LOST, UNACCOUNTED)
LedgerPhase = Literal["queued", "starting", "training", "evaluating", "saving", "stalled", "finishing", "restart_gap",
                      "operator_idle", "lost", "unaccounted"]

# --- the fallback detector's warm-up ------------------------------------------------------------
WARMING: Final = "warming"
STEADY: Final = "steady"
#: ``warmup.state`` (None before any counted step).
WarmupState = Literal["warming", "steady"]

# --- the run ------------------------------------------------------------------------------------
#: No run.json, or it says nothing more.
UNKNOWN: Final = "unknown"
#: The captured process is alive (or Slurm says the job runs on another node).
RUNNING: Final = "running"
#: exit.json exists, or Slurm ended the job.
EXITED: Final = "exited"
#: A Slurm job waiting in the queue (or started, with no process recorded yet).
PENDING: Final = "pending"
#: The snapshot's ``state``.
RunState = Literal["unknown", "running", "exited", "pending"]

# --- a process probe (the watchdog: pid + create time) -------------------------------------------
ALIVE: Final = "alive"
DEAD: Final = "dead"
ZOMBIE: Final = "zombie"
REUSED: Final = "reused"
#: :func:`stepwatch.monitors.watchdog.probe`'s verdict.
Verdict = Literal["alive", "dead", "zombie", "reused"]
#: ``process_verdict`` for a run whose supervisor died before it recorded the child.
NEVER_RECORDED: Final = "never_recorded"

# --- who watches the run (the supervisor, its warden and keeper: monitors/watch/warden.py) ----------
#: The supervisor is alive and not held stopped: it pumps the output, records the end, pages.
WATCHED: Final = "watched"
#: The supervisor is alive but held stopped (SIGSTOP): its warden pumps the output and pages it frozen.
HELD: Final = "held"
#: The supervisor is gone; a warden or the keeper lives: it pumps the output and pages the run's end.
WARDED: Final = "warded"
#: The run's process lives and none of its watchers does: nothing reads its output (its next print dies of
#: SIGPIPE), nothing records or pages its end.
UNWATCHED: Final = "unwatched"
#: ``watch.state`` (``not judged``: the run is not running, or run.json names no watcher this host can probe).
WatchState = Literal["watched", "held", "warded", "unwatched", "not judged"]

# --- the restart policy (launcher/restartpolicy.py; restart.json's decision: launcher/restartrun.py) --------------
#: ``[restart] mode``: ``off`` (no policy), ``observe`` (decide, record and page what it would do), ``enforce`` (do it).
OFF: Final = "off"
OBSERVE: Final = "observe"
ENFORCE: Final = "enforce"
RestartMode = Literal["off", "observe", "enforce"]
RESTART_MODES: Final = (OFF, OBSERVE, ENFORCE)
#: The policy's verdict on an attempt that ended.
RESTART: Final = "RESTART"
STOP: Final = "STOP"
RestartVerdict = Literal["RESTART", "STOP"]
RESTART_VERDICTS: Final = (RESTART, STOP)
#: What an enforced RESTART became, each a key the supervisor (or the requeued job's) adds to the decision: a new
#: attempt ``started``, ``not_started`` (and why), or left to Slurm, which ``requeued`` the job.
STARTED: Final = "started"
NOT_STARTED: Final = "not_started"
REQUEUED: Final = "requeued"
RestartOutcome = Literal["started", "not_started", "requeued"]
RESTART_OUTCOMES: Final = (STARTED, NOT_STARTED, REQUEUED)
#: The state word (monitors/snapshot/process.py ``state_word``) while an enforced RESTART's back-off runs and its next
#: attempt is not started yet: ``RESTARTING in 12 s (attempt 2 from ckpt_200)``.
RESTARTING: Final = "RESTARTING"
#: Who started an attempt (run.json ``resumed_from.by``; none: the operator's launch or relaunch): the ledger's
#: ``attempts[].started_by``.
BY_POLICY: Final = "restart policy"
BY_OPERATOR: Final = "operator"


def restart_awaited(decision: Any) -> bool:
    """The decision (restart.json's, already read under the trust rule) is an enforced RESTART with no outcome yet: a
    new attempt is promised and neither started, refused nor left to Slurm."""
    return (isinstance(decision, dict) and decision.get("mode") == ENFORCE and decision.get("verdict") == RESTART
            and not any(k in decision for k in RESTART_OUTCOMES))
