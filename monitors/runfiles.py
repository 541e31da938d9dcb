"""The files of one run directory: names, reading, atomic writing, time stamps.

A run is one directory, ``<runs_dir>/<name>/`` (ARCHITECTURE.md, "Files are the state, a view is
disposable", says who writes each). One file describes one
attempt: on relaunch the per-attempt files are renamed with the UTC stamp of that attempt's launch
(``train.log`` -> ``train.20260826T101500Z.log``). This module is the single place that knows the
names; it imports only the standard library.
"""

from __future__ import annotations

import errno
import grp
import json
import os
import sys
import re
import stat
import tempfile
import time
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

#: The modes stepwatch gives what it writes, whatever the umask: under a team's ``umask 002`` a plain create is
#: group-writable, and a member could then edit the owner's records in place (issue 43). A record others may read:
FILE_MODE = 0o644
#: A file holding a secret (``alerts.urls.json``: push URLs with their tokens), or the owner's private copy.
SECRET_MODE = 0o600
#: A run dir: others may read it, only its owner writes it.
DIR_MODE = 0o755
#: The owner's own state dir (launcher/trust.py).
STATE_DIR_MODE = 0o700

RUN_JSON = "run.json"
TRAIN_LOG = "train.log"
EVENTS_JSONL = "events.jsonl"
GPU_JSONL = "gpu.jsonl"
STOP_JSON = "stop.json"
EXIT_JSON = "exit.json"
SUPERVISOR_LOG = "supervisor.log"  # the supervisor's own diagnostics; never the child's output
EVENTS_STATE = "events.state.json"  # the supervisor's fold of events.jsonl (monitors/fold/savedstate.py)
ACKS_JSONL = "acks.jsonl"  # written by views; never rotated (alert ids carry the attempt)
#: The restart policy's record (launcher/restartrun.py): every attempt's end and the last decision; never rotated.
RESTART_JSON = "restart.json"
#: The attempt's ledger of where its time went, written by its supervisor at its end (monitors/snapshot/ledger.py).
LEDGER_JSON = "ledger.json"
#: A loss episode's rollback checkpoint, kept from the trainer's rotation (launcher/rollback.py): hard links in this
#: folder, and the record of what was kept; never rotated (released when the run ends healthy).
KEPT_DIR = "kept"
KEPT_JSON = "kept.json"
LOG_STEPS_JSONL = "logsteps.jsonl"  # step records the supervisor timed from train.log (monitors/watch/logsteps.py)
ALERTS_JSONL = "alerts.jsonl"  # the supervisor's alerts and their deliveries (monitors/watch/loop.py)
#: The run's push URLs (they carry tokens): 0600, read by its supervisor only; run.json names the
#: channels without their secrets (``config.alerts.channels``).
PUSH_URLS_JSON = "alerts.urls.json"
#: Every process of the attempt by identity, recorded by its supervisor (monitors/proctree.py).
PROCS_JSON = "procs.json"
#: A Slurm attempt's job as the login node last read it from the scheduler (monitors/slurm.py,
#: written by monitors/watch/jobwatch.py), and its batch script (launcher/slurm.py).
SCHEDULER_JSON = "scheduler.json"
JOB_SCRIPT = "job.sbatch"
JOBWATCH_LOG = "jobwatch.log"  # the login node's job watcher's own diagnostics

#: Files that describe one attempt and are renamed with the attempt's stamp on relaunch.
PER_ATTEMPT_FILES = (TRAIN_LOG, EVENTS_JSONL, GPU_JSONL, RUN_JSON, STOP_JSON, EXIT_JSON, SUPERVISOR_LOG, EVENTS_STATE,
                     LOG_STEPS_JSONL, ALERTS_JSONL, PUSH_URLS_JSON, PROCS_JSON, SCHEDULER_JSON, JOB_SCRIPT,
                     JOBWATCH_LOG, LEDGER_JSON)

#: A Slurm job's own files: its output (the supervisor's log), batch script, login-node watcher's log and state. A
#: requeued job's next attempt keeps them in place (slurmstepd and the watcher hold them open): launcher/requeue.py.
SLURM_JOB_FILES = frozenset({SUPERVISOR_LOG, JOB_SCRIPT, JOBWATCH_LOG, SCHEDULER_JSON})

