"""The ranks of a run (torchrun, accelerate): each rank's process from the supervisor's record of
the process tree (procs.json: pid, create time, ``RANK`` / ``LOCAL_RANK`` from its environment, how
it ended as the kernel told the supervisor), and torchrun's failure table from train.log.

A rank is the topmost recorded process carrying that rank (its DataLoader workers inherit ``RANK``
but have a parent of the same rank). A rank that ended by a signal or a non-zero code is a death;
the first one of a cascade (torchrun tears the others down with SIGTERM right after) is the alert,
the rest are named in it. Deaths after a stop request are the stop's doing, not alerts.
"""

from __future__ import annotations

import math
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal, cast
from collections.abc import Callable, MutableMapping

from stepwatch.monitors.detectors.straggler import straggler_state, stuck_ranks
from stepwatch.monitors.fold.stepcolumns import step_no, unix_time
from stepwatch.monitors.parsers.torchrun import FailureTable
from stepwatch.monitors.readers.jsonl import EventReader
from stepwatch.monitors.runfiles import (EVENTS_JSONL, LOG_STEPS_JSONL, PROCS_JSON, RANK_EVENTS, RANK_LOG_STEPS, STOP_JSON,
                                        read_json, utc_iso)
from stepwatch.monitors.stats.stepstats import StepStats
from stepwatch.monitors.snapshot.types import NewAlert, Rank, RankRestarts, RankStepSummary, Snapshot, Straggler, StuckRank
from stepwatch.monitors.states import ALIVE, FLAGGED, NOT_JUDGED, RUNNING
from stepwatch.monitors.watchdog import PID_MAX, ProcessRef, probe

#: Step ends kept per rank for the straggler detector (the last this many global_steps).
ENDS_KEPT = 512
#: Metrics kept per rank at most (its latest log record's).
MAX_RANK_METRICS = 32

#: Deaths within this many seconds of the first one are its cascade (torchrun's teardown).
CASCADE_S = 5.0


def _int(v: Any, lo: int = 0, hi: int = PID_MAX) -> int | None:
    return v if type(v) is int and lo <= v <= hi else None


def _seconds(v: Any) -> float | None:
    """A duration read from a file: a finite number, else None."""
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None


class RankSteps:
    """One rank's own events file folded: its step-time statistics (nearest-rank, first steps
    excluded) and the end time of each recent global_step."""

    def __init__(self, path: Path):
        #: "events": the rank's emitter wrote them; "log": the supervisor timed them from the rank's
        #: prefixed lines of train.log (an un-instrumented run)
        self.source: Literal["events", "log"] = "log" if path.name.startswith("logsteps") else "events"
        self.reader = EventReader(path)
        self.ends: OrderedDict[int, float] = OrderedDict()
        self.pid: int | None = None
        self._restart()

    def read(self) -> None:
        for ev in self.reader.read_new():
            kind = ev.get("kind")
            if kind == "run_start":
                pid = _int(ev.get("pid"), 1)
                if self.pid is not None and pid != self.pid:
                    self._restart()  # torchrun restarted this rank: a new process appends to the file
                self.pid = pid
                self.max_steps = _int(ev.get("max_steps"), 1, 10**12)
            if kind == "run_end":
                self.finished = True  # its training loop ended: teardown is no stuck rank
            if kind == "log" and isinstance(logs := ev.get("logs"), dict):  # its own metrics (loss, lr, ...)
                self.metrics = {str(k)[:64]: float(v) for k, v in list(logs.items())[:MAX_RANK_METRICS]
                                if type(v) in (int, float) and math.isfinite(v)}
            if kind != "step":
                continue
            dt, step, end = _seconds(ev.get("dt")), step_no(ev.get("step")), unix_time(ev.get("step_end"))
            if dt is None or dt < 0:
                continue
            flags = ev.get("flags")
            flags = flags if isinstance(flags, list) else []
            self.stats.add(step, dt, [f for f in flags if isinstance(f, str)], t=end)
            if step is not None and end is not None:
                self.ends[step] = end
                while len(self.ends) > ENDS_KEPT:
                    self.ends.popitem(last=False)
            self.last_step, self.last_end = step, end
            if step is not None and self.max_steps is not None and step >= self.max_steps:
                self.finished = True  # its last planned step: what follows is its final save or teardown

    def _restart(self) -> None:
        """The rank's earlier process's steps are not this one's (its step times, its step ends)."""
        self.stats = StepStats(recent_maxlen=64, window=64)
        self.ends.clear()
        self.last_step: int | None = None
        self.last_end: float | None = None
        self.max_steps: int | None = None
        #: the rank's training steps are done (its run_end, or its last planned step): never stuck
        self.finished = False
        self.metrics: dict[str, float] = {}  #: the rank's latest metrics (its log records)

    def summary(self) -> RankStepSummary:
        st = self.stats
        return {"n": st.n, "p50": st.p50, "p99": st.percentile(99), "last_step": self.last_step,
                "last_step_end_unix": self.last_end, "source": self.source, "metrics": dict(self.metrics)}


