"""The clean-tree gate and the identity it samples, and the stall detector's minimum of steps, through
``stepwatch launch`` on real git repos and real runs: a modified
or a staged file refuses the launch and reads dirty; untracked files alone do not, and are named; the
runs dir is left out of them by path, never by a name prefix (``runs-notes/`` beside ``runs/``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import git, make_repo, stepwatch


def _launch(repo: Path, name: str):
    return stepwatch("launch", "--no-tui", "--name", name, "--", sys.executable, "ok.py", cwd=repo)


def test_a_modified_or_staged_file_refuses_the_launch_and_a_clean_tree_does_not(tmp_path: Path):
    repo = make_repo(tmp_path / "h", {"ok.py": "print('ok')\n", "lib.py": "X = 1\n"})
    (repo / "lib.py").write_text("X = 2\n")  # modified, not staged
    r = _launch(repo, "mod")
    assert r.returncode == 1 and "lib.py" in r.stderr and not (repo / "runs" / "mod").exists(), r.stderr
    git(repo, "add", "lib.py")  # staged, not committed
    r = _launch(repo, "staged")
    assert r.returncode == 1 and "lib.py" in r.stderr, r.stderr
    git(repo, "commit", "-qm", "X = 2")
    r = _launch(repo, "clean")  # control: committed, the same launch goes
    assert r.returncode == 0, r.stderr
    ident = json.loads((repo / "runs" / "clean" / "run.json").read_text())["identity"]
    assert ident["harness_dirty_at_launch"] is False and ident["modified"] == [] and ident["staged"] == []


def test_untracked_files_are_named_and_the_runs_dir_is_left_out_by_path_not_by_prefix(tmp_path: Path):
    repo = make_repo(tmp_path / "h", {"ok.py": "print('ok')\n"})
    (repo / ".gitignore").write_text("")  # runs/ is not ignored here: only its being the runs dir leaves it out
    git(repo, "commit", "-qam", "no ignores")
    (repo / "runs-notes").mkdir()
    (repo / "runs-notes" / "todo.txt").write_text("a sibling whose name starts like the runs dir\n")
    r = _launch(repo, "u")
    assert r.returncode == 0, r.stderr  # untracked files warn, they do not refuse
    assert "runs-notes/todo.txt" in r.stderr, r.stderr
    ident = json.loads((repo / "runs" / "u" / "run.json").read_text())["identity"]
    assert ident["untracked"] == ["runs-notes/todo.txt"]  # nothing of runs/u itself
    assert ident["harness_dirty_at_launch"] is False


HANG_PY = ("import sys, time\nfrom stepwatch.telemetry import StepTelemetry\ntel = StepTelemetry()\n"
           "for i in range(int(sys.argv[1])):\n    time.sleep(0.02)\n    tel.step_end()\n"
           "print('hanging', flush=True)\ntime.sleep(120)\n")


@pytest.mark.slow
def test_a_stall_needs_exactly_the_minimum_of_counted_steps(tmp_path: Path):
    """STALL_MIN_STEPS counted steps (the first is never counted) then a hang: stalled; one fewer:
    the detector says it cannot judge yet, however long the hang (one step short of
    the minimum is not enough)."""
    from conftest import wait_until
    from stepwatch.monitors.detectors.stall import STALL_FLOOR_S, STALL_MIN_STEPS

    repo = make_repo(tmp_path / "h", {"hang.py": HANG_PY})
    for name, steps in (("enough", STALL_MIN_STEPS + 1), ("short", STALL_MIN_STEPS)):
        r = stepwatch("launch", "--no-tui", "--name", name, "--", sys.executable, "hang.py", str(steps), cwd=repo)
        assert r.returncode == 0, r.stderr

    def status(name: str) -> dict:
        return json.loads(stepwatch("status", str(repo / "runs" / name), "--json").stdout)

    try:
        snap = wait_until(lambda: (s := status("enough"))["stall"]["state"] == "stalled" and s, 30,
                          interval_s=0.5, what="the stall with the minimum of counted steps")
        assert snap["step_seconds"]["n"] == STALL_MIN_STEPS
        short = wait_until(lambda: (s := status("short"))["stall"].get("current_step_elapsed_s") is not None
                           and s["stall"]["current_step_elapsed_s"] > STALL_FLOOR_S + 2 and s, 30, interval_s=0.5,
                           what="the short run's hang to last past the floor")
        assert short["step_seconds"]["n"] == STALL_MIN_STEPS - 1
        assert short["stall"]["state"] != "stalled", short["stall"]
        assert f"a stall needs at least {STALL_MIN_STEPS}" in short["stall"]["reason"], short["stall"]
    finally:
        for name in ("enough", "short"):
            stepwatch("stop", str(repo / "runs" / name), "--grace", "1", timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a repo to another uid (CI runs as root)")
def test_a_launch_in_another_users_repo_is_one_line_through_the_real_entry_point(tmp_path: Path):
    """git refuses another user's repo ("detected dubious ownership"): ``python -m stepwatch.tui.cli
    launch`` as root exits 1 with one line naming the repo, git's reason and the fix; no traceback."""
    repo = make_repo(tmp_path / "theirs", {"ok.py": "print('ok')\n"})
    for dirpath, dirnames, filenames in os.walk(repo):
        for n in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, n), 65534, 65534)
    os.chown(repo, 65534, 65534)
    env = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, "ok.py",
                  cwd=repo, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"git cannot read the repository at {repo} (fatal: detected dubious ownership" in r.stderr, r.stderr
    assert f"git config --global --add safe.directory {repo}" in r.stderr, r.stderr
    assert not (tmp_path / "runs" / "ok").exists()
