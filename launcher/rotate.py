"""Log rotation on relaunch: one file describes one attempt (ARCHITECTURE.md R7).

Every per-attempt file of the previous attempt is renamed with the UTC stamp of that attempt's
launch (``train.log`` -> ``train.20260826T101500Z.log``). Never appended to, never deleted, except
an events.state.json of another attempt than run.json's (derived data, filed late: see
:func:`_drop_misfiled_state`). When the stamped names are taken (two relaunches within one second),
``-1``, ``-2``, ... is added to the stamp; one suffix serves all of an attempt's files so they stay
together.
"""

from __future__ import annotations

import os
from pathlib import Path

from stepwatch.monitors.runfiles import EVENTS_STATE, RUN_JSON, attempt_files, read_json, stamped_name, utc_stamp


def attempt_stamp(run_dir: Path) -> str | None:
    """The stamp of the attempt now in ``run_dir``: run.json's ``launched_at_unix``; without a readable
    run.json, the oldest modification time of the attempt's files; None when there is no attempt."""
    present = [run_dir / f for f in attempt_files(run_dir)]
    if not present:
        return None
    rj = read_json(run_dir / RUN_JSON) or {}
    t = rj.get("launched_at_unix")
    if not isinstance(t, (int, float)):
        t = min(p.stat().st_mtime for p in present)
    return utc_stamp(float(t))


def plan_rotation(run_dir: Path, keep: frozenset[str] = frozenset()) -> list[tuple[Path, Path]]:
    """The renames a relaunch will do, as ``[(current, stamped)]``; empty when nothing to rotate. ``keep``: names
    left in place (a requeued Slurm job's own files: launcher/requeue.py)."""
    stamp = attempt_stamp(run_dir)
    if stamp is None:
        return []
    present = [f for f in attempt_files(run_dir) if f not in keep]
    k = 0
    while True:
        s = stamp if k == 0 else f"{stamp}-{k}"
        targets = [run_dir / stamped_name(f, s) for f in present]
        if not any(t.exists() for t in targets):
            return [(run_dir / f, t) for f, t in zip(present, targets)]
        k += 1


def _drop_misfiled_state(run_dir: Path) -> None:
    """Remove an events.state.json that is not the attempt's in run.json: a previous attempt's
    supervisor saved it late, after a relaunch had rotated the files. It is derived data (views
    refuse it for this attempt and fold events.jsonl themselves), so it is not evidence to keep, and
    rotated under this attempt's stamp it would sit with the wrong attempt's files."""
    path = run_dir / EVENTS_STATE
    if not path.exists():
        return
    run = read_json(run_dir / RUN_JSON) or {}
    state = read_json(path) or {}
    if state.get("attempt") != [run.get("attempt"), run.get("launched_at_unix")]:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def rotate(run_dir: Path, keep: frozenset[str] = frozenset()) -> list[tuple[Path, Path]]:
    """Rename the previous attempt's files (see :func:`plan_rotation`); returns what was renamed.

    Uses ``os.link`` + unlink-free rename semantics: a target that appeared meanwhile is never
    overwritten (``os.link`` fails with FileExistsError, and the plan is recomputed). Raises OSError
    when the directory is not writable.
    """
    _drop_misfiled_state(run_dir)
    for _ in range(100):
        plan = plan_rotation(run_dir, keep)
        try:
            for src, dst in plan:
                os.link(src, dst)  # fails rather than overwrite evidence
                os.unlink(src)
            return plan
        except FileExistsError:
            continue
    raise OSError(f"could not find a free stamped name to rotate {run_dir}")
