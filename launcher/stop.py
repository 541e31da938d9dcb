"""``stepwatch stop``: INT -> TERM -> KILL, carried out by the supervisor.

The CLI writes the request into ``stop.json`` and sends SIGUSR1 to the supervisor (captured pid and
create_time), which escalates and records every signal. An SSH drop in the middle of a stop therefore
cannot leave it half done. When the supervisor is gone but the child still runs (before the stop or
in the middle of it), the CLI runs the ladder itself from where it was, recording the same way.

Every signal goes through :mod:`stepwatch.monitors.proctree`: only to a process whose pid and create
time the run's supervisor recorded and that belongs to the run dir's owner.
"""

from __future__ import annotations

import math
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from stepwatch.launcher.slurm import SlurmError, job_mismatch, scancel, slurm_job_id
from stepwatch.launcher.escalation import ESCALATION, Escalation, own_stop_record
from stepwatch.launcher.restartrun import recorded_decision
from stepwatch.monitors.fold.stepcolumns import unix_time
from stepwatch.monitors.signalling import belongs_to, owner_uid, send_signal
from stepwatch.monitors.runfiles import EXIT_JSON, RUN_JSON, STOP_JSON, read_json, utc_iso, write_json_atomic
from stepwatch.monitors.rundirs import foreign_records
from stepwatch.monitors.runsettings import RunSettings
from stepwatch.monitors.rundirs import run_survivors as run_survivors  # re-exported for the CLI
from stepwatch.monitors.watchdog import ProcessRef, is_alive, wait_for_exit
from stepwatch.monitors.states import ENFORCE, restart_awaited


class StopError(Exception):
    """A stop that cannot be carried out; the message says why."""


def _user_name() -> str:
    """Who asks for the stop (the name of this process's effective uid; the uid when it has none)."""
    try:
        import pwd  # noqa: PLC0415

        return pwd.getpwuid(os.geteuid()).pw_name
    except (KeyError, ImportError):
        return f"uid {os.geteuid()}"


class StopInProgress(StopError):
    """A stop was already requested for this attempt and has not finished; nothing is overwritten."""


STARTING_WAIT_S = 30.0


def _wait_while_starting(run_dir: Path, run: dict, uid: int | None) -> dict:
    """A run.json without pids, exit.json or start error is an attempt still starting: wait (up to
    STARTING_WAIT_S) for the supervisor to record the child, rather than call it ended."""
    deadline = time.monotonic() + STARTING_WAIT_S
    while ((run.get("process") or {}).get("pid") is None and not run.get("start_error")
           and read_json(run_dir / EXIT_JSON) is None and time.monotonic() < deadline):
        time.sleep(0.05)
        run = read_json(run_dir / RUN_JSON, uid) or run
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
    restart_cancelled: bool = False  # the restart policy's pending new attempt was called off


def refuse_foreign(run_dir: Path) -> None:
    """A stop signals as whoever runs it: refuse a run dir whose records were not written by the
    run dir's owner (another user's run.json in a group-writable dir, a symlinked record)."""
    why = foreign_records(run_dir)
    if why:
        raise StopError(f"refusing to signal anything for {run_dir.name}: {why}")


