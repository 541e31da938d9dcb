"""The ledger of where the hours went (monitors/snapshot/ledger.py): every second of an attempt in one account, the
run's restart gaps and lost work, what a view reads of earlier attempts, and where it shows (status, Prometheus)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from stepwatch.monitors.export.prometheus import text_of
from stepwatch.monitors.fold.events import EventsFold
from stepwatch.monitors.readers.jsonl import EventReader
from stepwatch.monitors.snapshot.ledger import attempt_ledger, ledger_part, past_attempts, run_ledger
from stepwatch.monitors.snapshot.model import null_snapshot
from stepwatch.monitors.states import (EVALUATING, FINISHING, LOST, QUEUED, RESTART_GAP, SAVING, STALLED, STARTING,
                                      TRAINING, UNACCOUNTED)
from stepwatch.tui.format import ledger_words
from stepwatch.tui.plain import status_lines

T0 = 1_800_000_000.0


def _fold(tmp_path: Path, steps: list[tuple[int, float, list[str]]]) -> EventsFold:
    """An events fold of rank 0's step records: (step, its end, flags), each dt its interval."""
    path = tmp_path / "events.jsonl"
    prev = None
    with path.open("w") as f:
        for step, end, flags in steps:
            dt = end - prev if prev is not None else 3.0
            f.write(json.dumps({"v": 1, "kind": "step", "rank": 0, "step": step, "dt": dt, "flags": flags,
                                "tokens": None, "padded_tokens": None, "t": end, "step_begin": end - dt,
                                "step_end": end}) + "\n")
            prev = end
    fold = EventsFold()
    fold.fold(EventReader(path))
    return fold


def _run(tmp_path: Path) -> tuple[EventsFold, float]:
    """Launched at T0; first step ends at T0+5; 20 one-second steps, one holding a 10 s evaluation, one a 4 s save, one
    a 30 s stall; the last step ends at ``end``."""
    t, steps = T0 + 5.0, [(1, T0 + 5.0, ["first"])]
    for n in range(2, 22):
        t += {8: 11.0, 12: 5.0, 16: 31.0}.get(n, 1.0)
        steps.append((n, t, {8: ["eval"], 12: ["save"], 16: ["idle"]}.get(n, [])))
    return _fold(tmp_path, steps), t


# ---------------------------------------------------------------------------------------------- one attempt
def test_each_second_of_an_attempt_is_in_one_account_and_they_add_up_to_its_wall_time(tmp_path: Path):
    fold, last = _run(tmp_path)
    end = last + 2.0  # exited 0 two seconds after its last step
    ph = attempt_ledger(fold, 1.0, T0, end, FINISHING)
    assert ph is not None
    assert ph[STARTING] == pytest.approx(5.0)
    assert ph[EVALUATING] == pytest.approx(10.0) and ph[SAVING] == pytest.approx(4.0) and ph[STALLED] == pytest.approx(30.0)
    assert ph[TRAINING] == pytest.approx(20.0)  # 17 plain steps, and one typical step in each of the three flagged
    assert ph[FINISHING] == pytest.approx(2.0) and ph[LOST] == 0.0
    assert sum(ph.values()) == pytest.approx(end - T0)


def test_a_healthy_evaluation_and_save_are_never_stalled_or_lost_time(tmp_path: Path):
    """The control: the same run with no stall has nothing stalled and nothing lost."""
    t, steps = T0 + 5.0, [(1, T0 + 5.0, ["first"])]
    for n in range(2, 12):
        t += 11.0 if n == 5 else 1.0
        steps.append((n, t, ["eval"] if n == 5 else []))
    ph = attempt_ledger(_fold(tmp_path, steps), 1.0, T0, t, FINISHING)
    assert ph is not None and ph[STALLED] == 0.0 and ph[LOST] == 0.0 and ph[EVALUATING] == pytest.approx(10.0)


def test_a_failed_attempts_step_in_flight_is_lost_and_a_live_ones_is_its_phase(tmp_path: Path):
    fold, last = _run(tmp_path)
    assert attempt_ledger(fold, 1.0, T0, last + 7.0, LOST)[LOST] == pytest.approx(7.0)  # type: ignore[index]
    assert attempt_ledger(fold, 1.0, T0, last + 7.0, SAVING)[SAVING] == pytest.approx(11.0)  # type: ignore[index]


def test_an_attempt_with_no_step_yet_is_all_starting_and_one_with_no_launch_time_has_no_ledger(tmp_path: Path):
    ph = attempt_ledger(None, None, T0, T0 + 42.0, TRAINING)
    assert ph is not None and ph[STARTING] == 42.0 and sum(ph.values()) == 42.0
    assert attempt_ledger(None, None, None, T0 + 42.0, TRAINING) is None


def test_a_slurm_jobs_wait_in_the_queue_is_queued_not_starting(tmp_path: Path):
    fold, last = _run(tmp_path)
    ph = attempt_ledger(fold, 1.0, T0 - 100.0, last, FINISHING, start_unix=T0)
    assert ph is not None and ph[QUEUED] == pytest.approx(100.0) and ph[STARTING] == pytest.approx(5.0)
    assert sum(ph.values()) == pytest.approx(last - T0 + 100.0)


# ---------------------------------------------------------------------------------------------- the run
def _attempt(no: int, launched: float, ended: float | None, training: float, last_step: int | None,
             resumed_from: int | None = None) -> Any:
    ph = dict.fromkeys(("queued", "starting", "training", "evaluating", "saving", "stalled", "finishing",
                        "restart_gap", "lost", "unaccounted"), 0.0)
    ph[STARTING], ph[TRAINING] = ((ended or launched) - launched - training), training
    return {"attempt": no, "launched_at_unix": launched, "ended_at_unix": ended,
            "wall_s": (ended or launched) - launched, "phases_s": ph, "last_step": last_step, "step_p50_s": 0.5,
            "resumed_from_step": resumed_from, "after_attempt": no - 1 if resumed_from is not None else None,
            "started_by": None, "lost_steps": None, "source": "record"}


