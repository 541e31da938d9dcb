"""The supervisor: a small process, in its own session, that owns one attempt of a run.

Started by the launcher as ``python -m stepwatch.launcher.supervisor RUN_DIR --run-fd N`` with ``start_new_session=True``
and stdin from /dev/null, so closing the TUI, losing the SSH link or a SIGHUP never reaches it.

It gets the attempt's run from its launcher over an inherited pipe (a Slurm job's supervisor reads
run.json, checked against the digest its batch script carries: ARCHITECTURE.md R17), opens ``train.log`` for appending (the file is new: the launcher
rotated the previous attempt's), starts the training command as its child in the child's own
process group with stdout+stderr going into a pipe its log pump copies into ``train.log`` unchanged
(a full disk costs log lines, never the run: :mod:`stepwatch.monitors.watch.logpump`), starts its warden,
completes run.json once with both pids, starts the GPU sampler and the run's monitoring (log-derived
step times, every detector, alerts.jsonl and their delivery: :mod:`stepwatch.monitors.watch.loop`),
reaps the child and writes ``exit.json``. On a stop request (SIGUSR1 after ``stepwatch stop`` wrote ``stop.json``; SIGTERM or
SIGINT to the supervisor itself count the same) it sends SIGINT to the child's process group, SIGTERM
after the grace, SIGKILL after a second grace, and records each signal in ``stop.json``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from stepwatch.launcher.checkpointpath import refused_at_exec
from stepwatch.launcher.restartrun import enforce, run_policy
from stepwatch.launcher.rollback import RollbackKeeper
from stepwatch.launcher.requeue import next_attempt_in_job, owner_launched, requeue_count
from stepwatch.launcher.escalation import ESCALATION, Escalation, new_stop_record, own_stop_record, stop_grace_s
from stepwatch.launcher.escalation import log_line as _log
from stepwatch.launcher.exitrecord import new_exit_record, record_exit, reserve_space
from stepwatch.launcher.slurm import slurm_job_id
from stepwatch.launcher.wardens import start_wardens
from stepwatch.launcher.trust import launch_digest, note_processes_in_owner_copy, read_private_json
from stepwatch.monitors import fdreserve
from stepwatch.monitors.oomkills import oom_count, oom_kills_between, oom_victims
from stepwatch.monitors.proctree import TreeRecorder, become_subreaper
from stepwatch.monitors.runfiles import (
    RUN_JSON, STOP_JSON, TRAIN_LOG, open_append, read_run_fd, write_json_atomic,
)
from stepwatch.monitors.runsettings import RunSettings
from stepwatch.monitors.watch.logpump import LogPump
from stepwatch.monitors.watchdog import ProcessRef

#: Set for the child unless the user set them: Rich (Lightning's default ``RichProgressBar``) then
#: draws its progress into train.log while the run goes on, instead of once at the end (Rich >= 14
#: reads them; a file is neither a terminal nor interactive to it otherwise). Rich only: tqdm, the
#: HF Trainer and Python's logging never read them.
RICH_PROGRESS_ENV = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}


def child_env(run: dict[str, Any]) -> dict[str, str]:
    """The child's environment: the supervisor's own plus run.json's ``env`` additions, and
    RICH_PROGRESS_ENV where neither set those names."""
    env = dict(os.environ)
    add = run.get("env")
    if not isinstance(add, dict):
        add = {}
    env.update({k: v for k, v in add.items() if isinstance(k, str) and isinstance(v, str)})
    for k, v in RICH_PROGRESS_ENV.items():
        env.setdefault(k, v)
    return env


def child_argv(run: dict[str, Any]) -> list[str]:
    """The argv the child runs: run.json's ``argv``, or ``/bin/sh -c`` around it when ``shell``."""
    argv = list(run["argv"])
    if run.get("shell"):
        return ["/bin/sh", "-c", argv[0]]
    return argv


