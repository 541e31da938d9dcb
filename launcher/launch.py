"""Launch and relaunch: gate, identity, guard, rotate, run.json, supervisor.

The order is ARCHITECTURE.md's rules R6, R5, R9, R7 in turn: check the tree, sample identity once, refuse
a second launch into a live run, rotate the previous attempt's files, write run.json, start the
supervisor in its own session, and return once run.json holds the child's pid.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepwatch.launcher.checkpointpath import resume_at_exec, scratch_note
from stepwatch.launcher.config import ConfigError, RunConfig, config_to_json, resolve_executable
from stepwatch.launcher.identity import gate_message, read_tree, untracked_warning
from stepwatch.launcher.preflight import Checklist, run_checklist
from stepwatch.launcher.rotate import rotate
from stepwatch.launcher.trust import group_name, launch_digest, read_owner_copy, save_owner_copy, shared_risk
from stepwatch.monitors.runfiles import (
    DIR_MODE, ENV_ATTEMPT, ENV_RUN_DIR, JOBWATCH_LOG, PUSH_URLS_JSON, RUN_JSON, SCHEMA_VERSION, SLURM_JOB_FILES, STOP_JSON,
    SUPERVISOR_LOG, make_run_dir, open_append, read_json, utc_iso, write_json_atomic,
)
from stepwatch.monitors.rundirs import live_attempt, live_words  # noqa: F401 - live_attempt re-exported for callers

SUPERVISOR_START_TIMEOUT_S = 60.0
# The supervisor runs the stepwatch this launcher is (the installed one, through this interpreter).
# -P: the run dir, its cwd, is not put on sys.path, so nothing in it can shadow stepwatch's modules.
# No PYTHONPATH either: an environment variable would leak into the training child.
SUPERVISOR_ARGV = (sys.executable, "-P", "-m", "stepwatch.launcher.supervisor")


class LaunchRefused(Exception):
    """A launch that must not happen; ``str()`` names what was wrong and how to proceed (exit code 1)."""


@dataclass
class LaunchResult:
    """What a launch did: the run dir, attempt number, the child's pid, renames, warnings."""

    run_dir: Path
    attempt: int
    pid: int | None
    rotated: list[tuple[Path, Path]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)


def launch(cfg: RunConfig, allow_dirty: str | None = None, override: str | None = None,
           checklist: Checklist | None = None, wait_s: float = SUPERVISOR_START_TIMEOUT_S,
           in_job: dict[str, Any] | None = None) -> LaunchResult:
    """Start one attempt of ``cfg``; with ``in_job`` (the scheduler record of the Slurm job running the caller, a
    requeued job's supervisor: launcher/requeue.py) only prepare it: the job's own files kept, run.json written.

    Runs the pre-launch checklist (or records ``checklist`` when the caller already ran it). A failing
    clean-tree item needs ``allow_dirty`` (a reason); any other failing item needs ``override``.
    Raises ConfigError (bad command or cwd) or LaunchRefused (a failed check without its override, run
    alive, supervisor that did not come up). Nothing is started and no file is written when it refuses.
    """
    for flag, val in (("--allow-dirty", allow_dirty), ("--override", override)):
        if val is not None and not val.strip():
            raise ConfigError(f"{flag} needs a non-empty REASON; it is recorded in run.json")
    if not cfg.cwd.is_dir():
        raise ConfigError(f"cwd does not exist or is not a directory: {cfg.cwd}")
    exe = resolve_executable(cfg)
    tree = read_tree(cfg.cwd, cfg.runs_dir)
    if tree.unreadable or (not tree.clean and allow_dirty is None):  # git failed: nothing to launch on
        raise LaunchRefused(gate_message(tree))
    with _launch_lock(cfg):
        _refuse_if_live(cfg)
        checklist = checklist or run_checklist(cfg, tree)
        others = [i for i in checklist.items if i.status == "fail" and i.id != "clean_tree"]
        if others and override is None:
            raise LaunchRefused("REFUSING: the pre-launch checklist failed:\n" + "\n".join(
                f"  [FAIL] {i.title}: {i.reason}" for i in others)
                + "\nFix them, or launch with --override \"REASON\" (recorded in run.json beside the failed items).")
        # The checklist can take minutes (the test suite): sample the tree again, right before the
        # child starts, so the identity recorded is the one that runs (ARCHITECTURE.md R5).
        tree = read_tree(cfg.cwd, cfg.runs_dir)
        if tree.unreadable or (not tree.clean and allow_dirty is None):
            raise LaunchRefused("the tree changed while the checklist ran.\n" + gate_message(tree))
        _refuse_if_live(cfg)
        resume_at_exec(cfg, LaunchRefused)  # the checkpoint's whole path, judged last (launcher/checkpointpath.py)
        return _start(cfg, exe, tree, checklist, allow_dirty, override, wait_s, in_job)


