"""The tree's identity on real git repos, function by function: the repo found from a subfolder, a repo with no commit yet and
its staged files, a staged deletion, a link out of the tree that is not the runs dir, and the
refusal and warning texts at their limits (20 files named, 10 untracked), and another user's repo (git
refuses it: one line naming the repo, git's reason and the fix, never a GitCommandError)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from conftest import git, make_repo
from stepwatch.launcher.identity import gate_message, read_tree, untracked_warning


def test_the_repo_is_found_from_a_subfolder(tmp_path: Path):
    repo = make_repo(tmp_path / "r", {"pkg/train.py": "x = 1\n"})
    st = read_tree(repo / "pkg")
    assert st.repo_root == repo.resolve() and st.error is None and not st.dirty
    assert st.identity["harness_commit"] == git(repo, "rev-parse", "HEAD") and st.identity["branch"] == "main"


def test_a_repo_with_no_commit_yet_names_its_staged_files_and_refuses_with_that_reason(tmp_path: Path):
    repo = tmp_path / "fresh"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("x = 1\n")
    (repo / "data.txt").write_text("d\n")
    git(repo, "add", "train.py", "data.txt")
    st = read_tree(repo)
    assert st.error == f"the repository at {repo.resolve()} has no commit yet"
    assert st.staged == ["data.txt", "train.py"] and st.identity["harness_commit"] is None
    assert st.identity["describe"] is None
    msg = gate_message(st)
    assert msg.startswith(f"REFUSING: the repository at {repo.resolve()} has no commit yet. harness_commit would not")


def test_a_staged_deletion_and_a_staged_new_file_are_named(tmp_path: Path):
    repo = make_repo(tmp_path / "r", {"old.py": "1\n", "keep.py": "2\n"})
    git(repo, "rm", "-q", "old.py")
    (repo / "new.py").write_text("3\n")
    git(repo, "add", "new.py")
    st = read_tree(repo)
    assert st.staged == ["new.py", "old.py"] and st.dirty


def test_a_link_out_of_the_tree_is_untracked_unless_it_is_the_runs_dir(tmp_path: Path):
    repo = make_repo(tmp_path / "r", {"a.py": "1\n"})
    runs = tmp_path / "m-runs"
    runs.mkdir()
    other = tmp_path / "z-other"  # sorts after the runs dir
    other.mkdir()
    before = tmp_path / "a-other"  # and one before it
    before.mkdir()
    os.symlink(runs, repo / "runs-link")
    os.symlink(other, repo / "zlink")
    os.symlink(before, repo / "alink")
    os.symlink(tmp_path / "missing", repo / "dangling")
    st = read_tree(repo, runs)
    assert st.untracked == ["alink", "dangling", "zlink"], st.untracked


def test_the_refusal_names_20_files_of_each_kind_then_counts_the_rest(tmp_path: Path):
    repo = make_repo(tmp_path / "r", {f"f{i:02d}.py": "1\n" for i in range(25)})
    for i in range(25):
        (repo / f"f{i:02d}.py").write_text("2\n")
    msg = gate_message(read_tree(repo))
    lines = msg.splitlines()
    assert lines[0] == "REFUSING: the working tree is dirty; harness_commit would not describe this run."
    assert lines[1:21] == [f"  modified: f{i:02d}.py" for i in range(20)] and lines[21] == "  ... and 5 more modified"
    assert lines[22].startswith("Commit (or stash) the changes")
    repo2 = make_repo(tmp_path / "r2", {f"f{i:02d}.py": "1\n" for i in range(21)})
    for i in range(21):
        (repo2 / f"f{i:02d}.py").write_text("2\n")
    assert "  ... and 1 more modified" in gate_message(read_tree(repo2))
    repo3 = make_repo(tmp_path / "r3", {f"f{i:02d}.py": "1\n" for i in range(20)})
    for i in range(20):
        (repo3 / f"f{i:02d}.py").write_text("2\n")
    assert "more modified" not in gate_message(read_tree(repo3)) and len(gate_message(read_tree(repo3)).splitlines()) == 22
    assert gate_message(read_tree(repo3), limit=3).splitlines()[4] == "  ... and 17 more modified"


def test_the_untracked_warning_names_10_then_says_how_many_in_all(tmp_path: Path):
    repo = make_repo(tmp_path / "r", {"a.py": "1\n"})
    assert untracked_warning(read_tree(repo)) is None
    for i in range(10):
        (repo / f"u{i:02d}.txt").write_text("")
    ten = untracked_warning(read_tree(repo))
    assert ten == ("warning: untracked files in the harness tree (not part of harness_commit): "
                   + ", ".join(f"u{i:02d}.txt" for i in range(10)))
    for i in range(10, 12):
        (repo / f"u{i:02d}.txt").write_text("")
    twelve = untracked_warning(read_tree(repo))
    assert twelve.endswith("u09.txt, ... (12 in all)") and "u10.txt" not in twelve
    assert untracked_warning(read_tree(repo), limit=2).endswith("u00.txt, u01.txt, ... (12 in all)")


def _theirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A committed repo given to uid 65534, read with no global or system git config (no
    ``safe.directory`` of the machine's lets it through)."""
    repo = make_repo(tmp_path / "theirs", {"ok.py": "print('ok')\n"})
    for dirpath, dirnames, filenames in os.walk(repo):
        for n in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, n), 65534, 65534)
    os.chown(repo, 65534, 65534)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", os.devnull)
    return repo


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a repo to another uid (CI runs as root)")


