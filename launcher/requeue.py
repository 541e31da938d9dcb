"""A requeued Slurm job (a preemption, ``scontrol requeue``): Slurm runs its batch script again, the same supervisor
command on the same run dir. That start is the run's next attempt, never the last one replayed onto its files
(ARCHITECTURE.md "The restart policy"):

- recognised by Slurm's own word, ``SLURM_RESTART_COUNT`` >= 1, in the job run.json names, whose attempt a
  supervisor has already started (run.json records it);
- what runs is the owner's last launch (launcher/relaunch.py: the config as launched, never a file others can
  write), through the same gate and checklist as any launch (launcher/launch.py, ``in_job``); the attempt's files
  are rotated, the job's own (``SLURM_JOB_FILES``: its output is the supervisor's log) stay;
- the restart policy's decision on the attempt that ended (restart.json, made by its supervisor once Slurm's
  SIGTERM ended it): in ``enforce`` mode RESTART resumes from its checkpoint and STOP runs nothing (the job ends
  there); ``observe`` and ``off`` run the command as launched, from scratch, as Slurm alone would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepwatch.launcher.restartpolicy import STOP
from stepwatch.launcher.restartrun import recorded_decision, restarts_so_far
from stepwatch.launcher.slurm import slurm_job_id
from stepwatch.launcher.trust import launch_digest, read_owner_copy
from stepwatch.launcher.exitrecord import new_exit_record
from stepwatch.monitors.runfiles import EXIT_JSON, LEDGER_JSON, RESTART_JSON, TRAIN_LOG, read_json, write_json_atomic
from stepwatch.monitors.states import ENFORCE

BY = "slurm requeue"


class _PolicyStop(Exception):
    """The restart policy's STOP on the attempt that ended: the requeued job runs nothing."""


def requeue_count(run: dict[str, Any]) -> int:
    """Slurm's ``SLURM_RESTART_COUNT`` when this process runs in the job ``run`` names and a supervisor already
    started that attempt: a requeue of it. 0 otherwise (a first start, a local run)."""
    job = slurm_job_id(run)
    try:
        n = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        return 0
    sup = run.get("supervisor")
    started = isinstance(sup, dict) and sup.get("pid") is not None
    return n if n > 0 and job is not None and os.environ.get("SLURM_JOB_ID") == job and started else 0


def owner_launched(run_dir: Path, run: dict[str, Any]) -> bool:
    """A requeue (:func:`requeue_count`) of the attempt the owner's own copy of the last launch describes
    (launcher/trust.py): the batch script's digest is the job's first attempt's, an earlier requeue wrote this one."""
    copy, _why = read_owner_copy(run_dir)
    return requeue_count(run) > 0 and copy is not None and copy.get("digest") == launch_digest(run)


def next_attempt_in_job(run_dir: Path, run: dict[str, Any], count: int, log: Callable[[str], None]) -> dict[str, Any] | None:
    """The requeued job's next attempt, prepared (run.json written, files rotated) for this supervisor to run; None
    when nothing is to run: the policy said STOP, or the launch was refused (both logged, and in restart.json)."""
    from stepwatch.launcher.launch import launch  # noqa: PLC0415
    from stepwatch.launcher.relaunch import newest_checkpoint_for, relaunch_config, resume_from  # noqa: PLC0415

    prev = run.get("attempt")
    doc, dec = recorded_decision(run_dir, prev)
    if dec is None:  # Slurm's kill took the supervisor before it recorded the end: recorded now, on its behalf
        _record_end(run_dir, run, log)
        doc, dec = recorded_decision(run_dir, prev)
    head = f"Slurm requeued job {slurm_job_id(run)} (restart {count}) after attempt {prev}"
    try:
        cfg, _changes = relaunch_config(run_dir)
        enforce = cfg.settings.restart.mode == ENFORCE
        if enforce and dec is not None and dec.get("verdict") == STOP:
            raise _PolicyStop(f"the restart policy said stop: {dec.get('reason')}")
        if enforce:
            cp = None if dec is not None else newest_checkpoint_for(cfg)
            where, step = ((dec.get("checkpoint"), dec.get("checkpoint_step")) if dec is not None
                           else (str(cp.path) if cp else None, cp.step if cp else None))
            resume_from(cfg, where, step, by=BY, after_attempt=prev, restarts=restarts_so_far(run) + 1)
        else:
            cfg.resumed_from = {"by": BY, "restarts": 0, "after_attempt": prev, "checkpoint": None, "step": None,
                                "unsafe_checkpoint": None}
        res = launch(cfg, allow_dirty=run.get("allow_dirty_reason"),
                     override=(run.get("preflight") or {}).get("override_reason"),
                     in_job={**run["scheduler"], "requeues": count})
    except Exception as e:  # noqa: BLE001 - a refusal (dirty tree, failed checklist, the policy's stop) is an outcome
        why = str(e) if isinstance(e, _PolicyStop) else f"{type(e).__name__}: {str(e)[:800]}"
        log(f"{head}: no new attempt: {why}")
        _record(run_dir, doc, dec, {"not_started": why})
        return None
    rf = res.run.get("resumed_from") or {}
    log(f"{head}: attempt {res.attempt} starts in the job, "
        + (f"resuming from {rf['checkpoint']} (step {rf['step']})" if rf.get("checkpoint") else "from scratch"))
    _record(run_dir, doc, dec, {"started": {"attempt": res.attempt, "by": BY, "argv": res.run.get("argv")}})
    return res.run


def _record_end(run_dir: Path, run: dict[str, Any], log: Callable[[str], None]) -> None:
    """The ended attempt's exit record (no exit code: the job's kill took its supervisor; its end is the log's last
    write), ledger and restart decision (its cause read from slurmstepd's line), unless it has them. Never raises."""
    from stepwatch.launcher.restartrun import run_policy  # noqa: PLC0415
    from stepwatch.monitors.snapshot.ledger import record as record_ledger  # noqa: PLC0415
    from stepwatch.monitors.snapshot.observer import snapshot  # noqa: PLC0415

    rec = read_json(run_dir / EXIT_JSON, owner_uid=os.getuid())
    try:
        if rec is None:
            launched = run.get("launched_at_unix")
            t = max([os.stat(run_dir / TRAIN_LOG).st_mtime] if (run_dir / TRAIN_LOG).exists() else [time.time()])
            rec = new_exit_record(t, round(t - launched, 3) if isinstance(launched, (int, float)) else None,
                                  error="Slurm ended the job with its supervisor before the end was recorded "
                                        "(recorded by the requeued job's supervisor)")
            write_json_atomic(run_dir / EXIT_JSON, rec, mode=0o644)
        if not (run_dir / LEDGER_JSON).exists():
            record_ledger(run_dir, snapshot(run_dir))
    except Exception as e:  # noqa: BLE001 - the next attempt goes on without the record
        log(f"could not record attempt {run.get('attempt')}'s end: {type(e).__name__}: {e}")
    run_policy(run_dir, run, log, rec)


def _record(run_dir: Path, doc: dict[str, Any] | None, dec: dict[str, Any] | None, outcome: dict[str, Any]) -> None:
    """The requeue's outcome added to restart.json's decision on the attempt that ended (when there is one)."""
    if doc is None or dec is None:
        return
    dec.pop("not_started", None)
    dec.update(outcome)
    try:
        write_json_atomic(run_dir / RESTART_JSON, doc, mode=0o644)
    except OSError:
        pass  # the supervisor's log has it
