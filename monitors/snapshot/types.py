"""The status snapshot's types: one ``TypedDict`` per part, and :class:`Snapshot`, the whole (the
parts about what the run uses, GPUs to the Slurm job, live in :mod:`.resourcetypes`; re-exported here).

The snapshot is a plain dict at run time (``status --json`` prints it as it is); these types let a
checker (pyright) see every key a producer writes and a view reads. Every key of a part is always
present (null when unknown) unless it is ``NotRequired``, which says when it is absent. State words
come from :mod:`stepwatch.monitors.states`.

Values copied from a run file as they were read (run.json's attempt, exit.json's fields, an
event's versions) are typed :data:`FileValue`: any JSON value, shown as data, never trusted. A
producer whose helper returns ``dict[str, Any]`` (the detectors, the GPU reading) casts at the
point it fills the snapshot.

No ``from __future__ import annotations`` here: ``NotRequired`` must be seen when each class is
made (``__required_keys__``), and the tests walk these types at run time.
"""

from typing import Literal, NotRequired, TypedDict

from stepwatch.monitors.detectors.losshealth import Episode as Episode, LossHealthPart as LossHealthPart
from stepwatch.monitors.snapshot.resourcetypes import (DeviceHistory, Disk, Energy, FileValue, GpuDevice, Health,
                                                       Padding, PaddingWidth, Scaling, ScalingShares, Scheduler,
                                                       Survivor)
from stepwatch.monitors.snapshot.runmodeltypes import LIVENESS_SIGNALS as LIVENESS_SIGNALS, Liveness
from stepwatch.monitors.snapshot.runmodeltypes import LivenessSignals as LivenessSignals, Phase as Phase
from stepwatch.monitors.snapshot.runmodeltypes import AttemptLedger as AttemptLedger, Ledger as Ledger
from stepwatch.monitors.snapshot.runmodeltypes import RestartView as RestartView, Watch as Watch
from stepwatch.monitors.states import (EtaState, FallbackState, RunState, StallFloorSource, StallState, StragglerState,
                                      WarmupState)

#: A counter read from a file: a finite number >= 0, else None (:func:`.model.count`).
Count = int | float | None


__all__ = ["Alert", "Arrival", "AttnImplementation", "Count", "Delivery", "DeviceHistory", "Disk", "Dynamo",
           "DynamoBySource", "DynamoCounts", "Ended", "Energy", "Eta", "Events", "Fallback", "FileValue",
           "GpuDevice", "Health", "Histogram", "Identity", "Log", "Metric", "NewAlert", "Padding", "PaddingWidth",
           "Rank", "RankRestarts", "RankStepSummary", "Resume", "Scaling", "ScalingShares", "Scheduler", "Snapshot",
           "Stall", "Step", "StepSeconds", "Straggler", "StuckRank", "Survivor", "Throughput", "Versions", "Warmup"]


class Ended(TypedDict):
    """``ended``: exit.json's record of the end (or, for a job Slurm ended, the scheduler's)."""

    ended_at: FileValue
    ended_at_unix: FileValue
    duration_s: FileValue
    stop_requested: FileValue
    error: FileValue
    write_errors: FileValue
    log_lost_bytes: FileValue
    log_lost_reason: FileValue


class RankStepSummary(TypedDict):
    """``ranks[].steps``: one rank's own step times (its events or log-step file)."""

    n: int
    p50: float | None
    p99: float | None
    last_step: int | None
    last_step_end_unix: float | None
    source: Literal["events", "log"]
    #: the rank's latest metrics (its own log events, or its prefixed lines: ``[default1]:{'loss': …}``)
    metrics: dict[str, float]


class Rank(TypedDict):
    """``ranks[]``: one ranked process (:mod:`.ranks`)."""

    rank: int
    local_rank: int | None
    pid: int | None
    alive: bool | None
    ended_at_unix: float | None
    returncode: int | None
    signal: str | None
    exit_source: Literal["kernel", "torchrun"] | None
    root_cause: bool
    after_stop: bool
    restart_count: int | None
    max_restarts: int | None
    started_at_unix: float | None
    steps: RankStepSummary | None


