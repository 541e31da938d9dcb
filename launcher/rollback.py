"""The rollback point of a loss episode (issue 47), kept from the trainer's own rotation.

When the training loss goes bad (monitors/detectors/losshealth.py opens an episode), the supervisor names the
**rollback point**: the newest complete checkpoint of this run (launcher/checkpoints.py's rule, launcher/provenance.py's
judgment: never another run's) written at or before the step the episode's level was measured from (at least a
window before the onset). It then **keeps** it: ``save_total_limit`` would delete it a few saves later. Kept means
hard links of its files in ``<run_dir>/kept/<its name>`` (the same inodes: no space, no time), or a copy of at most
MAX_COPY_BYTES where a link cannot be made (another file system); ``kept.json`` says what was kept and why.

Only a checkpoint whose whole path is safe to resume from (launcher/checkpointpath.py: owned by the run's owner,
writable by nobody else, no symlink) is kept, so a hard link shares an inode no member can write. The kept copy is
released (removed) by the attempt that kept it when that attempt ends healthy: it completed and every episode was a
spike that came back; only the newest KEEP_NEWEST points stay kept.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepwatch.launcher.checkpointpath import checkpoint_path_problem, kept_inodes
from stepwatch.launcher.checkpoints import (Checkpoint, find_checkpoints, hf_checkpoint, lightning_checkpoint,
                                            output_dir_of)
from stepwatch.launcher.provenance import judge_provenance
from stepwatch.monitors.detectors.losshealth import episodes_of
from stepwatch.monitors.states import SPIKE
from stepwatch.monitors.runfiles import KEPT_DIR, KEPT_JSON, read_json, write_json_atomic
from stepwatch.monitors.runsettings import RunSettings

#: Rollback points kept at most: the newest; older ones are pruned (hard links hold a checkpoint's whole size once
#: the trainer's rotation deleted its original).
KEEP_NEWEST = 2
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


def keep(run_dir: Path, cp: Checkpoint, onset_step: int | None, max_copy_bytes: int = MAX_COPY_BYTES,
         attempt: int | None = None, kind: str = "") -> Kept | str:
    """Keep ``cp`` in ``<run_dir>/kept/``: the Kept, or why it was not kept (words). The path judged is the path used
    (absolute, as the resume rule judges it); the copy made is judged complete again before it takes its name; only
    the newest KEEP_NEWEST rollback points stay kept (the older are pruned, folder and record)."""
    src = Path(os.path.abspath(cp.path))
    run_dir = Path(run_dir)
    if why := _own_dir_problem(run_dir):
        return f"not kept: the run dir {run_dir} {why}"
    root = run_dir / KEPT_DIR
    dest, tmp = root / src.name, root / f".{src.name}.partial"
    for name in _names(root):  # kept already: this checkpoint's files, under its name or a later pass's
        if (name == src.name or name.startswith(f"{src.name}.")) and _same_files(src, root / name):
            return Kept(str(src), cp.step, str(root / name), "already kept")
    problem = checkpoint_path_problem(src, own_links=kept_inodes(run_dir))
    if problem is not None:
        return f"not kept: {problem}"
    try:
        os.mkdir(root, 0o755)
    except FileExistsError:
        pass
    except OSError as e:
        return f"not kept: cannot make {root}: {e.strerror or e}"
    if why := _own_dir_problem(root):
        return f"not kept: {root} {why}"
    if os.path.lexists(dest):  # a checkpoint of that name kept earlier is another one (a later run over the step)
        dest = root / f"{src.name}.{time.time_ns()}"
    _remove(tmp)
    try:
        how, files = _link_or_copy(src, tmp, max_copy_bytes)
        if (again := _complete_again(tmp, cp)) is not None:
            raise ValueError(f"the kept tree is not a complete checkpoint ({again}): the trainer changed it meanwhile")
        os.rename(tmp, dest)
    except (OSError, ValueError) as e:
        _remove(tmp)
        return f"not kept: {e}"
    kept = Kept(str(src), cp.step, str(dest), how)
    try:
        _record(run_dir, {"checkpoint": kept.checkpoint, "step": kept.step, "kept": kept.kept, "how": how,
                          "onset_step": onset_step, "attempt": attempt, "kind": kind, "kept_at_unix": time.time(),
                          "files": files})
    except OSError as e:
        return f"{kept.kept} made, but kept.json could not be written: {e.strerror or e}"
    return kept


def _names(d: Path) -> list[str]:
    try:
        return os.listdir(d)
    except OSError:
        return []


def _own_dir_problem(d: Path) -> str | None:
    """Why ``d`` is not a directory of this user's that nobody else can write (None when it is)."""
    try:
        st = os.lstat(d)
    except OSError as e:
        return f"cannot be examined: {e.strerror or e}"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return "is not a directory of this user's that nobody else can write"
    return None


