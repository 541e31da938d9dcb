"""What a launch may trust when a run dir lies where others can write (ARCHITECTURE.md R17).

A team may keep one group-writable runs dir; any member can then replace or edit files in it. So what
stepwatch *runs* never comes from a file there:

- **The owner's copy.** Each launch writes what it launched (config, argv, cwd, env, the config
  file's path and digest) to ``<state dir>/launches/<key>.json``: the state dir is the launching
  user's own (``$STEPWATCH_STATE_DIR``, else ``$XDG_STATE_HOME/stepwatch``, else
  ``~/.local/state/stepwatch``), mode 0700, the copy 0600. A relaunch reads that copy (and the config
  file it names, when that file is the owner's alone), never run.json.
- **The digest.** :func:`launch_digest` covers every field of run.json that says what runs. The
  supervisor gets its run over an inherited pipe (a local launch), or reads run.json and checks it
  against the digest carried in the batch script Slurm stored (a Slurm launch).
- **Private files.** :func:`private_problem` is ssh's rule for ``authorized_keys``: a file that says
  what to run is trusted only when it is a regular file of the reader's own uid that neither group
  nor others may write, with one link.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from stepwatch.monitors.runfiles import group_name as group_name  # re-exported: the launcher's callers'
from stepwatch.monitors.runfiles import open_regular, trust_problem, write_json_atomic

#: run.json's fields that say what runs and as what; :func:`launch_digest` covers exactly these.
LAUNCH_KEYS = ("name", "attempt", "argv", "executable", "shell", "cwd", "env", "config", "config_path",
               "config_sha256", "launched_at_unix")
#: The environment variable that names the owner's state dir (tests, or a home on a slow file system).
ENV_STATE_DIR = "STEPWATCH_STATE_DIR"
OWNER_COPY_VERSION = 1
#: An owner's copy is a few KB; anything bigger is not one.
MAX_COPY_BYTES = 4 * 1024 * 1024


def launch_digest(run: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of run's LAUNCH_KEYS (missing keys count as null)."""
    doc = {k: run.get(k) for k in LAUNCH_KEYS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def state_dir() -> Path:
    """The launching user's own state dir (not created here)."""
    env = os.environ.get(ENV_STATE_DIR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "stepwatch"


def owner_copy_path(run_dir: Path) -> Path:
    """Where the owner's copy of ``run_dir``'s last launch lies: one file per run dir, by its real path."""
    key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:32]
    return state_dir() / "launches" / f"{key}.json"


def private_problem(st: os.stat_result, what: str) -> str | None:
    """Why a file with stat ``st`` cannot say what runs as this user, or None when it can: the one rule every
    reader that acts on a file keeps (``monitors/runfiles.py`` ``trust_problem``, which monitors/ can import)."""
    return trust_problem(st, what)


#: The words every command that runs a config file says when it refuses one (launch, preflight, alerts test,
#: relaunch and the TUI's launch key): one sentence, one home.
CONFIG_REFUSAL = ("A file others can write cannot say what runs as you: chmod go-w it (and its directory), or "
                  "use a copy of your own")


def config_file_problem(path: Path, st: os.stat_result) -> str | None:
    """Why the config file at ``path`` (``st``: its stat, taken on the descriptor that is read) cannot say what
    runs as this user, or None: :func:`private_problem` for the file, and its directory must be this user's or
    root's and writable by no group or other unless it is sticky (as /tmp): otherwise the file can be replaced."""
    problem = private_problem(st, "the file")
    if problem is not None:
        return problem
    parent = path.parent
    try:
        dst = parent.stat()
    except OSError as e:
        return f"its directory {parent} cannot be examined: {e.strerror or e}"
    if dst.st_uid not in (os.geteuid(), 0):
        return f"its directory {parent} belongs to uid {dst.st_uid}: the file can be replaced"
    if dst.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not dst.st_mode & stat.S_ISVTX:
        return (f"its directory {parent} is writable by others (mode {stat.S_IMODE(dst.st_mode):04o}): the file can "
                "be replaced")
    return None


def shared_dir_problem(path: Path) -> str | None:
    """Why others can replace files in directory ``path`` (group- or world-writable; a sticky world-
    writable dir still lets its members replace files of their own), or None. Does not follow a link."""
    try:
        st = path.lstat()
    except OSError as e:
        return f"{path} cannot be examined: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink"
    if st.st_mode & stat.S_IWOTH:
        return f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_mode & stat.S_IWGRP:
        return f"{path} is writable by group {group_name(st.st_gid)} (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to you"
    return None


def read_private_json(path: Path, what: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object at ``path``, None) when :func:`private_problem` finds nothing on the descriptor
    read (so a file swapped in after a check is never trusted); (None, why) otherwise."""
    try:
        fd = open_regular(path, None)
    except FileNotFoundError:
        return None, f"{what} does not exist"
    except OSError as e:
        return None, f"{what} cannot be read: {e.strerror or e}"
    if fd is None:
        return None, f"{what} is not a regular file (a symlink is never followed)"
    with os.fdopen(fd, "rb") as f:
        problem = private_problem(os.fstat(f.fileno()), what)
        data = f.read(MAX_COPY_BYTES + 1)
    if problem:
        return None, problem
    try:
        obj = json.loads(data) if len(data) <= MAX_COPY_BYTES else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        obj = None
    if not isinstance(obj, dict):
        return None, f"{what} is not a JSON object stepwatch wrote"
    return obj, None


def save_owner_copy(run_dir: Path, run: dict[str, Any]) -> str | None:
    """Write the owner's copy of the launch ``run`` describes; returns a warning when it could not be
    written (the launch goes on: a relaunch then needs a run dir only its owner can write)."""
    path = owner_copy_path(run_dir)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = shared_dir_problem(path.parent)
        if problem:
            return (f"what you launched is not kept where only you can write ({problem}): a relaunch of "
                    f"{run_dir.name} will need its run dir to be yours alone")
        doc = {"v": OWNER_COPY_VERSION, "run_dir": str(Path(run_dir).resolve()), "digest": launch_digest(run),
               **{k: run.get(k) for k in LAUNCH_KEYS}, "identity": run.get("identity")}  # (shown by relaunch)
        write_json_atomic(path, doc, mode=0o600)
    except OSError as e:
        return (f"could not keep a copy of what you launched in {path.parent}: {e.strerror or e}; a relaunch "
                f"of {run_dir.name} will need its run dir to be yours alone")
    return None


def read_owner_copy(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the owner's copy of ``run_dir``'s last launch, None), or (None, why there is none usable)."""
    path = owner_copy_path(run_dir)
    problem = shared_dir_problem(path.parent) if path.parent.exists() else None
    if problem:
        return None, f"your state dir is not yours alone: {problem}"
    doc, why = read_private_json(path, f"your copy of the launch ({path})")
    if doc is None:
        return None, why
    if doc.get("run_dir") != str(Path(run_dir).resolve()) or doc.get("digest") != launch_digest(doc):
        return None, f"your copy of the launch ({path}) does not describe {run_dir}"
    return doc, None


def shared_risk(runs_dir: Path, run_dir: Path) -> str | None:
    """The risk, stated at launch, of a run dir that others may write (one its owner opened to the team):
    they can change what a view shows of the run, never what runs. A team's runs dir (group-writable,
    sticky: a launch refuses one without the bit) holding a run dir of the owner's alone is no risk to it."""
    problem = shared_dir_problem(run_dir)
    if problem is None:
        return None
    return (f"{problem}: other users can replace this run's files, so what `status` and the TUI show of it "
            f"may be theirs. What runs, now and on relaunch, comes only from your own config and your copy "
            f"of the launch in {owner_copy_path(run_dir).parent}, never from run.json")


def note_processes_in_owner_copy(run_dir: Path, run: dict[str, Any]) -> None:
    """Add the supervisor's and the command's identity (pid + create time) to the owner's copy of the launch
    (the supervisor, once the command runs): `stop` then finds the supervisor to ask even when a member
    replaced run.json. Best effort: a copy that is missing or not the owner's alone is left as it is."""
    doc, _ = read_owner_copy(run_dir)
    if doc is None:
        return
    doc["supervisor"], doc["process"] = run.get("supervisor"), run.get("process")
    try:
        write_json_atomic(owner_copy_path(run_dir), doc, mode=0o600)
    except OSError:
        pass