def _start_gpu_sampler(run_dir: Path, run: dict[str, Any], child_pid: int, stop: threading.Event) -> None:
    """Start the NVML sampler in a daemon thread; any failure is logged and ignored. A run whose
    env names a recording (``STEPWATCH_GPU_RECORDING``, the demo on a machine without NVML) replays
    it: run.json carries it, so a relaunch replays it too."""
    try:
        from stepwatch.monitors.gpu.sampler import ENV_GPU_RECORDING, run_sampler  # noqa: PLC0415 - optional, heavy-ish
    except Exception as e:  # pragma: no cover - only when the gpu package is broken
        _log(f"GPU sampler not started: {type(e).__name__}: {e}")
        return
    recording = (run.get("env") or {}).get(ENV_GPU_RECORDING)
    if isinstance(recording, str) and recording:
        rel = Path(str(run.get("cwd") or ".")) / Path(recording).expanduser()
        if not Path(recording).is_absolute() and rel.exists():
            recording = str(rel)  # relative to the run's cwd, as the child sees it (this process runs in the run dir)
        os.environ[ENV_GPU_RECORDING] = recording  # the sampler's backend choice reads it

    def target() -> None:
        try:
            run_sampler(run_dir, child_pid, stop)
        except BaseException as e:  # never let the sampler take the supervisor down
            _log(f"GPU sampler stopped: {type(e).__name__}: {e}")

    threading.Thread(target=target, name="gpu-sampler", daemon=True).start()


def _start_events_state(run_dir: Path, run: dict[str, Any], done: threading.Event) -> threading.Thread | None:
    """Start the thread that folds events.jsonl and saves the fold for quick attaches
    (:func:`stepwatch.monitors.fold.savedstate.follow`); any failure is logged and ignored."""
    try:
        from stepwatch.monitors.fold.savedstate import follow  # noqa: PLC0415
    except Exception as e:  # pragma: no cover - only when the package is broken
        _log(f"events state not saved: {type(e).__name__}: {e}")
        return None
    key = (run.get("attempt"), run.get("launched_at_unix"))
    t = threading.Thread(target=follow, args=(run_dir, key, done), kwargs={"log": _log}, name="events-state",
                         daemon=True)
    t.start()
    return t


#: After the child ended, how long the supervisor waits for the last save of the events state.
EVENTS_STATE_FINAL_S = 60.0
#: ... and for its watch to record the last alerts and deliver them (a delivery waits at most 40 s).
WATCH_FINAL_S = 60.0


def _start_exporter(run: dict[str, Any]) -> Any:
    """The run's Prometheus endpoint when ``[export] prometheus`` asks for one (its address then goes
    to run.json ``export``); None otherwise, or when it cannot bind (logged, in run.json too)."""
    spec = RunSettings.of_run(run).export.prometheus
    if not spec:
        return None
    try:
        from stepwatch.monitors.export.prometheus import Exporter  # noqa: PLC0415

        exporter = Exporter(spec)
        run["export"] = {"prometheus": exporter.start(), "error": None}
        _log(f"serving Prometheus metrics on http://{exporter.address}/metrics")
        return exporter
    except Exception as e:  # noqa: BLE001 - the run goes on without its endpoint
        run["export"] = {"prometheus": None, "error": f"{type(e).__name__}: {e}"}
        _log(f"no Prometheus endpoint: {e}")
        return None


def _start_watch(run_dir: Path, run: dict[str, Any], exit_recorded: threading.Event,
                 exporter: Any = None, pump: LogPump | None = None) -> threading.Thread | None:
    """Start the run's monitoring (:func:`stepwatch.monitors.watch.loop.watch_attempt`): log-derived
    step times, every detector, alerts.jsonl and delivery, with no screen attached. A failure to
    start is logged; the run goes on."""
    try:
        from stepwatch.monitors.watch.loop import watch_attempt  # noqa: PLC0415
    except Exception as e:  # pragma: no cover - only when the package is broken
        _log(f"run not watched: {type(e).__name__}: {e}")
        return None
    t = threading.Thread(target=watch_attempt, args=(run_dir, run, exit_recorded),
                         kwargs={"log": _log, "exporter": exporter, "rollback": RollbackKeeper(run_dir, run, _log),
                                 "log_lost": None if pump is None else lambda: (pump.lost_bytes, pump.lost_reason)},
                         name="watch", daemon=True)
    t.start()
    return t