def test_a_resumed_attempt_moves_the_steps_after_its_checkpoint_to_lost_and_the_gap_is_a_restart_gap():
    first = _attempt(1, T0, T0 + 100.0, 90.0, 57)
    second = _attempt(2, T0 + 103.0, T0 + 150.0, 40.0, 80, resumed_from=40)
    led: Any = run_ledger([first, second], T0 + 150.0)
    assert first["lost_steps"] == 17 and led["phases_s"][LOST] == pytest.approx(8.5)  # 17 steps at 0.5 s
    assert led["phases_s"][TRAINING] == pytest.approx(90.0 - 8.5 + 40.0)
    assert led["phases_s"][RESTART_GAP] == pytest.approx(3.0)
    assert led["wall_s"] == pytest.approx(150.0) and sum(led["phases_s"].values()) == pytest.approx(150.0)
    assert led["goodput"] == pytest.approx((90.0 - 8.5 + 40.0) / 150.0, abs=1e-4)


def test_a_relaunch_from_scratch_loses_nothing_and_a_missing_attempt_is_unaccounted():
    led: Any = run_ledger([_attempt(1, T0, T0 + 10.0, 8.0, 16), _attempt(3, T0 + 30.0, T0 + 40.0, 8.0, 16)], T0 + 40.0)
    assert led["phases_s"][LOST] == 0.0 and led["phases_s"][UNACCOUNTED] == pytest.approx(20.0)
    assert led["phases_s"][RESTART_GAP] == 0.0


# ---------------------------------------------------------------------------------------------- earlier attempts' records
def _record(run_dir: Path, name: str, **over) -> Path:
    doc = {**_attempt(1, T0, T0 + 100.0, 90.0, 57), "v": 1, **over}
    path = run_dir / name
    path.write_text(json.dumps(doc))
    return path


def test_a_view_reads_earlier_attempts_records_its_owner_wrote_and_checks_every_value(tmp_path: Path):
    _record(tmp_path, "ledger.20261204T000000Z.json")
    _record(tmp_path, "ledger.20261204T000100Z.json", phases_s={"training": "lots"})  # a value of the wrong type
    _record(tmp_path, "ledger.20261204T000200Z.json", ended_at_unix=T0 - 5)  # ended before it began
    (tmp_path / "ledger.20261204T000300Z.json").symlink_to(_record(tmp_path, "elsewhere.json"))  # never followed
    got = past_attempts(tmp_path, os.getuid())
    assert [g["attempt"] for g in got] == [1] and got[0]["phases_s"][TRAINING] == 90.0  # type: ignore[index]


def test_an_earlier_attempts_record_another_user_wrote_is_not_read(tmp_path: Path):
    if os.getuid() != 0:
        pytest.fail("this test makes a file another user owns: run it as root, as CI does")
    path = _record(tmp_path, "ledger.20261204T000000Z.json")
    os.chown(path, 65534, 65534)
    assert past_attempts(tmp_path, os.getuid()) == []
    os.chown(path, 0, 0)  # the control: the owner's own record is read
    assert len(past_attempts(tmp_path, os.getuid())) == 1


# ---------------------------------------------------------------------------------------------- where it shows
def _snapshot_with_ledger(tmp_path: Path) -> Any:
    _record(tmp_path, "ledger.20261204T000000Z.json")
    (tmp_path / "run.json").write_text("{}")
    snap = null_snapshot()
    snap.update({"run": "r", "attempt": 2, "launched_at_unix": T0 + 103.0, "state": "running",
                 "phase": {"name": "training", "for_s": None, "source": None, "budget_s": None, "longest_s": {}}})
    fold = _fold(tmp_path, [(41 + n, T0 + 110.0 + n, ["first"] if n == 0 else []) for n in range(36)])  # 1 s steps
    snap["ledger"] = ledger_part(tmp_path, {"resumed_from": {"step": 40, "after_attempt": 1}}, snap, fold, 1.0,
                                 T0 + 150.0)
    return snap


def test_status_says_where_the_runs_hours_went_with_the_lost_steps_and_goodput(tmp_path: Path):
    snap = _snapshot_with_ledger(tmp_path)
    led = snap["ledger"]
    assert sum(led["phases_s"].values()) == pytest.approx(led["wall_s"]) and led["wall_s"] == pytest.approx(150.0)
    line = next(ln for ln in status_lines(snap) if "goodput" in ln)
    assert line.strip().startswith("time 0:02:30 in 2 attempts, goodput ")
    assert "lost 8 s (17 steps)" in line and "restart gap 3 s" in line
    assert ledger_words(None) is None


def test_prometheus_has_the_runs_time_by_account_and_its_goodput(tmp_path: Path):
    snap = _snapshot_with_ledger(tmp_path)
    text = text_of(snap).decode()  # type: ignore[arg-type]
    assert 'stepwatch_time_seconds_total{attempt="2",phase="lost",run="r"} 8.5' in text
    assert 'stepwatch_time_seconds_total{attempt="2",phase="restart_gap",run="r"} 3.0' in text
    assert f"stepwatch_goodput_ratio{{attempt=\"2\",run=\"r\"}} {snap['ledger']['goodput']}" in text
    snap["ledger"] = None  # no ledger: no sample, never a made-up 0
    assert "stepwatch_goodput_ratio{" not in text_of(snap).decode()  # type: ignore[arg-type]