def _refuse_if_live(cfg: RunConfig) -> None:
    live = live_attempt(cfg.run_dir)
    if live:
        raise LaunchRefused(f"REFUSING: run {cfg.name!r} is still running ({live_words(live)}). "
                            f"Stop it first: stepwatch stop {cfg.run_dir}")


@contextlib.contextmanager
def _launch_lock(cfg: RunConfig):
    """Hold ``<runs_dir>/.<name>.launch.lock`` (flock) from the guard until the supervisor recorded
    the child's pid: two launches of one run cannot interleave. Refuses when another holds it, and
    a lock that is not a regular file of this user's (another user's lock would let them block every
    launch of this name; as root, it opens anyway), checked on the descriptor before it is locked."""
    lock = cfg.runs_dir / f".{cfg.name}.launch.lock"
    try:
        cfg.runs_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        refuse_unsafe_dirs(cfg.runs_dir, cfg.run_dir)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LaunchRefused(f"REFUSING: {lock} is a symlink: the launch "
                                "lock is never opened through one (it would create or lock a file where the link "
                                "points). Remove it if it is yours, then launch again.") from None
        why = _lock_problem(lock, e)
        if why:
            raise LaunchRefused(why) from None
        raise LaunchRefused(f"cannot use the runs dir {cfg.runs_dir}: {e.strerror or e}. "
                            "Choose another with --runs-dir DIR (or runs_dir in the config).") from None
    try:
        why = _lock_not_ours(lock, os.fstat(fd))
        if why:
            raise LaunchRefused(why)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LaunchRefused(f"REFUSING: another launch of {cfg.name!r} is in progress right now "
                                f"(it holds {lock}); wait for it, "
                                f"then: stepwatch status {cfg.run_dir}") from None
        yield
    finally:
        os.close(fd)


def _lock_not_ours(lock: Path, st: os.stat_result) -> str | None:
    """Why the launch lock (``st``: its lstat, or the opened descriptor's fstat) is not this user's
    regular file, or None."""
    fix = "Remove it if you may (it is only a lock), or choose another --runs-dir DIR."
    if stat.S_ISDIR(st.st_mode):
        return f"REFUSING: the launch lock {lock} is a directory, not a lock file. {fix}"
    if not stat.S_ISREG(st.st_mode):
        return f"REFUSING: the launch lock {lock} is not a regular file (mode {stat.filemode(st.st_mode)}). {fix}"
    if st.st_uid != os.geteuid():
        return (f"REFUSING: the launch lock {lock} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): "
                f"whoever holds it could block every launch of this name. {fix}")
    return None


def _lock_problem(lock: Path, e: OSError) -> str | None:
    """The launch lock's own fault when opening it failed with ``e`` (it is there, and not this
    user's regular file, or its mode denies them), or None when the fault is the runs dir's."""
    try:
        st = os.lstat(lock)
    except OSError:
        return None  # not there: creating it failed, which is the runs dir's doing
    why = _lock_not_ours(lock, st)
    if why or e.errno not in (errno.EACCES, errno.EPERM):  # EROFS, EIO...: the runs dir's
        return why
    return (f"REFUSING: cannot open the launch lock {lock}: {e.strerror or e}. Fix its mode if it is yours "
            "(it is only a lock: remove it), or choose another --runs-dir DIR.")


def refuse_unsafe_dirs(runs_dir: Path, run_dir: Path) -> None:
    """Refuse (LaunchRefused) a place another user controls: a runs dir others may write without the sticky
    bit (a member could swap the run dir: its files read, the alert command run in it, as you), a run dir
    that is a symlink or another user's. At the lock and once the run dir is made (ARCHITECTURE.md R17)."""
    st = runs_dir.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        who = "every user" if st.st_mode & stat.S_IWOTH else f"group {group_name(st.st_gid)}"
        raise LaunchRefused(f"REFUSING: the runs dir {runs_dir} is writable by {who} and has no sticky bit: another user "
                            f"could rename your run dir away and put one of their choosing in its place. Make it "
                            f"sticky, as /tmp is: chmod +t {runs_dir}, or use a runs dir of your own (--runs-dir)")
    try:
        rst = run_dir.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(rst.st_mode):
        raise LaunchRefused(f"REFUSING: the run dir {run_dir} is a symlink (to {os.readlink(run_dir)}): a launch "
                            "writes only into a directory of its own. Remove the link or choose another name")
    if rst.st_uid != os.geteuid():
        raise LaunchRefused(f"REFUSING: the run dir {run_dir} belongs to uid {rst.st_uid}, not to you "
                            f"(uid {os.geteuid()}): its files, and where they point, are that user's to choose. "
                            "Launch under another name (--name) or another runs dir (--runs-dir)")


