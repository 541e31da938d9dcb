"""A Slurm run's job in the snapshot: ``scheduler`` (null for a local run), the run's state where only
the scheduler knows it (pending in the queue; running on a node this machine cannot probe; ended by
Slurm before the supervisor could write exit.json), and the alerts only the scheduler can give: an
abnormal end (``job_end``: CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, BOOT_FAIL,
DEADLINE) and a run that will not finish before the job's time limit (``time_limit``).

``scheduler.json`` is written by the login node's job watcher (:mod:`stepwatch.monitors.watch.jobwatch`)
from Slurm's own commands (:mod:`stepwatch.monitors.slurm`); read here as hostile as every file.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, MutableMapping

from stepwatch.monitors.runfiles import SCHEDULER_JSON, read_json, utc_iso
from stepwatch.monitors.slurm import ABNORMAL_ENDS, DEFAULT_POLL_S, ENDED_STATES, WAITING_STATES
from stepwatch.monitors.snapshot.types import NewAlert, Scheduler, Snapshot
from stepwatch.monitors.states import EXITED, PENDING, RUNNING

#: The ETA may run past the time left by this share before the time-limit alert (the ETA is an
#: estimate from the last steps; a run that just fits is not an alert).
TIME_LIMIT_MARGIN = 0.05
#: scheduler.json older than this many poll intervals: the job watcher is gone (the snapshot says so).
STALE_POLLS = 6
_STATE_RE = re.compile(r"^[A-Z_]{1,32}$")
_WHAT = {
    "CANCELLED": "the job was cancelled (scancel, by its owner or an administrator)",
    "TIMEOUT": "the job ran past its time limit and Slurm killed it: resume from the last checkpoint with a "
               "longer [slurm] time",
    "NODE_FAIL": "a node of the job failed: the run's processes there died with it",
    "OUT_OF_MEMORY": "a process of the job went over its memory limit and was killed: ask for more memory "
                     "([slurm] extra = [\"--mem=...\"]) or use less",
    "PREEMPTED": "a higher-priority job preempted it",
    "BOOT_FAIL": "the job's node failed to boot",
    "DEADLINE": "the job reached its deadline",
}


def _num(v: Any) -> float | None:
    """A time or duration from scheduler.json: a number from 0 to 1e12 (never a 400-digit int's
    OverflowError, a NaN, an inf)."""
    return float(v) if type(v) in (int, float) and 0 <= v < 1e12 else None


def _word(v: Any, n: int = 200) -> str | None:
    return v[:n] if isinstance(v, str) and v else None


def read_scheduler(run_dir: Path, run: dict[str, Any], now: float | None = None) -> Scheduler | None:
    """The snapshot's ``scheduler`` for a Slurm run (run.json ``scheduler.kind == "slurm"``), else None:
    the job id from run.json, the rest from scheduler.json, each value checked; ``poll_age_s`` says
    how old the last look is, ``stale`` whether the job watcher stopped looking."""
    sch = run.get("scheduler")
    if not isinstance(sch, dict) or sch.get("kind") != "slurm":
        return None
    now = time.time() if now is None else now
    job_id = sch.get("job_id") if isinstance(sch.get("job_id"), str) and sch["job_id"].isdigit() else None
    rec = read_json(run_dir / SCHEDULER_JSON) or {}
    if rec.get("job_id") != job_id:
        rec = {}  # another job's record (a relaunch's leftovers): not this attempt's
    state = rec.get("state") if isinstance(rec.get("state"), str) and _STATE_RE.match(rec["state"]) else None
    polled = _num(rec.get("polled_at_unix"))
    poll_s = _num(sch.get("poll_s")) or DEFAULT_POLL_S
    age = None if polled is None else max(0.0, now - polled)
    return {"kind": "slurm", "job_id": job_id, "state": state or ("SUBMITTED" if job_id else "NOT SUBMITTED"),
            "reason": _word(rec.get("reason")), "nodes": _word(rec.get("nodes")), "exit_code": _word(rec.get("exit_code"), 32),
            "time_limit_s": _num(rec.get("time_limit_s")), "time_left_s": _num(rec.get("time_left_s")),
            "start_unix": _num(rec.get("start_unix")), "end_unix": _num(rec.get("end_unix")),
            "source": _word(rec.get("source"), 16), "error": _word(rec.get("error"), 500),
            "poll_age_s": age, "stale": age is not None and age > STALE_POLLS * poll_s and state not in ENDED_STATES,
            "previous_job_ids": [j for j in sch.get("previous_job_ids") or [] if isinstance(j, str) and j.isdigit()][:20]}


def _stop_asked(snap: Snapshot) -> bool:
    """The operator asked for the stop (``stepwatch stop`` writes who), not Slurm's own TERM."""
    return bool((snap.get("stop") or {}).get("requested_by_user"))


