"""Finding runs: RUN arguments (a path or a name under the runs dir) and the list of runs."""

from __future__ import annotations

from pathlib import Path

import difflib
import errno
import os
import stat
import time

from stepwatch.monitors.proctree import recorded_processes
from stepwatch.monitors.signalling import signal_targets
from stepwatch.monitors.runfiles import ENV_RUNS_DIR, EXIT_JSON, PROCS_JSON, RUN_JSON, read_json, stamped_name
from stepwatch.monitors.watchdog import ProcessRef, is_alive


class RunNotFound(LookupError):
    """RUN names no run directory; the message says where it looked (CLI exit code 2)."""


class RunsDirError(RunNotFound):
    """The runs dir given is a symlink loop, or a symlink to nothing (CLI exit code 2)."""


def resolve_runs_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` (``~`` expanded, relative to the current directory) absolute, its symlinks resolved.

    A runs dir that does not exist yet is fine (a launch creates it), but never through a symlink to
    nothing: the launch would create the directory the link names, somewhere nobody chose. Raises
    RunsDirError for that and for a symlink loop (which Python 3.11's ``Path.resolve`` raises as a
    RuntimeError traceback)."""
    p = Path.cwd() / os.path.expanduser(os.fspath(path))  # never abspath: ".." after a link is the link's
    try:
        os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunsDirError(f"the runs dir {p} is a symlink loop: it names no directory. "
                               "Give another with --runs-dir DIR (or runs_dir in the config).") from None
        if e.errno == errno.ENOENT:
            dangling = _dangling_link(p)
            if dangling is not None:
                link, target = dangling
                on_way = "" if link == p else f" ({link} on its way)"
                raise RunsDirError(f"the runs dir {p}{on_way} is a symlink to {target}, which does not exist: "
                                   "nothing is created where a link points. Create the target, remove the link, "
                                   "or give another with --runs-dir DIR.") from None
    return Path(os.path.realpath(p))


def _dangling_link(p: Path) -> tuple[Path, str] | None:
    """The deepest part of ``p`` that is there at all (``lstat``), when it is a symlink to nothing:
    ``(link, what it names)``; None otherwise."""
    for q in (p, *p.parents):
        try:
            st = os.lstat(q)
        except OSError:
            continue
        if not stat.S_ISLNK(st.st_mode) or os.path.exists(q):
            return None
        try:
            return q, os.readlink(q)
        except OSError:
            return None
    return None


def shown_path(p: Path) -> str:
    """``p`` with its symlinks resolved, for a message: never raises (a symlink loop stays as it is)."""
    return os.path.realpath(p)


def resolve_run(arg: str, runs_dir: Path) -> Path:
    """``arg`` as a run directory: an existing directory path with a run.json, else ``runs_dir/arg``.

    Raises RunNotFound naming both places looked at.
    """
    p = Path(arg).expanduser()
    q = runs_dir / arg
    for cand in (p, q):
        if cand.is_dir() and (cand / RUN_JSON).exists():
            if not (cand / RUN_JSON).is_file():  # a FIFO or a device: opening it could hang
                raise RunNotFound(f"{cand / RUN_JSON} is not a regular file: not a run stepwatch wrote; "
                                  "nothing read from it")
            return Path(os.path.realpath(cand))
    known = [d.name for d in list_runs(runs_dir)]
    close = difflib.get_close_matches(arg, known, n=1)
    hint = (f" Did you mean {close[0]!r}?" if close else "") + (
        f" Runs under {runs_dir}: {', '.join(known[:10])}." if known else f" There are no runs under {runs_dir}.")
    raise RunNotFound(f"no run {arg!r}: neither {shown_path(p)} nor {q} is a run directory (one with a {RUN_JSON})."
                      f"{hint} List runs with: stepwatch runs --runs-dir DIR")


def list_runs(runs_dir: Path) -> list[Path]:
    """Run directories directly under ``runs_dir`` (those holding a run.json), newest launch first.

    An entry that is a symlink is no run, whatever it points at: a link another user put in a shared
    runs dir would make ``runs``, the home list and a bare ``attach`` show (and the views write their
    acknowledgements into) a directory that is not there (ARCHITECTURE.md R16)."""
    if not runs_dir.is_dir():
        return []
    found = []
    now = time.time()
    for d in runs_dir.iterdir():
        try:
            is_dir = stat.S_ISDIR(d.lstat().st_mode)  # never follows a symlink
        except OSError:
            continue
        if is_dir and (d / RUN_JSON).is_file():  # a FIFO run.json is no run (never opened)
            rj = read_json(d / RUN_JSON) or {}
            t = rj.get("launched_at_unix")
            # a launch time read from a file: a number, never past now (1e300 must not sort first)
            t = min(float(t), now) if type(t) in (int, float) and t == t else 0.0
            found.append((t, d))
    return [d for _, d in sorted(found, key=lambda x: -x[0])]


def owned_by_viewer(run_dir: Path) -> bool:
    """The run dir and its run.json belong to this process's user (never following a symlink)."""
    me = os.geteuid()
    try:
        return run_dir.lstat().st_uid == me and (run_dir / RUN_JSON).lstat().st_uid == me
    except OSError:
        return False


def default_runs_dir() -> Path:
    """``$STEPWATCH_RUNS_DIR`` or ``./runs``, absolute, relative to the shell's current directory
    (:func:`resolve_runs_dir`: RunsDirError for a symlink loop or a symlink to nothing)."""
    return resolve_runs_dir(os.environ.get(ENV_RUNS_DIR) or "runs")


def live_attempt(run_dir: Path) -> tuple[str, int] | None:
    """``("training process", pid)`` or ``("supervisor", pid)`` when the run's current attempt still
    runs (pid AND create_time match, never a pattern); None otherwise."""
    run = read_json(run_dir / RUN_JSON)
    if not run:
        return None
    proc = ProcessRef.from_json(run.get("process"))
    if is_alive(proc):
        return ("training process", proc.pid)
    sup = ProcessRef.from_json(run.get("supervisor"))
    if is_alive(sup) and read_json(run_dir / EXIT_JSON) is None:
        return ("supervisor", sup.pid)
    from stepwatch.monitors.snapshot.scheduler import read_scheduler  # noqa: PLC0415
    from stepwatch.monitors.slurm import is_ended  # noqa: PLC0415

    sch = read_scheduler(run_dir, run)  # a Slurm job not ended is live, queued or on another node
    if sch and sch["job_id"] and not is_ended(sch["state"]) and read_json(run_dir / EXIT_JSON) is None \
            and sch["state"] != "UNKNOWN":
        return ("Slurm job", int(sch["job_id"]))
    return None


def live_words(live: tuple[str, int]) -> str:
    """``training process pid 812 is alive`` / ``Slurm job 45 has not ended``: what live_attempt found."""
    what, n = live
    return f"{what} {n} has not ended" if what == "Slurm job" else f"{what} pid {n} is alive"


def foreign_records(run_dir: Path) -> str | None:
    """Why the run's records cannot be trusted to name its processes, or None: the run dir is a
    symlink, or one of its records (run.json, procs.json and every rotated
    ``run.<stamp>.json`` / ``procs.<stamp>.json``) is a symlink or belongs to another user than the
    run dir. (Readers check the owner again on the descriptor they read: a file swapped in after
    this check is never trusted.)"""
    try:
        st = run_dir.lstat()
    except OSError as e:
        return f"cannot read {run_dir}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{run_dir} is a symlink"
    try:
        names = [n for n in os.listdir(run_dir) if n in (RUN_JSON, PROCS_JSON)
                 or (n.endswith(".json") and n.startswith(("run.", "procs.")))]
    except OSError as e:
        return f"cannot list {run_dir}: {e.strerror}"
    for name in sorted(names)[:10_000]:
        try:
            fst = (run_dir / name).lstat()
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"cannot read {run_dir / name}: {e.strerror}"
        if stat.S_ISLNK(fst.st_mode):
            return f"{name} is a symlink, not a record the run's supervisor wrote"
        if fst.st_uid != st.st_uid:
            return (f"{name} belongs to uid {fst.st_uid}, not to the run dir's owner (uid {st.st_uid}): "
                    "it was not written by the run's supervisor")
    return None


def _attempt_files(run_dir: Path) -> list[tuple[Path, Path]]:
    """(run.json, procs.json) of every attempt, rotated ones too (``run.<stamp>.json``)."""
    out = []
    for rj in sorted(run_dir.glob("run*.json")):
        if rj.name == RUN_JSON:
            out.append((rj, run_dir / PROCS_JSON))
            continue
        stem, _, rest = rj.name.partition(".")
        stamp = rest[: -len(".json")] if rest.endswith(".json") else ""
        if stem == "run" and stamp and "/" not in stamp:
            out.append((rj, run_dir / stamped_name(PROCS_JSON, stamp)))
    return out


def run_survivors(run_dir: Path) -> list[dict]:
    """Processes of ENDED attempts still alive (DataLoader workers, re-parented ranks: they keep GPU
    memory and make the next launch run out of memory). Only what an attempt's supervisor recorded
    in its procs.json counts, matched by pid AND create time and owned by the run dir's owner (never
    by a group or session number alone, never by command line); every attempt counts, rotated ones
    too. A live attempt's own processes are not listed. Records not written by the run dir's owner
    name nothing (:func:`foreign_records`). Returns ``[{"pid", "create_time", "name", "rank", "pgid",
    "sid"}]`` sorted by pid."""
    if foreign_records(run_dir):
        return []
    found: dict[int, dict] = {}
    live: set[int] = set()
    ended = []
    owner = run_dir.lstat().st_uid
    for rj, pj in _attempt_files(run_dir)[:1000]:
        run = read_json(rj, owner) or {}
        if is_alive(ProcessRef.from_json(run.get("process"))):
            live |= {p.ref.pid for p in recorded_processes(pj, owner)}
            sup = ProcessRef.from_json(run.get("supervisor"))
            if sup is not None:
                live.add(sup.pid)
            continue
        ended.append(pj)
    for pj in ended:
        for p in signal_targets(run_dir, pj, exclude=live):
            found[p.ref.pid] = {"pid": p.ref.pid, "create_time": p.ref.create_time, "name": p.name,
                                "rank": p.rank, "pgid": _now(os.getpgid, p.ref.pid), "sid": _now(os.getsid, p.ref.pid)}
    return [found[k] for k in sorted(found)]


def _now(fn, pid: int) -> int | None:
    try:
        return fn(pid)
    except OSError:
        return None


class CachedSurvivors:
    """:func:`run_survivors` of one run dir, scanned at most every ``every_s`` seconds (a view
    refreshes several times a second; the scan walks every process)."""

    def __init__(self, run_dir: Path, every_s: float = 5.0):
        self.run_dir, self.every_s = run_dir, every_s
        self._cached: tuple[float, list[dict]] | None = None

    def get(self, now: float) -> list[dict]:
        if self._cached is None or now - self._cached[0] > self.every_s:
            self._cached = (now, run_survivors(self.run_dir))
        return self._cached[1]
