"""The rollback point of a loss episode (issue 47), kept from the trainer's own rotation.

When the training loss goes bad (monitors/detectors/losshealth.py opens an episode), the supervisor names the
**rollback point**: the newest complete checkpoint of this run (launcher/checkpoints.py's rule, launcher/provenance.py's
judgment: never another run's) written at or before the step the episode's level was measured from (at least a
window before the onset). It then **keeps** it: ``save_total_limit`` would delete it a few saves later. Kept means
hard links of its files in ``<run_dir>/kept/<its name>`` (the same inodes: no space, no time), or a copy of at most
MAX_COPY_BYTES where a link cannot be made (another file system); ``kept.json`` says what was kept and why.

Only a checkpoint whose whole path is safe to resume from (launcher/checkpointpath.py: owned by the run's owner,
writable by nobody else, no symlink) is kept, so a hard link shares an inode no member can write. The kept copy is
released (removed) when the run ends healthy: it completed and every episode was a spike that came back.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepwatch.launcher.checkpointpath import checkpoint_path_problem
from stepwatch.launcher.checkpoints import Checkpoint, find_checkpoints, output_dir_of
from stepwatch.launcher.provenance import judge_provenance
from stepwatch.monitors.runfiles import KEPT_DIR, KEPT_JSON, read_json, write_json_atomic
from stepwatch.monitors.runsettings import RunSettings

#: Rollback points kept.json lists at most (the newest is also its top level: what a view shows).
MAX_KEPT = 16
#: A checkpoint that cannot be hard-linked is copied only up to this many bytes.
MAX_COPY_BYTES = 2 * 1024**3


@dataclass(frozen=True, slots=True)
class Kept:
    """A rollback point kept: the checkpoint, its step, where its copy lies and how it was made."""

    checkpoint: str
    step: int
    kept: str
    how: str  # "hard links" or "a copy"


def rollback_point(run_dir: Path, run: dict[str, Any], at_or_before: int) -> Checkpoint | None:
    """The newest complete checkpoint of this run whose step is at most ``at_or_before``, or None."""
    s = RunSettings.of_run(run).restart
    cwd = Path(str(run.get("cwd") or run_dir))
    found = find_checkpoints(output_dir_of([str(a) for a in run.get("argv") or []], cwd), s.checkpoints, cwd,
                             s.complete_marker)
    mine = [c for c in judge_provenance(found, run_dir, run, None) if c.complete and c.step <= at_or_before]
    return max(mine, key=lambda c: c.step, default=None)


def keep(run_dir: Path, cp: Checkpoint, onset_step: int | None, max_copy_bytes: int = MAX_COPY_BYTES) -> Kept | str:
    """Keep ``cp`` in ``<run_dir>/kept/``: the Kept, or why it was not kept (words)."""
    problem = checkpoint_path_problem(os.path.abspath(cp.path))
    if problem is not None:
        return f"not kept: {problem}"
    root = Path(run_dir) / KEPT_DIR
    try:
        os.mkdir(root, 0o755)
    except FileExistsError:
        pass
    except OSError as e:
        return f"not kept: cannot make {root}: {e.strerror or e}"
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return f"not kept: {root} is not a directory of this user's that nobody else can write"
    dest, tmp = root / cp.path.name, root / f".{cp.path.name}.partial"
    if os.path.lexists(dest):
        return Kept(str(cp.path), cp.step, str(dest), "already kept")
    _remove(tmp)
    try:
        how = _link_or_copy(cp.path, tmp, max_copy_bytes)
        os.rename(tmp, dest)
    except (OSError, ValueError) as e:
        _remove(tmp)
        return f"not kept: {e}"
    kept = Kept(str(cp.path), cp.step, str(dest), how)
    prior = read_json(Path(run_dir) / KEPT_JSON, private=True) or {}
    listed = [k for k in prior.get("all") or [] if isinstance(k, dict)][-(MAX_KEPT - 1):]
    newest = {"checkpoint": kept.checkpoint, "step": kept.step, "kept": kept.kept, "how": how,
              "onset_step": onset_step, "kept_at_unix": time.time()}
    write_json_atomic(Path(run_dir) / KEPT_JSON, {"v": 1, **newest, "all": [*listed, newest]}, mode=0o644)
    return kept


def _remove(p: Path) -> None:
    """``p`` gone, a tree or a file (never a symlink's target)."""
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p, ignore_errors=True)
    elif os.path.lexists(p):
        os.unlink(p)