class RankWatch:
    """Fed train.log's lines (:meth:`feed`); :meth:`part` gives the snapshot's ``ranks`` and
    ``straggler``. Each rank's events file is folded once some rank N > 0 writes its own
    (``events.rank<N>.jsonl``); rank 0's is events.jsonl."""

    def __init__(self, run_dir: Path, trust_uid: int | None = None):
        self.run_dir = run_dir
        #: the owner's watchers (RunObserver's ``trust_uid``): procs.json and stop.json count only under the trust
        #: rule (a straggler's pid is py-spy's target; a stop's time says which rank ended after it)
        self.trust_uid = trust_uid
        self.table = FailureTable()
        self._stamp: tuple[int, int, int] | None = None
        self._records: list[dict[str, Any]] = []
        self.steps: dict[int, RankSteps] = {}

    def close(self) -> None:
        for rs in self.steps.values():
            rs.reader.close()

    def _read_steps(self) -> None:
        try:
            names = os.listdir(self.run_dir)
        except OSError:
            return
        ranks = {int(m.group(1)): n for n in names if (m := RANK_EVENTS.match(n))}
        if ranks:
            ranks[0] = EVENTS_JSONL  # every rank writes its own events (STEPWATCH_ALL_RANKS)
        else:  # an un-instrumented run whose ranks print prefixed lines: the supervisor's per-rank log steps
            ranks = {int(m.group(1)): n for n in names if (m := RANK_LOG_STEPS.match(n))}
            if ranks:
                ranks[0] = LOG_STEPS_JSONL
        if not ranks and not self.steps:
            return
        for rank, name in sorted(ranks.items())[:1024]:
            if rank not in self.steps:
                self.steps[rank] = RankSteps(self.run_dir / name)
        for rs in self.steps.values():
            rs.read()

    def feed(self, line: str) -> None:
        self.table.feed(line)

    def _read(self) -> list[dict[str, Any]]:
        path = self.run_dir / PROCS_JSON
        try:
            st = os.stat(path)
        except OSError:
            return self._records
        if (st.st_mtime_ns, st.st_size, st.st_ctime_ns) != self._stamp:  # ctime: a chmod is a change too
            rec = read_json(path, self.trust_uid, private=self.trust_uid is not None)
            items = rec.get("processes") if isinstance(rec, dict) else None
            self._records = [d for d in items if isinstance(d, dict)] if isinstance(items, list) else []
            self._stamp = (st.st_mtime_ns, st.st_size, st.st_ctime_ns)
        return self._records

    def part(self) -> tuple[list[Rank], Straggler, RankRestarts | None]:
        """``ranks``: ``[{rank, local_rank, pid, alive, ended_at_unix, returncode, signal,
        exit_source, root_cause, after_stop, restart_count, steps}]`` by rank then start ([] for a
        run without ranked processes or rank files; a rank torchrun restarted has one entry per
        process); ``straggler``: the detector's verdict; ``rank_restarts``: :func:`restarts_of`."""
        self._read_steps()
        recs = self._read()
        ranked = {r["pid"]: r for r in recs if _int(r.get("pid"), 1) and _int(r.get("rank"), 0, 10**6) is not None}
        failures = self.table.by_pid()
        stop = read_json(self.run_dir / STOP_JSON, self.trust_uid, private=self.trust_uid is not None)
        stop_t = unix_time(stop.get("requested_at_unix")) if isinstance(stop, dict) else None
        out: list[Rank] = []
        for pid, r in ranked.items():
            parent = ranked.get(r.get("ppid"))
            if parent is not None and parent.get("rank") == r["rank"]:
                continue  # a worker of that rank
            ended = unix_time(r.get("ended_at_unix"))
            ex = r.get("exit")
            ex = ex if isinstance(ex, dict) else {}
            rc, sig, source = _int(ex.get("returncode"), 0, 255), ex.get("signal"), "kernel" if ex else None
            f = failures.get(pid)
            if f is not None and rc is None and not sig:
                rc, sig, source = (None, f.how()[len("killed by "):], "torchrun") if f.exitcode < 0 else (
                    f.exitcode, None, "torchrun")
            alive = ended is None and probe(ProcessRef(pid, unix_time(r.get("create_time")))) == ALIVE
            out.append({"rank": r["rank"], "local_rank": _int(r.get("local_rank"), 0, 10**6), "pid": pid,
                        "alive": alive, "ended_at_unix": ended, "returncode": rc,
                        "signal": sig if isinstance(sig, str) else None, "exit_source": source,
                        "root_cause": bool(f and f.root_cause),
                        "after_stop": bool(stop_t is not None and ended is not None and ended >= stop_t),
                        "restart_count": _int(r.get("restart_count"), 0, 10**6),
                        "max_restarts": _int(r.get("max_restarts"), 0, 10**6),
                        "started_at_unix": unix_time(r.get("first_seen_unix")), "steps": None})
        out.sort(key=lambda d: (d["rank"], d["started_at_unix"] or 0))
        latest = {d["rank"]: d for d in out}  # a restarted rank: its latest process carries the steps
        for rank, rs in self.steps.items():
            if rank not in latest:  # a rank file without a recorded process (no supervisor record)
                latest[rank] = {"rank": rank, "local_rank": None, "pid": rs.pid, "alive": None, "ended_at_unix": None,
                                "returncode": None, "signal": None, "exit_source": None, "root_cause": False,
                                "after_stop": False, "restart_count": None, "max_restarts": None,
                                "started_at_unix": None, "steps": None}
                out.append(latest[rank])
            latest[rank]["steps"] = rs.summary()
        out.sort(key=lambda d: (d["rank"], d["started_at_unix"] or 0))
        verdict = cast(Straggler, straggler_state({r: rs.ends for r, rs in self.steps.items()}))
        verdict["stuck"] = cast("list[StuckRank]", stuck_ranks({r: (rs.last_step, rs.last_end, rs.stats.percentile(99))
                                        for r, rs in self.steps.items()
                                        if latest.get(r, {}).get("alive") is not False and not rs.finished},
                                       time.time()))
        dead = sorted({d["rank"] for d in latest.values() if died(d)})
        if dead and verdict["state"] != NOT_JUDGED:  # a dead rank's old steps prove nothing now
            verdict.update(state=NOT_JUDGED, reason=f"rank(s) {', '.join(map(str, dead))} died")
        return out, verdict, restarts_of(out)


