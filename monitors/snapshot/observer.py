"""The status snapshot: one plain dict computed from a run directory's files alone.

``stepwatch status --json`` prints it, the TUI draws it, ``watch --plain`` narrates its changes.
A :class:`RunObserver` keeps incremental readers (events.jsonl from its start, train.log, gpu.jsonl)
so following a live run costs only the new bytes; :func:`snapshot` is the one-shot form, and
:meth:`RunObserver.view_update` the form a screen uses (the snapshot plus the new log lines: a view
reads each run file through its observer only). An attach starts events.jsonl from the supervisor's
saved fold when it checks out (``events.state.json``, :mod:`stepwatch.monitors.fold.savedstate`),
the same state a fold of every line gives. Views only read (but :meth:`RunObserver.acknowledge`:
acks.jsonl). Keys and types: :mod:`.types` (null value: :mod:`.model`); which steps speak and the
stall guards: :mod:`.stepsource`; alerts: :mod:`.alerts`; detectors: :mod:`stepwatch.monitors.detectors`.

Where numbers come from:
- process state: run.json's captured pid + create_time (``kill -0``, psutil), exit.json;
- step times: events.jsonl ``step`` records (``source: "events"``), else the supervisor's records of
  train.log's steps (logsteps.jsonl, any shape :mod:`~stepwatch.monitors.parsers.logtracker` reads);
- dynamo: events.jsonl ``dynamo`` records (``torch._dynamo.utils.counters`` and what the emitter saw)
  and train.log's dynamo records (``TORCH_LOGS=recompiles`` lines, the recompile-limit warning);
  ``source`` names which one each count came from;
- GPU: gpu.jsonl, written by the sampler beside the supervisor (never NVML here)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from collections.abc import Callable

from stepwatch.monitors.snapshot.disk import disk_status
from stepwatch.monitors.snapshot.stepsource import (ObservedStart, busy_budget_s, choose, global_step, guard_stall, stall_part,
                                                    step_source, step_started)
from stepwatch.monitors.snapshot.ranks import RankWatch
from stepwatch.monitors.fold.events import EventsFold
from stepwatch.monitors.fold.stepcolumns import step_no
from stepwatch.monitors.fold.savedstate import load as load_saved_state, refused
from stepwatch.monitors.parsers.dynamolog import DynamoLogScanner, RecompileLimit, Recompile
from stepwatch.monitors.parsers.logtracker import LogTracker, log_hint, own_run_record
from stepwatch.monitors.runsettings import RunSettings
from stepwatch.monitors.snapshot.metrics import arrival_check, metric_parts
from stepwatch.monitors.snapshot.eta import ETA_RECENT_STEPS, eta_part
from stepwatch.monitors.gpu.energy import RECENT_STEPS as ENERGY_STEPS
from stepwatch.monitors.snapshot.gpuview import GpuView
from stepwatch.monitors.detectors.frozen import frozen_verdict
from stepwatch.monitors.snapshot.health import TreeHealth
from stepwatch.monitors.parsers.traceback import last_text, traceback_last_line
from stepwatch.monitors.snapshot.phase import follow_stacks, learn_phase_lengths, phase_part
from stepwatch.monitors.readers.jsonl import EventReader
from stepwatch.monitors.readers.loglines import LogLines
from stepwatch.monitors.readers.textlog import DEFAULT_MAX_BYTES_PER_POLL, LogFollower
from stepwatch.monitors.rundirs import CachedSurvivors
from stepwatch.monitors.runfiles import (ALERTS_JSONL, EVENTS_JSONL, LOG_STEPS_JSONL, RUN_JSON,
                                         TRAIN_LOG, read_json, size_at_most)
from stepwatch.monitors.snapshot.acks import acknowledge, read_acked
from stepwatch.monitors.snapshot.alerts import alerts_for, channel_names, merge_alerts, read_alert_records
from stepwatch.monitors.snapshot.dynamo import dynamo_status
from stepwatch.monitors.snapshot.model import json_safe, null_snapshot, obj, run_ended, shallow
from stepwatch.monitors.snapshot.process import process_part
from stepwatch.monitors.snapshot.ledger import ledger_part
from stepwatch.monitors.snapshot.restart import restart_part
from stepwatch.monitors.snapshot.types import (AttnImplementation, Energy, Fallback, Padding, Resume, Scaling, Snapshot,
                                               StepSeconds, Survivor, Throughput, Versions, Warmup)
from stepwatch.monitors.states import FINISHING, NOT_JUDGED, RUNNING, STEADY
from stepwatch.monitors.stats.stepstats import StepStats

__all__ = ["RunObserver", "ViewUpdate", "json_safe", "run_ended", "snapshot", "process_snapshot"]

#: train.log up to this size is read from its first byte (dynamo counts and log-derived steps see
#: the whole attempt); a bigger one only from its tail, and the snapshot says so (``log.from_start``).
LOG_FULL_READ_MAX_BYTES = 64 * 1024 * 1024
#: One refresh polls train.log until it has read to the end as it is now (one poll reads at most
#: DEFAULT_MAX_BYTES_PER_POLL): a one-shot status of a finished run must see the log's last lines
#: (the traceback) and every dynamo record. Bounded, so a writer faster than the reader cannot pin it.
LOG_POLLS_PER_REFRESH = LOG_FULL_READ_MAX_BYTES // DEFAULT_MAX_BYTES_PER_POLL + 2
RECENT_STEPS = 60
HIST_BINS = 24
#: New complete log lines one view update carries at most (the log panel keeps 1,000): an attach to
#: a long log brings its last lines and says the panel starts over (``log_reset``).
VIEW_LOG_LINES = 1000

@dataclass
class ViewUpdate:
    """What one refresh brings a screen (:meth:`RunObserver.view_update`)."""

    snapshot: Snapshot
    #: complete log lines since the last update, oldest first (the text after a line's last ``\r``)
    log_lines: list[str] = field(default_factory=list)
    #: the current unfinished line (a progress bar), or None
    log_partial: str | None = None
    #: the log panel starts over (a new attempt, or more new lines than one update carries)
    log_reset: bool = False
    #: run.json names another attempt than the previous update did
    attempt_changed: bool = False


class _Attempt:
    """Everything accumulated from one attempt's files (reset when run.json's attempt changes)."""

    def __init__(self, run_dir: Path, trust_uid: int | None = None):
        self.events = EventReader(run_dir / EVENTS_JSONL)
        log_path = run_dir / TRAIN_LOG
        self.log_from_start = size_at_most(log_path, LOG_FULL_READ_MAX_BYTES)  # missing: read from byte 0
        self.log = LogFollower(log_path, keep_lines=200, from_start=self.log_from_start)
        self.ranks = RankWatch(run_dir, trust_uid)  # procs.json's ranked processes, torchrun's failure table
        self.gpu = GpuView(run_dir)  # gpu.jsonl: the verdicts' window and the panel's history
        self.logsteps = EventReader(run_dir / LOG_STEPS_JSONL)  # the supervisor's log-timed steps
        self.log_ev = EventsFold()  # ... folded like events.jsonl
        # the supervisor's alerts and deliveries; for the owner's watchers (``trust_uid``) only under the trust rule:
        # a line a member wrote into it must not make an alert "recorded", which silences its page
        self.alerts_file = EventReader(run_dir / ALERTS_JSONL, trust_uid=trust_uid)
        self.recorded_alerts: dict[str, dict[str, Any]] = {}
        self.deliveries: dict[str, dict[str, Any]] = {}
        self.shown_alerts: dict[str, dict[str, Any]] = {}  # every alert this view showed: they stay
        self.new_lines: deque[str] = deque(maxlen=VIEW_LOG_LINES)  # complete lines since the last view update
        self.new_lines_dropped = False  # more arrived than new_lines holds
        self.ev = EventsFold()  # what events.jsonl says (from a saved state, see refresh())
        self.ev_resume: dict[str, Any] | None = None  # the snapshot's events.resume
        own = RunSettings.of_run(own_run_record(run_dir))  # the run config's tables, from one read
        self.progress = LogTracker(list(own.patterns), own.log)
        self.stall = own.stall  # [stall]: the floors of the budgets
        self.progress.phases.floor_s = self.stall.phase_floor_s
        self.log_stats = StepStats()
        self.dynlog = DynamoLogScanner()
        self.dynlog_flushed = False
        self.limit_hits: list[tuple[RecompileLimit, int | None, float]] = []  # (event, global_step, seen at)
        self.log_recompile_steps: deque[int] = deque(maxlen=1000)  # global_step of each recompile the log shows
        self.last_advance_at: float | None = None  # arrival of the log's last step advance (unix s)
        self.first_alert_t: dict[str, float] = {}
        self.stall_at: float | None = None
        self.observed_start = ObservedStart()  # the step in progress as this observer saw it begin (monotonic)
        self.fallback_onset_t: float | None = None
        self.speaking: EventsFold | None = None  # the fold whose steps speak (.stepsource rule 1): the ledger's

    def close(self) -> None:
        """Close the files this attempt's readers hold open."""
        for reader in (self.events, self.gpu, self.log, self.logsteps, self.alerts_file, self.ranks):
            try:
                reader.close()
            except Exception:
                pass


