"""Whether a checkpoint may be handed to the job: judged on its whole path, at the moment it is handed.

A resume unpickles the checkpoint with the owner's rights, so it must be the owner's in every sense that matters,
as ssh's ``StrictModes`` judges the path of ``authorized_keys`` (ARCHITECTURE.md "The restart policy", R17):

- the checkpoint, and for a directory every entry a resume loads (files and subdirectories, recursively, at most
  MAX_ENTRIES), is owned by the owner or root, writable by no group or other, a file with one link;
- every directory above it, up to ``/``, is owned by the owner or root and writable by no one but them, except a
  directory with the sticky bit (``/tmp``), which is safe for an entry below it that the owner or root owns: a safe
  ``out/`` in a group-writable project dir is not safe, since the group can rename ``out/`` away and put their own;
- no component is a symlink (never followed: it is unsafe, and named), and none is ``..``.

Such a path can be changed by no one but the owner and root. So a check right before the next attempt's exec (after
the policy's back-off and after the checklist, :func:`resume_at_exec` in ``launch``, and again in the supervisor
just before it starts the command, :func:`refused_at_exec`) closes the window between the choice and the load: what
passed cannot be swapped by a member afterwards. A refused resume stops, or starts from scratch where ``[restart]
unsafe_checkpoint = "scratch"`` says so.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepwatch.launcher.checkpoints import MAX_ENTRIES
from stepwatch.launcher.restartpolicy import RESTART, STOP, Decision, RestartSettings
from stepwatch.launcher.trust import group_name
from stepwatch.monitors.runfiles import KEPT_DIR

if TYPE_CHECKING:
    from stepwatch.launcher.config import RunConfig

_WRITE_GO = stat.S_IWGRP | stat.S_IWOTH
#: Files of the run's kept rollback checkpoints looked at, at most (two checkpoints are kept: launcher/rollback.py).
MAX_KEPT_FILES = 10 * MAX_ENTRIES


@dataclass(frozen=True, slots=True)
class UnsafePath:
    """What made a checkpoint's path unsafe: ``where`` (a directory above it, the checkpoint, or an entry in it) and
    ``why`` (its mode, owner, links), e.g. ``/team/proj`` · ``is writable by group swteam (mode 2775): the group can
    rename out/ away``."""

    where: str
    why: str

    def __str__(self) -> str:
        return f"{self.where} {self.why}"


def _who(st: os.stat_result) -> str:
    return "every user" if st.st_mode & stat.S_IWOTH else f"group {group_name(st.st_gid)}"


def _mode(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}"


def _owner_problem(st: os.stat_result, uid: int) -> str | None:
    if st.st_uid not in (uid, 0):
        return f"belongs to uid {st.st_uid}, not to you (uid {uid}) or root"
    return None


def _entry_problem(p: str, st: os.stat_result, uid: int, own_links: frozenset[tuple[int, int]] = frozenset()
                   ) -> UnsafePath | None:
    """The checkpoint itself, or an entry in it: the owner's or root's, writable by no one else, one link (or two,
    the second the run's own: a rollback checkpoint it kept, ``own_links``' (device, inode))."""
    if stat.S_ISLNK(st.st_mode):
        return UnsafePath(p, "is a symlink: a checkpoint is never loaded through one")
    if why := _owner_problem(st, uid):
        return UnsafePath(p, f"{why}: its owner can change what a resume loads")
    if st.st_mode & _WRITE_GO:
        return UnsafePath(p, f"is writable by {_who(st)} ({_mode(st)}): they can change what a resume loads")
    if stat.S_ISREG(st.st_mode) and st.st_nlink != 1 and not (
            st.st_nlink == 2 and (st.st_dev, st.st_ino) in own_links):
        return UnsafePath(p, f"has {st.st_nlink} hard links: another name may lead to it")
    return None


def _inside_problem(top: str, uid: int, own_links: frozenset[tuple[int, int]]) -> UnsafePath | None:
    """Every entry under the checkpoint directory ``top``, depth first, never through a symlink."""
    seen, todo = 0, [top]
    while todo:
        d = todo.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError as e:
            return UnsafePath(d, f"cannot be read: {e.strerror or e}")
        for e in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                return UnsafePath(top, f"holds more than {MAX_ENTRIES} entries: not judged")
            try:
                st = os.lstat(e.path)
            except OSError as err:
                return UnsafePath(e.path, f"cannot be examined: {err.strerror or err}")
            if problem := _entry_problem(e.path, st, uid, own_links):
                return problem
            if stat.S_ISDIR(st.st_mode):
                todo.append(e.path)
    return None


def checkpoint_path_problem(path: str | Path, uid: int | None = None,
                            own_links: frozenset[tuple[int, int]] = frozenset()) -> UnsafePath | None:
    """What makes ``path`` (absolute, as it is handed to the job) unsafe to resume from as ``uid`` (default: this
    process's), or None when it is safe: the module's rule, from ``/`` down, then inside the checkpoint. ``own_links``:
    the (device, inode) of the files the run itself keeps a second name of (:func:`kept_inodes`)."""
    uid = os.geteuid() if uid is None else uid
    p = str(path)
    parts = p.split("/")
    if not p.startswith("/") or ".." in parts:
        return UnsafePath(p, "is not an absolute path without '..': it is not judged")
    names = [n for n in parts if n and n != "."]
    if not names:
        return UnsafePath(p, "is the root directory, not a checkpoint")
    here = "/"
    for name in names:
        below = os.path.join(here, name)
        try:
            st, st_below = os.lstat(here), os.lstat(below)
        except OSError as e:
            return UnsafePath(below, f"cannot be examined: {e.strerror or e}")
        if stat.S_ISLNK(st.st_mode):
            return UnsafePath(here, "is a symlink: a checkpoint's path is never followed through one")
        if not stat.S_ISDIR(st.st_mode):
            return UnsafePath(here, "is not a directory")
        if why := _owner_problem(st, uid):
            return UnsafePath(here, f"{why}: its owner can rename {name} away")
        if st.st_mode & _WRITE_GO and not st.st_mode & stat.S_ISVTX:  # sticky: only the entry's owner may rename
            them = "anyone" if st.st_mode & stat.S_IWOTH else "the group"  # it, and its owner is judged next
            return UnsafePath(here, f"is writable by {_who(st)} ({_mode(st)}): {them} can rename "
                                    f"{name}{'/' if stat.S_ISDIR(st_below.st_mode) else ''} away")
        here = below
    try:
        st = os.lstat(here)
    except OSError as e:
        return UnsafePath(here, f"cannot be examined: {e.strerror or e}")
    if problem := _entry_problem(here, st, uid, own_links):
        return problem
    return _inside_problem(here, uid, own_links) if stat.S_ISDIR(st.st_mode) else None


def kept_inodes(run_dir: str | Path | None) -> frozenset[tuple[int, int]]:
    """The (device, inode) of every regular file under ``<run_dir>/kept`` (launcher/rollback.py's hard links of a
    rollback checkpoint): the run's own second names, in a folder of the run dir only its owner writes. A kept folder
    that is not this user's alone counts for nothing."""
    if run_dir is None:
        return frozenset()
    root = os.path.join(str(run_dir), KEPT_DIR)
    try:
        st = os.lstat(root)
    except OSError:
        return frozenset()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & _WRITE_GO:
        return frozenset()
    out: set[tuple[int, int]] = set()
    for here, dirs, names in os.walk(root, followlinks=False):
        if here == root:
            dirs[:] = [d for d in dirs if not d.startswith(".")]  # a keep cut short (.name.partial) is nobody's name
        for n in names[:MAX_KEPT_FILES]:
            try:
                f = os.lstat(os.path.join(here, n))
            except OSError:
                continue
            if stat.S_ISREG(f.st_mode):
                out.add((f.st_dev, f.st_ino))
        if len(out) >= MAX_KEPT_FILES:
            break
    return frozenset(out)


def refusal(checkpoint: str, problem: UnsafePath) -> str:
    """One line: the resume refused, the path that made it unsafe and why."""
    return (f"REFUSING to resume from {checkpoint}: {problem}. A resume loads it (a pickle) with your rights, so "
            "its whole path must be writable by you and root alone (chmod g-w,o-w the directory named)")


def judge_decision(d: Decision, s: RestartSettings, run_dir: str | Path | None = None
                   ) -> tuple[Decision, dict[str, str] | None]:
    """The policy's RESTART from a checkpoint, judged at decision time: unchanged when its path is safe; else STOP,
    or RESTART from scratch where ``unsafe_checkpoint = "scratch"``, with the reason; and what was refused."""
    if d.verdict != RESTART or not d.checkpoint:
        return d, None
    cp = os.path.normpath(d.checkpoint)
    problem = checkpoint_path_problem(cp, own_links=kept_inodes(run_dir))
    if problem is None:
        return d, None
    refused = {"checkpoint": cp, "where": problem.where, "why": str(problem)}
    if s.unsafe_checkpoint == "scratch":
        lost = None if d.lost_steps is None else d.lost_steps + (d.checkpoint_step or 0)
        return replace(d, checkpoint=None, checkpoint_step=None, lost_steps=lost,
                       reason=f"{d.reason}; from scratch instead: {cp} is not safe to resume from: {problem}"), refused
    return replace(d, verdict=STOP, checkpoint=None, checkpoint_step=None, lost_steps=None,
                   reason=f"{cp} is not safe to resume from: {problem}"), refused


def resume_at_exec(cfg: RunConfig, refuse: type[Exception]) -> None:
    """The launch's last look at the checkpoint ``cfg`` resumes from, after the back-off and the checklist, right
    before the supervisor starts the command: raises ``refuse`` (the launch's LaunchRefused) naming what made the path
    unsafe; where ``[restart] unsafe_checkpoint = "scratch"`` says so, ``cfg`` becomes its command without the resume
    argument instead (``resumed_from`` says why: :func:`scratch_note`)."""
    rf = cfg.resumed_from or {}
    cp = rf.get("checkpoint")
    problem = checkpoint_path_problem(cp, own_links=kept_inodes(cfg.run_dir)) if isinstance(cp, str) and cp else None
    if problem is None:
        return
    if cfg.settings.restart.unsafe_checkpoint == "scratch" and cfg.scratch_command is not None:
        cfg.command = list(cfg.scratch_command)
        cfg.resumed_from = {**rf, "checkpoint": None, "step": None, "unsafe_checkpoint": str(problem)}
        return
    raise refuse(refusal(str(cp), problem))


def scratch_note(cfg: RunConfig) -> str | None:
    """The launch's warning when :func:`resume_at_exec` turned a resume into a start from scratch, else None."""
    why = (cfg.resumed_from or {}).get("unsafe_checkpoint")
    return f'starting from scratch ([restart] unsafe_checkpoint = "scratch"), not from the checkpoint: {why}' if why else None


def refused_at_exec(run: dict[str, Any], run_dir: str | Path | None = None) -> str | None:
    """The supervisor's look, just before it starts the command (a Slurm job may wait in the queue long after its
    launch): why the checkpoint the attempt resumes from (run.json ``resumed_from``, the owner's) is refused."""
    rf = run.get("resumed_from")
    cp = rf.get("checkpoint") if isinstance(rf, dict) else None
    if not isinstance(cp, str) or not cp:
        return None
    problem = checkpoint_path_problem(cp, own_links=kept_inodes(run_dir))
    return refusal(cp, problem) if problem else None
