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
    again = hf_ckpt(repo / "out", 200)  # a later pass over step 200 (after a resume from before it): another one
    other = kept_ok(keep(run_dir, point(run_dir, run, 250), 401))
    assert other.how == "hard links" and other.kept != kept.kept, other  # kept apart, the first one untouched
    assert (run_dir / KEPT_DIR / "checkpoint-200" / "model.safetensors").read_bytes() == weights
    assert kept_ok(keep(run_dir, point(run_dir, run, 250), 402)).how == "already kept", again


def test_a_second_episode_naming_the_same_checkpoint_finds_it_kept_and_only_the_newest_two_stay(run_here):
    repo, run, run_dir = run_here
    for step in (100, 200, 300):
        hf_ckpt(repo / "out", step)
    first = kept_ok(keep(run_dir, point(run_dir, run, 150), 160))
    # the original still there, its files now with two names (the run's own): the same point again is found kept
    assert kept_ok(keep(run_dir, point(run_dir, run, 150), 170)).how == "already kept"
    kept_ok(keep(run_dir, point(run_dir, run, 250), 260))
    kept_ok(keep(run_dir, point(run_dir, run, 350), 360))
    assert sorted(p.name for p in (run_dir / KEPT_DIR).iterdir()) == ["checkpoint-200", "checkpoint-300"]
    assert not Path(first.kept).exists()  # pruned: hard links hold a checkpoint's whole size once rotated away
    listed = json.loads((run_dir / "kept.json").read_text())["all"]
    assert [k["step"] for k in listed] == [200, 300]
    assert (repo / "out" / "checkpoint-100" / "model.safetensors").stat().st_nlink == 1  # its original, whole


def test_a_later_episode_after_the_rotation_names_the_point_kept_before(run_here):
    repo, run, run_dir = run_here
    hf_ckpt(repo / "out", 200)
    keeper = RollbackKeeper(run_dir, {**run, "attempt": 1})
    keeper.episode({"onset_step": 301, "level_from_step": 285, "kind": "spike"})
    shutil.rmtree(repo / "out" / "checkpoint-200")  # save_total_limit
    hf_ckpt(repo / "out", 500)
    words = keeper.episode({"onset_step": 520, "level_from_step": 504, "kind": "spike"})
    assert words == "rollback checkpoint-500 (step 500): kept in " + str(run_dir / KEPT_DIR / "checkpoint-500")
    assert keeper.episode({"onset_step": 320, "level_from_step": 290, "kind": "spike"}) == \
        f"rollback checkpoint-200 (step 200): kept in {run_dir / KEPT_DIR / 'checkpoint-200'}"


def test_an_attempt_that_ends_healthy_releases_only_what_it_kept(run_here):
    repo, run, run_dir = run_here
    hf_ckpt(repo / "out", 200)
    hf_ckpt(repo / "out", 400)
    RollbackKeeper(run_dir, {**run, "attempt": 1}).episode({"onset_step": 301, "level_from_step": 285,
                                                            "kind": "persistent"})
    second = RollbackKeeper(run_dir, {**run, "attempt": 2})
    second.episode({"onset_step": 450, "level_from_step": 430, "kind": "spike"})
    spike = {"kind": "spike", "recovered_step": 455}
    second.ended({"returncode": 0, "loss_health": {"ended": [spike], "episode": None}})
    assert sorted(p.name for p in (run_dir / KEPT_DIR).iterdir()) == ["checkpoint-200"]  # attempt 1's stays
    assert [k["attempt"] for k in json.loads((run_dir / "kept.json").read_text())["all"]] == [1]


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
    assert words == f"rollback checkpoint-200 (step 200): kept in {run_dir / KEPT_DIR / 'checkpoint-200'}"
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


def test_after_a_persistent_episode_a_later_episodes_rollback_point_is_never_a_checkpoint_saved_since(run_here):
    repo, run, run_dir = run_here
    for step in (200, 300, 400):
        hf_ckpt(repo / "out", step)
    keeper = RollbackKeeper(run_dir, {**run, "attempt": 1})
    rise = {"onset_step": 303, "level_from_step": 285, "kind": "persistent"}
    assert "checkpoint-200 (step 200)" in keeper.episode(rise)
    later = {"onset_step": 420, "level_from_step": 404, "kind": "spike"}  # measured on the bad weights since 303
    assert keeper.episode(later, [rise]) == \
        f"rollback checkpoint-200 (step 200): kept in {run_dir / KEPT_DIR / 'checkpoint-200'}"
    spike = {**rise, "kind": "spike"}  # the control: after a spike that came back, the later point is its own
    assert "checkpoint-400 (step 400)" in keeper.episode(later, [spike])