def scheduler_state(snap: Snapshot, run: dict[str, Any], exit_record: dict[str, Any] | None) -> None:
    """Set the run's ``state`` where only the scheduler knows it (the snapshot's ``scheduler`` is set)."""
    sch = snap.get("scheduler")
    if not sch:
        return
    state = sch["state"]
    proc_host = (run.get("process") or {}).get("host")
    elsewhere = isinstance(proc_host, str) and proc_host != socket.gethostname()
    if state in ABNORMAL_ENDS and (ended := snap.get("ended")) and not _stop_asked(snap):
        ended["stop_requested"] = False  # Slurm's own TERM (time limit, scancel) reached the supervisor
    if snap["state"] == RUNNING or exit_record is not None:
        return
    if state in WAITING_STATES or state == "SUBMITTED" or (state in ("RUNNING", "COMPLETING") and snap["pid"] is None):
        snap["state"] = PENDING
        snap["process_verdict"] = f"Slurm job {sch['job_id']} {state}" + (f" ({sch['reason']})" if sch["reason"] else "")
    elif state in ("RUNNING", "COMPLETING") and elsewhere:
        snap["state"], snap["alive"] = RUNNING, True
        snap["process_verdict"] = f"on {proc_host}: alive as far as Slurm says (job {sch['job_id']} {state})"
    elif state in ENDED_STATES:
        snap["state"] = EXITED
        snap["ended"] = {"ended_at": utc_iso(sch["end_unix"]) if sch["end_unix"] else None,
                         "ended_at_unix": sch["end_unix"], "duration_s": None,
                         "stop_requested": _stop_asked(snap), "write_errors": None, "log_lost_bytes": None,
                         "log_lost_reason": None,
                         "error": f"Slurm ended job {sch['job_id']} {state} before the supervisor wrote exit.json"}


def scheduler_alerts(snap: Snapshot, make: Callable[..., NewAlert],
                     first_seen: MutableMapping[str, float]) -> list[NewAlert]:
    """``job_end`` for an abnormal end Slurm reports (not after a stop the operator asked for, when
    it is CANCELLED), ``time_limit`` while the ETA runs past the job's time left."""
    sch = snap.get("scheduler")
    if not sch:
        return []
    out: list[NewAlert] = []
    state, job = sch["state"], sch["job_id"]
    if state in ABNORMAL_ENDS and not (_stop_asked(snap) and state == "CANCELLED"):
        where = f" on {sch['nodes']}" if sch["nodes"] else ""
        code = f", exit code {sch['exit_code']}" if sch["exit_code"] and sch["exit_code"] != "0:0" else ""
        why = f" (Slurm's reason: {sch['reason']})" if sch["reason"] else ""
        out.append(make(first_seen, snap["attempt"], "job_end", f"{job}-{state}",
                        f"Slurm job {job} ended {state}{where}{code}{why}: {_WHAT.get(state, state)}", sch["end_unix"]))
    eta, left = snap.get("eta") or {}, sch["time_left_s"]
    if snap.get("state") == RUNNING and left is not None and isinstance(eta_s := eta.get("eta_s"), (int, float)) \
            and eta_s > left * (1 + TIME_LIMIT_MARGIN) + 60:
        limit = sch["time_limit_s"]
        out.append(make(first_seen, snap["attempt"], "time_limit", job,
                        f"will not finish before the time limit: about {_hms(eta_s)} of steps left "
                        f"({eta.get('remaining_steps')} steps) but {_hms(left)} left of job {job}'s "
                        f"{_hms(limit) if limit else '?'} limit: save a checkpoint, or resubmit with a longer "
                        "[slurm] time", None))
    return out


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
