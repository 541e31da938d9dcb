"""The tree's identity on real git repos, function by function: the repo found from a subfolder, a repo with no commit yet and
its staged files, a staged deletion, a link out of the tree that is not the runs dir, and the
refusal and warning texts at their limits (20 files named, 10 untracked)."""

from __future__ import annotations

import os
from pathlib import Path

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