class PinnedDir:
    """The run dir as it was when the stop began (device and inode, never through a symlink):
    :meth:`same` is False once anything replaced it or a directory above it (a swapped parent)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        try:
            st = run_dir.lstat()
        except OSError as e:
            raise StopError(f"cannot read {run_dir}: {e.strerror}") from None
        self.key = (st.st_dev, st.st_ino, st.st_uid)

    def same(self) -> bool:
        try:
            st = self.run_dir.lstat()
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino, st.st_uid) == self.key

    def check(self) -> None:
        if not self.same():
            raise StopError(f"{self.run_dir} was replaced while the stop ran (it, or a directory above it): "
                            "nothing more is signalled or written")


def _ladder_sent(stop: dict) -> int:
    """How many rungs of the INT -> TERM -> KILL ladder ``stop.json`` says were sent."""
    names = [s.get("signal") for s in stop.get("signals") or [] if isinstance(s, dict)]
    done = 0
    for i, sig in enumerate(ESCALATION):
        if sig.name in names:
            done = i + 1
    return done


def request_stop(run_dir: Path, grace_s: float = 30.0, reason: str | None = None, wait: bool = True,
                 wait_timeout_s: float | None = None) -> StopOutcome:
    """Ask the run in ``run_dir`` to stop; with ``wait`` block until it ended (or the timeout).

    Raises StopError when there is no run.json, its records were not written by the run dir's owner,
    or the request cannot be written (read-only run dir).
    """
    if not (grace_s >= 0 and math.isfinite(grace_s)):
        raise StopError(f"the grace must be a finite number of seconds >= 0; got {grace_s!r}")
    pin = PinnedDir(run_dir)
    if why := foreign_records(run_dir):
        return _stop_by_owner_copy(run_dir, why, grace_s, reason, wait, wait_timeout_s, pin)
    uid = owner_uid(run_dir)
    run = read_json(run_dir / RUN_JSON, uid)
    if run is None:
        raise StopError(f"no readable {RUN_JSON} of the run dir's owner in {run_dir}: not a run directory")
    job = slurm_job_id(run)
    if job and not is_alive(ProcessRef.from_json(run.get("process"))) and (
            read_json(run_dir / EXIT_JSON) is None or _requeued(run_dir, run) or _queued_again(run, job, uid)):
        return _stop_job(run_dir, run, job, grace_s, reason, wait, wait_timeout_s)
    run = _wait_while_starting(run_dir, run, uid)
    pin.check()
    refuse_foreign(run_dir)
    proc = ProcessRef.from_json(run.get("process"))
    sup = ProcessRef.from_json(run.get("supervisor"))
    if proc is not None and is_alive(proc) and not belongs_to(proc, uid):
        raise StopError(f"refusing to signal pid {proc.pid}: run.json names it as the training process of "
                        f"{run_dir.name}, but it does not belong to the run dir's owner (uid {uid}) "
                        "or has no recorded create time")
    if not is_alive(proc):
        cancelled = False
        if sup is not None and belongs_to(sup, uid):  # the supervisor outlives its child: it may be about to restart
            pin.check()  # ([restart] enforce) the signal cancels a restart decided or still to be decided
            send_signal(sup, signal.SIGUSR1, uid)
            cancelled = restart_pending(run_dir) or _restart_enforced(run)
        return StopOutcome(True, read_json(run_dir / EXIT_JSON), read_json(run_dir / STOP_JSON), False,
                           restart_cancelled=cancelled)
    sup_alive = belongs_to(sup, uid) if sup is not None else False
    current = own_stop_record(run_dir)
    in_progress = current is not None and current.get("ended_by") is None and (
        unix_time(current.get("requested_at_unix")) or 0.0) >= (unix_time(run.get("launched_at_unix")) or 0.0)
    if in_progress and current is not None and sup_alive:  # (in_progress implies a current stop.json)
        sent = ", ".join(str(x.get("signal")) for x in current.get("signals") or [] if isinstance(x, dict)) or "none yet"
        raise StopInProgress(f"a stop of {run_dir.name} is already in progress (requested {current.get('requested_at')}, "
                             f"grace {current.get('grace_s')} s; sent so far: {sent}); the supervisor escalates. "
                             f"Follow it with: stepwatch watch {run_dir} --plain")
    start_at = 0
    if in_progress and current is not None:  # the supervisor died mid-stop: this command takes the ladder over
        start_at = _ladder_sent(current)
        t = time.time()
        stop = {"v": 1, "requested_at": utc_iso(t), "requested_at_unix": t, "grace_s": grace_s, "reason": reason,
                "requested_by_pid": os.getpid(), "requested_by_user": _user_name(), "ended_by": None,  # rebuilt: only validated fields are kept
                "signals": [{"signal": x["signal"], "sent_at_unix": unix_time(x.get("sent_at_unix"))}
                            for x in current.get("signals") or []
                            if isinstance(x, dict) and x.get("signal") in {s.name for s in ESCALATION}][:len(ESCALATION)],
                "notes": [f"{utc_iso(t)}: the supervisor was gone; stepwatch stop (pid {os.getpid()}) took the "
                          f"escalation over after {start_at} rung(s)"]}
    else:
        stop = _new_request(grace_s, reason)
    _write_stop(run_dir, stop, pin)
    if sup_alive and sup is not None:  # (sup_alive implies a recorded supervisor)
        pin.check()
        send_signal(sup, signal.SIGUSR1, uid)
    else:
        return _escalate_here(run_dir, proc, stop, start_at, grace_s, pin)
    if not wait:
        return StopOutcome(False, None, read_json(run_dir / STOP_JSON), False)
    timeout = wait_timeout_s if wait_timeout_s is not None else 2 * grace_s + 10
    deadline = time.monotonic() + timeout
    wait_for_exit(proc, timeout_s=timeout, poll_s=0.1)
    ex = read_json(run_dir / EXIT_JSON)
    while ex is None and is_alive(sup) and time.monotonic() < deadline + 5:
        time.sleep(0.05)
        ex = read_json(run_dir / EXIT_JSON)
    if ex is not None:  # the supervisor writes ended_by once the whole tree is gone (or the ladder ran out)
        while time.monotonic() < deadline + 5:
            st = own_stop_record(run_dir) or {}  # a member's "ended" never cuts the wait short
            if st.get("ended_by") is not None or not is_alive(sup):
                break
            time.sleep(0.05)
    return StopOutcome(False, ex, read_json(run_dir / STOP_JSON), True, not is_alive(proc))


def _new_request(grace_s: float, reason: str | None) -> dict:
    t = time.time()
    return {"v": 1, "requested_at": utc_iso(t), "requested_at_unix": t, "grace_s": grace_s, "reason": reason,
            "requested_by_pid": os.getpid(), "requested_by_user": _user_name(), "signals": [], "ended_by": None}


def _write_stop(run_dir: Path, stop: dict, pin: PinnedDir) -> None:
    pin.check()
    try:
        write_json_atomic(run_dir / STOP_JSON, stop)
    except OSError as e:
        raise StopError(f"cannot write {run_dir / STOP_JSON}: {e}") from None


def _stop_by_owner_copy(run_dir: Path, why: str, grace_s: float, reason: str | None, wait: bool,
                        wait_timeout_s: float | None, pin: PinnedDir) -> StopOutcome:
    """The run dir's records are not all its owner's (a member replaced run.json in a shared runs dir): ask the
    supervisor that your own copy of the launch names (launcher/trust.py; the supervisor notes itself there at
    its start), only when it is alive and yours; it carries the ladder out as for any stop. Else refused."""
    from stepwatch.launcher.trust import read_owner_copy  # noqa: PLC0415

    doc, _ = read_owner_copy(run_dir)
    uid = os.geteuid()
    sup, proc = ProcessRef.from_json((doc or {}).get("supervisor")), ProcessRef.from_json((doc or {}).get("process"))
    if sup is None or not belongs_to(sup, uid):
        raise StopError(f"refusing to signal anything for {run_dir.name}: {why}; and no copy of your launch names "
                        "a live supervisor of yours to ask")
    print(f"{run_dir.name}: {why}: asking the supervisor your launch recorded (pid {sup.pid})", file=sys.stderr)
    stop = _new_request(grace_s, reason)
    _write_stop(run_dir, stop, pin)
    send_signal(sup, signal.SIGUSR1, uid)
    if not wait:
        return StopOutcome(False, None, stop, False)
    deadline = time.monotonic() + (wait_timeout_s if wait_timeout_s is not None else 2 * grace_s + 10)
    if proc is not None:
        wait_for_exit(proc, timeout_s=max(0.0, deadline - time.monotonic()), poll_s=0.1)
    ex = read_json(run_dir / EXIT_JSON, uid)
    while ex is None and is_alive(sup) and time.monotonic() < deadline + 5:
        time.sleep(0.05)
        ex = read_json(run_dir / EXIT_JSON, uid)
    return StopOutcome(False, ex, own_stop_record(run_dir), True, proc is None or not is_alive(proc))


def _stop_job(run_dir: Path, run: dict, job: str, grace_s: float, reason: str | None, wait: bool,
              wait_timeout_s: float | None) -> StopOutcome:
    """A Slurm run whose training process this machine does not see: queued (``scancel``: nothing
    has started), or running on another node (``scancel --batch --signal=USR1``: the supervisor there
    carries out the ladder, as it does for a local stop). Recorded in stop.json like any stop."""
    from stepwatch.monitors.slurm import WAITING_STATES, is_ended, query_job  # noqa: PLC0415

    st = query_job(job)
    if is_ended(st["state"]):
        return StopOutcome(True, read_json(run_dir / EXIT_JSON), read_json(run_dir / STOP_JSON), False)
    why = job_mismatch(job, run_dir, owner_uid(run_dir))
    if why:
        raise StopError(f"refusing to cancel Slurm job {job}, which run.json names: {why}. Nothing was cancelled.")
    t = time.time()
    queued = st["state"] in WAITING_STATES or (run.get("supervisor") or {}).get("pid") is None
    stop = {"v": 1, "requested_at": utc_iso(t), "requested_at_unix": t, "grace_s": grace_s, "reason": reason,
            "requested_by_pid": os.getpid(), "requested_by_user": _user_name(), "ended_by": None,
            "signals": [{"signal": "scancel" if queued else "SIGUSR1 (scancel --batch)", "sent_at": utc_iso(t),
                         "sent_at_unix": t, "pgid": None, "pids": [], "job_id": job}]}
    try:
        write_json_atomic(run_dir / STOP_JSON, stop)
    except OSError as e:
        raise StopError(f"cannot write {run_dir / STOP_JSON}: {e}") from None
    try:
        scancel(job) if queued else scancel(job, signal="USR1", batch=True)
    except SlurmError as e:
        raise StopError(f"Slurm would not take the stop of job {job}: {e}") from None
    if not wait:
        return StopOutcome(False, None, stop, False)
    deadline = time.monotonic() + (wait_timeout_s if wait_timeout_s is not None else 2 * grace_s + 30)
    while not (ended := is_ended(query_job(job)["state"])) and time.monotonic() < deadline:
        time.sleep(0.5)
    if queued and ended:
        stop["ended_by"] = {"last_signal_sent": "scancel", "returncode": None, "signal": None,
                            "ended_at": utc_iso(time.time()), "job_cancelled_while": st["state"]}
        write_json_atomic(run_dir / STOP_JSON, stop)
    return StopOutcome(False, read_json(run_dir / EXIT_JSON), stop, True, ended)


def _escalate_here(run_dir: Path, proc: ProcessRef, stop: dict, start_at: int, grace_s: float,
                   pin: PinnedDir) -> StopOutcome:
    """No supervisor to carry the stop out: run the ladder from this command (recorded in stop.json
    all the same), to the command's group and every recorded process of its tree, with this
    command's grace, checking before each rung that the run dir is still the one pinned."""
    job = slurm_job_id(read_json(run_dir / RUN_JSON, owner_uid(run_dir)) or {})
    if job and job_mismatch(job, run_dir, owner_uid(run_dir)):
        job = None  # a job Slurm does not confirm as this run's gets no signal; the processes here still do
    esc = Escalation(run_dir, proc, start_at=start_at, grace_s=grace_s, still_same_dir=pin.same, job_id=job)
    esc.start()
    esc.thread.join()
    gone = not esc.alive()
    st = own_stop_record(run_dir) or stop  # rewritten below: never from a record others may have written
    if gone and pin.same():
        st["ended_by"] = {"last_signal_sent": esc.last_signal, "returncode": None, "signal": None,
                          "ended_at": utc_iso(time.time()),
                          "note": "the supervisor was gone: the CLI escalated, and no exit status can be known"}
        try:
            write_json_atomic(run_dir / STOP_JSON, st)
        except OSError:
            pass
    return StopOutcome(False, read_json(run_dir / EXIT_JSON), st, True, gone, True)


