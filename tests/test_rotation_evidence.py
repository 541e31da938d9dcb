"""Rotation never loses an attempt's evidence: one taken stamped
name moves the whole attempt to the next suffix, nothing overwritten; a saved state of another attempt
is dropped, the attempt's own kept; without run.json the stamp is the OLDEST file's time."""

from __future__ import annotations

import json
import os
from pathlib import Path

from stepwatch.launcher.rotate import attempt_stamp, rotate
from stepwatch.monitors.runfiles import utc_stamp

T_LAUNCH = 1_780_000_000.0


def _attempt(run_dir: Path, attempt: int = 1, run_json: bool = True) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    if run_json:
        (run_dir / "run.json").write_text(json.dumps({"v": 1, "attempt": attempt, "launched_at_unix": T_LAUNCH}))
    (run_dir / "train.log").write_text(f"attempt {attempt} log\n")
    (run_dir / "events.jsonl").write_text(f'{{"attempt": {attempt}}}\n')


def test_one_taken_stamped_name_moves_every_file_to_the_next_suffix_and_overwrites_nothing(tmp_path: Path):
    d = tmp_path / "run"
    _attempt(d)
    stamp = utc_stamp(T_LAUNCH)
    (d / f"train.{stamp}.log").write_text("an earlier attempt's log, same second\n")  # one name taken, not all
    plan = rotate(d)
    assert sorted(p.name for _, p in plan) == sorted([f"train.{stamp}-1.log", f"events.{stamp}-1.jsonl",
                                                      f"run.{stamp}-1.json"])
    assert (d / f"train.{stamp}.log").read_text() == "an earlier attempt's log, same second\n"  # untouched
    assert (d / f"train.{stamp}-1.log").read_text() == "attempt 1 log\n"
    assert not (d / f"events.{stamp}.jsonl").exists()  # the attempt's files stay together under one suffix


def test_a_saved_state_of_another_attempt_is_dropped_and_the_attempts_own_is_kept(tmp_path: Path):
    stamp = utc_stamp(T_LAUNCH)
    other = tmp_path / "other"
    _attempt(other, attempt=2)
    (other / "events.state.json").write_text(json.dumps({"attempt": [1, T_LAUNCH - 100]}))  # filed late by attempt 1
    rotate(other)
    assert not list(other.glob("events.state*"))
    own = tmp_path / "own"
    _attempt(own, attempt=2)
    (own / "events.state.json").write_text(json.dumps({"attempt": [2, T_LAUNCH]}))
    rotate(own)
    assert (own / f"events.{stamp}.state.json").exists()  # control: its own state goes with it


def test_without_run_json_the_stamp_is_the_oldest_files_time(tmp_path: Path):
    d = tmp_path / "run"
    _attempt(d, run_json=False)
    os.utime(d / "train.log", (T_LAUNCH, T_LAUNCH))
    os.utime(d / "events.jsonl", (T_LAUNCH + 7200, T_LAUNCH + 7200))
    assert attempt_stamp(d) == utc_stamp(T_LAUNCH)
    os.utime(d / "train.log", (T_LAUNCH + 9000, T_LAUNCH + 9000))  # control: now events.jsonl is the oldest
    assert attempt_stamp(d) == utc_stamp(T_LAUNCH + 7200)


def test_a_state_of_a_later_attempt_is_dropped_too(tmp_path: Path):
    d = tmp_path / "run"
    _attempt(d, attempt=2)
    (d / "events.state.json").write_text(json.dumps({"attempt": [3, T_LAUNCH + 100]}))  # not this attempt's
    rotate(d)
    assert not list(d.glob("events*state*"))


def test_a_name_taken_while_rotating_moves_the_attempt_to_the_next_suffix(tmp_path: Path, monkeypatch):
    """Another process takes a stamped name between the plan and the link: the link fails rather than
    overwrite, and the whole attempt goes to the next suffix."""
    d = tmp_path / "run"
    _attempt(d)
    stamp = utc_stamp(T_LAUNCH)
    real_link, raced = os.link, []

    def link(src, dst):
        if not raced:
            raced.append(dst)
            Path(dst).write_text("another process's file\n")
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", link)
    plan = rotate(d)
    assert Path(raced[0]).read_text() == "another process's file\n"  # never overwritten
    assert {p.name for _, p in plan} == {f"train.{stamp}-1.log", f"events.{stamp}-1.jsonl", f"run.{stamp}-1.json"}
    assert (d / f"train.{stamp}-1.log").read_text() == "attempt 1 log\n"
