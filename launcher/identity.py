"""The clean-tree gate and the harness identity, sampled once at launch (ARCHITECTURE.md R6, R5).

Read with GitPython on the repository that holds the run's ``cwd``. Nothing re-reads git after the
child starts: a commit that lands during a seven-hour run must not change what run.json says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import git


@dataclass
class TreeState:
    """What git says about the harness checkout at launch.

    ``repo_root`` is None when ``cwd`` is not in a git work tree (``error`` then says why).
    ``modified``/``staged`` are paths relative to the repo root; ``untracked`` excludes the runs dir.
    """

    repo_root: Path | None
    error: str | None = None
    #: git itself failed while the tree was sampled (another user's repo: "dubious ownership"; no git
    #: binary): ``error`` says why and the fix, and no --allow-dirty launches it (nothing was sampled)
    unreadable: bool = False
    modified: list[str] = field(default_factory=list)
    staged: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)
    identity: dict[str, Any] = field(default_factory=dict)

    @property
    def dirty(self) -> bool:
        """True when tracked files are modified or changes are staged (untracked files do not count)."""
        return bool(self.modified or self.staged)

    @property
    def clean(self) -> bool:
        """True only for a git work tree with no tracked modification and nothing staged."""
        return self.repo_root is not None and self.error is None and not self.dirty


def _null_identity() -> dict[str, Any]:
    return {"repo_root": None, "harness_commit": None, "harness_dirty_at_launch": None, "branch": None,
            "describe": None, "untracked": [], "modified": [], "staged": []}


def read_tree(cwd: Path, runs_dir: Path | None = None) -> TreeState:
    """Sample the work tree holding ``cwd``: dirty files, untracked files, identity.

    identity keys (always all present): repo_root, harness_commit (full sha), harness_dirty_at_launch,
    branch (null when HEAD is detached), describe (``git describe --always --dirty``), untracked,
    modified, staged. Never raises for "not a repo" or "no commit yet"; those land in ``error``.
    """
    try:
        repo = git.Repo(cwd, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        st = TreeState(None, error=f"not inside a git work tree: {cwd}")
        st.identity = _null_identity()
        return st
    if repo.bare or repo.working_tree_dir is None:
        st = TreeState(None, error=f"{cwd} is in a bare repository (no work tree)")
        st.identity = _null_identity()
        return st
    root = Path(os.path.realpath(repo.working_tree_dir))
    try:
        return _sample(repo, root, runs_dir)
    except (git.GitError, OSError) as e:  # GitCommandError, GitCommandNotFound: git refused or is missing
        st = TreeState(root, error=_git_failure(root, e), unreadable=True)
        st.identity = _null_identity()
        return st
    finally:
        repo.close()


def _sample(repo: git.Repo, root: Path, runs_dir: Path | None) -> TreeState:
    st = TreeState(root)
    try:
        head = repo.head.commit
    except ValueError:
        st.error = f"the repository at {root} has no commit yet"
        head = None
    st.modified = sorted({d.a_path for d in repo.index.diff(None)})
    if head is not None:
        st.staged = sorted({d.a_path or d.b_path for d in repo.index.diff("HEAD")})
    else:
        st.staged = sorted(str(k[0]) for k in repo.index.entries)
    untracked = repo.untracked_files
    if runs_dir is not None:
        target = runs_dir.resolve()
        try:
            rel = target.relative_to(root).as_posix().rstrip("/") + "/"
            untracked = [u for u in untracked if not u.startswith(rel)]
        except ValueError:
            # outside the tree, but maybe linked into it (runs -> /scratch/runs): git lists the
            # link as an untracked file of its own name
            untracked = [u for u in untracked if not _links_to(root / u, target)]
    st.untracked = sorted(untracked)
    try:
        branch = None if repo.head.is_detached else repo.active_branch.name
    except TypeError:
        branch = None
    describe = None
    if head is not None:
        try:
            describe = repo.git.describe("--always", "--dirty")
        except git.GitCommandError:
            describe = None
    st.identity = {
        "repo_root": str(root),
        "harness_commit": head.hexsha if head is not None else None,
        "harness_dirty_at_launch": st.dirty,
        "branch": branch,
        "describe": describe,
        "untracked": st.untracked,
        "modified": st.modified,
        "staged": st.staged,
    }
    return st


def _git_failure(root: Path, e: BaseException) -> str:
    """One line: git could not read the repository at ``root``, git's own reason (asked again with a
    plain ``git rev-parse``: a failed ``git diff`` reports "Not a git repository" for what is another
    user's repo), and the fix when the repository is another user's."""
    reason = ""
    try:
        _, _, err = git.Git(str(root)).rev_parse("--git-dir", with_extended_output=True, with_exceptions=False)
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        reason = next((ln for ln in lines if ln.startswith(("fatal:", "error:"))), lines[0] if lines else "")
    except (git.GitError, OSError) as probe:
        reason = str(probe)
    if not reason:
        reason = " ".join(str(e).split())[:300]
    msg = f"git cannot read the repository at {root} ({reason})"
    if "dubious ownership" in reason:
        try:
            owner = f"uid {root.stat().st_uid}"
        except OSError:
            owner = "another user"
        msg += (f": it belongs to {owner}, not to you (uid {os.geteuid()}). Only if it is really theirs to "
                f"trust, run: git config --global --add safe.directory {root}  (then launch again)")
    return msg


def _links_to(path: Path, target: Path) -> bool:
    """``path`` is a symlink to ``target`` (a link loop or a dangling link is not)."""
    try:
        return path.is_symlink() and path.resolve(strict=True) == target
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11)
        return False


def gate_message(st: TreeState, limit: int = 20) -> str:
    """The refusal text for a tree that fails the gate: names the files and the override."""
    if st.unreadable:
        return f"REFUSING: {st.error}"
    if st.repo_root is None or st.error:
        return (f"REFUSING: {st.error}. harness_commit would not describe this run. Commit the harness in git, "
                f"or launch with --allow-dirty \"REASON\" to record why it may run anyway.")
    lines = ["REFUSING: the working tree is dirty; harness_commit would not describe this run."]
    for label, files in (("modified", st.modified), ("staged", st.staged)):
        for f in files[:limit]:
            lines.append(f"  {label}: {f}")
        if len(files) > limit:
            lines.append(f"  ... and {len(files) - limit} more {label}")
    lines.append("Commit (or stash) the changes, or launch with --allow-dirty \"REASON\" (the reason is recorded in run.json).")
    return "\n".join(lines)


def untracked_warning(st: TreeState, limit: int = 10) -> str | None:
    """A warning naming untracked files (outside the runs dir and .gitignore), or None."""
    if not st.untracked:
        return None
    shown = ", ".join(st.untracked[:limit]) + (f", ... ({len(st.untracked)} in all)" if len(st.untracked) > limit else "")
    return f"warning: untracked files in the harness tree (not part of harness_commit): {shown}"

