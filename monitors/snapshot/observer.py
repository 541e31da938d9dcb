"""The status snapshot: one plain dict computed from a run directory's files alone.

``stepwatch status --json`` prints it, the TUI draws it, ``watch --plain`` narrates its changes.
A :class:`RunObserver` keeps incremental readers (events.jsonl from its start, train.log, gpu.jsonl)
so following a live run costs only the new bytes; :func:`snapshot` is the one-shot form. An attach
starts events.jsonl from the supervisor's saved fold when it checks out (``events.state.json``,
:mod:`stepwatch.monitors.fold.savedstate`), the same state a fold of every line gives. Views only read: nothing
here writes into the run dir. Every key is always present (null when unknown).

Where numbers come from:
- process state: run.json's captured pid + create_time (``kill -0``, psutil), exit.json;
- step times: events.jsonl ``step`` records (``source: "events"``), else HF/tqdm progress updates in
  train.log (``source: "log"``, approximate: arrival times of counter advances);
- dynamo: events.jsonl ``dynamo`` records (``torch._dynamo.utils.counters`` and what the emitter saw)
  and train.log's dynamo records (``TORCH_LOGS=recompiles`` lines, the recompile-limit warning);
  ``source`` names which one each count came from;
- GPU: gpu.jsonl, written by the sampler that runs beside the supervisor (never NVML here).
"""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path
from typing import Any

from stepwatch.monitors.detectors.fallback import stall_state
from stepwatch.monitors.fold.events import EventsFold, step_no, unix_time
from stepwatch.monitors.fold.savedstate import load as load_saved_state, refused
from stepwatch.monitors.parsers.dynamolog import DynamoLogScanner, RecompileLimit, Recompile
from stepwatch.monitors.readers.jsonl import EventReader
from stepwatch.monitors.gpu.reading import WINDOW_S as GPU_WINDOW_S
from stepwatch.monitors.gpu.reading import gpu_source, gpu_status_from_records
from stepwatch.monitors.readers.textlog import DEFAULT_MAX_BYTES_PER_POLL, LogFollower
from stepwatch.monitors.parsers.hf_progress import ProgressTracker, rank_prefix
from stepwatch.monitors.snapshot.acks import read_acked
from stepwatch.monitors.rundirs import run_survivors
from stepwatch.monitors.runfiles import EVENTS_JSONL, EXIT_JSON, GPU_JSONL, RUN_JSON, STOP_JSON, TRAIN_LOG, read_json, utc_iso
from stepwatch.monitors.stats.stepstats import StepStats
from stepwatch.monitors.watchdog import ProcessRef, probe

#: train.log up to this size is read from its first byte (dynamo counts and log-derived steps see
#: the whole attempt); a bigger one only from its tail, and the snapshot says so (``log.from_start``).
LOG_FULL_READ_MAX_BYTES = 64 * 1024 * 1024
#: One refresh polls train.log until it has read to the end as it is now (one poll reads at most
#: DEFAULT_MAX_BYTES_PER_POLL): a one-shot status of a finished run must see the log's last lines
#: (the traceback) and every dynamo record. Bounded, so a writer faster than the reader cannot pin it.
LOG_POLLS_PER_REFRESH = LOG_FULL_READ_MAX_BYTES // DEFAULT_MAX_BYTES_PER_POLL + 2
RECENT_STEPS = 60
#: A run.json whose supervisor recorded nothing this long after launch: the supervisor died first.
SUPERVISOR_SILENT_S = 60.0
HIST_BINS = 24
#: A recompile storm: at least this many recompiles within STORM_WINDOW_STEPS optimizer steps after
#: warm-up (dynamic padding gives a new shape per batch).
STORM_MIN_RECOMPILES = 5
STORM_WINDOW_STEPS = 100
GPU_HISTORY_POINTS = 3600  # the last hour at 1 Hz