@ROOT_ONLY
def test_another_users_repo_is_an_unreadable_tree_naming_gits_reason_and_the_fix(tmp_path: Path, monkeypatch):
    """git refuses a repo owned by another user ("detected dubious ownership"; GitPython's ``git diff``
    raised GitCommandError saying "Not a git repository"): read_tree says so, and the gate refuses in one line."""
    repo = _theirs(tmp_path, monkeypatch)
    st = read_tree(repo)
    assert st.unreadable and not st.clean and st.identity["harness_commit"] is None, st
    msg = gate_message(st)
    assert msg == (f"REFUSING: git cannot read the repository at {repo} (fatal: detected dubious ownership in repository "
                   f"at '{repo}'): it belongs to uid 65534, not to you (uid 0). Only if it is really theirs to trust, "
                   f"run: git config --global --add safe.directory {repo}  (then launch again)"), msg
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")  # positive control: trusted, it reads clean
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "safe.directory")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", str(repo))
    st = read_tree(repo)
    assert st.clean and not st.unreadable and st.identity["harness_commit"], st


@ROOT_ONLY
def test_launching_in_another_users_repo_is_one_line_exit_1_not_a_traceback(tmp_path: Path, monkeypatch, capsys):
    """``stepwatch launch`` (and ``preflight``) with its cwd in another user's repo, as root, through the
    CLI's entry point: exit 1, one line, even with --allow-dirty (nothing was sampled to record)."""
    from stepwatch.tui.cli import main

    monkeypatch.setattr(sys, "stdout", sys.stdout)  # main() wraps both streams: put back what capsys set
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    repo = _theirs(tmp_path, monkeypatch)
    runs = tmp_path / "runs"
    for extra in ([], ["--allow-dirty", "a reason"]):
        argv = ["launch", "--no-tui", "--runs-dir", str(runs), "--cwd", str(repo), *extra, "--",
                sys.executable, "ok.py"]
        assert main(argv) == 1, argv
        out, err = capsys.readouterr()
        assert len(err.splitlines()) == 1 and err.startswith(f"stepwatch: REFUSING: git cannot read the repository at "
                                                             f"{repo} (fatal: detected dubious ownership"), err
        assert f"safe.directory {repo}" in err and "Traceback" not in err
    assert not (runs / "ok").exists()
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'name = "r"\ncommand = ["python3", "ok.py"]\ncwd = "{repo}"\nruns_dir = "{runs}"\n')
    assert main(["preflight", str(cfg)]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] working tree committed: git cannot read the repository" in out, out
