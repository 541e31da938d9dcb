"""The snapshot's process part: run, attempt, state, pid, alive, exit, the supervisor, the stop
record; and, for a Slurm run, the job as the scheduler reports it (:mod:`.scheduler`), which says
the state where no local probe can (queued, on another node, ended by Slurm)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, cast

from stepwatch.monitors.fold.stepcolumns import unix_time
from stepwatch.monitors.runfiles import EXIT_JSON, RUN_JSON, STOP_JSON, read_json
from stepwatch.monitors.slurm import ABNORMAL_ENDS
from stepwatch.monitors.snapshot.restart import from_words, restart_pending
from stepwatch.monitors.snapshot.scheduler import read_scheduler, scheduler_state
from stepwatch.monitors.snapshot.types import Ended, Scheduler, Snapshot
from stepwatch.monitors.snapshot.watchers import watch_part
from stepwatch.monitors.states import ALIVE, EXITED, NEVER_RECORDED, PENDING, RESTARTING, RUNNING
from stepwatch.monitors.watchdog import ProcessRef, probe

#: A run.json whose supervisor recorded nothing this long after launch: the supervisor died first
#: (a Slurm run's supervisor starts when the job does: the scheduler says when).
SUPERVISOR_SILENT_S = 60.0
#: The rotated run.json copies read for the run's first launch, at most (a hostile dir may hold millions of names).
MAX_ROTATED = 10_000


def process_part(run_dir: Path, snap: Snapshot, run: dict[str, Any], trust_uid: int | None = None) -> None:
    """Fill the process keys of ``snap`` from run.json (``run``), exit.json, stop.json, a probe of the
    captured pids (identity: pid + create time) and, for a Slurm run, scheduler.json. With ``trust_uid``
    (the run owner's own processes), an exit.json or stop.json another user wrote reads as absent."""
    snap["run"] = run.get("name") or run_dir.name
    snap["attempt"] = run.get("attempt")
    snap["identity"] = run.get("identity")
    snap["launched_at_unix"] = run.get("launched_at_unix")
    proc = ProcessRef.from_json(run.get("process"))
    snap["pid"] = proc.pid if proc else None
    verdict = probe(proc) if proc else None
    snap["process_verdict"] = verdict
    snap["alive"] = verdict == ALIVE
    ex = read_json(run_dir / EXIT_JSON, trust_uid, private=trust_uid is not None)  # R17: the owner's alone
    if ex is not None:
        snap["returncode"] = ex.get("returncode")
        snap["signal"] = ex.get("signal")
        snap["ended"] = cast(Ended, {k: ex.get(k) for k in ("ended_at", "ended_at_unix", "duration_s", "stop_requested",
                                                        "error", "write_errors", "log_lost_bytes", "log_lost_reason")})
    sup_ref = ProcessRef.from_json(run.get("supervisor"))
    snap["supervisor_alive"] = sup_ref is not None and probe(sup_ref) == ALIVE
    snap["stop"] = read_json(run_dir / STOP_JSON, trust_uid, private=trust_uid is not None)  # R17: the owner's alone
    snap["scheduler"] = read_scheduler(run_dir, run)
    if snap["alive"]:
        snap["state"] = RUNNING
    elif ex is not None:
        snap["state"] = EXITED
    elif proc is None and not run.get("start_error") and snap["scheduler"] is None:
        launched = run.get("launched_at_unix")
        silent = isinstance(launched, (int, float)) and time.time() - launched > SUPERVISOR_SILENT_S
        if (sup_ref is not None and probe(sup_ref) != ALIVE) or (sup_ref is None and silent):
            # the supervisor died before it recorded the child: nothing will ever say more
            snap["process_verdict"] = NEVER_RECORDED
    scheduler_state(snap, run, ex)
    snap["watch"] = watch_part(snap, run)  # who watches it: the supervisor, held stopped, its wardens, nobody


def state_word(snap: Snapshot, now: float | None = None) -> str:
    """RUNNING / PENDING (a queued Slurm job) / RESTARTING in N s (attempt 2 from ckpt_200) (an enforced restart's
    back-off, counting down to ``now``; ``RESTARTING now`` once it is over and the attempt is being launched) /
    EXITED code / STOPPED (the operator asked) / KILLED signal / Slurm's end (TIMEOUT, CANCELLED, ...) / UNKNOWN: the
    one word for the run's state that the screen's header, ``status``, the home list and every page's first line
    (:func:`.alerts.headline_of`) show."""
    st = snap["state"]
    sch: Scheduler | None = snap["scheduler"]
    job = sch["state"] if sch is not None else None
    if st == RUNNING:
        return "RUNNING"
    if (pending := restart_pending(snap, time.time() if now is None else now)) is not None and snap["restart"] is not None:
        nxt, left = pending
        return f"{RESTARTING} {'now' if left is None else f'in {left} s'} (attempt {nxt} {from_words(snap['restart'])})"
    if st == PENDING:
        return job if job in ("PENDING", "CONFIGURING", "RUNNING") else "PENDING"
    if st != EXITED:
        return "UNKNOWN"
    rc, sig = snap["returncode"], snap["signal"]
    if job in ABNORMAL_ENDS:  # Slurm's word first: TIMEOUT, CANCELLED, NODE_FAIL ...
        return job if rc is None and not sig else f"{job} ({sig or 'exit ' + str(rc)})"
    ended: Ended | None = snap["ended"]
    if ended is not None and ended["stop_requested"]:
        return f"STOPPED ({sig or 'exit ' + str(rc)})"
    return f"KILLED {sig}" if sig else f"EXITED {rc}"


def run_began_at(run_dir: Path, run: dict[str, Any]) -> float | None:
    """When this run's first attempt was launched: the earliest ``launched_at_unix`` of run.json and its rotated
    copies (``run.<stamp>.json``) that the run dir's owner wrote and no one else can write; None when none says."""
    uid = os.getuid()
    times = [run.get("launched_at_unix")]
    try:
        names = [n for n in os.listdir(run_dir) if n.startswith("run.") and n.endswith(".json") and n != RUN_JSON][:MAX_ROTATED]
    except OSError:
        names = []
    for n in names:
        rec = read_json(run_dir / n, owner_uid=uid, private=True)
        if isinstance(rec, dict) and rec.get("name") == run.get("name"):
            times.append(rec.get("launched_at_unix"))
    good = [u for t in times if (u := unix_time(t))]
    return min(good) if good else None