def _same_files(src: Path, dest: Path) -> bool:
    """Whether ``dest`` holds hard links of ``src``'s files (the same checkpoint kept already)."""
    def inodes(top: Path) -> dict[str, tuple[int, int]]:
        return {str(p.relative_to(top)): ((st := os.lstat(p)).st_dev, st.st_ino) for p in _files_of(top)}
    try:
        a, b = inodes(src), inodes(dest)
    except (OSError, ValueError):
        return False
    return bool(a) and a == b


def _files_of(top: Path) -> list[Path]:
    if not stat.S_ISDIR(os.lstat(top).st_mode):
        return [top]
    return [Path(here) / n for here, _d, names in os.walk(top, followlinks=False, onerror=_raise) for n in names]


def _raise(e: OSError) -> None:
    raise e


def _complete_again(tmp: Path, cp: Checkpoint) -> str | None:
    """Why the kept tree is not complete by the rule ``cp`` was judged by (HF, Lightning), else None."""
    if cp.kind == "hf":
        again = hf_checkpoint(tmp, cp.step)
    elif cp.kind == "lightning":
        again = lightning_checkpoint(tmp, cp.step)
    else:
        return None
    return None if again.complete else again.why


def _records(run_dir: Path) -> list[dict[str, Any]]:
    """kept.json's rollback points (``all``), as this user alone wrote them (else none)."""
    prior = read_json(run_dir / KEPT_JSON, private=True) or {}
    return [k for k in prior.get("all") or [] if isinstance(k, dict)]


def _kept_path(run_dir: Path, k: dict[str, Any]) -> Path | None:
    """Where record ``k`` says its copy lies, when that is a name in ``<run_dir>/kept`` (else None: never removed)."""
    p = k.get("kept")
    return Path(p) if isinstance(p, str) and Path(p).parent == run_dir / KEPT_DIR else None


def _record(run_dir: Path, newest: dict[str, Any]) -> None:
    """kept.json: the newest point on top, every point kept in ``all``; older points beyond KEEP_NEWEST pruned."""
    listed = [*_records(run_dir), newest]
    for old in listed[:-KEEP_NEWEST]:
        if (p := _kept_path(run_dir, old)) is not None:
            _remove(p)
    write_json_atomic(run_dir / KEPT_JSON, {"v": 1, **newest, "all": listed[-KEEP_NEWEST:]}, mode=0o644)


def _remove(p: Path) -> None:
    """``p`` gone, a tree or a file (never a symlink's target)."""
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p, ignore_errors=True)
    elif os.path.lexists(p):
        os.unlink(p)


#: Where a hard link cannot be made (another file system, a file system without them, too many links): a copy.
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EMLINK})


def _link_or_copy(src: Path, dest: Path, max_copy_bytes: int) -> tuple[str, dict[str, list[int]]]:
    """``src`` (a file or a directory tree, symlinks never followed, nothing but directories and regular files) as
    hard links under ``dest``, else copied (0644) when every file together is at most ``max_copy_bytes``. Returns how,
    and each file's ``[size, mtime_ns]`` (what kept.json records, to tell later whether a link was written over).
    Raises OSError or ValueError."""
    files: list[tuple[Path, Path, os.stat_result]] = []
    if stat.S_ISDIR(os.lstat(src).st_mode):
        os.mkdir(dest, 0o755)
        for here, dirs, names in os.walk(src, followlinks=False, onerror=_raise):
            rel = Path(here).relative_to(src)
            for d in dirs:
                os.mkdir(dest / rel / d, 0o755)
            files += [(Path(here) / n, dest / rel / n, os.lstat(Path(here) / n)) for n in names]
    else:
        files.append((src, dest, os.lstat(src)))
    if bad := [str(a) for a, _, st in files if not stat.S_ISREG(st.st_mode)]:
        raise ValueError(f"{bad[0]} is not a regular file")
    record = {str(b.relative_to(dest)) if b != dest else b.name: [st.st_size, st.st_mtime_ns] for _, b, st in files}
    try:
        for a, b, _ in files:
            os.link(a, b, follow_symlinks=False)
        return "hard links", record
    except OSError as e:
        if e.errno not in _NO_LINK:
            raise
    total = sum(st.st_size for _, _, st in files)
    if total > max_copy_bytes:
        raise ValueError(f"it cannot be hard-linked and its {total} bytes are over the copy limit ({max_copy_bytes})")
    for a, b, _ in files:
        if os.path.lexists(b):
            os.unlink(b)
        _copy(a, b)
    return "a copy", record