def restarts_of(ranks: list[Rank]) -> RankRestarts | None:
    """``{count, max}``: how many times torchrun restarted the worker group (the highest
    ``TORCHELASTIC_RESTART_COUNT`` among the recorded ranks) and its ``--max-restarts``; None where
    no rank's environment said (not torchrun, or no record)."""
    counts = [c for r in ranks if (c := r.get("restart_count")) is not None]
    if not counts:
        return None
    limits = [m for r in ranks if (m := r.get("max_restarts")) is not None]
    return {"count": max(counts), "max": max(limits) if limits else None}


def restarts_words(restarts: RankRestarts | None) -> str:
    """``; torchrun restarted the workers 1 time (at most 3)``; '' before any restart or without
    torchrun's record."""
    if not restarts or not restarts.get("count"):
        return ""
    n, limit = restarts["count"], restarts.get("max")
    return f"; torchrun restarted the workers {n} time{'s' if n != 1 else ''}" + (
        f" (at most {limit})" if limit is not None else "")


def latest_per_rank(ranks: list[Rank]) -> list[Rank]:
    """Each rank's latest process (a rank torchrun restarted has older, ended ones), by rank."""
    latest: dict[int, Rank] = {}
    for r in ranks:  # sorted by rank then start: the last of a rank is its latest
        latest[r["rank"]] = r
    return [latest[k] for k in sorted(latest)]


def _restart_words(first: Rank, snap: Snapshot) -> str:
    """``; torchrun restarted the workers (restart 1 of at most 3)`` when a later process of the
    same rank carries a higher restart count; ``; torchrun may restart the workers (2 restarts
    left)`` while the run goes on and restarts remain; '' otherwise."""
    rc = first.get("restart_count")
    if rc is None:
        return ""
    later = [c for r in snap.get("ranks") or []
             if r["rank"] == first["rank"] and (c := r.get("restart_count")) is not None and c > rc]
    limit = first.get("max_restarts")
    of = f" of at most {limit}" if limit is not None else ""
    if later:
        return f"; torchrun restarted the workers (restart {min(later)}{of})"
    if snap.get("state") == RUNNING and limit is not None and limit > rc:
        return f"; torchrun may restart the workers ({limit - rc} restart{'s' if limit - rc != 1 else ''} left)"
    if limit is not None and limit <= rc and limit > 0:
        return f"; no restart left (--max-restarts {limit})"
    return ""


def ranks_last_words(snap: Snapshot) -> str:
    """``; ranks by last step: 1 at step 118 (pid 813), 0 at step 120 (pid 812)``, the first to stop
    first ('' without per-rank steps)."""
    rs = [(end, r, steps) for r in snap.get("ranks") or []
          if (steps := r.get("steps")) is not None and (end := steps.get("last_step_end_unix")) is not None]
    if len(rs) < 2:
        return ""
    rs.sort(key=lambda t: t[0])
    return "; ranks by last step: " + ", ".join(f"{r['rank']} at step {steps['last_step']} (pid {r['pid']})"
                                                for _, r, steps in rs[:8])