class RunObserver:
    """Follows one run directory and produces status snapshots.

    ``refresh()`` reads whatever is new in the run's files and returns a fresh snapshot dict.
    Raises nothing for missing or half-written files; a run dir without run.json gives state
    ``unknown``. Not thread-safe: one observer per thread.

    ``use_saved_state``: start an attempt from the supervisor's saved fold of events.jsonl
    (``events.state.json``, :mod:`stepwatch.monitors.fold.savedstate`) when it checks out, reading only the lines
    after it; False folds every line (the bench's cold attach, tests that compare the two).
    """

    def __init__(self, run_dir: Path, *, use_saved_state: bool = True, monotonic: Callable[[], float] = time.monotonic,
                 trust_uid: int | None = None, own_run: dict[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        #: The run owner's own watchers (the supervisor's detector loop, its warden, the job watcher): run.json,
        #: exit.json and stop.json count only when ``trust_uid`` wrote them, and ``own_run`` (the record the
        #: launcher handed over) stands for a run.json someone else put in its place (ARCHITECTURE.md R17).
        self.trust_uid, self.own_run = trust_uid, own_run
        self.use_saved_state = use_saved_state
        self.monotonic = monotonic  # how long it watched a step: immune to the run's clock and to clock steps
        self.survivors = CachedSurvivors(self.run_dir)  # what outlives the ended run (by recorded identity)
        self.log_lines = LogLines(self.run_dir / TRAIN_LOG)  # the whole log, for search (read on demand)
        self.health = TreeHealth(self.run_dir, trust_uid=trust_uid)  # CPU and memory of the recorded tree, the host's load
        self._attempt_no: Any = object()
        self.a: _Attempt | None = None
        #: alert ids acknowledged in this view that acks.jsonl could not take (a run dir the viewer
        #: may only read); replaced whole, never changed in place (the UI thread sets it)
        self.session_acked: frozenset[str] = frozenset()
        self._attempt_changed = False

    def _new_attempt(self, key: tuple[Any, Any], resume: bool) -> _Attempt:
        """A fresh _Attempt; with ``resume``, its events fold from the saved state when it checks out."""
        a = _Attempt(self.run_dir, self.trust_uid)
        if resume and self.use_saved_state:
            fold, a.ev_resume = load_saved_state(self.run_dir, key, a.events)
            if fold is not None:
                a.ev = fold
        return a

    def _read_events(self, a: _Attempt, key: tuple[Any, Any]) -> _Attempt:
        """Fold what events.jsonl gained into ``a`` (see :meth:`EventsFold.fold`); returns the
        attempt to use from now on (a new one when the file was replaced)."""
        a.ev.fold(a.events)
        if a.events.restarted:
            # events.jsonl was replaced or truncated under the same attempt (a run dir made again
            # with the same name and launch time, a hand edit): what was built from the old file
            # is not this file's story; start the attempt over from byte 0 of the new one
            resumed = a.ev_resume is not None
            a.close()
            a = self._new_attempt(key, resume=False)
            if resumed:
                a.ev_resume = refused(f"{EVENTS_JSONL} was replaced or truncated after the saved state was checked")
            a.ev.fold(a.events)
        a.log_ev.fold(a.logsteps)
        if a.logsteps.restarted:  # logsteps.jsonl replaced under the same attempt: fold the new one
            a.log_ev = EventsFold()
            a.log_ev.fold(a.logsteps)
        learn_phase_lengths(a.progress.phases, a.log_ev.phase_longest_s, a.ev.phase_longest_s)
        return a

    def _read_log(self, a: _Attempt) -> None:
        for _ in range(LOG_POLLS_PER_REFRESH):
            for seg in a.log.poll():
                if seg.end == "\n":
                    if len(a.new_lines) == VIEW_LOG_LINES:
                        a.new_lines_dropped = True
                    a.new_lines.append(seg.text)
                    a.ranks.feed(seg.text)
                self._progress(a, seg)
                self._dynamo_events(a, a.dynlog.feed(seg.text))
            if not a.log.behind:
                break
        if a.log.partial_segment:  # the newest bar is unterminated: the step it shows is the run's step
            self._progress(a, a.log.partial_segment)

    @staticmethod
    def _progress(a: _Attempt, seg: Any) -> None:
        for adv in a.progress.feed(seg):
            a.last_advance_at = adv.at_s
            if adv.dt_s is not None and adv.dt_s >= 0:
                a.log_stats.add(adv.step, adv.dt_s, ())

    def _dynamo_events(self, a: _Attempt, events: list) -> None:
        # the step the log itself had reached where the record lies: the same in every view, whenever it reads the
        # record (the emitter's step is as far as events.jsonl got when this view read it: a cold status says the last)
        step = a.progress.global_step if a.progress.global_step is not None else self._global_step(a)
        for e in events:
            if isinstance(e, RecompileLimit):
                a.limit_hits.append((e, step, time.time()))
            elif isinstance(e, Recompile) and step is not None:
                a.log_recompile_steps.append(step)

    @staticmethod
    def _global_step(a: _Attempt) -> int | None:
        return global_step(a.ev, a.progress)

    # --- the snapshot ----------------------------------------------------------------------------
    def refresh(self, now: float | None = None) -> Snapshot:
        """Read what is new and return the snapshot (a new dict each call)."""
        try:
            return self._refresh(now)
        except Exception as e:
            a = self.a
            if a is None or a.ev_resume is None or a.ev_resume.get("from_offset") is None:
                raise  # a bug of ours, not a saved state: let it show
            # A saved state that checked out (source, attempt, bytes, every type) and still fails:
            # made by hand. Drop it and fold every line, as without it.
            a.close()
            self.a = _Attempt(self.run_dir, self.trust_uid)
            self.a.ev_resume = refused(f"the saved state failed in use: {type(e).__name__}: {e}")
            return self._refresh(now)

    def _refresh(self, now: float | None) -> Snapshot:
        now = time.time() if now is None else now
        snap = null_snapshot()
        snap["run_dir"] = str(self.run_dir)
        snap["run"] = self.run_dir.name
        run = read_json(self.run_dir / RUN_JSON, self.trust_uid, private=self.trust_uid is not None) or self.own_run
        if run is None:
            return snap
        # an attempt is its number and its launch time: a run dir removed and launched again under
        # the same name is attempt 1 again, but not the same attempt
        key = (run.get("attempt"), run.get("launched_at_unix"))
        if key != self._attempt_no or self.a is None:
            self._attempt_no = key
            if self.a is not None:
                self.a.close()
                self._attempt_changed = True
            self.a = self._new_attempt(key, resume=True)
        process_part(self.run_dir, snap, run, self.trust_uid)
        self.a = a = self._read_events(self.a, key)
        self._read_log(a)
        a.gpu.read()
        read_alert_records(a.alerts_file, a.recorded_alerts, a.deliveries)
        if run_ended(snap) and not a.dynlog_flushed and not a.log.behind:
            self._dynamo_events(a, a.dynlog.flush())
            a.dynlog_flushed = True
        snap["health"] = self.health.part(snap["state"] == RUNNING)  # before the steps: the stall reads its CPU
        self._steps_part(snap, a, now)
        self._dynamo_part(snap, a)
        a.gpu.part(snap)
        self._log_part(snap, a, now)
        ended = snap["ended"] or {}
        snap["disk"] = disk_status(self.run_dir, ended.get("write_errors"), ended.get("log_lost_bytes"),
                                   ended.get("log_lost_reason"))
        running = snap["state"] == RUNNING
        snap["liveness"] = {"frozen": frozen_verdict(self.health.stopped, self.health.examined, running),
                            "signals_s": {"cpu": self.health.cpu_idle_s if running else None,
                                          "output": snap["log"].get("last_byte_age_s") if running else None,
                                          "step": snap["stall"].get("current_step_elapsed_s") if running else None}}
        snap["phase"] = phase_part(a.ev.open_phase, a.progress.phases, run_ended(snap), now)
        snap["restart"] = restart_part(self.run_dir)
        snap["ledger"] = ledger_part(self.run_dir, run, snap, a.speaking, snap["step_seconds"]["p50"], now)
        snap["ranks"], snap["straggler"], snap["rank_restarts"] = a.ranks.part()
        guard_stall(snap)
        if run_ended(snap):
            snap["survivors"] = cast("list[Survivor]", self.survivors.get(now))
        computed = alerts_for(snap, first_seen=a.first_alert_t, limit_hits=a.limit_hits,
                              recompile_sources=(a.ev.recompile_steps, a.log_recompile_steps),
                              fallback_onset_t=a.fallback_onset_t, stall_at=a.stall_at)
        snap["alerts"] = merge_alerts(computed, a.recorded_alerts, a.shown_alerts, a.deliveries,
                                      channel_names((run.get("config") or {}).get("alerts")))
        acked = read_acked(self.run_dir) | self.session_acked
        for al in snap["alerts"]:
            al["acknowledged"] = al["id"] in acked
        return snap

    def view_update(self, now: float | None = None) -> ViewUpdate:
        """A refresh for a screen: the snapshot, plus the log lines completed since the last
        update (at most VIEW_LOG_LINES), the unfinished line, and whether the panel starts over
        (a new attempt, or more lines than one update carries). The screen reads no file itself."""
        snap = self.refresh(now)
        a = self.a
        if a is None:
            return ViewUpdate(snap, [], None, False, False)
        changed, self._attempt_changed = self._attempt_changed, False
        lines = list(a.new_lines)
        reset = changed or a.new_lines_dropped
        a.new_lines.clear()
        a.new_lines_dropped = False
        return ViewUpdate(snap, lines, a.log.current_partial, reset, changed)

    def acknowledge(self, alert_ids: list[str]) -> str | None:
        """Acknowledge alerts: appended to acks.jsonl (the one file a view writes); when the run
        dir is not writable, for this view only. Returns None, or why it holds for this view only.
        The next snapshot marks them ``acknowledged`` either way."""
        try:
            acknowledge(self.run_dir, alert_ids)
            return None
        except OSError as e:
            self.session_acked = self.session_acked | frozenset(alert_ids)
            return f"could not write acks.jsonl ({e}); acknowledged for this session only"

    def _steps_part(self, snap: Snapshot, a: _Attempt, now: float) -> None:
        rs = a.ev.run_start or {}
        if rs:
            snap["versions"] = cast(Versions, {k: shallow(obj(rs.get("versions")).get(k))
                                               for k in ("python", "torch", "transformers")})
            snap["attn_implementation"] = cast(AttnImplementation, {k: shallow(obj(rs.get("attn_implementation")).get(k))
                                                                    for k in ("requested", "resolved")})
        # Which steps speak (the rule: .stepsource): the emitter's (exact), else the supervisor's
        # log-timed records, else this view's own parse of train.log
        src = choose(a.ev, a.log_ev, a.log_stats, snap["supervisor_alive"], snap["ended"])
        fold, stats, timing = src.fold, src.stats, src.timing
        a.speaking = fold
        gs = self._global_step(a)
        max_steps = step_no(rs.get("max_steps")) or a.progress.total
        snap["step"] = {"global_step": gs, "max_steps": max_steps, "source": step_source(src.use_events, gs),
                        "timing": timing,
                        "arrival": arrival_check(stats, a.log_ev.arrival_stats) if timing == "reported" else None}
        summ = stats.summary()
        snap["step_seconds"] = cast(StepSeconds, {k: summ.get(k)
                                                  for k in ("n", "min", "p50", "p90", "p99", "max", "last")})
        snap["step_line"] = stats.canonical_line()
        tp = stats.throughput()
        snap["throughput"] = cast(Throughput, {k: tp.get(k)
                                               for k in ("tokens_per_s", "real_tokens_per_s", "padding_share")})
        snap["scaling"], snap["padding"] = cast(Scaling, a.ev.scaling.scaling()), cast(Padding, a.ev.scaling.padding())
        snap["energy"] = cast(Energy, a.gpu.energy.part(stats.recent(ENERGY_STEPS)))
        hist = stats.histogram(bins=HIST_BINS)
        snap["histogram"] = {"edges_s": [h[0] for h in hist] + ([hist[-1][1]] if hist else []),
                             "counts": [h[2] for h in hist]}
        snap["recent_dt"] = [r.dt_s for r in stats.recent(RECENT_STEPS) if r.counted]  # as the summary counts
        a.fallback_onset_t = None
        if fold is not None:
            snap["warmup"] = cast(Warmup, fold.detector.warmup())  # the detectors' dicts: these types
            snap["fallback"] = fb = cast(Fallback, fold.detector.snapshot())
            a.fallback_onset_t = fold.flagged_onset_end
            if snap["warmup"].get("state") != STEADY:
                fb["state"] = NOT_JUDGED
                fb["reason"] = ("no counted step yet" if snap["warmup"].get("state") is None
                                else f"warming up (not judged until the step times settle): {(fb.get('reason') or '').removeprefix('warming up: ')}".rstrip(": "))
        elif timing == "approximate":
            snap["fallback"]["reason"] = ("step times are this view's own reading of train.log (no record from the "
                                          "supervisor): approximate, not judged")
        if snap["state"] == RUNNING:  # the step's start, and as this observer saw it begin (monotonic)
            started, mono = step_started(src, a.last_advance_at), self.monotonic()
            ph = a.progress.phases
            follow_stacks(ph, gs, started)  # what the stacks said of a step past its budget (saw_in_stacks)
            log_phase = (ph.name, ph.budget_s()) if ph.budget_s() is not None else None  # an evaluation, a save
            h = snap["health"]  # the CPU over this observer's last look: a silent step that computes is busy
            busy = ((h["cpu_cores"], busy_budget_s(max(ph.longest_s.values(), default=0.0), a.stall.busy_floor_s))
                    if h["cpu_cores"] is not None and str(h["cpu_cores_basis"] or "").startswith("last") else None)
            snap["stall"], a.stall_at = stall_part(src, started, now, a.ev.open_phase, a.progress.finished,
                                                   a.log.last_byte_age_s, a.observed_start.observe(started, mono),
                                                   log_phase, busy, a.stall.step_floor_s, ph.name == FINISHING,
                                                   a.stall.step_floor_source())
        else:
            snap["stall"].update(reason="the run is not running", floor_s=a.stall.step_floor_s,
                                 floor_source=a.stall.step_floor_source())
        snap["eta"] = eta = eta_part([r.dt_s for r in stats.recent(4 * ETA_RECENT_STEPS) if r.counted], max_steps, gs,
                                     snap["stall"], snap["state"] == RUNNING, now)
        snap["eta_s"] = eta["eta_s"]
        snap["last_logs"] = shallow(a.ev.last_logs or a.progress.last_log)

    def saw_in_stacks(self, phase: str, global_step: Any) -> None:
        """The stacks the supervisor took of a step past its step budget show ``phase`` (saving, evaluating: however
        the time is spent, a silent save on a slow file system with the CPU idle included): from the next refresh
        until the run steps past ``global_step``, the step is judged against that phase's budget, as if the log had
        said it (monitors/watch/stacks.py). Called from the stack thread: one assignment."""
        if self.a is not None:
            self.a.progress.phases.stacks_saw = (phase, global_step)

    def _dynamo_part(self, snap: Snapshot, a: _Attempt) -> None:
        snap["dynamo"] = dynamo_status(a.ev.dynamo_ev, a.ev.run_end, a.dynlog.counts(), snap["dynamo"])

    def _log_part(self, snap: Snapshot, a: _Attempt, now: float) -> None:
        lines = list(a.log.last_lines)
        last = last_text(lines, a.log.current_partial)
        snap["log"] = {"file": TRAIN_LOG, "last_line": last, "traceback_last_line": traceback_last_line(lines),
                       "last_byte_age_s": a.log.last_byte_age_s, "from_start": a.log_from_start,
                       "format": a.progress.format, "matched_lines": a.progress.matched_lines,
                       "hint": log_hint(a.progress, a.ev.stats.seen > 0),
                       "streams": a.progress.streams.interleaved if a.progress.streams is not None else 0}
        metric_parts(snap, a.progress, a.ev, self.run_dir)  # metrics, metrics_series, loss_health
        snap["events"] = {"file": EVENTS_JSONL if a.events.exists else None, "lines": a.events.lines_read,
                          "corrupt_lines": a.events.corrupt_lines, "unusable_steps": a.ev.unusable_steps,
                          "dropped_events": shallow((a.ev.run_end or {}).get("dropped_events")),
                          "resume": cast("Resume | None", a.ev_resume)}


def snapshot(run_dir: Path, now: float | None = None) -> Snapshot:
    """One-shot status of ``run_dir`` from its files (see :class:`RunObserver`)."""
    return RunObserver(run_dir).refresh(now)


def process_snapshot(run_dir: Path) -> Snapshot:
    """The watchdog's part of the snapshot only (run, attempt, state, pid, alive, returncode, signal,
    ended, ...) from run.json and exit.json and a probe of the captured pid; every other key as in
    a run with no files. Reads no events or log: a listing of many long runs stays instant."""
    snap = null_snapshot()
    run_dir = Path(run_dir)
    snap["run_dir"], snap["run"] = str(run_dir), run_dir.name
    run = read_json(run_dir / RUN_JSON)
    if run is not None:
        process_part(run_dir, snap, run)
    return snap

