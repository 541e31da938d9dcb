"""The supervisor's warden: ``python -m stepwatch.monitors.watch.warden RUN_DIR --run-fd N``.

A second small process of the run's owner, started by the supervisor once the child runs, in a
session of its own, with the supervisor's record of the attempt on an inherited pipe (ARCHITECTURE.md
R17). It waits on the supervisor by identity (a pidfd: notice the instant it ends). A supervisor that
ended after writing exit.json saw the run's end and delivered its alerts: the warden ends too. A
supervisor that ended without one (the OOM killer, ``kill -9``, a crash) leaves nobody to page the
run's end, so the warden:

1. records and delivers a ``supervisor_lost`` alert at once (the run goes on, unwatched by the
   supervisor: no exit status will be recorded);
2. takes the detector loop over (:class:`~stepwatch.monitors.watch.loop.AlertRecorder`, the same
   code: what the supervisor recorded is not recorded again), about once a second, until the run's
   processes are gone and the end was recorded, then waits (bounded) for the deliveries.

It holds a copy of the run's output pipe (:mod:`.logpump`) and, once the supervisor is lost, pumps
the output into train.log itself: the run's next print neither blocks nor dies of SIGPIPE. Until
then it imports nothing heavy and reads nothing. Its diagnostics go to ``supervisor.log``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.runfiles import EXIT_JSON, TRAIN_LOG, diagnostic, read_json, read_run_fd
from stepwatch.monitors.watchdog import ProcessRef, is_alive, wait_for_exit

#: How often the detector loop looks once the warden took it over (s): the supervisor's own pace.
LOOP_S = 1.0
#: Looks after the run's processes are gone, for the end to be recorded (the observer's state turns
#: from running to unknown once the process probe says dead: the next look).
FINAL_LOOKS = 3


def _log(msg: str) -> None:
    """One line to this process's own log (:func:`~stepwatch.monitors.runfiles.diagnostic`)."""
    diagnostic("warden", msg)


def _same_attempt(run_dir: Path, run: dict[str, Any]) -> bool:
    """Whether the run dir still holds ``run``'s attempt: only a run.json of the owner's (a relaunch) says it
    does not; one another user put there (a group member, in a shared runs dir) says nothing."""
    cur = read_json(run_dir / "run.json", os.geteuid())
    return cur is None or (cur.get("attempt"), cur.get("launched_at_unix")) == (run.get("attempt"), run.get("launched_at_unix"))


def ward(run_dir: Path, run: dict[str, Any], log: Callable[[str], None] = _log, loop_s: float = LOOP_S,
         output_fd: int | None = None) -> int:
    """Wait for the supervisor of ``run``; page its loss and the run's end when it dies first, and
    pump the run's output (``output_fd``, the read end of its pipe) into train.log from then on.
    Returns 0 (the supervisor ended normally, or the loss was handled), 2 (a record naming no
    supervisor or no process)."""
    sup, child = ProcessRef.from_json(run.get("supervisor")), ProcessRef.from_json(run.get("process"))
    if sup is None or child is None:
        log("the run names no supervisor or no process: nothing to ward")
        return 2
    wait_for_exit(sup)
    if read_json(run_dir / EXIT_JSON, os.geteuid()) is not None or not _same_attempt(run_dir, run):
        return 0  # it saw the end (or a relaunch took the run dir over): nothing is left to page
    pump = None
    if output_fd is not None:  # first: a full pipe would block the run's next print
        from stepwatch.monitors.watch.logpump import LogPump  # noqa: PLC0415

        pump = LogPump(output_fd, run_dir / TRAIN_LOG, log).start()
    from stepwatch.monitors.snapshot.alerts import alert, headline_of  # noqa: PLC0415 - only once the supervisor is lost
    from stepwatch.monitors.watch.loop import SCHEDULER_ALERT_KINDS, AlertRecorder  # noqa: PLC0415

    alive = is_alive(child)
    log(f"the supervisor (pid {sup.pid}) ended without an exit record; the run's process {child.pid} is "
        + ("alive: paging the loss, and taking the watch over" if alive else "gone too: paging its end"))
    recorder = AlertRecorder(run_dir, run, log, skip=SCHEDULER_ALERT_KINDS)
    try:
        lost = alert({}, run.get("attempt"), "supervisor_lost", str(sup.pid),
                     f"stepwatch's supervisor (pid {sup.pid}) of {run.get('name') or run_dir.name} is gone "
                     f"(killed: the OOM killer, kill -9, a crash); the run's process {child.pid} "
                     + ("goes on, no longer supervised: no exit status will be recorded, a stop is "
                        "carried out by `stepwatch stop`; its end will still be paged"
                        if alive else "has ended too"), time.time())
        try:
            headline = headline_of(recorder.observer.refresh(), recorder.host)  # host · run · STATE · step N/M
        except Exception as e:  # noqa: BLE001 - the page goes without its first line rather than not at all
            log(f"no headline for the page: {type(e).__name__}: {e}")
            headline = None
        recorder.record(lost, {"supervisor_pid": sup.pid, "process_pid": child.pid, "process_alive": alive},
                        page={**lost, "headline": headline})
        looks_after_end = 0
        while looks_after_end < FINAL_LOOKS:
            try:
                snap = recorder.detect()
            except Exception as e:  # noqa: BLE001 - a detector bug must not end the warding
                log(f"detector: {type(e).__name__}: {e}")
                snap = None
            if not is_alive(child):
                looks_after_end += 1
                if snap is not None and any(a["kind"] == "watchdog" for a in snap.get("alerts") or []):
                    break  # the end is recorded and handed to the deliverer
            if not _same_attempt(run_dir, run):
                log("the run dir holds another attempt now: the warding ends")
                break
            wait_for_exit(child, timeout_s=loop_s, poll_s=loop_s)
    finally:
        recorder.finish()
    if pump is not None:
        pump.drain()
    log("the warding ends: what it recorded was handed to the channels")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 5) or args[1] != "--run-fd" or not args[2].isdigit() or (
            len(args) == 5 and (args[3] != "--output-fd" or not args[4].isdigit())):
        print("usage: python -m stepwatch.monitors.watch.warden RUN_DIR --run-fd N [--output-fd M]", file=sys.stderr)
        return 2
    run = read_run_fd(int(args[2]))
    if run is None:
        _log(f"no run from the supervisor on descriptor {args[2]}; nothing to ward")
        return 2
    try:
        return ward(Path(args[0]).resolve(), run, output_fd=int(args[4]) if len(args) == 5 else None)
    except Exception as e:  # noqa: BLE001 - its own log says why, never a traceback into nowhere
        _log(f"crashed: {type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