def _link_or_copy(src: Path, dest: Path, max_copy_bytes: int) -> str:
    """``src`` (a file or a directory tree, symlinks never followed) as hard links under ``dest``, else copied when
    every file together is at most ``max_copy_bytes``. Returns how; raises OSError or ValueError."""
    files: list[tuple[Path, Path, int]] = []
    if stat.S_ISDIR(os.lstat(src).st_mode):
        os.mkdir(dest, 0o755)
        for here, dirs, names in os.walk(src, followlinks=False):
            rel = Path(here).relative_to(src)
            for d in dirs:
                os.mkdir(dest / rel / d, 0o755)
            files += [(Path(here) / n, dest / rel / n, os.lstat(Path(here) / n).st_size) for n in names]
    else:
        files.append((src, dest, os.lstat(src).st_size))
    try:
        for a, b, _ in files:
            os.link(a, b, follow_symlinks=False)
        return "hard links"
    except OSError:
        total = sum(n for _, _, n in files)
        if total > max_copy_bytes:
            raise ValueError(f"it cannot be hard-linked and its {total} bytes are over the copy limit "
                             f"({max_copy_bytes})") from None
        for a, b, _ in files:
            if os.path.lexists(b):
                os.unlink(b)
            shutil.copyfile(a, b, follow_symlinks=False)
            os.chmod(b, 0o644)  # the owner's alone to write, whatever the umask
        return "a copy"


def release(run_dir: Path) -> bool:
    """Remove the kept checkpoints (the run ended healthy). Whether there were any."""
    root = Path(run_dir) / KEPT_DIR
    if not os.path.lexists(root):
        return False
    _remove(root)
    try:
        os.unlink(Path(run_dir) / KEPT_JSON)
    except OSError:
        pass
    return True


class RollbackKeeper:
    """The supervisor's hooks for the detector loop (monitors/watch/loop.py): :meth:`episode` when a loss episode is
    first alerted (it names and keeps the rollback point, and says so in words for the alert), :meth:`ended` at the
    attempt's last look (it releases what was kept when the run ended healthy)."""

    def __init__(self, run_dir: Path, run: dict[str, Any], log: Any = None):
        self.run_dir, self.run, self.log = Path(run_dir), run, log or (lambda _m: None)

    def episode(self, ep: dict[str, Any]) -> str:
        onset = ep.get("onset_step")
        at = ep.get("level_from_step") if type(ep.get("level_from_step")) is int else onset
        if type(at) is not int:
            return "no rollback point: the episode's steps are not known"
        cp = rollback_point(self.run_dir, self.run, at)
        if cp is None:
            return f"no complete checkpoint of this run at or before step {at} to roll back to"
        kept = keep(self.run_dir, cp, onset if type(onset) is int else None)
        if isinstance(kept, str):
            self.log(f"rollback point {cp.path}: {kept}")
            return f"rollback point {cp.path.name} (step {cp.step}), {kept}"
        self.log(f"rollback point {cp.path} kept in {kept.kept} ({kept.how})")
        return f"rollback {cp.path.name} (step {cp.step}) kept in {kept.kept}"

    def ended(self, snap: Any) -> None:
        lh = snap.get("loss_health") or {}
        eps = [*(lh.get("ended") or []), *([lh["episode"]] if lh.get("episode") else [])]
        healthy = snap.get("returncode") == 0 and all(
            e.get("kind") == "spike" and e.get("recovered_step") is not None for e in eps)
        if healthy and release(self.run_dir):
            self.log("the run ended healthy: its kept rollback checkpoints are released")