def _child_signal_defaults() -> None:
    """In the child before exec: SIGHUP back to its default (the supervisor ignores it, and an
    ignored signal stays ignored across exec). Runs before any supervisor thread exists."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def read_run(run_dir: Path, run_fd: int | None, launch_sha256: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """What this attempt runs: from the launcher's pipe (``run_fd``, read to EOF), or from run.json
    when it is this user's alone (launcher/trust.py) and matches ``launch_sha256`` (the digest the
    batch script carries). Returns (run, None) or (None, why not)."""
    if run_fd is not None:
        run = read_run_fd(run_fd)
        return (run, None) if run is not None else (None, f"no run (a JSON object) from the launcher on descriptor {run_fd}")
    run, why = read_private_json(run_dir / RUN_JSON, str(run_dir / RUN_JSON))
    if run is None:
        return None, f"{why}: it cannot say what runs as this user"
    if launch_sha256 is None:
        return None, "no digest of the launch given (--launch-sha256): run.json alone is not trusted"
    if launch_digest(run) != launch_sha256 and not owner_launched(run_dir, run):  # a requeued job's later attempt
        return None, (f"{RUN_JSON} is not what was launched (its digest differs from the one the batch script "
                      "carries): it was changed after the launch, and is not run")
    return run, None


def supervise(run_dir: Path, run_fd: int | None = None, launch_sha256: str | None = None) -> int:
    """Run one attempt to its end (:func:`read_run` says what). Returns the supervisor's exit
    status (0 when exit.json was written)."""
    run, why = read_run(run_dir, run_fd, launch_sha256)
    if run is None:
        _log(f"REFUSING to run: {why}")
        return 2
    if launch_sha256 is not None and (requeues := requeue_count(run)):  # Slurm reran the job: the next attempt
        run = next_attempt_in_job(run_dir, run, requeues, _log)
        if run is None:
            return 0
    stop_requested = threading.Event()
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop_requested.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    subreaper = become_subreaper()  # an orphaned worker of the run stays in its tree, not init's
    me = psutil.Process()
    supervisor_rec = {"pid": me.pid, "create_time": me.create_time(), "sid": os.getsid(0), "host": socket.gethostname()}
    t_start = time.time()
    reserve = reserve_space(run_dir, _log)
    if (n := fdreserve.hold()) < fdreserve.RESERVE_FDS:  # descriptors for exit.json and alerts, whatever takes the rest
        _log(f"only {n} of {fdreserve.RESERVE_FDS} descriptors held back for exit.json and alerts")
    out_r = out_w = None
    try:
        os.close(open_append(run_dir / TRAIN_LOG))  # the attempt's log exists from its start (never via a symlink)
        if refused := refused_at_exec(run, run_dir):  # the checkpoint it resumes from, judged again right before the exec
            raise ValueError(refused)
        out_r, out_w = os.pipe()  # the child's output: through the log pump (monitors/watch/logpump.py)
        child = subprocess.Popen(
            child_argv(run), cwd=run["cwd"], env=child_env(run), stdin=subprocess.DEVNULL,
            stdout=out_w, stderr=subprocess.STDOUT, process_group=0, close_fds=True,
            preexec_fn=_child_signal_defaults,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        if out_r is not None:
            os.close(out_r)
        _log(f"could not start the command: {e}")
        run["supervisor"] = supervisor_rec
        run["process"] = {"pid": None, "create_time": None, "pgid": None, "host": supervisor_rec["host"]}
        run["start_error"] = f"{type(e).__name__}: {e}"
        t = time.time()
        try:
            write_json_atomic(run_dir / RUN_JSON, run, mode=0o644)
        finally:
            record_exit(run_dir, new_exit_record(t, 0.0, error=run["start_error"]), reserve, retry_for_s=10.0,
                        log=_log)
        return 1
    finally:
        if out_w is not None:
            os.close(out_w)  # the child holds its own copy: the pipe ends when the run's writers are gone
    pump = LogPump(out_r, run_dir / TRAIN_LOG, _log).start()
    oom_start = oom_count(os.getpid())  # the child's cgroup is this one (forked here): the kernel's OOM kills so far
    oom_since_s = time.monotonic() - 1.0  # the kernel log's clock: its victims from the attempt's start

    try:
        ctime = psutil.Process(child.pid).create_time()
    except psutil.NoSuchProcess:
        ctime = None  # exited already; exit.json will say how
    run["supervisor"] = supervisor_rec
    run["process"] = {"pid": child.pid, "create_time": ctime, "pgid": child.pid, "host": supervisor_rec["host"]}
    run["start_error"] = None
    exporter = _start_exporter(run)
    start_wardens(run_dir, run, out_r, _log)  # they pump the output and page when this process is stopped or gone
    try:
        write_json_atomic(run_dir / RUN_JSON, run, mode=0o644)
    except OSError as e:  # a full disk: the child runs all the same, supervised; exit.json says how it ended
        _log(f"could not record the pids in {RUN_JSON}: {e}")
    note_processes_in_owner_copy(run_dir, run)  # stop finds this supervisor even when run.json is replaced
    _log(f"started pid {child.pid}: {child_argv(run)!r}" + ("" if subreaper else " (not a child subreaper: "
         "a worker whose parent dies goes to init, and is found only while in this session)"))

    child_done = threading.Event()
    child_ref = ProcessRef(child.pid, ctime)
    tree = TreeRecorder(run_dir, child_ref, log=_log, job_id=slurm_job_id(run)).start(child_done)
    exit_recorded = threading.Event()  # exit.json is written: the watch's last look sees the verdict
    _start_gpu_sampler(run_dir, run, child.pid, child_done)
    events_state = _start_events_state(run_dir, run, child_done)
    watching = _start_watch(run_dir, run, exit_recorded, exporter, pump)
    escalation: Escalation | None = None
    while True:
        try:
            rc = child.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            pass
        if stop_requested.is_set() and escalation is None:
            escalation = Escalation(run_dir, child_ref, job_id=slurm_job_id(run), recorded=tree.recorded)
            escalation.start()
    t_end = time.time()
    if not pump.drain():
        _log("the run's output pipe is still held open (a surviving worker?): its later output still goes to train.log "
             "while this process lives")
    child_done.set()
    sig_name = signal.Signals(-rc).name if rc < 0 else None
    exit_rec = new_exit_record(t_end, round(t_end - t_start, 3), returncode=rc if rc >= 0 else None, signal=sig_name,
                               stop_requested=escalation is not None, log_lost_bytes=pump.lost_bytes,
                               log_lost_reason=pump.lost_reason)
    exit_rec["oom_kills"], exit_rec["oom_where"] = oom_kills_between(
        oom_start, oom_count(os.getpid()), [p.ref.pid for p in tree.recorded()], lambda: oom_victims(oom_since_s))
    tree.finish(5.0)  # the last look at the tree first: once exit.json is there, what the command left behind is on record
    record_exit(run_dir, exit_rec, reserve, log=_log)
    exit_recorded.set()
    if stop_requested.is_set() and escalation is None:  # asked in the last poll interval
        escalation = Escalation(run_dir, child_ref, job_id=slurm_job_id(run), recorded=tree.recorded)
        escalation.start()
    if escalation is not None:
        escalation.thread.join(len(ESCALATION) * stop_grace_s(run_dir) + 5)  # the rest of the tree, bounded
        stop = own_stop_record(run_dir) or new_stop_record(None)  # never a member's, nor one the group may write
        stop["ended_by"] = {"last_signal_sent": escalation.last_signal, "returncode": exit_rec["returncode"],
                            "signal": sig_name, "ended_at": exit_rec["ended_at"]}
        try:
            write_json_atomic(run_dir / STOP_JSON, stop)
        except OSError as e:
            _log(f"could not complete stop.json: {e}")
    _log(f"child ended: returncode={exit_rec['returncode']} signal={sig_name}")
    if events_state is not None:
        events_state.join(EVENTS_STATE_FINAL_S)  # the last save: an attach then reads no backlog
    if watching is not None:
        watching.join(WATCH_FINAL_S)  # the last alerts recorded and delivered (bounded)
    restart = run_policy(run_dir, run, _log, exit_rec)  # [restart]: why it ended, RESTART or STOP, in restart.json and paged
    if exporter is not None:  # a last scrape sees the end (stepwatch_run_ended, the exit code)
        linger = RunSettings.of_run(run).export.linger_s  # EXPORT_LINGER_S unless set: a scrape every 15 s sees the end
        time.sleep(max(0.0, linger - (time.time() - t_end)))
        exporter.close()
    enforce(run_dir, run, restart, stop_requested, _log)  # enforce: the next attempt, after the back-off
    if slurm_job_id(run):  # the batch step's status is the run's: Slurm then says FAILED for a failed run
        return rc if rc >= 0 else 128 - rc
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m stepwatch.launcher.supervisor RUN_DIR --run-fd N`` (a local launch:
    the run on an inherited pipe) or ``... RUN_DIR --launch-sha256 HEX`` (a Slurm job's batch script)."""
    argv = sys.argv[1:] if argv is None else argv
    run_fd = digest = None
    if len(argv) == 3 and argv[1] == "--run-fd" and argv[2].isdigit():
        run_fd = int(argv[2])
    elif len(argv) == 3 and argv[1] == "--launch-sha256":
        digest = argv[2]
    else:
        print("usage: python -m stepwatch.launcher.supervisor RUN_DIR (--run-fd N | --launch-sha256 HEX)",
              file=sys.stderr)
        return 2
    try:
        return supervise(Path(argv[0]).resolve(), run_fd, digest)
    except Exception:
        _log("crashed:\n" + traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main())