SNAPSHOT_KEYS = (
    "run", "run_dir", "attempt", "state", "pid", "alive", "returncode", "signal", "ended", "launched_at_unix",
    "versions", "step", "step_seconds", "step_line", "throughput", "eta_s", "warmup", "fallback", "stall",
    "dynamo", "attn_implementation", "gpu", "gpu_error", "gpu_source", "gpu_history", "alerts", "identity",
    "log", "events", "histogram", "recent_dt", "process_verdict", "stop", "last_logs", "survivors", "supervisor_alive",
)


def _null_snapshot() -> dict[str, Any]:
    return {
        "run": None, "run_dir": None, "attempt": None, "state": "unknown", "pid": None, "alive": False,
        "returncode": None, "signal": None, "ended": None, "launched_at_unix": None,
        "versions": {"python": None, "torch": None, "transformers": None},
        "step": {"global_step": None, "max_steps": None, "source": None},
        "step_seconds": {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None, "last": None},
        "step_line": "n=0 seconds_per_optimizer_step",
        "throughput": {"tokens_per_s": None, "real_tokens_per_s": None, "padding_share": None},
        "eta_s": None,
        "warmup": {"state": None, "until_step": None},
        "fallback": {"state": "ok", "slow_steps": [], "onset_step": None, "reason": None},
        "stall": {"state": "ok", "current_step_elapsed_s": None},
        "dynamo": {"recompiles": None, "graph_breaks": None, "unique_graphs": None, "recompile_limit_hits": None,
                   "source": None, "by_source": {"events": None, "log": None}, "top_recompile_reason": None},
        "attn_implementation": {"requested": None, "resolved": None},
        "gpu": None, "gpu_error": None, "gpu_source": None, "gpu_history": {},
        "alerts": [],
        "identity": None,
        "log": {"file": None, "last_line": None, "traceback_last_line": None, "last_byte_age_s": None,
                "from_start": None},
        "events": {"file": None, "lines": 0, "corrupt_lines": 0, "unusable_steps": 0, "dropped_events": None,
                   "resume": None},
        "histogram": {"edges_s": [], "counts": []},
        "recent_dt": [],
        "process_verdict": None, "stop": None, "last_logs": None, "survivors": [], "supervisor_alive": None,
    }


def traceback_last_line(lines: list[str]) -> str | None:
    """The exception line of the last Python traceback in ``lines`` (``RuntimeError: boom``), or None.

    It is the first unindented line after the last ``Traceback (most recent call last):``; tqdm
    often redraws its bar after the traceback, so the log's last line is not it. Rank prefixes
    (``[rank3]:``) are looked through.
    """
    bodies = []
    for ln in lines:
        rank, body = rank_prefix(ln)
        bodies.append(body[1:] if rank is not None and body.startswith(" ") else body)
    start = None
    for i in range(len(bodies) - 1, -1, -1):
        if "Traceback (most recent call last)" in bodies[i]:  # may be glued onto a tqdm segment
            start = i
            break
    if start is None:
        return None
    for ln, body in zip(lines[start + 1:], bodies[start + 1:]):
        if body.strip() and not body[0].isspace():
            return ln.strip()
    return None


