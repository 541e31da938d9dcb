"""The restart policy, run by the supervisor once its attempt has ended (``[restart] mode`` observe or enforce):
gather the facts of the end (the snapshot of the run dir, the log's tail, the run's checkpoints), classify the
cause (:mod:`stepwatch.monitors.parsers.endcauses`), decide (:mod:`.restartpolicy`), record the decision in
``restart.json`` (every attempt's end, and the last decision; never rotated) and page it through the run's
``[alerts]`` channels. ``observe`` stops there: it says what it would have done.
"""

from __future__ import annotations

import math
import os
import socket
import stat
import threading
import time
from dataclasses import asdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepwatch.launcher.checkpointpath import judge_decision
from stepwatch.launcher.checkpoints import find_checkpoints, newest_complete, output_dir_of
from stepwatch.launcher.provenance import NOT_THIS_RUNS, judge_provenance, refused_words
from stepwatch.launcher.restartpolicy import RESTART, AttemptEnd, Decision, decide
from stepwatch.launcher.slurm import slurm_job_id
from stepwatch.monitors.parsers.endcauses import SLURM_CANCELLED, EndFacts, classify, slurm_requeued
from stepwatch.monitors.runfiles import (ALERTS_JSONL, RESTART_JSON, SUPERVISOR_LOG, TRAIN_LOG, read_json, read_push_urls,
                                         write_json_atomic)
from stepwatch.monitors.runsettings import RunSettings
from stepwatch.monitors.snapshot.alerts import headline_of
from stepwatch.monitors.snapshot.types import Snapshot
from stepwatch.monitors.states import ENFORCE, OBSERVE, OFF

#: The log's tail the end's signatures are read from.
TAIL_BYTES = 64 * 1024
#: Checkpoints listed in restart.json (the newest).
LISTED_CHECKPOINTS = 8


