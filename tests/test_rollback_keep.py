"""A loss episode's rollback point (issue 47), in process on real files: the newest complete checkpoint of this run at
or before the level's window, kept as hard links that outlive the trainer's rotation, a copy under a limit where a
link cannot be made; never a checkpoint a member could have written or another run left; released at a healthy end."""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from stepwatch.launcher.checkpoints import Checkpoint
from stepwatch.launcher.rollback import Kept, RollbackKeeper, keep, rollback_point
from stepwatch.monitors.runfiles import KEPT_DIR


def hf_ckpt(out: Path, step: int, mtime: float | None = None) -> Path:
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True, mode=0o755)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    for p in (d / "trainer_state.json", d / "model.safetensors"):
        p.chmod(0o644)
    if mtime is not None:
        for p in (d / "trainer_state.json", d / "model.safetensors", d):
            os.utime(p, (mtime, mtime))
    return d


def point(run_dir: Path, run: dict, at: int) -> Checkpoint:
    cp = rollback_point(run_dir, run, at)
    assert cp is not None, f"no rollback point at or before {at}"
    return cp


def kept_ok(got: Kept | str) -> Kept:
    assert isinstance(got, Kept), got
    return got


@pytest.fixture
def run_here(tmp_path: Path) -> tuple[Path, dict, Path]:
    os.chmod(tmp_path, 0o755)
    repo, run_dir = tmp_path / "repo", tmp_path / "repo" / "runs" / "r"
    run_dir.mkdir(parents=True, mode=0o755)
    (tmp_path / "repo" / "runs").chmod(0o755)
    repo.chmod(0o755)
    run = {"name": "r", "argv": ["python", "train.py", "--output_dir", "out"], "cwd": str(repo),
           "launched_at_unix": time.time() - 600, "config": {}}
    (repo / "out").mkdir(mode=0o755)
    return repo, run, run_dir


def test_the_rollback_point_is_the_newest_complete_checkpoint_of_this_run_at_or_before_the_window(run_here):
    repo, run, run_dir = run_here
    for step in (100, 200, 300):
        hf_ckpt(repo / "out", step)
    assert point(run_dir, run, 285).step == 200  # 300 is past the window's start: not before the episode
    assert rollback_point(run_dir, run, 99) is None
    old = hf_ckpt(repo / "out", 250, mtime=time.time() - 86400)  # left by another run in a reused output dir
    assert point(run_dir, run, 285).step == 200, old


def test_a_kept_checkpoint_outlives_the_trainers_rotation_and_a_second_keep_says_so(run_here):
    repo, run, run_dir = run_here
    hf_ckpt(repo / "out", 200)
    kept = kept_ok(keep(run_dir, point(run_dir, run, 250), 301))
    assert kept.how == "hard links" and kept.kept == str(run_dir / KEPT_DIR / "checkpoint-200")
    weights = (repo / "out" / "checkpoint-200" / "model.safetensors").read_bytes()
    shutil.rmtree(repo / "out" / "checkpoint-200")  # save_total_limit's rotation
    assert (run_dir / KEPT_DIR / "checkpoint-200" / "model.safetensors").read_bytes() == weights
    record = json.loads((run_dir / "kept.json").read_text())
    assert (record["step"], record["onset_step"], record["how"]) == (200, 301, "hard links")
    hf_ckpt(repo / "out", 200)
    assert kept_ok(keep(run_dir, point(run_dir, run, 250), 301)).how == "already kept"


def test_a_checkpoint_a_member_could_write_or_that_holds_a_symlink_is_never_kept(run_here):
    repo, run, run_dir = run_here
    d = hf_ckpt(repo / "out", 200)
    (d / "model.safetensors").chmod(0o664)  # umask 002: the group's file, whoever made it
    got = keep(run_dir, Checkpoint(d, 200, "hf", True), 301)  # as if judged complete: keep judges its path again
    assert isinstance(got, str) and got.startswith("not kept:") and "model.safetensors" in got, got
    (d / "model.safetensors").chmod(0o644)
    os.symlink("/etc/passwd", d / "extra.bin")
    got = keep(run_dir, point(run_dir, run, 250), 301)
    assert isinstance(got, str) and "symlink" in got, got
    assert not (run_dir / KEPT_DIR / "checkpoint-200").exists()


