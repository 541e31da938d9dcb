"""``stepwatch stop``: INT -> TERM -> KILL, carried out by the supervisor.

The CLI writes the request into ``stop.json`` and sends SIGUSR1 to the supervisor (captured pid and
create_time), which escalates and records every signal. An SSH drop in the middle of a stop therefore
cannot leave it half done. When the supervisor is gone but the child still runs, the CLI escalates
itself, recording the same way.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from stepwatch.launcher.supervisor import Escalation
from stepwatch.monitors.runfiles import EXIT_JSON, RUN_JSON, STOP_JSON, read_json, utc_iso, write_json_atomic
from stepwatch.monitors.rundirs import run_survivors
from stepwatch.monitors.watchdog import ProcessRef, is_alive, wait_for_exit


class StopError(Exception):
    """A stop that cannot be carried out; the message says why."""


class StopInProgress(StopError):
    """A stop was already requested for this attempt and has not finished; nothing is overwritten."""


STARTING_WAIT_S = 30.0


def _wait_while_starting(run_dir: Path, run: dict) -> dict:
    """A run.json without pids, exit.json or start error is an attempt still starting: wait (up to
    STARTING_WAIT_S) for the supervisor to record the child, rather than call it ended."""
    deadline = time.monotonic() + STARTING_WAIT_S
    while ((run.get("process") or {}).get("pid") is None and not run.get("start_error")
           and read_json(run_dir / EXIT_JSON) is None and time.monotonic() < deadline):
        time.sleep(0.05)
        run = read_json(run_dir / RUN_JSON) or run
    return run


@dataclass
class StopOutcome:
    """What ``stop`` found or did: ``already_ended``, the exit record, and the stop record."""

    already_ended: bool
    exit: dict | None
    stop: dict | None
    waited: bool
    ended: bool = False  # the process is gone (exit may still be None when the supervisor was gone)
    supervisor_gone: bool = False


def request_stop(run_dir: Path, grace_s: float = 30.0, reason: str | None = None, wait: bool = True,
                 wait_timeout_s: float | None = None) -> StopOutcome:
    """Ask the run in ``run_dir`` to stop; with ``wait`` block until it ended (or the timeout).

    Raises StopError when there is no run.json or the request cannot be written (read-only run dir).
    """
    if not (grace_s >= 0 and math.isfinite(grace_s)):
        raise StopError(f"the grace must be a finite number of seconds >= 0; got {grace_s!r}")
    run = read_json(run_dir / RUN_JSON)
    if run is None:
        raise StopError(f"no readable {RUN_JSON} in {run_dir}: not a run directory")
    run = _wait_while_starting(run_dir, run)
    proc = ProcessRef.from_json(run.get("process"))
    if not is_alive(proc):
        return StopOutcome(True, read_json(run_dir / EXIT_JSON), read_json(run_dir / STOP_JSON), False)
    current = read_json(run_dir / STOP_JSON)
    if current is not None and current.get("ended_by") is None and (current.get("requested_at_unix") or 0) >= (
            run.get("launched_at_unix") or 0):
        sent = ", ".join(x["signal"] for x in current.get("signals", [])) or "none yet"
        raise StopInProgress(f"a stop of {run_dir.name} is already in progress (requested {current.get('requested_at')}, "
                             f"grace {current.get('grace_s')} s; sent so far: {sent}); the supervisor escalates. "
                             f"Follow it with: stepwatch watch {run_dir} --plain")
    t = time.time()
    stop = {"v": 1, "requested_at": utc_iso(t), "requested_at_unix": t, "grace_s": grace_s, "reason": reason,
            "requested_by_pid": os.getpid(), "signals": [], "ended_by": None}
    try:
        write_json_atomic(run_dir / STOP_JSON, stop)
    except OSError as e:
        raise StopError(f"cannot write {run_dir / STOP_JSON}: {e}") from None
    sup = ProcessRef.from_json(run.get("supervisor"))
    if is_alive(sup):
        os.kill(sup.pid, signal.SIGUSR1)
    else:
        # No supervisor to carry it out: escalate from here (recorded in stop.json all the same).
        done = threading.Event()
        esc = Escalation(run_dir, int((run.get("process") or {}).get("pgid") or proc.pid), done)
        esc.start()
        gone = wait_for_exit(proc, timeout_s=3 * grace_s + 5)
        done.set()
        esc.thread.join(timeout=1)
        st = read_json(run_dir / STOP_JSON) or stop
        if gone:
            st["ended_by"] = {"last_signal_sent": esc.last_signal, "returncode": None, "signal": None,
                              "ended_at": utc_iso(time.time()),
                              "note": "the supervisor was gone: the CLI escalated, and no exit status can be known"}
            try:
                write_json_atomic(run_dir / STOP_JSON, st)
            except OSError:
                pass
        return StopOutcome(False, read_json(run_dir / EXIT_JSON), st, True, gone, True)
    if not wait:
        return StopOutcome(False, None, read_json(run_dir / STOP_JSON), False)
    timeout = wait_timeout_s if wait_timeout_s is not None else 2 * grace_s + 10
    wait_for_exit(proc, timeout_s=timeout, poll_s=0.1)
    deadline = time.monotonic() + 5
    ex = read_json(run_dir / EXIT_JSON)
    while ex is None and is_alive(sup) and time.monotonic() < deadline:
        time.sleep(0.05)
        ex = read_json(run_dir / EXIT_JSON)
    if ex is not None:  # the supervisor writes ended_by right after exit.json
        for _ in range(40):
            st = read_json(run_dir / STOP_JSON) or {}
            if st.get("ended_by") is not None or not is_alive(sup):
                break
            time.sleep(0.05)
    return StopOutcome(False, ex, read_json(run_dir / STOP_JSON), True, not is_alive(proc))


def kill_survivors(run_dir: Path) -> list[dict]:
    """SIGKILL each survivor of an ended run (re-checked just before the signal); returns them."""
    killed = []
    for p in run_survivors(run_dir):
        try:
            os.kill(p["pid"], signal.SIGKILL)
            killed.append(p)
        except ProcessLookupError:
            pass
    return killed