def log_tail(run_dir: Path, name: str = TRAIN_LOG) -> list[str]:
    """The last lines of the attempt's train.log (or ``name``; at most TAIL_BYTES), ``\\r`` frames split; [] when
    unreadable."""
    try:
        fd = os.open(run_dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device put in its place: never waited on
            return []
        size = st.st_size
        os.lseek(fd, max(0, size - TAIL_BYTES), os.SEEK_SET)
        data = os.read(fd, TAIL_BYTES)
    finally:
        os.close(fd)
    return [ln for ln in data.decode("utf-8", "replace").replace("\r", "\n").split("\n") if ln.strip()]


def slurm_cancel_line(run_dir: Path, run: dict[str, Any]) -> str | None:
    """slurmstepd's line saying the scheduler ended this attempt's job (a requeue, a preemption, its time limit),
    from the job's output (the supervisor's log) after this supervisor's start; None for a local run or none."""
    job = slurm_job_id(run)
    if job is None:
        return None
    lines = log_tail(run_dir, SUPERVISOR_LOG)
    mine = f"supervisor[{os.getpid()}]: started pid "
    start = max((i for i, ln in enumerate(lines) if mine in ln), default=-1)
    hits = [m[0] for ln in lines[start + 1:] if (m := SLURM_CANCELLED.search(ln)) and m["job"] == job]
    return hits[-1] if hits else None


def recorded_decision(run_dir: Path, attempt: Any = None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """restart.json (its owner's alone, writable by no one else: runfiles.trust_problem) and its last decision, that
    decision None when there is none or, with ``attempt``, when it is on another attempt."""
    doc = read_json(run_dir / RESTART_JSON, owner_uid=os.getuid(), private=True)
    d = doc.get("decision") if isinstance(doc, dict) else None
    ok = isinstance(d, dict) and (attempt is None or d.get("attempt") == attempt)
    return doc, d if ok else None


def previous_ends(run_dir: Path, attempt: int) -> list[AttemptEnd]:
    """The ends of the run's earlier attempts as restart.json recorded them (a malformed row is left out)."""
    doc = read_json(run_dir / RESTART_JSON, owner_uid=os.getuid(), private=True) or {}
    out: list[AttemptEnd] = []
    for row in doc.get("attempts") or []:
        try:
            end = AttemptEnd(**row)
        except TypeError:
            continue
        if isinstance(end.attempt, int) and end.attempt < attempt:
            out.append(end)
    return out


def _written_since(p: Path, t: float) -> bool:
    """``p`` is the owner's and was changed at or after ``t`` (unix s): this attempt's own writing."""
    try:
        st = os.lstat(p)
    except OSError:
        return False
    return st.st_uid == os.getuid() and st.st_mtime >= t


def end_of(run_dir: Path, run: dict[str, Any], snap: Snapshot,
           exit_rec: dict[str, Any] | None = None) -> tuple[AttemptEnd, list[dict[str, Any]]]:
    """This attempt's end as the policy reads it, and the checkpoints found (as listed in restart.json).
    ``exit_rec``: the supervisor's own record of the end (exit.json read back could be another's)."""
    s = RunSettings.of_run(run).restart
    cwd = Path(str(run.get("cwd") or run_dir))
    argv = [str(a) for a in run.get("argv") or []]
    step = (snap.get("step") or {}).get("global_step")
    found = find_checkpoints(output_dir_of(argv, cwd), s.checkpoints, cwd, s.complete_marker)
    cps = judge_provenance(found, run_dir, run, step)  # never another run's, nor one ahead of this attempt's line
    newest = newest_complete(cps)
    launched = float(run.get("launched_at_unix") or 0.0)
    cut_short = any(not c.complete and not c.why.startswith(NOT_THIS_RUNS) and (newest is None or c.step > newest.step)
                    and _written_since(c.path, launched)
                    for c in cps)  # a save this attempt began and did not finish (never one another user left)
    ended = dict(snap.get("ended") or {})
    if exit_rec is not None:
        ended.update(exit_rec)
        snap = {**snap, "returncode": exit_rec.get("returncode"), "signal": exit_rec.get("signal")}  # type: ignore[typeddict-item]
    facts = EndFacts(returncode=snap.get("returncode"), signal=snap.get("signal"),
                     stop_requested=bool(ended.get("stop_requested")),
                     scheduler_state=(snap.get("scheduler") or {}).get("state"),
                     traceback_last_line=(snap.get("log") or {}).get("traceback_last_line"), log_tail=log_tail(run_dir),
                     step=step, phase="saving" if cut_short else (snap.get("phase") or {}).get("name"),
                     alert_kinds=frozenset(str(a.get("kind")) for a in snap.get("alerts") or []),
                     scheduler_line=slurm_cancel_line(run_dir, run), oom_kills=_count(ended.get("oom_kills")),
                     oom_where=str(ended.get("oom_where") or "the run's cgroup"),
                     ended=snap.get("returncode") is not None or snap.get("signal") is not None or bool(ended.get("error")),
                     resumed_step=rs if type(rs := (run.get("resumed_from") or {}).get("step")) is int else None)
    cause = classify(facts)
    end = AttemptEnd(attempt=int(run.get("attempt") or 1), cause=cause.cause, evidence=cause.evidence, step=step,
                     checkpoint=str(newest.path) if newest else None, checkpoint_step=newest.step if newest else None,
                     ended_at_unix=_finite(ended.get("ended_at_unix")))
    listed = [{"path": str(c.path), "step": c.step, "kind": c.kind, "complete": c.complete, "why": c.why}
              for c in cps[-LISTED_CHECKPOINTS:]]
    return end, listed


def _count(v: Any) -> int:
    return v if type(v) is int and v > 0 else 0


def _finite(v: Any) -> float:
    return float(v) if type(v) in (int, float) and math.isfinite(v) else time.time()


def decision_words(d: Decision, mode: str, backoff_s: float) -> str:
    """One line: ``would restart in 30 s from …/checkpoint-40 (observe mode: nothing started): killed_by_signal …``."""
    if d.verdict == RESTART:
        where = f"from {d.checkpoint}" if d.checkpoint else "from scratch"
        lost = f"; {d.lost_steps} steps lost" if d.lost_steps else ""
        head = (f"would restart {where} (observe mode: nothing started)" if mode == OBSERVE
                else f"restarting {where} when Slurm runs the requeued job" if slurm_requeued(d.evidence)
                else f"restarting in {backoff_s:g} s {where}")
        return f"{head}: {d.reason.split(':', 1)[0]}: {d.evidence}{lost}"
    return f"{'would stop' if mode == OBSERVE else 'not restarting'}: {d.reason}; {d.evidence}"


def restarts_so_far(run: dict[str, Any]) -> int:
    """How many restarts the policy made in a row up to this attempt: the supervisor's own run record (its
    ``resumed_from``, set by the policy's launch), 0 for an attempt someone launched."""
    rf = run.get("resumed_from")
    n = rf.get("restarts") if isinstance(rf, dict) else None
    return n if type(n) is int and n >= 0 else 0


def decide_after(run_dir: Path, run: dict[str, Any], snap: Snapshot, log: Callable[[str], None],
                 exit_rec: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Decide after the attempt's end and record it in restart.json; the record, or None when the policy is off.
    A decision that could not be recorded never restarts (``recorded`` false): restart.json is the history the
    crash-loop rule reads."""
    s = RunSettings.of_run(run).restart
    if s.mode == OFF:
        return None
    end, listed = end_of(run_dir, run, snap, exit_rec)
    previous = previous_ends(run_dir, end.attempt)
    # a checkpoint whose path others can change is never resumed from: STOP, or from scratch (checkpointpath.py)
    d, unsafe = judge_decision(decide(previous, end, s, restarts_so_far(run)), s, run_dir)
    record = {"v": 1, "attempts": [asdict(e) for e in [*previous, end]],
              "decision": {**d.as_record(), "mode": s.mode, "cause": end.cause,
                           "words": decision_words(d, s.mode, s.backoff_s)
                           + (refused_words(listed, d.checkpoint_step) if d.verdict == RESTART else ""),
                           "decided_at_unix": time.time(), "backoff_s": s.backoff_s, "unsafe_checkpoint": unsafe},
              "checkpoints": listed}
    record["decision"]["restarts"] = restarts_so_far(run)
    try:
        write_json_atomic(run_dir / RESTART_JSON, record, mode=0o644)
        record["recorded"] = True
    except OSError as e:
        record["recorded"] = False
        log(f"could not record the restart decision: {e}")
    log(f"restart policy ({s.mode}): {record['decision']['words']}")
    return record


def page_decision(run_dir: Path, run: dict[str, Any], snap: Snapshot, record: dict[str, Any],
                  log: Callable[[str], None], alert: dict[str, Any] | None = None) -> None:
    """Page the decision through the run's [alerts] channels (not for a completed run or the operator's stop: the
    finished page and the stop say those), or ``alert`` (its outcome), and wait for the delivery, bounded."""
    from stepwatch.monitors.watch.delivery import Deliverer  # noqa: PLC0415
    from stepwatch.monitors.watch.loop import AttemptFile  # noqa: PLC0415

    d = record["decision"]
    if alert is None and d["cause"] in ("completed", "operator_stop"):
        return
    alert = alert or {"id": f"a{d['attempt']}-restart", "kind": "restart",
                      "level": "warning" if d["verdict"] == RESTART else "error", "message": d["words"]}
    config = dict((run.get("config") or {}).get("alerts") or {})
    config["urls"] = read_push_urls(run_dir)
    out = AttemptFile(run_dir / ALERTS_JSONL, log)
    try:
        deliverer = Deliverer(run_dir, out.append_json, config, str(run.get("name") or run_dir.name), log=log)
        deliverer.submit({**alert, "headline": headline_of(snap, socket.gethostname())})
        deliverer.wait(40.0)
    finally:
        out.close()


def run_policy(run_dir: Path, run: dict[str, Any], log: Callable[[str], None],
               exit_rec: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The supervisor's call once its attempt ended: decide, record, page. Never raises; None when off."""
    if RunSettings.of_run(run).restart.mode == OFF:
        return None
    try:
        from stepwatch.monitors.snapshot.observer import snapshot  # noqa: PLC0415

        snap = snapshot(run_dir)
        record = decide_after(run_dir, run, snap, log, exit_rec)
        if record is not None:
            page_decision(run_dir, run, snap, record, log)
        return record
    except Exception as e:  # noqa: BLE001 - a policy bug must never cost the exit record or the pages
        log(f"restart policy: {type(e).__name__}: {e}")
        return None


def _backoff_begins(run_dir: Path, record: dict[str, Any], log: Callable[[str], None]) -> bool:
    """Record when the back-off begins (the decision's page and the exporter's last scrape came first): the views
    count the restart down from it. Always True (a record that cannot be written costs the countdown, not the restart)."""
    record["decision"]["backoff_from_unix"] = time.time()
    try:
        write_json_atomic(run_dir / RESTART_JSON, record, mode=0o644)
    except OSError as e:
        log(f"could not record the back-off's start: {e}")
    return True


def enforce(run_dir: Path, run: dict[str, Any], record: dict[str, Any] | None, stop: threading.Event,
            log: Callable[[str], None]) -> dict[str, Any] | None:
    """``enforce`` and RESTART: after the back-off (a stop asked for meanwhile cancels it), a new attempt of the run
    as its owner launched it (launcher/relaunch.py: never from a file others can write), its command resuming from
    the checkpoint (a Slurm run: a new job submitted; one Slurm requeued resumes in the same job, launcher/requeue.py); the outcome added to restart.json's decision (``started`` or ``not_started`` with the reason).
    Never raises; returns the updated record."""
    if record is None or record["decision"]["mode"] != ENFORCE or record["decision"]["verdict"] != RESTART:
        return record
    d = record["decision"]
    if not record.get("recorded"):
        d["not_started"] = f"{RESTART_JSON} could not be written: without its history no restart is safe"
    elif (job := slurm_job_id(run)) is not None and slurm_requeued(record["attempts"][-1].get("evidence")):
        d["requeued"] = f"Slurm requeued job {job}: when it runs again, its next attempt starts there (resuming)"
    elif _backoff_begins(run_dir, record, log) and stop.wait(float(d.get("backoff_s") or 0.0)):
        d["not_started"] = "the operator stopped the run during the back-off: no new attempt"
    else:
        try:
            from stepwatch.launcher.launch import launch  # noqa: PLC0415
            from stepwatch.launcher.relaunch import relaunch_config, resume_from  # noqa: PLC0415

            cfg, _changes = relaunch_config(run_dir)
            resume_from(cfg, d["checkpoint"], d["checkpoint_step"], by="restart policy", after_attempt=d["attempt"],
                        restarts=restarts_so_far(run) + 1)
            if stop.is_set():  # asked while the back-off ended
                raise RuntimeError("the operator stopped the run: no new attempt")
            # the operator's reasons for the launch hold for its restarts (as for a requeued job's, requeue.py): a run
            # launched with --override was never restarted, its checklist item failing again (issue 44)
            carried = {"override": (run.get("preflight") or {}).get("override_reason"),
                       "allow_dirty": run.get("allow_dirty_reason")}
            res = launch(cfg, allow_dirty=carried["allow_dirty"], override=carried["override"])
            d["started"] = {"attempt": res.run.get("attempt"), "pid": (res.run.get("process") or {}).get("pid"),
                            "argv": res.run.get("argv"),  # and why it went from scratch, when the checkpoint was refused
                            "unsafe_checkpoint": (res.run.get("resumed_from") or {}).get("unsafe_checkpoint"),
                            "carried": {k: v for k, v in carried.items() if v is not None} or None}
        except Exception as e:  # noqa: BLE001 - a refusal (dirty tree, failed checklist) is a recorded outcome
            d["not_started"] = f"{type(e).__name__}: {str(e)[:800]}"
    log("restart policy (enforce): " + (f"attempt {d['started']['attempt']} started" if "started" in d
                                         else d["requeued"] if "requeued" in d else f"no new attempt: {d['not_started']}"))
    try:
        write_json_atomic(run_dir / RESTART_JSON, record, mode=0o644)
    except OSError as e:
        log(f"could not record the restart: {e}")
    if "not_started" in d and not stop.is_set():  # the decision's page promised a restart: its refusal is paged too
        try:  # (the checkpoint refused at exec names the directory that made it unsafe: launcher/checkpointpath.py)
            from stepwatch.monitors.snapshot.observer import snapshot  # noqa: PLC0415

            page_decision(run_dir, run, snapshot(run_dir), record, log, {
                "id": f"a{d['attempt']}-restart-not-started", "kind": "restart", "level": "error",
                "message": f"the restart did not start: {d['not_started']}"})
        except Exception as e:  # noqa: BLE001 - the record above stands
            log(f"could not page the restart's outcome: {type(e).__name__}: {e}")
    return record