def _hand_over(wfd: int, run: dict[str, Any]) -> None:
    """Write ``run`` to the supervisor's inherited pipe, then close it (the supervisor reads to EOF)."""
    try:
        with os.fdopen(wfd, "wb") as f:
            f.write(json.dumps(run).encode("utf-8"))
    except OSError:
        pass  # the supervisor died before reading: the launch says so from its log


def next_attempt(run_dir: Path) -> int:
    """1 + the highest attempt recorded in run.json or any rotated ``run.<stamp>.json`` (a corrupt
    run.json must not restart the numbering: alert ids carry it)."""
    best = 0
    for rj in run_dir.glob("run*.json"):
        a = (read_json(rj) or {}).get("attempt")
        if isinstance(a, int):
            best = max(best, a)
    return best + 1


#: How long a relaunch waits for the previous attempt's supervisor, its child already ended, to
#: finish (it saves its last fold of events.jsonl after exit.json; see monitors/fold/savedstate.py).
LAST_SUPERVISOR_WAIT_S = 15.0


def _let_the_last_supervisor_finish(run_dir: Path) -> None:
    """Wait (at most LAST_SUPERVISOR_WAIT_S) for the previous attempt's supervisor to exit, so its
    last save lands before the files are rotated. The child is gone already (live_attempt refused
    otherwise); when the supervisor takes longer, the launch goes on: the saved state is only a
    shortcut, refused by a view unless it fits the attempt and the file.

    A stop still carrying out its ladder (the command ended, a worker that ignores INT and TERM
    not yet) is waited for to its last rung; a process of the stopped attempt still alive after that
    refuses the launch (a survivor of a run that ended by itself is only warned of, by the CLI)."""
    from stepwatch.launcher.escalation import ESCALATION, stop_grace_s  # noqa: PLC0415
    from stepwatch.monitors.rundirs import run_survivors  # noqa: PLC0415
    from stepwatch.monitors.watchdog import ProcessRef, wait_for_exit  # noqa: PLC0415

    run = read_json(run_dir / RUN_JSON, os.geteuid()) or {}
    sup = ProcessRef.from_json(run.get("supervisor"))
    if sup is not None and sup.pid == os.getpid():  # the restart policy's launch, from that supervisor: it has
        sup = None  # saved its last fold already and waits for nothing of this launch
    stop = read_json(run_dir / STOP_JSON, os.geteuid(), private=True) or {}  # not one the group may have written
    stopping = bool(stop) and stop.get("ended_by") is None
    if sup is not None:
        wait_s = len(ESCALATION) * stop_grace_s(run_dir) + LAST_SUPERVISOR_WAIT_S if stopping else LAST_SUPERVISOR_WAIT_S
        if stopping and not wait_for_exit(sup, timeout_s=0.0):
            print(f"waiting for the stop of attempt {run.get('attempt')} to finish its ladder "
                  f"(at most {wait_s:.0f} s) ...", file=sys.stderr, flush=True)
        wait_for_exit(sup, timeout_s=wait_s, poll_s=0.05)
    left = run_survivors(run_dir) if stopping else []
    if left:
        raise LaunchRefused(f"REFUSING: the stop of attempt {run.get('attempt')} ran its ladder and "
                            f"{len(left)} of its process(es) still run: "
                            + ", ".join(f"pid {p['pid']} ({p['name']})" for p in left[:10])
                            + f". A stop finishes before a relaunch starts: kill them first: "
                            f"stepwatch stop {run_dir} --survivors")


