"""A stop's ladder: INT -> TERM -> KILL to a run's recorded processes, each signal in ``stop.json``.

Carried out by the supervisor on a stop request, or by ``stepwatch stop`` itself when the supervisor
is gone (it takes over the rungs not yet sent).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors import fdreserve
from stepwatch.launcher.slurm import SlurmError, scancel
from stepwatch.monitors.runfiles import PROCS_JSON, STOP_JSON, diagnostic, read_json, utc_iso, write_json_atomic
from stepwatch.monitors.proctree import RecordedProcess
from stepwatch.monitors.signalling import (belongs_to, in_group, never_signalled, owner_uid, send_signal, signal_group,
                                           signal_targets)
from stepwatch.monitors.watchdog import ProcessRef, is_alive

ESCALATION = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
DEFAULT_GRACE_S = 30.0



def log_line(msg: str) -> None:
    """One line to this process's own log (:func:`~stepwatch.monitors.runfiles.diagnostic`)."""
    diagnostic("supervisor", msg)


class Escalation:
    """Carries out a stop: INT -> TERM -> KILL to the training command's process group and to every
    other process of the attempt's recorded tree (``procs.json``, by identity: a worker that moved to
    a session of its own too), each signal recorded in ``stop.json``. The ladder goes on while any of
    them lives (a frozen rank outlives its launcher), a grace between rungs; ``start_at`` skips rungs
    already sent (``stepwatch stop`` taking over from a supervisor that died mid-stop)."""

    POLL_S = 0.2

    def __init__(self, run_dir: Path, leader: ProcessRef, start_at: int = 0, grace_s: float | None = None,
                 still_same_dir: Callable[[], bool] | None = None, job_id: str | None = None,
                 recorded: Callable[[], list[RecordedProcess]] | None = None):
        """``grace_s``: the seconds between rungs (default: stop.json's, as the supervisor reads it);
        ``still_same_dir``: checked before each rung (the CLI's pinned run dir): False ends the ladder;
        ``job_id``: a Slurm run's job, whose steps get each signal too (the supervisor's own record, or
        one Slurm confirmed: never a bare id read from a file); ``recorded``: the tree as the supervisor's own
        recorder holds it (``TreeRecorder.recorded``), else procs.json read under the trust rule (the CLI's)."""
        self.run_dir = run_dir
        self.leader = leader
        self.uid = owner_uid(run_dir)
        self.start_at = start_at
        self.grace_s = grace_s
        self.still_same_dir = still_same_dir or (lambda: True)
        self.last_signal: str | None = None
        self.job_id = job_id
        self.recorded = recorded
        self._seen: dict[tuple[int, float | None], Any] = {}
        self.thread = threading.Thread(target=self._run, name="stop-escalation", daemon=True)

    def start(self) -> None:
        """Begin the escalation in a thread (idempotent: the caller starts it once)."""
        self.thread.start()

    def _others(self) -> list:
        """The recorded processes alive now: procs.json's, and every one an earlier rung saw (a
        relaunch may rotate procs.json under a ladder still running; its processes stay targets)."""
        uid = self.uid
        if self.recorded is not None:
            exclude = never_signalled() | {self.leader.pid}
            targets = [t for t in self.recorded() if t.ref.pid not in exclude and belongs_to(t.ref, uid)]
        else:
            targets = signal_targets(self.run_dir, self.run_dir / PROCS_JSON, exclude={self.leader.pid})
        for t in targets:
            self._seen.setdefault((t.ref.pid, t.ref.create_time), t)
        return [t for t in self._seen.values() if belongs_to(t.ref, uid)]

    def alive(self) -> bool:
        """The command or any recorded process of its tree still runs."""
        return is_alive(self.leader) or bool(self._others())

    def _record(self, sig: signal.Signals, pids: list[int], group: bool) -> None:
        stop = own_stop_record(self.run_dir) or new_stop_record(reason="supervisor received a stop signal")
        t = time.time()
        stop.setdefault("signals", []).append(
            {"signal": sig.name, "sent_at": utc_iso(t), "sent_at_unix": t,
             "pgid": self.leader.pid if group else None, "pids": pids})
        write_json_atomic(self.run_dir / STOP_JSON, stop)

    def _send(self, sig: signal.Signals) -> tuple[bool, list[int]]:
        group = signal_group(self.leader, sig, self.uid)
        pids = [t.ref.pid for t in self._others()
                if not (group and in_group(t.ref.pid, self.leader.pid)) and send_signal(t.ref, sig, self.uid)]
        if not group and send_signal(self.leader, sig, self.uid):  # a leader that left its group
            pids.insert(0, self.leader.pid)
        if self.job_id:  # the job's steps (srun's tasks, on every node): srun takes one INT as "status?"
            try:
                scancel(self.job_id, signal=sig.name.removeprefix("SIG"))
                log_line(f"scancel --signal={sig.name.removeprefix('SIG')} {self.job_id} (the job's steps)")
            except SlurmError as e:
                log_line(f"could not signal the job's steps: {e}")
        return group, pids

    def _run(self) -> None:
        with fdreserve.room():  # stop.json and /proc, with every other descriptor taken too: the stop is the end
            self._escalate()

    def _escalate(self) -> None:
        grace = stop_grace_s(self.run_dir) if self.grace_s is None else self.grace_s
        for sig in ESCALATION[self.start_at:]:
            if not self.alive():
                return
            if not self.still_same_dir():
                log_line(f"the run dir {self.run_dir} was replaced: the stop ends here, nothing more is signalled")
                return
            group, pids = self._send(sig)
            if group or pids:
                self.last_signal = sig.name
                log_line(f"sent {sig.name} to " + ", ".join(
                    ([f"process group {self.leader.pid}"] if group else []) + [f"pid {p}" for p in pids]))
            try:
                self._record(sig, pids, group)
            except OSError as e:  # an unwritable run dir must not stop the stop
                log_line(f"could not record {sig.name} in stop.json: {e}")
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                time.sleep(min(self.POLL_S, max(0.0, deadline - time.monotonic())))
                if not self.alive():
                    return


def own_stop_record(run_dir: Path) -> dict[str, Any] | None:
    """stop.json when this process's user or the run dir's owner wrote it and no one else can have since (the
    trust rule, ``runfiles.trust_problem``), else None: a stop "in progress" or a grace of days that a group member
    put in a shared run dir, or wrote into a stop.json the group may write, neither holds a stop back nor slows it."""
    path = run_dir / STOP_JSON
    owner, me = owner_uid(run_dir), os.geteuid()
    return read_json(path, me, private=True) or (
        read_json(path, owner, private=True) if owner is not None and owner != me else None)


def stop_grace_s(run_dir: Path) -> float:
    grace = (own_stop_record(run_dir) or {}).get("grace_s")
    if isinstance(grace, bool) or not isinstance(grace, (int, float)):  # a JSON number only (true/false refused)
        return DEFAULT_GRACE_S
    return float(grace) if 0 <= grace < 1e7 else DEFAULT_GRACE_S


def new_stop_record(reason: str | None, grace_s: float | None = None) -> dict[str, Any]:
    t = time.time()
    return {"v": 1, "requested_at": utc_iso(t), "requested_at_unix": t, "grace_s": grace_s, "reason": reason,
            "requested_by_pid": None, "signals": [], "ended_by": None}