class _Attempt:
    """Everything accumulated from one attempt's files (reset when run.json's attempt changes)."""

    def __init__(self, run_dir: Path):
        self.events = EventReader(run_dir / EVENTS_JSONL)
        log_path = run_dir / TRAIN_LOG
        try:
            from_start = log_path.stat().st_size <= LOG_FULL_READ_MAX_BYTES
        except OSError:
            from_start = True  # not there yet: it will start at byte 0
        self.log_from_start = from_start
        self.log = LogFollower(log_path, keep_lines=200, from_start=from_start)
        self.gpu = EventReader(run_dir / GPU_JSONL)
        self.gpu_window: deque[dict[str, Any]] = deque()
        self.gpu_history: dict[str, dict[str, deque]] = {}
        self.ev = EventsFold()  # what events.jsonl says (from a saved state, see refresh())
        self.ev_resume: dict[str, Any] | None = None  # the snapshot's events.resume
        self.progress = ProgressTracker()
        self.log_stats = StepStats()
        self.dynlog = DynamoLogScanner()
        self.dynlog_flushed = False
        self.limit_hits: list[tuple[RecompileLimit, int | None, float]] = []  # (event, global_step, seen at)
        self.log_recompile_steps: deque[int] = deque(maxlen=1000)  # global_step of each recompile the log shows
        self.last_advance_at: float | None = None  # arrival of the log's last step advance (unix s)
        self.first_alert_t: dict[str, float] = {}
        self.stall_at: float | None = None

    def close(self) -> None:
        """Close the files this attempt's readers hold open."""
        for reader in (self.events, self.gpu, self.log):
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

    def __init__(self, run_dir: Path, *, use_saved_state: bool = True):
        self.run_dir = Path(run_dir)
        self.use_saved_state = use_saved_state
        self._attempt_no: Any = object()
        self.a: _Attempt | None = None

    def _new_attempt(self, key: tuple[Any, Any], resume: bool) -> _Attempt:
        """A fresh _Attempt; with ``resume``, its events fold from the saved state when it checks out."""
        a = _Attempt(self.run_dir)
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
        return a

    def _read_log(self, a: _Attempt) -> None:
        for _ in range(LOG_POLLS_PER_REFRESH):
            for seg in a.log.poll():
                for adv in a.progress.feed(seg):
                    a.last_advance_at = adv.at_s
                    if adv.dt_s is not None and adv.dt_s >= 0:
                        a.log_stats.add(adv.step, adv.dt_s, ())
                self._dynamo_events(a, a.dynlog.feed(seg.text))
            if not a.log.behind:
                break

    def _dynamo_events(self, a: _Attempt, events: list) -> None:
        step = self._global_step(a)
        for e in events:
            if isinstance(e, RecompileLimit):
                a.limit_hits.append((e, step, time.time()))
            elif isinstance(e, Recompile) and step is not None:
                a.log_recompile_steps.append(step)

    def _read_gpu(self, a: _Attempt) -> None:
        new = a.gpu.read_new()
        if not new:
            return
        for rec in new:
            if not isinstance(rec, dict):
                continue
            a.gpu_window.append(rec)
            for d in rec.get("devices") or []:
                if not isinstance(d, dict):
                    continue
                h = a.gpu_history.setdefault(str(d.get("index")), {
                    "t": deque(maxlen=GPU_HISTORY_POINTS), "util_pct": deque(maxlen=GPU_HISTORY_POINTS),
                    "power_share": deque(maxlen=GPU_HISTORY_POINTS)})
                h["t"].append(rec.get("t"))
                h["util_pct"].append(d.get("util_pct"))
                pw, lim = d.get("power_w"), d.get("power_limit_w")
                h["power_share"].append(pw / lim if isinstance(pw, (int, float)) and lim else None)
        t_last = a.gpu_window[-1].get("t") if a.gpu_window else None
        while a.gpu_window and isinstance(t_last, (int, float)) and isinstance(a.gpu_window[0].get("t"), (int, float)) \
                and t_last - a.gpu_window[0]["t"] > GPU_WINDOW_S + 5:
            a.gpu_window.popleft()

    @staticmethod
    def _global_step(a: _Attempt) -> int | None:
        step = step_no(a.ev.last_step.get("step")) if a.ev.last_step is not None else None
        return step if step is not None else a.progress.global_step

    # --- the snapshot ----------------------------------------------------------------------------
    def refresh(self, now: float | None = None) -> dict[str, Any]:
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
            self.a = _Attempt(self.run_dir)
            self.a.ev_resume = refused(f"the saved state failed in use: {type(e).__name__}: {e}")
            return self._refresh(now)

    def _refresh(self, now: float | None) -> dict[str, Any]:
        now = time.time() if now is None else now
        snap = _null_snapshot()
        snap["run_dir"] = str(self.run_dir)
        snap["run"] = self.run_dir.name
        run = read_json(self.run_dir / RUN_JSON)
        if run is None:
            return snap
        # an attempt is its number and its launch time: a run dir removed and launched again under
        # the same name is attempt 1 again, but not the same attempt
        key = (run.get("attempt"), run.get("launched_at_unix"))
        if key != self._attempt_no or self.a is None:
            self._attempt_no = key
            if self.a is not None:
                self.a.close()
            self.a = self._new_attempt(key, resume=True)
        self._process_part(snap, run)
        self.a = a = self._read_events(self.a, key)
        self._read_log(a)
        self._read_gpu(a)
        if run_ended(snap) and not a.dynlog_flushed and not a.log.behind:
            self._dynamo_events(a, a.dynlog.flush())
            a.dynlog_flushed = True
        self._steps_part(snap, a, now)
        self._dynamo_part(snap, a)
        self._gpu_part(snap, a)
        self._log_part(snap, a, now)
        if run_ended(snap):
            snap["survivors"] = self._survivors(now)
        snap["alerts"] = self._alerts(snap, a, run)
        acked = read_acked(self.run_dir)
        for al in snap["alerts"]:
            al["acknowledged"] = al["id"] in acked
        return snap

    def _process_part(self, snap: dict[str, Any], run: dict[str, Any]) -> None:
        snap["run"] = run.get("name") or self.run_dir.name
        snap["attempt"] = run.get("attempt")
        snap["identity"] = run.get("identity")
        snap["launched_at_unix"] = run.get("launched_at_unix")
        proc = ProcessRef.from_json(run.get("process"))
        snap["pid"] = proc.pid if proc else None
        verdict = probe(proc) if proc else None
        snap["process_verdict"] = verdict
        snap["alive"] = verdict == "alive"
        ex = read_json(self.run_dir / EXIT_JSON)
        if ex is not None:
            snap["returncode"] = ex.get("returncode")
            snap["signal"] = ex.get("signal")
            snap["ended"] = {k: ex.get(k) for k in ("ended_at", "ended_at_unix", "duration_s", "stop_requested", "error")}
        sup_ref = ProcessRef.from_json(run.get("supervisor"))
        snap["supervisor_alive"] = sup_ref is not None and probe(sup_ref) == "alive"
        if snap["alive"]:
            snap["state"] = "running"
        elif ex is not None:
            snap["state"] = "exited"
        elif proc is None and not run.get("start_error"):
            sup = ProcessRef.from_json(run.get("supervisor"))
            launched = run.get("launched_at_unix")
            silent = isinstance(launched, (int, float)) and time.time() - launched > SUPERVISOR_SILENT_S
            if (sup is not None and probe(sup) != "alive") or (sup is None and silent):
                # the supervisor died before it recorded the child: nothing will ever say more
                snap["process_verdict"] = "never_recorded"
        snap["stop"] = read_json(self.run_dir / STOP_JSON)

    def _steps_part(self, snap: dict[str, Any], a: _Attempt, now: float) -> None:
        rs = a.ev.run_start or {}
        if rs:
            snap["versions"] = {k: _shallow(_obj(rs.get("versions")).get(k)) for k in ("python", "torch", "transformers")}
            snap["attn_implementation"] = {k: _shallow(_obj(rs.get("attn_implementation")).get(k))
                                           for k in ("requested", "resolved")}
        use_events = a.ev.stats.seen > 0
        stats = a.ev.stats if use_events or a.log_stats.seen == 0 else a.log_stats
        gs = self._global_step(a)
        max_steps = step_no(rs.get("max_steps")) or a.progress.total
        snap["step"] = {"global_step": gs, "max_steps": max_steps,
                        "source": "events" if use_events else ("log" if gs is not None else None)}
        summ = stats.summary()
        snap["step_seconds"] = {k: summ.get(k) for k in ("n", "min", "p50", "p90", "p99", "max", "last")}
        snap["step_line"] = stats.canonical_line()
        tp = stats.throughput()
        snap["throughput"] = {k: tp.get(k) for k in ("tokens_per_s", "real_tokens_per_s", "padding_share")}
        snap["eta_s"] = stats.eta_s(max_steps, gs) if snap["state"] == "running" else None
        hist = stats.histogram(bins=HIST_BINS)
        snap["histogram"] = {"edges_s": [h[0] for h in hist] + ([hist[-1][1]] if hist else []),
                             "counts": [h[2] for h in hist]}
        snap["recent_dt"] = [r.dt_s for r in stats.recent(RECENT_STEPS) if r.counted]  # as the summary counts
        if use_events:
            snap["warmup"] = a.ev.detector.warmup()
            snap["fallback"] = a.ev.detector.snapshot()
        if snap["state"] == "running":
            started = unix_time(a.ev.last_step.get("step_end")) if a.ev.last_step else None
            if started is None and not use_events:
                started = a.last_advance_at
            sv = stall_state(started, now, stats, a.ev.open_phase)
            snap["stall"] = sv.as_dict()
            # when it became a stall, from the files: the step's start plus the threshold
            a.stall_at = started + sv.threshold_s if sv.state == "stalled" and started and sv.threshold_s else None
        snap["last_logs"] = _shallow(a.ev.last_logs or a.progress.last_log)

    def _dynamo_part(self, snap: dict[str, Any], a: _Attempt) -> None:
        ev_part = None
        if a.ev.dynamo_ev is not None:
            c = _obj(a.ev.dynamo_ev.get("counters"))
            gb = c.get("graph_break")
            ev_part = {
                "recompiles": _count(a.ev.dynamo_ev.get("recompiles")),
                "recompile_limit_hits": _count(a.ev.dynamo_ev.get("recompile_limit_hits")),
                "unique_graphs": _count(_obj(c.get("stats")).get("unique_graphs")),
                "graph_breaks": sum(v for v in map(_count, gb.values()) if v is not None) if type(gb) is dict else 0,
            }
        if a.ev.run_end and type(a.ev.run_end.get("dynamo")) is dict:
            ev_part = ev_part or {"unique_graphs": None, "graph_breaks": None}
            for k in ("recompiles", "recompile_limit_hits"):
                if _count(a.ev.run_end["dynamo"].get(k)) is not None:
                    ev_part[k] = a.ev.run_end["dynamo"][k]
        log_counts = a.dynlog.counts()
        log_seen = bool(log_counts["recompiles"] or log_counts["recompile_limit_hits"] or log_counts["graph_breaks"])
        log_part = {"recompiles": log_counts["recompiles"], "recompile_limit_hits": log_counts["recompile_limit_hits"],
                    "graph_breaks": log_counts["graph_breaks"], "unique_graphs": None}
        d = snap["dynamo"]
        d["by_source"] = {"events": ev_part, "log": log_part}
        d["top_recompile_reason"] = log_counts["top_recompile_reason"]
        sources = []
        for key in ("recompiles", "recompile_limit_hits", "graph_breaks", "unique_graphs"):
            vals = [(src, part.get(key)) for src, part in (("events", ev_part), ("log", log_part))
                    if part is not None and part.get(key) is not None and (src == "events" or log_seen)]
            if vals:
                src, v = max(vals, key=lambda sv: sv[1])  # the source that saw the most wins
                d[key] = v
                sources.append(src)
        d["source"] = "+".join(sorted(set(sources))) or None

    def _gpu_part(self, snap: dict[str, Any], a: _Attempt) -> None:
        recs = list(a.gpu_window)
        if not recs and not a.gpu.exists:
            snap["gpu"], snap["gpu_error"] = None, "no GPU samples recorded (gpu.jsonl missing): NVML state unknown"
            return
        snap["gpu"], snap["gpu_error"] = gpu_status_from_records(recs)
        snap["gpu_source"] = gpu_source(recs)
        snap["gpu_history"] = {k: {f: list(v)[-120:] for f, v in h.items() if f != "t"} for k, h in a.gpu_history.items()}

    def _log_part(self, snap: dict[str, Any], a: _Attempt, now: float) -> None:
        lines = list(a.log.last_lines)
        last = next((ln for ln in reversed(lines) if ln.strip()), None)
        snap["log"] = {"file": TRAIN_LOG, "last_line": last, "traceback_last_line": traceback_last_line(lines),
                       "last_byte_age_s": a.log.last_byte_age_s, "from_start": a.log_from_start}
        snap["events"] = {"file": EVENTS_JSONL if a.events.exists else None, "lines": a.events.lines_read,
                          "corrupt_lines": a.events.corrupt_lines, "unusable_steps": a.ev.unusable_steps,
                          "dropped_events": _shallow((a.ev.run_end or {}).get("dropped_events")), "resume": a.ev_resume}

    def _survivors(self, now: float) -> list[dict[str, Any]]:
        """What outlives the ended run in its process groups/sessions (scanned at most every 5 s)."""
        cached = getattr(self, "_surv_cache", None)
        if cached is None or now - cached[0] > 5.0:
            self._surv_cache = (now, run_survivors(self.run_dir))
        return self._surv_cache[1]

    # --- alerts ----------------------------------------------------------------------------------
    def _alert(self, a: _Attempt, attempt: Any, kind: str, key: str, message: str, at: float | None) -> dict[str, Any]:
        aid = f"a{attempt}-{kind}-{key}"
        t = at if at is not None else a.first_alert_t.setdefault(aid, time.time())
        return {"id": aid, "kind": kind, "at": utc_iso(t), "message": message}

    def _alerts(self, snap: dict[str, Any], a: _Attempt, run: dict[str, Any]) -> list[dict[str, Any]]:
        """Alerts with stable ids (attempt + kind + step or key), oldest first."""
        att = snap["attempt"]
        out = []
        for e, step, seen in a.limit_hits:
            where = f" on rank {e.rank}" if e.rank is not None else ""
            out.append(self._alert(a, att, "recompile_limit", f"{e.function}-{e.rank}",
                                   f"dynamo hit {e.limit_name} ({e.limit}) for {e.function}{where}"
                                   f"{f' near step {step}' if step is not None else ''}: that frame now runs EAGERLY", seen))
        if not a.limit_hits and (snap["dynamo"].get("recompile_limit_hits") or 0) > 0:
            out.append(self._alert(a, att, "recompile_limit", "events",
                                   f"dynamo hit its recompile limit {snap['dynamo']['recompile_limit_hits']} time(s) "
                                   "(seen by the emitter): a frame now runs eagerly", None))
        storm = self._storm(snap, a)
        if storm:
            out.append(self._alert(a, att, "recompile_storm", str(storm[0]), storm[1], None))
        fb = snap["fallback"]
        if fb.get("state") == "flagged":
            onset = fb.get("onset_step")
            out.append(self._alert(a, att, "fallback", str(onset),
                                   f"step times went bimodal (eager fallback?): {fb.get('reason')}",
                                   a.ev.flagged_onset_end))
        st = snap["stall"]
        if st.get("state") == "stalled":
            gs = snap["step"].get("global_step")
            out.append(self._alert(a, att, "stall", str(gs),
                                   f"alive but stuck: no optimizer step for {st['current_step_elapsed_s']:.0f} s after "
                                   f"step {gs} (p99 {snap['step_seconds'].get('p99')} s)", a.stall_at))
        for g in snap.get("gpu") or []:
            if str(g.get("verdict") or "").startswith("SM-busy, tensor-idle"):
                out.append(self._alert(a, att, "gpu", f"{g.get('index')}-tensor-idle", f"GPU{g.get('index')}: {g['verdict']}", None))
        if run_ended(snap):
            ended = snap.get("ended") or {}
            bad = (snap["state"] == "unknown" or snap.get("signal") or snap.get("returncode") not in (0, None)
                   or ended.get("error"))
            if ended.get("stop_requested"):
                bad = False  # the operator asked for it: an event (exit.json says how it ended), not an alert
            if bad:
                from stepwatch.tui.plain import end_words  # noqa: PLC0415

                stopped = " (stop requested)" if ended.get("stop_requested") else ""
                tb = snap["log"].get("traceback_last_line")
                last = f"traceback: {tb}" if tb else f"last log line: {snap['log'].get('last_line')!r}"
                who = f"process {snap['pid']}" if snap["pid"] is not None else "the command"
                out.append(self._alert(a, att, "watchdog", "end",
                                       f"{who} {end_words(snap)}{stopped}; {last}",
                                       ended.get("ended_at_unix")))
        return out

    @staticmethod
    def _storm(snap: dict[str, Any], a: _Attempt) -> tuple[int, str] | None:
        """A recompile storm in what one source saw: the step flags of events.jsonl, else the
        recompile records of train.log (the same recompile is often in both: never added up)."""
        wu = snap["warmup"]
        if wu.get("state") != "steady":
            return None
        for steps in (a.ev.recompile_steps, a.log_recompile_steps):
            after = [s for s in steps if wu.get("until_step") is None or s > wu["until_step"]]
            for i in range(len(after) - STORM_MIN_RECOMPILES + 1):
                if after[i + STORM_MIN_RECOMPILES - 1] - after[i] <= STORM_WINDOW_STEPS:
                    top = snap["dynamo"].get("top_recompile_reason")
                    return after[i], (f"recompile storm after warm-up: {len(after)} recompiles since step {after[0]}; "
                                      f"most frequent reason: {top or 'unknown (enable TORCH_LOGS=recompiles)'}")
        return None


