"""Which checkpoints are complete (launcher/checkpoints.py): the HF Trainer's layout as a real run left it (the
listing of capture step 22: a run that completed, and one SIGKILLed while checkpoint-40 was being written), a
sharded index with a shard missing, a Lightning archive cut short, a symlink never followed, a user glob with its
marker; the trainer's output directory from its command line."""

from __future__ import annotations

import json
import os
from pathlib import Path


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


def test_a_lightning_archive_cut_short_and_a_user_glob_with_its_marker(tmp_path: Path):
    import torch  # the trainer's own format, as Lightning writes it (torch.save)
    out = tmp_path / "lightning"
    out.mkdir()
    torch.save({"state_dict": {"w": torch.zeros(4)}, "global_step": 30}, out / "epoch=0-step=30.ckpt")
    whole = (out / "epoch=0-step=30.ckpt").read_bytes()
    (out / "epoch=0-step=60.ckpt").write_bytes(whole[: len(whole) // 2])  # killed mid-write
    got = [(c.step, c.kind, c.complete) for c in find_checkpoints(out)]
    assert got == [(30, "lightning", True), (60, "lightning", False)]
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


def test_a_glob_file_is_judged_as_an_archive_and_a_huge_state_file_is_not_read(tmp_path: Path):
    import torch

    torch.save({"w": torch.zeros(2)}, tmp_path / "ckpt_100.pt")
    (tmp_path / "ckpt_200.pt").write_bytes(os.urandom(100))  # cut short, or not a checkpoint at all
    got = [(c.step, c.complete) for c in find_checkpoints(None, "ckpt_*.pt", tmp_path, "DONE")]
    assert got == [(100, True), (200, False)]
    out = _as_left(tmp_path / "hf", "complete_run")
    with (out / "checkpoint-60" / "trainer_state.json").open("r+b") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: 65 MiB on paper
    got60 = next(c for c in find_checkpoints(out) if c.step == 60)
    assert not got60.complete and "not a regular file of at most" in got60.why
