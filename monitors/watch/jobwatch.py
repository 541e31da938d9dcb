"""The login node's watcher of a Slurm run: ``python -m stepwatch.monitors.watch.jobwatch RUN_DIR``.

Started by ``stepwatch launch`` beside the submitted job (the run on an inherited pipe: ``--run-fd N``), in a session of its own (closing the
terminal or losing SSH leaves it running). Every ``[slurm] poll_s`` seconds it asks Slurm about the
job (:func:`stepwatch.monitors.slurm.query_job`) and writes ``scheduler.json`` (atomically), then
records and delivers the alerts only the scheduler can raise (``job_end``, ``time_limit``; the
supervisor inside the allocation records every other kind). It exits once the job ended (after a
last look and the deliveries in flight), when the run dir holds another attempt (a relaunch; not a requeue of the
same job, nor the restart policy's resubmission after it, whose next attempt it goes on watching; a run.json
mid-rotation, not yet naming the resubmitted job, or written by another user is no other attempt), or
when Slurm has forgotten the job for good (no accounting) and the supervisor's exit record is there.

Its own diagnostics go to ``jobwatch.log``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.runfiles import (
    EXIT_JSON, RUN_JSON, SCHEDULER_JSON, diagnostic, read_json, read_run_fd, write_json_atomic,
)
from stepwatch.monitors.slurm import DEFAULT_POLL_S, is_ended, query_job
from stepwatch.monitors.watch.loop import SCHEDULER_ALERT_KINDS, AlertRecorder

#: Polls in a row Slurm may not know the job before the watcher gives up (with exit.json there).
UNKNOWN_POLLS = 12
#: ... and without exit.json (the job and its supervisor vanished: a state nobody can report on).
UNKNOWN_POLLS_NO_EXIT = 720


def _log(msg: str) -> None:
    """One line to this process's own log (:func:`~stepwatch.monitors.runfiles.diagnostic`)."""
    diagnostic("jobwatch", msg)


def watch_job(run_dir: Path, run: dict[str, Any], log: Callable[[str], None] = _log,
              query: Callable[[str], dict[str, Any]] = query_job, sleep: Callable[[float], None] = time.sleep) -> int:
    """Watch the job of the attempt ``run`` describes (its launcher's record: what the alerts run
    comes from it, never from run.json; ARCHITECTURE.md R17) until it ended; returns the exit status
    (0, or 2 when the run names no Slurm job)."""
    sch = run.get("scheduler")
    if not isinstance(sch, dict):
        sch = {}
    job_id, key = sch.get("job_id"), (run.get("attempt"), run.get("launched_at_unix"))
    if sch.get("kind") != "slurm" or not isinstance(job_id, str) or not job_id.isdigit():
        log(f"{run_dir}: run.json names no Slurm job; nothing to watch")
        return 2
    poll_s = float(sch.get("poll_s") or DEFAULT_POLL_S)
    recorder = AlertRecorder(run_dir, run, log, kinds=SCHEDULER_ALERT_KINDS)
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    last_state, unknown = None, 0
    log(f"watching Slurm job {job_id} of {run_dir} every {poll_s:g} s")
    try:
        while True:
            st = query(job_id)
            st["watcher"] = me
            try:
                write_json_atomic(run_dir / SCHEDULER_JSON, st)
            except OSError as e:
                log(f"could not write {SCHEDULER_JSON}: {e}")
            if st["state"] != last_state:
                log(f"job {job_id}: {st['state']}" + (f" ({st['reason']})" if st.get("reason") else "")
                    + (f"; {st['error']}" if st.get("error") else ""))
                last_state = st["state"]
            try:
                recorder.detect()
            except Exception as e:  # noqa: BLE001 - a detector bug must not end the watching
                log(f"detector: {type(e).__name__}: {e}")
            cur = read_json(run_dir / RUN_JSON) or {}
            if (cur.get("attempt"), cur.get("launched_at_unix")) != key:
                cur = read_json(run_dir / RUN_JSON, os.geteuid()) or {}  # followed only when its owner's own
                cur_sch, rf = cur.get("scheduler"), cur.get("resumed_from")
                new_job = cur_sch.get("job_id") if isinstance(cur_sch, dict) else None
                policy = isinstance(rf, dict) and rf.get("by") == "restart policy" and rf.get("after_attempt") == key[0]
                # No attempt to judge yet: run.json mid-rotation, another user's (never followed, never the end of
                # this watch), or the policy's next attempt written before its job is submitted (the id follows).
                # This job is watched on until there is one, or until it ends.
                judged = bool(cur) and not (policy and new_job is None)
                if judged and new_job != job_id and not (policy and isinstance(new_job, str) and new_job.isdigit()):
                    log("the run dir holds another attempt now: this job's watch ends")
                    return 0
                if judged:
                    # Slurm requeued the job and it runs the next attempt (launcher/requeue.py), or the restart
                    # policy submitted the next attempt as a new job from inside this one (no watcher of its own
                    # there): watched on with the launcher's alert config, its alerts now the new attempt's
                    key = (cur.get("attempt"), cur.get("launched_at_unix"))
                    recorder.finish()
                    recorder = AlertRecorder(run_dir, {**run, "attempt": key[0]}, log, kinds=SCHEDULER_ALERT_KINDS)
                    if new_job == job_id:
                        log(f"job {job_id} was requeued: attempt {key[0]} runs in it; the watch goes on")
                    else:
                        log(f"the restart policy submitted attempt {key[0]} as job {new_job}: the watch follows it")
                        job_id, last_state = str(new_job), None
                        sleep(poll_s)
                        continue  # this poll's state was the last job's
            unknown = unknown + 1 if st["state"] == "UNKNOWN" else 0
            exited = read_json(run_dir / EXIT_JSON) is not None
            if is_ended(st["state"]) or unknown >= (UNKNOWN_POLLS if exited else UNKNOWN_POLLS_NO_EXIT):
                log(f"job {job_id} ended {st['state']}; the watch ends")
                return 0
            sleep(poll_s)
    finally:
        recorder.finish()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[1] != "--run-fd" or not args[2].isdigit():
        print("usage: python -m stepwatch.monitors.watch.jobwatch RUN_DIR --run-fd N", file=sys.stderr)
        return 2
    run = read_run_fd(int(args[2]))
    if run is None:
        _log(f"no run from the launcher on descriptor {args[2]}; nothing to watch")
        return 2
    return watch_job(Path(args[0]).resolve(), run)


if __name__ == "__main__":
    sys.exit(main())
