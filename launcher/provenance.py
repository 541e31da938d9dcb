"""Whose checkpoint is it: the restart policy resumes only from a checkpoint this run could have written.

A reused output directory holds another run's checkpoints, or an earlier attempt's that went further than this one:
resuming from them skips steps that were never trained (``ckpt_400`` after a death at step 195: 205 steps) or
trains on another run's weights. Before the policy (or a requeued job) picks the newest complete checkpoint, each
complete one is judged (ARCHITECTURE.md "The restart policy"):

- written before this run's first attempt was launched (its newest modification time, the directory's and its
  entries', earlier than the earliest ``launched_at_unix`` of this run's attempts, run.json and its rotated copies,
  the owner's alone): another run's;
- ahead of the step this attempt reached and not written while it ran: not this attempt's line of training (an
  earlier attempt's that went further, or a ``trainer_state.json`` that claims a later step).

A refused checkpoint is left in the list, not complete, with the reason (restart.json's ``checkpoints``, the
decision's words, the page). The checkpoint the operator named for this attempt (``relaunch --from-checkpoint``, the
run screen's choice: run.json ``resumed_from`` by ``operator``) is theirs and never refused. What this cannot see: a
checkpoint copied in with fresh modification times; the supervisor's own record of the saves it saw is the next step.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from stepwatch.launcher.checkpoints import MAX_ENTRIES, Checkpoint
from stepwatch.monitors.fold.stepcolumns import unix_time
from stepwatch.monitors.runfiles import utc_iso
from stepwatch.monitors.snapshot.process import run_began_at as run_began_at  # the finished page reads it too

#: Seconds a file system's clock may lag the launching host's (a network file system stamps with the server's clock).
CLOCK_SLACK_S = 5.0
#: The word every provenance refusal starts with (restart.json's ``why``).
NOT_THIS_RUNS = "not this run's"


def written_at(path: Path) -> float | None:
    """The newest modification time of ``path`` and, for a directory, of its entries (never following a link); None
    when it cannot be examined."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    newest = st.st_mtime
    if stat.S_ISDIR(st.st_mode):
        try:
            with os.scandir(path) as it:
                for i, e in enumerate(it):
                    if i >= MAX_ENTRIES:
                        break
                    try:
                        newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
                    except OSError:
                        continue
        except OSError:
            pass
    return newest


def operator_named(run: dict[str, Any]) -> str | None:
    """The checkpoint the operator chose for this attempt (run.json ``resumed_from`` by ``operator``), or None."""
    rf = run.get("resumed_from")
    if isinstance(rf, dict) and rf.get("by") == "operator" and isinstance(rf.get("checkpoint"), str):
        return os.path.normpath(rf["checkpoint"])
    return None


def judge_provenance(checkpoints: list[Checkpoint], run_dir: Path, run: dict[str, Any],
                     reached_step: int | None) -> list[Checkpoint]:
    """``checkpoints`` with every complete one this run could not have written made not complete, the reason in its
    ``why`` (see the module). ``reached_step``: the step this attempt reached (None: unknown, the step rule is off)."""
    began = run_began_at(run_dir, run)
    attempt_began = unix_time(run.get("launched_at_unix")) or None
    named = operator_named(run)
    out: list[Checkpoint] = []
    for c in checkpoints:
        why = None
        if c.complete and os.path.normpath(str(c.path)) != named:
            t = written_at(c.path)
            if t is not None and began is not None and t < began - CLOCK_SLACK_S:
                why = (f"{NOT_THIS_RUNS}: last written {utc_iso(t)}, before the run's first launch "
                       f"({utc_iso(began)})")
            elif (reached_step is not None and c.step > reached_step
                  and (t is None or attempt_began is None or t < attempt_began - CLOCK_SLACK_S)):
                why = (f"{NOT_THIS_RUNS}: step {c.step} is ahead of step {reached_step}, where this attempt ended, "
                       "and it was not written while this attempt ran")
        out.append(Checkpoint(c.path, c.step, c.kind, False, why) if why else c)
    return out


def refused_words(listed: list[dict[str, Any]], chosen_step: int | None) -> str:
    """``; not resuming from …/ckpt_400 (not this run's: …)`` for the newest checkpoint of ``listed`` (restart.json's
    rows) refused as another's that is newer than the one chosen (and how many more), or ``""``."""
    refused = [r for r in listed if str(r.get("why") or "").startswith(NOT_THIS_RUNS)
               and (chosen_step is None or int(r.get("step") or 0) > chosen_step)]
    if not refused:
        return ""
    top = max(refused, key=lambda r: int(r.get("step") or 0))
    more = f" and {len(refused) - 1} more" if len(refused) > 1 else ""
    return f"; not resuming from {top['path']}{more} ({top['why']})"