def _start(cfg: RunConfig, exe: str, tree, checklist: Checklist, allow_dirty: str | None, override: str | None,
           wait_s: float, in_job: dict[str, Any] | None = None) -> LaunchResult:
    run_dir = cfg.run_dir
    warnings = [w for w in [untracked_warning(tree), scratch_note(cfg)] if w]
    if allow_dirty is not None and not tree.clean:
        warnings.append(f"launching from a dirty tree, as allowed: {allow_dirty}")
    try:
        make_run_dir(run_dir)  # 0755 whatever the umask, an earlier attempt's of yours too
        refuse_unsafe_dirs(cfg.runs_dir, run_dir)  # a member's dir made under this name since the lock: refused
        attempt = next_attempt(run_dir)
        _let_the_last_supervisor_finish(run_dir)
        rotated = rotate(run_dir, SLURM_JOB_FILES if in_job else frozenset({JOBWATCH_LOG}) if _resubmitted_in_job(cfg)
                         else frozenset())
    except OSError as e:
        raise LaunchRefused(f"cannot prepare the run dir {run_dir}: {e.strerror or e}. "
                            "Choose another with --runs-dir DIR (or runs_dir in the config).") from None

    t = time.time()
    env_add = dict(cfg.env)
    env_add[ENV_RUN_DIR] = str(run_dir)
    env_add[ENV_ATTEMPT] = str(attempt)
    env_add.setdefault("PYTHONUNBUFFERED", "1")
    run = {
        "v": SCHEMA_VERSION,
        "name": cfg.name,
        "attempt": attempt,
        "argv": cfg.command,
        "executable": exe,
        "shell": cfg.shell,
        "cwd": str(cfg.cwd),
        "env": env_add,
        "config_path": str(cfg.config_path) if cfg.config_path else None,
        "config_sha256": cfg.config_sha256,
        "config": config_to_json(cfg),
        "launched_at": utc_iso(t),
        "launched_at_unix": t,
        "identity": tree.identity,
        "preflight": checklist.to_json(override_reason=override, allow_dirty_reason=allow_dirty),
        "allow_dirty_reason": allow_dirty,
        "resumed_from": cfg.resumed_from,
        "rotated_previous": [[str(a.name), str(b.name)] for a, b in rotated],
        "launched_by": {"pid": os.getpid(), "user": _user()},
        "supervisor": {"pid": None, "create_time": None, "sid": None, "host": None},
        "process": {"pid": None, "create_time": None, "pgid": None, "host": None},
        "start_error": None,
    }
    if cfg.settings.alerts.urls:  # tokens: readable by the run's owner (its supervisor) alone
        write_json_atomic(run_dir / PUSH_URLS_JSON, {"v": 1, "urls": list(cfg.settings.alerts.urls)}, mode=0o600)
    warnings.extend(w for w in [shared_risk(cfg.runs_dir, run_dir), save_owner_copy(run_dir, run)] if w)
    if in_job is not None:  # a requeued job's next attempt: its supervisor, the caller, runs it
        run["scheduler"] = in_job
        write_json_atomic(run_dir / RUN_JSON, run)  # 0644 whatever the umask (runfiles.FILE_MODE)
        return LaunchResult(run_dir, attempt, None, rotated, warnings, run)
    if cfg.slurm is not None:
        return _submit(cfg, cfg.slurm, run, rotated, warnings)
    write_json_atomic(run_dir / RUN_JSON, run)
    # What the supervisor runs reaches it over an inherited pipe, never by re-reading run.json: in a
    # shared run dir another user could replace that file between this write and its read.
    rfd, wfd = os.pipe()
    try:
        with open(open_append(run_dir / SUPERVISOR_LOG), "ab") as slog:  # never through a symlink
            sup = subprocess.Popen(
                [*SUPERVISOR_ARGV, str(run_dir), "--run-fd", str(rfd)],
                stdin=subprocess.DEVNULL, stdout=slog, stderr=slog, start_new_session=True, close_fds=True,
                pass_fds=(rfd,), cwd=str(run_dir),
            )
    finally:
        os.close(rfd)
    threading.Thread(target=_hand_over, args=(wfd, run), name=f"run-to-supervisor-{sup.pid}", daemon=True).start()
    # A TUI that launched stays open after the run: reap its supervisor when it ends (no zombie);
    # a CLI launch exits first and the supervisor is re-parented to init, which reaps it.
    threading.Thread(target=sup.wait, name=f"reap-supervisor-{sup.pid}", daemon=True).start()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        cur = read_json(run_dir / RUN_JSON, os.geteuid()) or read_owner_copy(run_dir)[0] or {}  # a member's: your copy
        if (cur.get("supervisor") or {}).get("pid") == sup.pid:  # its own record, not a planted one
            if cur.get("start_error"):
                raise LaunchRefused(f"the command could not be started: {cur['start_error']}")
            return LaunchResult(run_dir, attempt, cur["process"]["pid"], rotated, warnings, cur)
        if sup.poll() is not None:
            break
        time.sleep(0.02)
    tail = (run_dir / SUPERVISOR_LOG).read_text(errors="replace")[-2000:]
    if sup.poll() is None:
        raise LaunchRefused(f"the supervisor (pid {sup.pid}) has not recorded the child's pid after {wait_s:.0f} s; "
                            f"it may still be starting the run. Check: stepwatch status {run_dir}; "
                            f"stop it with: stepwatch stop {run_dir}")
    raise LaunchRefused(f"the supervisor exited (status {sup.poll()}) without starting the run; its log:\n{tail}")


