"""The supervisor's warden and keeper (:mod:`stepwatch.monitors.watch.warden`): started once the child runs, each
in a session of its own, each holding a copy of the read end of the run's output pipe, so that the run's process
dies of its watchers' loss (SIGPIPE at its next print, or blocked on a full pipe) only once the supervisor, the
warden and the keeper are all gone. The warden stands in for the supervisor (a kill, a SIGSTOP, the back-off
before a restart); the keeper for both, told that the warden is gone by the end of a pipe only the warden holds
the write end of (a ``done`` before it: the warden finished its watch).

Each gets this attempt's record over a pipe (never a file it would re-read: ARCHITECTURE.md R17), with both
identities in it (``wardens``: role, pid, create time), which the supervisor then writes into run.json (0644) for
a view: ``status`` says when none of them lives (monitors/snapshot/watchers.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from collections.abc import Callable

import psutil

from stepwatch.monitors.proctree import HELPER_PIDS, HELPERS_LOCK
from stepwatch.monitors.runfiles import SUPERVISOR_LOG, open_append

#: The warden's and the keeper's command (one module, two roles).
WARDEN_ARGV = (sys.executable, "-P", "-m", "stepwatch.monitors.watch.warden")


def start_wardens(run_dir: Path, run: dict[str, Any], output_fd: int, log: Callable[[str], None]) -> None:
    """Start the warden and the keeper, note them in ``run["wardens"]`` (before the caller writes run.json) and
    hand each the run; a failure is logged: the run goes on, watched by whoever did start."""
    done_r, done_w = os.pipe()  # the warden's "done" to the keeper; its end of file: the warden is gone
    started: list[tuple[str, subprocess.Popen[bytes], int]] = []
    try:
        for role, extra, fd in (("warden", "--done-fd", done_w), ("keeper", "--ahead-fd", done_r)):
            rfd, wfd = os.pipe()
            try:
                with HELPERS_LOCK, open(open_append(run_dir / SUPERVISOR_LOG), "ab") as wlog:
                    p = subprocess.Popen([*WARDEN_ARGV, str(run_dir), "--run-fd", str(rfd), "--output-fd",
                                          str(output_fd), extra, str(fd)],
                                         stdin=subprocess.DEVNULL, stdout=wlog, stderr=wlog, start_new_session=True,
                                         close_fds=True, pass_fds=(rfd, output_fd, fd), cwd=str(run_dir))
                    HELPER_PIDS.add(p.pid)  # never part of the run's tree, never signalled by a stop
                started.append((role, p, wfd))
            except (OSError, subprocess.SubprocessError) as e:
                os.close(wfd)
                log(f"no {role}: {e}; " + ("a kill of this supervisor would go unpaged" if role == "warden"
                                           else "the run's output has one reader fewer"))
            finally:
                os.close(rfd)
    finally:
        os.close(done_r)
        os.close(done_w)
    rows = []
    for role, p, _ in started:
        try:
            ctime: float | None = psutil.Process(p.pid).create_time()
        except psutil.Error:
            ctime = None
        rows.append({"role": role, "pid": p.pid, "create_time": ctime})
    run["wardens"] = rows
    data = json.dumps(run).encode("utf-8")
    for role, p, wfd in started:
        threading.Thread(target=_hand_over, args=(role, p, wfd, data, log), name=role, daemon=True).start()


def _hand_over(role: str, p: subprocess.Popen[bytes], wfd: int, data: bytes, log: Callable[[str], None]) -> None:
    try:
        with os.fdopen(wfd, "wb") as f:
            f.write(data)
    except OSError as e:
        log(f"the {role} did not take the run: {e}")
    p.wait()  # reaped here if it ends first (it normally outlives this process)