#: Rank N's own events file (N > 0) when every rank writes (``STEPWATCH_ALL_RANKS=1``, or the
#: emitter's ``all_ranks=True``); rank 0 writes events.jsonl. Rotated with the attempt's files.
RANK_EVENTS = re.compile(r"^events\.rank([1-9][0-9]{0,5})\.jsonl$")


#: Rank N's log-derived step records (N > 0), timed by the supervisor from train.log's lines behind
#: a ``[rankN]:`` / ``[defaultN]:`` prefix (monitors/watch/logsteps.py); rank 0's go to logsteps.jsonl.
RANK_LOG_STEPS = re.compile(r"^logsteps\.rank([1-9][0-9]{0,5})\.jsonl$")


def rank_log_steps_name(rank: int) -> str:
    """``logsteps.rank<N>.jsonl`` (rank 0: ``logsteps.jsonl``)."""
    return LOG_STEPS_JSONL if rank == 0 else f"logsteps.rank{rank}.jsonl"


def rank_events_name(rank: int) -> str:
    """``events.rank<N>.jsonl`` (rank 0: ``events.jsonl``)."""
    return EVENTS_JSONL if rank == 0 else f"events.rank{rank}.jsonl"


def attempt_files(run_dir: str | os.PathLike[str]) -> list[str]:
    """The names of the attempt's files present in ``run_dir``: PER_ATTEMPT_FILES and each rank's
    events file and log-derived step file."""
    try:
        names = set(os.listdir(run_dir))
    except OSError:
        return []
    return [f for f in PER_ATTEMPT_FILES if f in names] + sorted(n for n in names if RANK_EVENTS.match(n)
                                                                 or RANK_LOG_STEPS.match(n))


ENV_RUN_DIR = "STEPWATCH_RUN_DIR"
ENV_ALL_RANKS = "STEPWATCH_ALL_RANKS"
ENV_ATTEMPT = "STEPWATCH_ATTEMPT"
ENV_RUNS_DIR = "STEPWATCH_RUNS_DIR"


def utc_iso(t: float | None) -> str | None:
    """Unix seconds -> ISO-8601 UTC with a ``Z`` and millisecond precision; None stays None."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utc_stamp(t: float) -> str:
    """Unix seconds -> the compact stamp used in rotated names, e.g. ``20260826T101500Z``."""
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y%m%dT%H%M%SZ")


def stamped_name(filename: str, stamp: str) -> str:
    """``train.log`` + stamp -> ``train.<stamp>.log``; ``events.jsonl`` -> ``events.<stamp>.jsonl``."""
    stem, dot, ext = filename.partition(".")
    return f"{stem}.{stamp}.{ext}" if dot else f"{filename}.{stamp}"


def size_at_most(path: str | os.PathLike[str], max_bytes: int) -> bool:
    """The file holds at most ``max_bytes`` (True when it is missing: it will start at byte 0)."""
    try:
        return os.stat(path).st_size <= max_bytes
    except OSError:
        return True


def open_regular(path: str | os.PathLike[str], owner_uid: int | None = None) -> int | None:
    """A read-only descriptor of ``path`` when it is a regular file, else None (a FIFO, a device, a
    directory put in its place: opened without blocking, so a FIFO with no writer never hangs the
    reader, then closed; a symlink: never followed, stepwatch writes none; with ``owner_uid``, a
    file another uid owns, checked on the opened descriptor). Raises OSError (FileNotFoundError,
    PermissionError) as ``os.open``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None
        raise
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and (owner_uid is None or st.st_uid == owner_uid):
        return fd
    os.close(fd)
    return None


#: A run's JSON files (run.json, exit.json, stop.json) are a few KB; a bigger one is not read.
MAX_JSON_BYTES = 16 * 1024 * 1024