def kill_survivors(run_dir: Path) -> list[dict]:
    """SIGKILL each survivor of an ended run: a process its supervisor recorded, alive now with the
    recorded create time and the run owner's (checked through a pidfd right before the signal)."""
    pin = PinnedDir(run_dir)
    refuse_foreign(run_dir)
    uid = owner_uid(run_dir)
    killed = []
    for p in run_survivors(run_dir):
        pin.check()
        if send_signal(ProcessRef(p["pid"], p["create_time"]), signal.SIGKILL, uid):
            killed.append(p)
    return killed


def restart_pending(run_dir: Path) -> bool:
    """The restart policy decided RESTART in enforce mode and has neither started the next attempt nor given up (nor
    left it to Slurm, which requeued the job: launcher/requeue.py)."""
    return restart_awaited(recorded_decision(run_dir)[1])


def _requeued(run_dir: Path, run: dict) -> bool:
    """Slurm requeued this attempt's job (restart.json, the policy's record): its next attempt starts when the job runs
    again (launcher/requeue.py), so a stop cancels the queued job."""
    d = recorded_decision(run_dir, run.get("attempt"))[1]
    return d is not None and "requeued" in d


def _queued_again(run: dict, job: str, uid: int | None) -> bool:
    """The attempt's supervisor is gone and Slurm holds its job in the queue again (a requeue whose decision the
    supervisor never recorded: Slurm's KillWait took it first), so the job would start the run's next attempt
    (launcher/requeue.py) unless the stop cancels it."""
    from stepwatch.monitors.slurm import WAITING_STATES, query_job  # noqa: PLC0415

    sup = ProcessRef.from_json(run.get("supervisor"))
    return not (sup is not None and belongs_to(sup, uid)) and query_job(job)["state"] in WAITING_STATES


def _restart_enforced(run: dict) -> bool:
    """The run's config enforces the restart policy (as its supervisor reads it: the signal is sent to a live
    supervisor)."""
    return RunSettings.of_run(run).restart.mode == ENFORCE