def _submit(cfg: RunConfig, slurm_cfg: dict[str, Any], run: dict[str, Any], rotated: list,
            warnings: list[str]) -> LaunchResult:
    """A Slurm attempt: run.json, the batch script submitted held, its job id recorded, the login
    node's job watcher started, the job released (launcher/slurm.py). Returns at once: the job may
    wait in the queue; ``status`` says PENDING and Slurm's reason."""
    from stepwatch.launcher import slurm  # noqa: PLC0415

    run_dir = cfg.run_dir
    previous = [j for j in [slurm.slurm_job_id(read_json(run_dir / n) or {}) for _, n in
                            sorted((p.stat().st_mtime, p.name) for p in run_dir.glob("run.*.json"))] if j]
    run["scheduler"] = {"kind": "slurm", "job_id": None, "poll_s": float(slurm_cfg.get("poll_s") or slurm.DEFAULT_POLL_S),
                        "sbatch_argv": None, "submitted_at": None, "previous_job_ids": previous[-20:]}
    write_json_atomic(run_dir / RUN_JSON, run)
    try:
        job_id, argv = slurm.submit_held(slurm_cfg, run_dir, f"stepwatch-{cfg.name}", launch_digest(run))
    except (slurm.SlurmError, OSError) as e:
        run["start_error"] = f"sbatch: {e}"
        write_json_atomic(run_dir / RUN_JSON, run)
        raise LaunchRefused(f"Slurm did not take the job: {e}") from None
    run["scheduler"].update(job_id=job_id, sbatch_argv=argv, submitted_at=utc_iso(time.time()))
    write_json_atomic(run_dir / RUN_JSON, run)  # before the release: the supervisor reads it when the job starts
    if _resubmitted_in_job(cfg):
        return _release(run_dir, job_id, run, rotated, warnings)  # the last job's login-node watcher follows it
    rfd, wfd = os.pipe()  # the watcher delivers alerts (the [alerts] command): its run comes from here (R17)
    try:
        with open(open_append(run_dir / JOBWATCH_LOG), "ab") as jlog:
            w = subprocess.Popen([*SUPERVISOR_ARGV[:3], "stepwatch.monitors.watch.jobwatch", str(run_dir),
                                  "--run-fd", str(rfd)],
                                 stdin=subprocess.DEVNULL, stdout=jlog, stderr=jlog, start_new_session=True,
                                 close_fds=True, pass_fds=(rfd,), cwd=str(run_dir))
    finally:
        os.close(rfd)
    threading.Thread(target=_hand_over, args=(wfd, run), name=f"run-to-jobwatch-{w.pid}", daemon=True).start()
    threading.Thread(target=w.wait, name=f"reap-jobwatch-{w.pid}", daemon=True).start()
    return _release(run_dir, job_id, run, rotated, warnings)


def _resubmitted_in_job(cfg: RunConfig) -> bool:
    """The restart policy submits the next attempt from inside the job that ended: no watcher of its own (it would
    die with that job); the last job's login-node watcher follows it, its log kept (monitors/watch/jobwatch.py)."""
    return (cfg.resumed_from or {}).get("by") == "restart policy" and bool(os.environ.get("SLURM_JOB_ID"))


def _release(run_dir: Path, job_id: str, run: dict[str, Any], rotated: list, warnings: list[str]) -> LaunchResult:
    """Let the held job be scheduled; cancelled when Slurm will not (LaunchRefused)."""
    from stepwatch.launcher import slurm  # noqa: PLC0415

    try:
        slurm.release(job_id)
    except slurm.SlurmError as e:
        with contextlib.suppress(slurm.SlurmError):
            slurm.scancel(job_id)
        raise LaunchRefused(f"Slurm took job {job_id} but would not release it: {e} (the job is cancelled)") from None
    return LaunchResult(run_dir, run["attempt"], None, rotated, warnings, run)


def _user() -> str | None:
    with contextlib.suppress(KeyError):
        return pwd.getpwuid(os.getuid()).pw_name
    return None