def _obj(v: Any) -> dict[str, Any]:
    """``v`` when it is a JSON object, else an empty one: a nested value read from a file."""
    return v if type(v) is dict else {}


#: Values read from events.jsonl and shown as they are (last_logs, versions) are cut at this depth: a
#: line may nest ~1,000 deep (orjson reads 1,024), and every writer of the snapshot (json.dumps with
#: an indent, the screen) recurses per level.
SHOWN_DEPTH = 32
_TOO_DEEP = f"<nested deeper than {SHOWN_DEPTH} levels: not shown>"


def _shallow(v: Any, depth: int = SHOWN_DEPTH) -> Any:
    """``v`` (a JSON value read from a file) with what lies deeper than ``depth`` levels replaced by
    a note; a copy when it is a container (never deeper than ``depth`` calls)."""
    if type(v) is dict:
        return {k: _shallow(x, depth - 1) for k, x in v.items()} if depth > 0 else _TOO_DEEP
    if type(v) is list:
        return [_shallow(x, depth - 1) for x in v] if depth > 0 else _TOO_DEEP
    return v


def _count(v: Any) -> int | float | None:
    """A counter read from a file: a finite number >= 0 (not a bool), else None."""
    if (type(v) is int or (type(v) is float and math.isfinite(v))) and v >= 0:
        return v
    return None


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (a NaN loss) replaced by the string ``"NaN"``,
    ``"Infinity"`` or ``"-Infinity"``: strict JSON parsers reject bare NaN, and null would hide it."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def run_ended(snap: dict[str, Any]) -> bool:
    """True once the snapshot's attempt is over: its captured process is gone (dead, reused pid,
    zombie), or exit.json exists although no process was ever captured (the command could not be
    started: the supervisor records the error in exit.json and run.json holds no pid)."""
    if snap["state"] == "running":
        return False
    return snap.get("process_verdict") not in (None, "alive") or snap.get("ended") is not None


def snapshot(run_dir: Path, now: float | None = None) -> dict[str, Any]:
    """One-shot status of ``run_dir`` from its files (see :class:`RunObserver`)."""
    return RunObserver(run_dir).refresh(now)


def process_snapshot(run_dir: Path) -> dict[str, Any]:
    """The watchdog's part of the snapshot only (run, attempt, state, pid, alive, returncode, signal,
    ended, ...) from run.json and exit.json and a probe of the captured pid; every other key as in
    a run with no files. Reads no events or log: a listing of many long runs stays instant."""
    snap = _null_snapshot()
    run_dir = Path(run_dir)
    snap["run_dir"], snap["run"] = str(run_dir), run_dir.name
    run = read_json(run_dir / RUN_JSON)
    if run is not None:
        RunObserver(run_dir)._process_part(snap, run)
    return snap