class RankRestarts(TypedDict):
    """``rank_restarts``: torchrun's restarts of the worker group."""

    count: int
    max: int | None


class StuckRank(TypedDict):
    """``straggler.stuck[]``: a rank that stopped stepping while another goes on."""

    rank: int
    last_step: int | None
    behind_s: float
    ahead_rank: int
    ahead_step: int | None
    threshold_s: float


class Straggler(TypedDict):
    """``straggler``: the straggler detector's verdict (:mod:`stepwatch.monitors.detectors.straggler`)."""

    state: StragglerState
    rank: int | None
    lag_s: float | None
    trip_s: float | None
    steps: int
    #: per rank (a string), its median lag in seconds
    lags_s: dict[str, float]
    reason: str
    stuck: list[StuckRank]


class Versions(TypedDict):
    """``versions``: the emitter's run_start, as read."""

    python: FileValue
    torch: FileValue
    transformers: FileValue


class Arrival(TypedDict):
    """``step.arrival``: the supervisor's arrival-time figure beside the program's own step times."""

    n: int
    p50: float | None
    p99: float | None
    agrees: bool | None


class Step(TypedDict):
    """``step``: the headline step and where it comes from (:mod:`.stepsource`)."""

    global_step: int | None
    max_steps: int | None
    source: Literal["events", "log"] | None
    timing: Literal["exact", "reported", "shared", "per_update", "approximate"] | None
    arrival: Arrival | None


class StepSeconds(TypedDict):
    """``step_seconds``: counted steps' times, nearest-rank, in seconds."""

    n: int
    min: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    last: float | None


class Throughput(TypedDict):
    tokens_per_s: float | None
    real_tokens_per_s: float | None
    padding_share: float | None


class Eta(TypedDict):
    """``eta`` (:mod:`.eta`)."""

    eta_s: float | None
    remaining_steps: int | None
    end_at_unix: float | None
    seconds_per_step: float | None
    state: EtaState
    basis: str | None


class Warmup(TypedDict):
    """``warmup``: the fallback detector's warm-up (state None before any counted step)."""

    state: WarmupState | None
    until_step: int | None


class Fallback(TypedDict):
    """``fallback``: the fallback detector's verdict."""

    state: FallbackState
    slow_steps: list[int]
    onset_step: int | None
    reason: str | None


class Stall(TypedDict):
    """``stall``: the stall detector's verdict after the guards (:mod:`.stepsource`)."""

    state: StallState
    current_step_elapsed_s: float | None
    reason: str
    #: the elapsed time at which the step in progress reads stalled: max(10 x p99, floor_s), or the busy budget when
    #: the processes computed past it; None while not judged
    threshold_s: float | None
    #: the step budget's floor in use, and where it came from
    floor_s: float
    floor_source: StallFloorSource


class DynamoCounts(TypedDict):
    """``dynamo.by_source.events`` / ``.log``: one source's counts. The events part has no
    ``recompiles`` / ``recompile_limit_hits`` when only run_end spoke and it did not count them."""

    recompiles: NotRequired[Count]
    recompile_limit_hits: NotRequired[Count]
    graph_breaks: Count
    unique_graphs: Count


class DynamoBySource(TypedDict):
    events: DynamoCounts | None
    log: DynamoCounts | None


class Dynamo(TypedDict):
    """``dynamo`` (:mod:`.dynamo`): per count the source that saw the most."""

    recompiles: Count
    graph_breaks: Count
    unique_graphs: Count
    recompile_limit_hits: Count
    source: str | None
    by_source: DynamoBySource
    top_recompile_reason: str | None


class AttnImplementation(TypedDict):
    requested: FileValue
    resolved: FileValue


class Delivery(TypedDict):
    """``alerts[].delivered[channel]``: the recorded outcome of one channel's delivery."""

    outcome: FileValue
    detail: FileValue
    attempts: NotRequired[FileValue]  # absent while no delivery is recorded
    t: NotRequired[FileValue]


class NewAlert(TypedDict):
    """An alert as a detector's rule makes it (:func:`.alerts.alert`)."""

    id: str
    kind: str
    at: str
    message: str