def _copy(a: Path, b: Path) -> None:
    """``a``'s bytes into a new file ``b`` (0644, never through a symlink, never over an existing name)."""
    fi = os.open(a, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fo = os.open(b, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.fchmod(fo, 0o644)  # whatever the umask
            while chunk := os.read(fi, 1 << 20):
                os.write(fo, chunk)
        finally:
            os.close(fo)
    finally:
        os.close(fi)


def release(run_dir: Path, attempt: int | None = None) -> bool:
    """Remove the kept rollback points of ``attempt`` (None: every one) and their records. Whether any went."""
    run_dir = Path(run_dir)
    listed = _records(run_dir)
    gone = [k for k in listed if attempt is None or k.get("attempt") == attempt]
    for k in gone:
        if (p := _kept_path(run_dir, k)) is not None:
            _remove(p)
    left = [k for k in listed if k not in gone]
    if left:
        write_json_atomic(run_dir / KEPT_JSON, {"v": 1, **left[-1], "all": left}, mode=0o644)
    else:
        _remove(run_dir / KEPT_JSON)
        _remove(run_dir / KEPT_DIR)
    return bool(gone)


class RollbackKeeper:
    """The supervisor's hooks for the detector loop (monitors/watch/loop.py): :meth:`episode` when a loss episode is
    first alerted (it names and keeps the rollback point, and says so in words for the alert), :meth:`ended` at the
    attempt's last look (it releases what was kept when the run ended healthy)."""

    def __init__(self, run_dir: Path, run: dict[str, Any], log: Any = None):
        self.run_dir, self.run, self.log = Path(run_dir), run, log or (lambda _m: None)

    def episode(self, ep: dict[str, Any], earlier: list[dict[str, Any]] | tuple[()] = ()) -> str:
        """Name and keep ``ep``'s rollback point, in words. ``earlier``: the run's episodes before it; a persistent
        or catastrophic one bounds every later point (a spike after the run went bad measures its level on bad
        weights: its rollback point is the first bad episode's, never a checkpoint saved since)."""
        onset = ep.get("onset_step")
        at = ep.get("level_from_step") if type(ep.get("level_from_step")) is int else onset
        if type(at) is not int:
            return "no rollback point: the episode's steps are not known"
        for e in earlier:
            if e.get("kind") != SPIKE and type(b := e.get("level_from_step") or e.get("onset_step")) is int:
                at = min(at, b)
        cp = rollback_point(self.run_dir, self.run, at)
        held = self._kept_at_or_before(at)
        if held is not None and (cp is None or held["step"] >= cp.step):  # rotated away since, and kept
            return f"rollback {Path(held['checkpoint']).name} (step {held['step']}): kept in {held['kept']}"
        if cp is None:
            return f"no complete checkpoint of this run at or before step {at} to roll back to"
        attempt = self.run.get("attempt") if type(self.run.get("attempt")) is int else None
        kept = keep(self.run_dir, cp, onset if type(onset) is int else None, attempt=attempt,
                    kind=str(ep.get("kind") or ""))
        words = kept if isinstance(kept, str) else f"kept in {kept.kept}"
        self.log(f"rollback point {cp.path}: {words}" + ("" if isinstance(kept, str) else f" ({kept.how})"))
        return f"rollback {cp.path.name} (step {cp.step}): {words}"

    def _kept_at_or_before(self, at: int) -> dict[str, Any] | None:
        """The newest rollback point kept earlier (kept.json, this user's alone) at or before ``at``, still there."""
        kept = [k for k in _records(self.run_dir) if type(k.get("step")) is int and k["step"] <= at
                and isinstance(k.get("checkpoint"), str) and (p := _kept_path(self.run_dir, k)) is not None
                and p.is_dir()]
        return max(kept, key=lambda k: k["step"], default=None)

    def ended(self, snap: Any) -> None:
        """This attempt's last look: when it completed and every loss episode was a spike that came back, the
        rollback points it kept are released (an earlier attempt's stay)."""
        healthy = snap["returncode"] == 0 and all(
            e["kind"] == SPIKE and e["recovered_step"] is not None for e in episodes_of(snap["loss_health"]))
        attempt = self.run.get("attempt") if type(self.run.get("attempt")) is int else None
        if healthy and release(self.run_dir, attempt):
            self.log("the attempt ended healthy: the rollback checkpoints it kept are released")