def group_name(gid: int) -> str:
    """The name of group ``gid`` (its number when it has none)."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def trust_problem(st: os.stat_result, what: str, owner_uid: int | None = None) -> str | None:
    """Why a file with stat ``st`` cannot be believed by a reader that acts on it, or None when it can: ssh's rule
    for ``authorized_keys`` (ARCHITECTURE.md R17). It must be a regular file of ``owner_uid`` (default: this
    process's user) that neither group nor others may write, with one link: a file the owner wrote under a
    team's umask, or opened to the group, can be edited in place by a member while every owner check passes,
    and a second name may be a member's way in. launcher/trust.py's ``private_problem`` is this rule."""
    me = os.geteuid() if owner_uid is None else owner_uid
    if not stat.S_ISREG(st.st_mode):
        return f"{what} is not a regular file"
    if st.st_uid != me:
        return f"{what} belongs to uid {st.st_uid}, not to {'you' if me == os.geteuid() else 'the run owner'} (uid {me})"
    if st.st_mode & stat.S_IWOTH:
        return f"{what} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_mode & stat.S_IWGRP:
        return f"{what} is writable by group {group_name(st.st_gid)} (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_nlink != 1:
        return f"{what} has {st.st_nlink} hard links (another name may lead to it)"
    return None


_IGNORED: set[tuple[str, str]] = set()


def ignored_once(path: str | os.PathLike[str], why: str, then: str = "read as if it were absent") -> None:
    """Say once per process (a diagnostic line: supervisor.log for the supervisor and its warden, stderr for
    the CLI) that ``path`` was not believed, why, and what was done (``then``)."""
    key = (os.fspath(path), why)
    if key not in _IGNORED:
        _IGNORED.add(key)
        diagnostic("stepwatch", f"not trusting {os.fspath(path)}: {why}; {then}")


def read_json(path: str | os.PathLike[str], owner_uid: int | None = None,
              private: bool = False) -> dict[str, Any] | None:
    """Read a JSON object from ``path``.

    Returns None when the file does not exist, is not a regular file (a FIFO in its place is never
    opened blocking; a symlink is never followed), is another uid's than ``owner_uid`` (when given:
    checked on the descriptor read, so a file swapped in after a check is never trusted), is empty
    or over MAX_JSON_BYTES, is not valid JSON (a writer caught mid-write by a crash, or nested too
    deep to parse) or is not an object. Never raises for those; PermissionError is raised, because a
    file that exists and cannot be read is something the caller must say.

    ``private``: a reader that decides an act from the file (a stop, whom to signal, what was paged) believes it
    only under :func:`trust_problem` (``owner_uid``'s, default this user's; checked on the descriptor read), and
    says once why it did not (:func:`ignored_once`).
    """
    try:
        # never blocks: a FIFO in a run.json's place must not hang a view
        fd = open_regular(path, None if private else owner_uid)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:  # pragma: no cover - O_RDONLY on a directory succeeds on Linux
        return None
    if fd is None:
        return None  # not a regular file (a FIFO, a device, a directory): nothing a run wrote
    if private and (why := trust_problem(os.fstat(fd), os.fspath(path), owner_uid)) is not None:
        os.close(fd)
        ignored_once(path, why)
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        return None
    if not data.strip():
        return None
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def write_json_atomic(path: str | os.PathLike[str], obj: dict[str, Any], indent: int | None = 2,
                      mode: int = FILE_MODE) -> None:
    """Write ``obj`` as JSON to ``path`` through a temp file and ``os.replace`` (``indent`` as
    json.dump takes it; None: one compact line; ``mode``: the file's mode, FILE_MODE by default).

    A reader never sees half a file. The file gets FILE_MODE (0644) whatever the umask, not mkstemp's
    0o600: other users may read a run dir (a view works on a run dir it may only read), and none may
    write it (a team's umask 002 would let the group edit the owner's record in place).
    Raises OSError (e.g. PermissionError) when the directory is not writable.
    """
    # dumps + one write: json.dump streams through the pure-Python iterencode (~4x slower on the
    # supervisor's MB-sized events.state.json)
    text = json.dumps(obj, indent=indent, sort_keys=False, separators=None if indent else (",", ":"))
    write_bytes_atomic(path, (text + "\n").encode("utf-8"), mode)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, mode: int = FILE_MODE) -> None:
    """Write ``data`` to ``path`` through a temp file beside it, fsync, then ``os.replace``: a reader
    never sees half a file (``mode``: the file's mode, whatever the umask). Raises OSError."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_append(path: str | os.PathLike[str], mode: int | None = FILE_MODE) -> int:
    """A descriptor for appending to ``path``, that is never a symlink's target (``O_NOFOLLOW``) nor
    anything but a regular file (a FIFO in its place fails at once, ``O_NONBLOCK``, instead of hanging
    the writer). Raises OSError.

    Created if missing with ``mode`` whatever the umask (``fchmod``: a team's umask 002 would make the
    owner's record group-writable). A file already there is appended to only when it is this user's
    with one link (PermissionError otherwise, naming the reason: the owner's records never go into a
    file a member planted, nor through a second name); one the group or others may write is appended to
    and said once (:func:`ignored_once`): no reader that acts believes it (:func:`trust_problem`), and its
    mode is left as the owner set it (tightening it would make a member's lines in it look like ours).
    ``mode`` None: the umask's, and any user's file (``acks.jsonl``, a view's shared notes).
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    created = False
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
        created = True
    except FileExistsError:
        fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        if created and mode is not None:
            os.fchmod(fd, mode)
        elif not created and mode is not None:
            why = trust_problem(st, os.fspath(path))
            if why is not None and (st.st_uid != os.geteuid() or st.st_nlink != 1):
                raise PermissionError(errno.EPERM, f"not appended to: {why}", os.fspath(path))
            if why is not None:
                ignored_once(path, why, "appended to all the same, and believed by no reader that acts on it")
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (os.write may write less than asked). Raises OSError."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_bytes(path: str | os.PathLike[str], data: bytes, mode: int | None = FILE_MODE) -> None:
    """Append ``data`` to ``path`` with one write (see :func:`open_append`, ``mode`` too). Raises OSError."""
    fd = open_append(path, mode)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def diagnostic(role: str, msg: str) -> None:
    """One line of a stepwatch process's own diagnostics to its stderr (``supervisor.log``,
    ``jobwatch.log``): ``<utc> <role>[<pid>]: <msg>``. A full disk loses the line, never the process."""
    try:
        print(f"{utc_iso(time.time())} {role}[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def make_run_dir(run_dir: str | os.PathLike[str]) -> None:
    """Create the run dir (and its parents) DIR_MODE whatever the umask: its owner writes it, others read it (a
    team's umask 002 would let a member replace the owner's files in it). An existing one of this user's (an
    earlier attempt, an older stepwatch) is set so too; another's, or a symlink, is left alone (the launch's
    checks refuse or warn of it). A setgid bit (inherited from a team's runs dir) stays: the files keep the
    team's group, for reading. Raises OSError."""
    os.makedirs(run_dir, mode=DIR_MODE, exist_ok=True)
    st = os.lstat(run_dir)
    want = DIR_MODE | (st.st_mode & stat.S_ISGID)
    if st.st_uid == os.geteuid() and stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) != want:
        os.chmod(run_dir, want, follow_symlinks=False)


def read_run_fd(fd: int) -> dict[str, Any] | None:
    """The run a launcher handed a process of the run's owner on an inherited pipe, read to EOF
    (ARCHITECTURE.md R17: never re-read from the run dir); None when it is not a JSON object."""
    try:
        with os.fdopen(fd, "rb") as f:
            obj = json.loads(f.read(MAX_JSON_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def read_push_urls(run_dir: str | os.PathLike[str]) -> list[str]:
    """The push URLs of this attempt (``alerts.urls.json``, written 0600 at launch), [] when none or
    when the file is not this user's own (another user's file in a shared run dir would send the
    owner's alerts where they choose)."""
    obj = read_json(Path(run_dir) / PUSH_URLS_JSON, os.geteuid())
    urls = (obj or {}).get("urls")
    return [u for u in urls if isinstance(u, str)] if isinstance(urls, list) else []


def append_jsonl(path: str | os.PathLike[str], obj: dict[str, Any]) -> None:
    """Append one JSON object as one line (one write) to ``path`` (see :func:`open_append`)."""
    append_bytes(path, (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8"))


def now() -> float:
    """Wall-clock unix seconds (``time.time()``); one place so tests can see where time comes from."""
    return time.time()
