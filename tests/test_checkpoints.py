"""Which checkpoints are complete (launcher/checkpoints.py): the HF Trainer's layout as a real run left it (the
listing of capture step 22: a run that completed, and one SIGKILLed while checkpoint-40 was being written), a
sharded index with a shard missing, a Lightning archive cut short, a symlink never followed, a user glob with its
marker; the trainer's output directory from its command line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from stepwatch.launcher.checkpoints import find_checkpoints, newest_complete, output_dir_of

LISTING = json.loads((REPO_ROOT / "tests" / "fixtures" / "real" / "hf_checkpoints_save20.json").read_text())


def _as_left(root: Path, run: str) -> Path:
    """The output directory as the real run left it: each checkpoint's files by name (the weights' bytes do not
    matter), its trainer_state.json saying the step the Trainer wrote."""
    out = root / run
    for name, cp in LISTING[run]["checkpoints"].items():
        d = out / name
        d.mkdir(parents=True)
        for f in cp["files"]:
            (d / f).write_bytes(b"\0" * 16)
        if "trainer_state.json" in cp["files"]:
            (d / "trainer_state.json").write_text(json.dumps({"global_step": cp["trainer_state_global_step"]}))
    return out


def test_every_checkpoint_of_a_completed_run_is_complete_and_the_newest_is_chosen(tmp_path: Path):
    cps = find_checkpoints(_as_left(tmp_path, "complete_run"))
    assert [(c.path.name, c.step, c.kind, c.complete) for c in cps] == [
        ("checkpoint-20", 20, "hf", True), ("checkpoint-40", 40, "hf", True), ("checkpoint-60", 60, "hf", True)]
    assert (newest := newest_complete(cps)) is not None and newest.step == 60


def test_the_checkpoint_being_written_when_the_run_was_killed_is_never_chosen(tmp_path: Path):
    cps = find_checkpoints(_as_left(tmp_path, "killed_run"))
    assert [(c.path.name, c.complete, c.why) for c in cps] == [
        ("checkpoint-20", True, ""), ("checkpoint-40", False, "no trainer_state.json (written last: the save was cut short)")]
    assert (newest := newest_complete(cps)) is not None and newest.path.name == "checkpoint-20"


def test_a_missing_shard_a_wrong_step_and_a_symlink_are_not_complete(tmp_path: Path):
    out = _as_left(tmp_path, "complete_run")
    d60 = out / "checkpoint-60"
    (d60 / "model.safetensors").unlink()
    (d60 / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                                                "b": "model-00002-of-00002.safetensors"}}))
    (d60 / "model-00001-of-00002.safetensors").write_bytes(b"w")
    (out / "checkpoint-40" / "trainer_state.json").write_text(json.dumps({"global_step": 39}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "checkpoint-80")  # a link to another place: never a checkpoint of this run
    got = {c.path.name: (c.complete, c.why) for c in find_checkpoints(out)}
    assert got == {"checkpoint-20": (True, ""), "checkpoint-40": (False, "trainer_state.json says global_step 39"),
                   "checkpoint-60": (False, "shards missing: model-00002-of-00002.safetensors")}


@pytest.mark.system  # torch's import alone takes 1.5-5 s: over the unit tier's 2 s a test
def test_a_lightning_archive_cut_short(tmp_path: Path):
    import torch  # the trainer's own format, as Lightning writes it (torch.save)
    out = tmp_path / "lightning"
    out.mkdir()
    torch.save({"state_dict": {"w": torch.zeros(4)}, "global_step": 30}, out / "epoch=0-step=30.ckpt")
    whole = (out / "epoch=0-step=30.ckpt").read_bytes()
    (out / "epoch=0-step=60.ckpt").write_bytes(whole[: len(whole) // 2])  # killed mid-write
    got = [(c.step, c.kind, c.complete) for c in find_checkpoints(out)]
    assert got == [(30, "lightning", True), (60, "lightning", False)]


def test_a_user_glob_with_its_marker(tmp_path: Path):
    for n, done in ((10, True), (20, False)):
        (tmp_path / f"ckpt_{n}").mkdir()
        if done:
            (tmp_path / f"ckpt_{n}" / "DONE").write_text("")
    got = [(c.step, c.kind, c.complete) for c in find_checkpoints(None, "ckpt_*", tmp_path, "DONE")]
    assert got == [(10, "glob", True), (20, "glob", False)]


def test_the_output_directory_comes_from_the_command_line():
    cwd = Path("/work/run")
    assert output_dir_of(["python", "run_clm.py", "--output_dir", "out/a"], cwd) == cwd / "out/a"
    assert output_dir_of(["python", "t.py", "--output-dir=out/b"], cwd) == cwd / "out/b"
    assert output_dir_of(["python", "t.py"], cwd) is None


def test_a_checkpoint_another_user_owns_or_can_write_is_never_chosen(tmp_path: Path):
    out = _as_left(tmp_path, "complete_run")
    os.chown(out / "checkpoint-60", 65534, 65534)  # nobody's: planted by another user (the tests run as root)
    os.chmod(out / "checkpoint-40", 0o775)  # a group member could have changed it
    got = {c.path.name: (c.complete, c.why) for c in find_checkpoints(out)}
    assert got == {"checkpoint-20": (True, ""), "checkpoint-40": (False, "others can write it (mode 775)"),
                   "checkpoint-60": (False, "owned by uid 65534, not by the run's owner")}
    assert (newest := newest_complete(find_checkpoints(out))) is not None and newest.step == 20


@pytest.mark.system  # torch's import alone takes 1.5-5 s: over the unit tier's 2 s a test
def test_a_glob_file_is_judged_as_an_archive(tmp_path: Path):
    import torch

    torch.save({"w": torch.zeros(2)}, tmp_path / "ckpt_100.pt")
    (tmp_path / "ckpt_200.pt").write_bytes(os.urandom(100))  # cut short, or not a checkpoint at all
    got = [(c.step, c.complete) for c in find_checkpoints(None, "ckpt_*.pt", tmp_path, "DONE")]
    assert got == [(100, True), (200, False)]


def test_a_huge_state_file_is_not_read(tmp_path: Path):
    out = _as_left(tmp_path / "hf", "complete_run")
    with (out / "checkpoint-60" / "trainer_state.json").open("r+b") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: 65 MiB on paper
    got60 = next(c for c in find_checkpoints(out) if c.step == 60)
    assert not got60.complete and "not a regular file of at most" in got60.why


# ---------------------------------------------------------------- the whole path (launcher/checkpointpath.py)
def _private_checkpoint(tmp_path: Path) -> Path:
    """<tmp>/proj/out/checkpoint-20 as a private run leaves it: directories 0755 and files 0644, all the owner's
    (root: the tests run as root); tmp_path's own parents are pytest's 0700 directories under the sticky /tmp."""
    cp = tmp_path / "proj" / "out" / "checkpoint-20"
    (cp / "rng").mkdir(parents=True)
    for d in (tmp_path / "proj", tmp_path / "proj" / "out", cp, cp / "rng"):
        d.chmod(0o755)
    for f in (cp / "trainer_state.json", cp / "model.safetensors", cp / "rng" / "rng_state.pth"):
        f.write_bytes(b"{}")
        f.chmod(0o644)
    return cp


def test_a_private_checkpoint_path_is_safe_and_a_group_writable_project_dir_is_named(tmp_path: Path):
    from stepwatch.launcher.checkpointpath import checkpoint_path_problem
    from stepwatch.launcher.trust import group_name

    cp = _private_checkpoint(tmp_path)
    assert checkpoint_path_problem(cp) is None  # the control: every directory up to / the owner's or root's
    (tmp_path / "proj").chmod(0o2775)  # a team's project dir: out/ is safe, yet the group can rename it away
    problem = checkpoint_path_problem(cp)
    assert problem is not None and problem.where == str(tmp_path / "proj")
    assert str(problem) == (f"{tmp_path / 'proj'} is writable by group {group_name(os.stat(tmp_path).st_gid)} "
                            "(mode 2775): the group can rename out/ away")


def test_a_sticky_directory_is_safe_for_the_owners_entry_and_not_for_another_users(tmp_path: Path):
    from stepwatch.launcher.checkpointpath import checkpoint_path_problem

    cp = _private_checkpoint(tmp_path)
    (tmp_path / "proj").chmod(0o1777)  # like /tmp: anyone may create, only an entry's owner may rename it
    assert checkpoint_path_problem(cp) is None
    os.chown(tmp_path / "proj" / "out", 65534, 65534)  # out/ made by another user in the sticky dir
    problem = checkpoint_path_problem(cp)
    assert problem is not None and problem.where == str(tmp_path / "proj" / "out")
    assert "belongs to uid 65534" in problem.why, problem


def test_a_symlink_in_the_path_is_never_followed(tmp_path: Path):
    from stepwatch.launcher.checkpointpath import checkpoint_path_problem

    cp = _private_checkpoint(tmp_path)
    os.symlink(tmp_path / "proj", tmp_path / "link")
    problem = checkpoint_path_problem(tmp_path / "link" / "out" / cp.name)
    assert problem is not None and problem.where == str(tmp_path / "link") and "symlink" in problem.why
    os.symlink(cp, tmp_path / "proj" / "out" / "checkpoint-40")  # the checkpoint itself a link
    problem = checkpoint_path_problem(tmp_path / "proj" / "out" / "checkpoint-40")
    assert problem is not None and "is a symlink" in problem.why
    problem = checkpoint_path_problem(f"{tmp_path}/proj/out/../out/{cp.name}")
    assert problem is not None and "'..'" in problem.why  # judged only as the job will open it


def test_a_group_writable_or_hard_linked_file_inside_the_checkpoint_is_named(tmp_path: Path):
    from stepwatch.launcher.checkpointpath import checkpoint_path_problem

    cp = _private_checkpoint(tmp_path)
    rng = cp / "rng" / "rng_state.pth"  # in a subdirectory: every entry a resume loads is judged
    rng.chmod(0o664)
    problem = checkpoint_path_problem(cp)
    assert problem is not None and problem.where == str(rng) and "(mode 0664)" in problem.why
    rng.chmod(0o644)
    assert checkpoint_path_problem(cp) is None
    os.link(cp / "model.safetensors", tmp_path / "another-name")
    problem = checkpoint_path_problem(cp)
    assert problem is not None and problem.where == str(cp / "model.safetensors")
    assert problem.why == "has 2 hard links: another name may lead to it"


def test_the_policy_refuses_an_unsafe_checkpoint_or_starts_from_scratch_as_restart_says(tmp_path: Path):
    import pytest

    from stepwatch.launcher.checkpointpath import judge_decision
    from stepwatch.launcher.restartpolicy import RESTART, STOP, Decision, restart_settings

    cp = _private_checkpoint(tmp_path)
    d = Decision(RESTART, "killed_by_signal: restart 1 of 3", "SIGKILL", str(cp), 20, 1, 7)
    assert judge_decision(d, restart_settings({})) == (d, None)  # the control: a private path resumes
    (tmp_path / "proj").chmod(0o775)
    stop, refused = judge_decision(d, restart_settings({}))  # "stop", the default
    assert (stop.verdict, stop.checkpoint, refused and refused["where"]) == (STOP, None, str(tmp_path / "proj"))
    assert f"is not safe to resume from: {tmp_path / 'proj'} is writable by group" in stop.reason
    scratch, _ = judge_decision(d, restart_settings({"unsafe_checkpoint": "scratch"}))
    assert (scratch.verdict, scratch.checkpoint, scratch.lost_steps) == (RESTART, None, 27)
    assert "from scratch instead" in scratch.reason
    with pytest.raises(ValueError, match='unsafe_checkpoint must be "stop" or "scratch"'):
        restart_settings({"unsafe_checkpoint": "ignore"})


def test_the_last_looks_before_exec_refuse_or_go_from_scratch_and_the_supervisors_refuses(tmp_path: Path):
    import pytest

    from stepwatch.launcher.checkpointpath import refused_at_exec, resume_at_exec, scratch_note
    from stepwatch.launcher.config import RunConfig
    from stepwatch.launcher.relaunch import resume_from
    from stepwatch.launcher.restartpolicy import restart_settings
    from stepwatch.monitors.runsettings import RunSettings

    cp = _private_checkpoint(tmp_path)

    def cfg(unsafe: str) -> RunConfig:
        table = {"resume": "hf", "unsafe_checkpoint": unsafe}
        c = RunConfig("r", ["python", "t.py"], tmp_path, tmp_path / "runs", restart=table,
                      settings=RunSettings(restart=restart_settings(table)))
        resume_from(c, str(cp), 20, by="operator", after_attempt=1, restarts=0)
        return c

    ok = cfg("stop")
    resume_at_exec(ok, RuntimeError)  # the control: a private path is handed as it is
    assert ok.command[-2:] == ["--resume_from_checkpoint", str(cp)] and scratch_note(ok) is None
    assert refused_at_exec({"resumed_from": ok.resumed_from}) is None
    (tmp_path / "proj").chmod(0o2775)
    with pytest.raises(RuntimeError, match=f"REFUSING to resume from {cp}: {tmp_path / 'proj'} is writable by group"):
        resume_at_exec(cfg("stop"), RuntimeError)
    assert (refused_at_exec({"resumed_from": ok.resumed_from}) or "").startswith(f"REFUSING to resume from {cp}: ")
    scratch = cfg("scratch")
    resume_at_exec(scratch, RuntimeError)
    assert scratch.command == ["python", "t.py"] and scratch.resumed_from is not None
    assert scratch.resumed_from["checkpoint"] is None and str(tmp_path / "proj") in (scratch_note(scratch) or "")