class Alert(NewAlert):
    """``alerts[]``: an alert as the snapshot lists it (:func:`.alerts.merge_alerts`)."""

    recorded: bool
    active: bool
    #: per configured channel, or None when the run names no channel
    delivered: dict[str, Delivery] | None
    acknowledged: bool
    #: the supervisor's level (only for an alert recorded in alerts.jsonl)
    level: NotRequired[str]
    #: the supervisor's Python stack taken for the alert (only once it recorded one)
    stack: NotRequired[str]
    #: for a stall: where each process of the tree stands, grouped, the odd one out first (one line)
    stacks_summary: NotRequired[str]


class Identity(TypedDict, total=False):
    """``identity``: the git identity of the launch, copied from run.json (the launcher writes every
    key; a run.json written by other hands may lack some)."""

    repo_root: str | None
    harness_commit: str | None
    harness_dirty_at_launch: bool | None
    branch: str | None
    describe: str | None
    untracked: list[str]
    modified: list[str]
    staged: list[str]


class Log(TypedDict):
    """``log``: train.log as this view read it."""

    file: str | None
    last_line: str | None
    traceback_last_line: str | None
    last_byte_age_s: float | None
    from_start: bool | None
    format: str | None
    matched_lines: int
    hint: str | None
    #: How many processes' bars interleave in this log (0: one bar at a time); the step follows the first.
    streams: int


class Metric(TypedDict):
    """``metrics[name]``: its latest value (a NaN or inf one: value null, finite false)."""

    step: int | None
    value: float | None
    finite: bool
    #: NaN/inf values of this metric over the whole run, and the step of the first (0, None: none)
    nonfinite_count: int
    first_nonfinite_step: int | None


class Resume(TypedDict):
    """``events.resume``: the saved fold an attach started from, or why it was refused."""

    file: str
    from_offset: int | None
    from_line: int | None
    refused: str | None


class Events(TypedDict):
    """``events``: events.jsonl as this view read it."""

    file: str | None
    lines: int
    corrupt_lines: int
    unusable_steps: int
    dropped_events: FileValue
    resume: Resume | None


class Histogram(TypedDict):
    edges_s: list[float]
    counts: list[int]


class Snapshot(TypedDict):
    """The status snapshot: every key always present (:func:`.model.null_snapshot`), in this order."""

    #: run.json's name as read (else the run dir's name); null only before run.json is read
    run: FileValue
    run_dir: str | None
    attempt: FileValue
    state: RunState
    pid: int | None
    alive: bool
    returncode: FileValue
    signal: FileValue
    ended: Ended | None
    launched_at_unix: FileValue
    disk: Disk | None
    ranks: list[Rank]
    rank_restarts: RankRestarts | None
    straggler: Straggler
    versions: Versions
    step: Step
    step_seconds: StepSeconds
    step_line: str
    throughput: Throughput
    eta_s: float | None
    eta: Eta
    warmup: Warmup
    fallback: Fallback
    stall: Stall
    dynamo: Dynamo
    attn_implementation: AttnImplementation
    gpu: list[GpuDevice] | None
    gpu_error: FileValue
    gpu_source: str | None
    gpu_history: dict[str, DeviceHistory]
    alerts: list[Alert]
    identity: Identity | None
    log: Log
    #: per metric name
    metrics: dict[str, Metric]
    #: per metric name: ``[[first_step, last_step, min, max], ...]`` oldest first
    metrics_series: dict[str, list[list[float | int | None]]]
    #: whether the training loss went bad, judged on its own spread (issue 47)
    loss_health: LossHealthPart
    health: Health
    liveness: Liveness
    phase: Phase
    events: Events
    histogram: Histogram
    recent_dt: list[float]
    #: the watchdog's probe verdict, ``never_recorded``, or Slurm's words for a job
    process_verdict: str | None
    #: stop.json as read
    stop: dict[str, FileValue] | None
    #: the latest ``log`` event's values, as read
    last_logs: FileValue
    survivors: list[Survivor]
    supervisor_alive: bool | None
    #: the supervisor held stopped, gone with a warden left, or every watcher gone (monitors/snapshot/process.py)
    watch: Watch
    scheduler: Scheduler | None
    restart: RestartView | None
    ledger: Ledger | None
    scaling: Scaling
    padding: Padding
    energy: Energy