def test_where_no_link_can_be_made_a_copy_under_the_limit_and_a_refusal_over_it(run_here, monkeypatch):
    repo, run, run_dir = run_here
    hf_ckpt(repo / "out", 200)

    def no_link(*_a, **_k):  # another file system: the kernel's EXDEV
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(os, "link", no_link)
    over = keep(run_dir, point(run_dir, run, 250), 301, max_copy_bytes=1000)
    assert isinstance(over, str) and "over the copy limit" in over, over
    assert not list((run_dir / KEPT_DIR).iterdir())  # nothing half-made is left
    kept = kept_ok(keep(run_dir, point(run_dir, run, 250), 301))
    assert kept.how == "a copy"
    f = run_dir / KEPT_DIR / "checkpoint-200" / "model.safetensors"
    assert f.stat().st_mode & 0o777 == 0o644 and f.stat().st_nlink == 1


def test_the_keeper_says_the_rollback_in_words_and_releases_it_only_at_a_healthy_end(run_here):
    repo, run, run_dir = run_here
    hf_ckpt(repo / "out", 200)
    keeper = RollbackKeeper(run_dir, run)
    words = keeper.episode({"onset_step": 301, "level_from_step": 285})
    assert words == f"rollback checkpoint-200 (step 200) kept in {run_dir / KEPT_DIR / 'checkpoint-200'}"
    assert keeper.episode({"onset_step": 90, "level_from_step": 74}) == \
        "no complete checkpoint of this run at or before step 74 to roll back to"
    rise = {"kind": "persistent", "recovered_step": 340}
    keeper.ended({"returncode": 0, "loss_health": {"ended": [rise], "episode": None}})
    assert (run_dir / KEPT_DIR / "checkpoint-200").is_dir()  # the loss rose and stayed: kept for the operator
    spike = {"kind": "spike", "recovered_step": 305}
    keeper.ended({"returncode": 1, "loss_health": {"ended": [spike], "episode": None}})
    assert (run_dir / KEPT_DIR).is_dir()  # it did not complete: kept
    keeper.ended({"returncode": 0, "loss_health": {"ended": [spike], "episode": None}})
    assert not (run_dir / KEPT_DIR).exists() and not (run_dir / "kept.json").exists()  # healthy: released


def test_a_view_shows_the_kept_rollback_only_from_the_owners_own_record(run_here):
    from stepwatch.monitors.snapshot.observer import snapshot
    repo, run, run_dir = run_here
    hf_ckpt(repo / "out", 200)
    (run_dir / "run.json").write_text(json.dumps({**run, "attempt": 1}))  # a run the view reads
    (run_dir / "train.log").write_text("")
    assert snapshot(run_dir)["loss_health"]["rollback"] is None  # nothing kept: nothing said
    RollbackKeeper(run_dir, run).episode({"onset_step": 301, "level_from_step": 285})
    shown = snapshot(run_dir)["loss_health"]["rollback"]
    assert shown is not None and (shown["step"], shown["how"]) == (200, "hard links"), shown
    (run_dir / "kept.json").chmod(0o664)  # a file the group can write is the group's: not shown
    assert snapshot(run_dir)["loss_health"]["rollback"] is None


def test_a_kept_checkpoint_is_still_one_to_resume_from_and_a_second_name_elsewhere_is_not(run_here):
    """The restart policy's rule refuses a checkpoint file with a second name (another may lead to it); the run's own
    kept hard links are no such name: the original and the kept copy both stay resumable."""
    from stepwatch.launcher.checkpointpath import checkpoint_path_problem, kept_inodes
    repo, run, run_dir = run_here
    d = hf_ckpt(repo / "out", 200)
    kept_ok(keep(run_dir, point(run_dir, run, 250), 301))
    assert checkpoint_path_problem(str(d)) is not None  # the control: without the run's own links, two names refuse
    own = kept_inodes(run_dir)
    assert checkpoint_path_problem(str(d), own_links=own) is None
    assert checkpoint_path_problem(str(run_dir / "kept" / "checkpoint-200"), own_links=own) is None
    os.link(d / "model.safetensors", repo / "elsewhere.bin")  # a third name, not the run's
    problem = checkpoint_path_problem(str(d), own_links=own)
    assert problem is not None and "3 hard links" in str(problem), problem
    os.unlink(repo / "elsewhere.bin")
    (run_dir / "kept").chmod(0o775)  # a kept folder the group could write counts for nothing
    assert kept_inodes(run_dir) == frozenset()
