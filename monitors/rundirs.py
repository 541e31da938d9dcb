"""Finding runs: RUN arguments (a path or a name under the runs dir) and the list of runs."""

from __future__ import annotations

from pathlib import Path

import difflib
import os
import time

from stepwatch.monitors.runfiles import ENV_RUNS_DIR, EXIT_JSON, RUN_JSON, read_json
from stepwatch.monitors.watchdog import ProcessRef, is_alive, survivors


class RunNotFound(LookupError):
    """RUN names no run directory; the message says where it looked (CLI exit code 2)."""


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
            return cand.resolve()
    known = [d.name for d in list_runs(runs_dir)]
    close = difflib.get_close_matches(arg, known, n=1)
    hint = (f" Did you mean {close[0]!r}?" if close else "") + (
        f" Runs under {runs_dir}: {', '.join(known[:10])}." if known else f" There are no runs under {runs_dir}.")
    raise RunNotFound(f"no run {arg!r}: neither {p.resolve()} nor {q} is a run directory (one with a {RUN_JSON})."
                      f"{hint} List runs with: stepwatch runs --runs-dir DIR")


def list_runs(runs_dir: Path) -> list[Path]:
    """Run directories directly under ``runs_dir`` (those holding a run.json), newest launch first."""
    if not runs_dir.is_dir():
        return []
    found = []
    now = time.time()
    for d in runs_dir.iterdir():
        if d.is_dir() and (d / RUN_JSON).is_file():  # a FIFO run.json is no run (never opened)
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
    """``$STEPWATCH_RUNS_DIR`` or ``./runs``, absolute, relative to the shell's current directory."""
    return Path(os.environ.get(ENV_RUNS_DIR) or "runs").resolve()


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
    return None


def run_survivors(run_dir: Path) -> list[dict]:
    """Processes of ENDED attempts still alive in their process group or their supervisor's session
    (DataLoader workers, re-parented ranks: they keep GPU memory and make the next launch run out of
    memory). Every attempt counts, rotated ones too (``run.<stamp>.json``); matched by the pgid and
    sid that run.json captured, never by command line. A live attempt's own processes are not listed.
    """
    found: dict[int, dict] = {}
    live_sids, live_pgids = set(), set()
    attempts = []
    for rj in sorted(run_dir.glob("run*.json")):
        run = read_json(rj) or {}
        proc, sup = run.get("process") or {}, run.get("supervisor") or {}
        if is_alive(ProcessRef.from_json(proc)):
            live_pgids.add(proc.get("pgid"))
            live_sids.add(sup.get("sid"))
            continue
        attempts.append((proc.get("pgid"), sup.get("sid"), ProcessRef.from_json(sup)))
    for pgid, sid, sup in attempts:
        exclude = {sup.pid} if sup and is_alive(sup) else set()
        for p in survivors(pgid if pgid not in live_pgids else None, sid if sid not in live_sids else None, exclude):
            found[p["pid"]] = p
    return [found[k] for k in sorted(found)]
