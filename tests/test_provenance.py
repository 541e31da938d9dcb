"""launcher/provenance.py: the restart policy resumes only from a checkpoint this run could have written (issue 44):
never another run's left in a reused output directory, never one ahead of the step this attempt reached that it did
not write, always the one the operator named for it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from stepwatch.launcher.checkpoints import find_checkpoints, newest_complete
from stepwatch.launcher.provenance import NOT_THIS_RUNS, judge_provenance, refused_words, run_began_at

NOW = time.time()


def _ckpt(out: Path, step: int, written: float) -> Path:
    d = out / f"ckpt_{step}"
    d.mkdir(parents=True)
    (d / "DONE").write_text("ok")
    for p in (d / "DONE", d):
        os.utime(p, (written, written))
    return d


def _judge(out: Path, run_dir: Path, run: dict, reached: int | None):
    cps = judge_provenance(find_checkpoints(None, "out/ckpt_*", out.parent, "DONE"), run_dir, run, reached)
    return {c.step: (c.complete, c.why) for c in cps}, newest_complete(cps)


def _run(run_dir: Path, launched: float, **more) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    run = {"name": "r", "attempt": 1, "launched_at_unix": launched, **more}
    (run_dir / "run.json").write_text(json.dumps(run))
    return run


def test_another_runs_checkpoints_left_in_the_output_dir_are_refused_and_this_runs_newest_is_chosen(tmp_path: Path):
    out = tmp_path / "out"
    for step in (50, 100, 200, 400):  # another run, an hour before this one
        _ckpt(out, step, NOW - 3600)
    for step in (20, 40, 60):  # this run's own
        _ckpt(out, step, NOW - 60 + step)
    run = _run(tmp_path / "run", NOW - 100)
    got, newest = _judge(out, tmp_path / "run", run, 70)
    assert newest is not None and newest.step == 60
    assert all(not got[s][0] and got[s][1].startswith(NOT_THIS_RUNS) and "before the run's first launch" in got[s][1]
               for s in (50, 100, 200, 400)), got
    assert all(got[s] == (True, "") for s in (20, 40, 60)), got
    rows = [{"path": str(out / f"ckpt_{s}"), "step": s, "why": got[s][1]} for s in sorted(got)]
    words = refused_words(rows, 60)
    assert words.startswith(f"; not resuming from {out / 'ckpt_400'} and 2 more (not this run's: "), words
    assert refused_words(rows[:3], 60) == ""  # ckpt_50 refused, but older than the one chosen: nothing to say


def test_a_checkpoint_ahead_of_the_step_reached_is_refused_unless_this_attempt_wrote_it(tmp_path: Path):
    out = tmp_path / "out"
    first_launch = NOW - 1000
    _ckpt(out, 20, NOW - 900)  # attempt 1's (this run's, it went to step 450)
    _ckpt(out, 400, NOW - 500)  # attempt 1's too, ahead of where this attempt got
    _ckpt(out, 120, NOW - 5)  # written while this attempt ran, its step ahead of the step read (the log lags)
    run_dir = tmp_path / "run"
    _run(run_dir, first_launch)
    os.rename(run_dir / "run.json", run_dir / "run.20261207T100000Z.json")  # attempt 1, rotated
    run = _run(run_dir, NOW - 100, attempt=2)  # attempt 2, launched by hand from scratch; it reached step 110
    assert run_began_at(run_dir, run) == first_launch
    got, newest = _judge(out, run_dir, run, 110)
    assert not got[400][0] and "step 400 is ahead of step 110" in got[400][1], got
    assert got[20] == (True, "") and got[120] == (True, "") and newest is not None and newest.step == 120
    got, newest = _judge(out, run_dir, run, None)  # the control: the step reached unknown, the step rule says nothing
    assert got[400] == (True, "") and newest is not None and newest.step == 400


def test_the_checkpoint_the_operator_named_is_theirs_and_a_member_s_rotated_record_moves_no_launch(tmp_path: Path):
    out = tmp_path / "out"
    theirs = _ckpt(out, 300, NOW - 7200)  # from another run, chosen by hand (relaunch --from-checkpoint)
    run_dir = tmp_path / "run"
    run = _run(run_dir, NOW - 100, resumed_from={"by": "operator", "checkpoint": str(theirs), "step": 300})
    got, newest = _judge(out, run_dir, run, 350)
    assert got[300] == (True, "") and newest is not None and newest.step == 300
    run = _run(run_dir, NOW - 100, resumed_from={"by": "restart policy", "checkpoint": str(theirs), "step": 300})
    got, _ = _judge(out, run_dir, run, 350)
    assert not got[300][0]  # the control: not the operator's choice, refused
    planted = run_dir / "run.20200101T000000Z.json"  # a rotated record that says the run began in 2020
    planted.write_text(json.dumps({"name": "r", "launched_at_unix": NOW - 10**8}))
    os.chmod(planted, 0o664)  # the group can write it: not the owner's record
    assert run_began_at(run_dir, run) == NOW - 100
    os.chmod(planted, 0o644)  # the control: the owner's alone, it counts
    assert run_began_at(run_dir, run) == NOW - 10**8