def root_cause_words(snap: Snapshot) -> str:
    """``; root cause: rank 1 (pid N) killed by SIGKILL`` for an end whose first rank death is
    known ('' otherwise): torchrun's own traceback ends in an empty ``ChildFailedError:``."""
    deaths = [r for r in snap.get("ranks") or [] if died(r) and not r["after_stop"]]
    if not deaths:
        return ""
    first = first_of(sorted(deaths, key=lambda r: r["ended_at_unix"] or 0))
    return f"; root cause: rank {first['rank']} (pid {first['pid']}) {_how(first)}"


def _how(r: Rank) -> str:
    if r.get("signal"):
        return f"killed by {r['signal']}"
    return f"exited with code {r['returncode']}"


def died(r: Rank) -> bool:
    """The rank ended by a signal or a non-zero code."""
    return not r["alive"] and (bool(r.get("signal")) or (r.get("returncode") or 0) != 0)


def cascades(deaths: list[Rank]) -> list[list[Rank]]:
    """Deaths grouped by time: one starts a group, those within CASCADE_S of it follow it. A death
    whose time is not known yet (read from torchrun's table before the supervisor recorded the exit)
    joins the latest group: it never starts one ahead of a death whose time is known."""
    groups: list[list[Rank]] = []
    for r in sorted(deaths, key=lambda r: (r["ended_at_unix"] is None, r["ended_at_unix"] or 0)):
        t, t0 = r["ended_at_unix"], groups[-1][0]["ended_at_unix"] if groups else None
        if groups and (t is None or t0 is None or t - t0 < CASCADE_S):
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def first_of(group: list[Rank]) -> Rank:
    """The death a cascade starts with: torchrun's root cause where its table says; else the earliest
    that is not a SIGTERM (torchrun tears the other workers down with SIGTERM, and on a busy machine
    the supervisor can notice the torn-down rank's exit before the one that caused it); else the
    earliest."""
    return (next((r for r in group if r["root_cause"]), None)
            or next((r for r in group if r.get("signal") != "SIGTERM"), None) or group[0])


def rank_alerts(snap: Snapshot, make: Callable[..., NewAlert], first_seen: MutableMapping[str, float]) -> list[NewAlert]:
    """One alert per cascade of rank deaths, naming its first (torchrun's root cause where the table
    says, else the earliest) and listing the rest; and a straggler, by rank and pid (``make`` is
    snapshot.alerts.alert)."""
    out: list[NewAlert] = []
    sg = snap.get("straggler") or {}
    for st in sg.get("stuck") or [] if snap.get("state") == RUNNING else []:
        pid = next((r["pid"] for r in reversed(snap.get("ranks") or []) if r["rank"] == st["rank"]), None)
        out.append(make(first_seen, snap["attempt"], "stuck_rank", f"{st['rank']}-{st['last_step']}",
                        f"rank {st['rank']} (pid {pid}) stopped stepping: its last step {st['last_step']} ended "
                        f"{st['behind_s']:.0f} s before rank {st['ahead_rank']}'s step {st['ahead_step']} "
                        f"(threshold {st['threshold_s']:.1f} s)", None))
    if sg.get("state") == FLAGGED and snap.get("state") == RUNNING:
        pid = next((r["pid"] for r in reversed(snap.get("ranks") or []) if r["rank"] == sg["rank"]), None)
        out.append(make(first_seen, snap["attempt"], "straggler", str(sg["rank"]),
                        f"straggler: rank {sg['rank']} (pid {pid}) {sg['reason'].split(' ', 2)[2]}", None))
    for group in cascades([r for r in snap.get("ranks") or [] if died(r) and not r["after_stop"]]):
        first = first_of(group)
        others = [r for r in group if r is not first]
        lr = f"local_rank {first['local_rank']}, " if first.get("local_rank") is not None else ""
        src = {"kernel": "its exit status", "torchrun": "torchrun's failure table"}.get(first["exit_source"] or "", "?")
        then = ("; then " + ", ".join(f"rank {r['rank']} (pid {r['pid']}) {_how(r)}" for r in others)) if others else ""
        going = "; the run goes on" if snap.get("state") == RUNNING else ""
        out.append(make(first_seen, snap["attempt"], "rank_death", f"{first['rank']}-{first['pid']}",
                        f"rank {first['rank']} ({lr}pid {first['pid']}) {_how(first)} at "
                        f"{utc_iso(first['ended_at_unix'])} (from {src}){then}{_restart_words(first, snap)}{going}",
                        first["ended_at_unix"]))
    return out
